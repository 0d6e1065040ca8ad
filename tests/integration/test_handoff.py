"""Partition handoff on each broker: a second worker joins the group, takes one of
the two partitions, and continues it from the first worker's snapshot in the snapshot topic.

The same input goes through a single uninterrupted worker on its own topics; the two runs must end
with the same models to the last bit and the same decisions and joins."""

import threading
import uuid

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.stream.snapshots import TopicStore, create_snapshot_topic, load_latest
from streambandit.stream.worker import Worker
from streambandit.wire import Context, Reward, encode

from .helpers import caught_up, engine_states_equal, outputs, producer, send_tracked, wait_for

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {
            "match": "sum-*",
            "policy": "glb_omd",
            "dim": 4,
            "reward_window_ms": 400,
            "default_reward": 0.0,
            "aggregation": "sum",
            "epsilon": 0.1,
            "hyper": {"link": "poisson", "S": 2.0},
        },
        {
            "match": "first-*",
            "policy": "oful",
            "dim": 4,
            "reward_window_ms": 300,
            "default_reward": 0.5,
            "aggregation": "first",
        },
    ]
}
KEYS = [f"{kind}-{c}" for c in "abcd" for kind in ("sum", "first")]
PER_BATCH = 240
SETTINGS = dict(
    merge_wait_ms=1500,  # long enough that a fetch of the other input always arrives in time
    idle_tick_ms=10**9,  # no wall-clock ticks: both runs must see the same input
    snapshot_interval_s=0.5,
    snapshot_every_updates=40,
    batch_max_records=100,
)


class Run:
    """A worker on its own thread with its own TopicStore (as a separate process would have)."""

    def __init__(
        self, broker, topics: Topics, snap_topic: str, group: str, instance: str, **overrides
    ) -> None:
        cfg = WorkerConfig(
            bootstrap_servers=broker.bootstrap_servers,
            models=parse_models_config(MODELS),
            group_id=group,
            topics=topics,
            **(SETTINGS | overrides),
        )
        # Small chunks: every snapshot here spans several records.
        self.store = TopicStore(broker.bootstrap_servers, snap_topic, max_chunk_bytes=2048)
        self.worker = Worker(cfg, self.store, instance_id=instance)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # reported by stop(): a dead thread must fail the test
            self.error = exc

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)
        self.store.close()
        assert not self.thread.is_alive(), "the worker did not stop"
        assert self.error is None, repr(self.error)


def make_topics(broker) -> tuple[Topics, str]:
    tag = uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"c-{tag}",
        rewards=f"r-{tag}",
        actions=f"a-{tag}",
        joined=f"j-{tag}",
        dead_letter=f"d-{tag}",
    )
    broker.create_topics(t.all(), partitions=2)
    snaps = f"snapshots-{tag}"
    assert create_snapshot_topic(broker.bootstrap_servers, snaps, partitions=2)
    return t, snaps


def batch(first: int, seed: int) -> list[tuple[int, object]]:
    """Contexts ``first..first+PER_BATCH-1`` and their rewards (0 to 2 each, some before or long
    after the decision), in event-time order. Each batch starts after the previous one's last
    event, so the merge order is the same whether the batches arrive together or apart."""
    rng = np.random.default_rng(seed)
    events = []
    for i in range(first, first + PER_BATCH):
        key = KEYS[i % len(KEYS)]
        ts = 10_000 + 10 * i + 1_000 * (first // PER_BATCH)
        events.append((ts, 0, context(f"e{i}", key, ts, rng)))
        for _ in range(int(rng.integers(0, 3))):
            d = int(rng.integers(-20, 500))
            events.append((ts + d, 1, Reward(f"e{i}", key, ts + d, float(rng.integers(0, 3)) / 2)))
    return [(src, ev) for _, src, ev in sorted(events, key=lambda e: (e[0], e[1]))]


def context(event_id: str, key: str, ts: int, rng) -> Context:
    return Context(event_id, key, ts, ("x", "y", "z"), rng.standard_normal((3, 4)) / 3)


def closing(events, partition_of: dict[str, int], tag: str) -> list[tuple[int, object]]:
    """One context per partition after everything in ``events``. The merge releases a record
    whose other input is empty only after ``merge_wait_ms``, one record at a time; ending each
    partition with a single record keeps that wait to one per partition and batch."""
    end = max(ev.timestamp_ms for _, ev in events) + 1
    keys: dict[int, str] = {}
    for k, p in sorted(partition_of.items()):
        keys.setdefault(p, k)
    rng = np.random.default_rng(sum(tag.encode()))
    return [(0, context(f"{tag}-{p}", k, end, rng)) for p, k in sorted(keys.items())]


def produce(broker, runs: list[Topics], events) -> dict[Topics, list]:
    """The same records into each run's topics; returns where they landed."""
    prod = producer(broker)
    sent = {
        t: [
            send_tracked(
                prod, t.contexts if src == 0 else t.rewards, ev.model_key.encode(), encode(ev)
            )
            for src, ev in events
        ]
        for t in runs
    }
    assert prod.flush(30) == 0
    return sent


def test_a_moved_partition_continues_from_the_previous_owners_snapshot(broker, topics):
    snaps = f"snapshots-{uuid.uuid4().hex[:8]}"
    assert create_snapshot_topic(broker.bootstrap_servers, snaps, partitions=2)
    ref_topics, ref_snaps = make_topics(broker)
    tag = uuid.uuid4().hex[:8]
    group, ref_group = f"handoff-{tag}", f"reference-{tag}"

    events = batch(0, seed=1)
    first = produce(broker, [topics, ref_topics], events)
    partition_of = {
        s.key.decode(): s.partition for s in first[topics] if s.topic == topics.contexts
    }
    assert set(partition_of.values()) == {0, 1}, "the keys must cover both partitions"
    tail = closing(events, partition_of, "end1")
    first_ids = {ev.event_id for src, ev in events + tail if src == 0}
    sent = produce(broker, [topics, ref_topics], tail)
    first = {t: first[t] + sent[t] for t in first}

    # The group's snapshots are all taken by forked children, which send their bytes back for the
    # worker to produce; the reference's are copied on its loop.
    forked = {"snapshot_fork_models": 1}
    w1 = Run(broker, topics, snaps, group, "w1", **forked)
    ref = Run(broker, ref_topics, ref_snaps, ref_group, "ref", snapshot_fork_models=0)
    runs = [w1, ref]
    try:
        assert wait_for(lambda: caught_up(broker, topics, group, first[topics]), timeout_s=120)
        assert wait_for(
            lambda: caught_up(broker, ref_topics, ref_group, first[ref_topics]), timeout_s=120
        )
        assert sorted(w1.worker.partitions) == [0, 1]

        w2 = Run(broker, topics, snaps, group, "w2", **forked)
        runs.append(w2)
        assert wait_for(
            lambda: len(w1.worker.partitions) == 1 and len(w2.worker.partitions) == 1, timeout_s=90
        )
        moved = set(w2.worker.partitions)

        events = batch(PER_BATCH, seed=2)
        second = produce(broker, [topics, ref_topics], events)
        sent = produce(broker, [topics, ref_topics], closing(events, partition_of, "end2"))
        second = {t: second[t] + sent[t] for t in second}
        assert wait_for(lambda: caught_up(broker, topics, group, second[topics]), timeout_s=120)
        assert wait_for(
            lambda: caught_up(broker, ref_topics, ref_group, second[ref_topics]), timeout_s=120
        )
        assert set(w2.worker.partitions) == moved and set(w1.worker.partitions) == {0, 1} - moved
    finally:
        for r in runs:
            r.worker.stop()
        for r in runs:
            r.stop()

    # The new owner restored the moved partition from the snapshot topic: it re-applied no joined
    # record (a missing snapshot would have made it replay the partition's whole joined log).
    assert w2.worker.metrics["recovered_joined"] == 0 and w2.worker.metrics["snapshots"] > 0
    assert w1.worker.metrics["snapshot_forks"] > 0 and w2.worker.metrics["snapshot_forks"] > 0
    assert ref.worker.metrics["snapshot_forks"] == 0

    out, ref_out = outputs(broker, topics, group), outputs(broker, ref_topics, ref_group)
    n = 2 * PER_BATCH + 4
    # Exactly one committed action per context, and no record written twice (not even one the
    # committed-view filter would hide).
    ids = [a.event_id for a in out["actions"]]
    assert len(ids) == len(set(ids)) == n == out["raw_counts"]["actions"]
    joined_ids = [j.event_id for j in out["joined"]]
    assert len(joined_ids) == len(set(joined_ids)) == out["raw_counts"]["joined"]

    # Models in the moved partition continued: versions go on from where the first owner left.
    for key, p in partition_of.items():
        if p not in moved:
            continue
        versions = [
            (a.event_id in first_ids, a.model_version) for a in out["actions"] if a.model_key == key
        ]
        before = max(v for first_batch, v in versions if first_batch)
        after = min(v for first_batch, v in versions if not first_batch)
        assert 0 < before <= after, (key, before, after)

    # Same decisions, same joins (each reward applied once), same refusals as the single worker.
    akey = lambda a: (a.event_id, a.arm_index, a.model_version, a.propensity)
    assert sorted(map(akey, out["actions"])) == sorted(map(akey, ref_out["actions"]))
    jkey = lambda j: (j.event_id, j.reward, j.reward_observed, j.model_version_before)
    assert sorted(map(jkey, out["joined"])) == sorted(map(jkey, ref_out["joined"]))
    dkey = lambda d: (d.reason, d.source_partition, d.source_offset)
    assert sorted(map(dkey, out["dead_letter"])) == sorted(map(dkey, ref_out["dead_letter"]))

    # And the same state to the last bit, read back from each run's snapshot topic.
    with (
        TopicStore(broker.bootstrap_servers, snaps) as s,
        TopicStore(broker.bootstrap_servers, ref_snaps) as r,
    ):
        for p in (0, 1):
            engine_states_equal(
                load_latest(s.scoped(group), p)["engine"],
                load_latest(r.scoped(ref_group), p)["engine"],
            )
