"""Two consumer groups with different configurations on the same input topics, sharing one
snapshot store (a compacted topic, or a directory): each reads back only its own snapshots. With
snapshots keyed by partition alone, a restart loaded whichever group wrote last, refused it as
another configuration's and rebuilt its models from the whole joined log."""

import uuid

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.stream.snapshots import (
    DirectoryStore,
    TopicStore,
    create_snapshot_topic,
    load_latest,
)
from streambandit.stream.worker import Worker
from streambandit.wire import Context, Reward

from .helpers import producer, run_in_thread, send, wait_for

pytestmark = pytest.mark.integration

N = 120
CONFIGS = {  # a learner and a window of its own per group
    "g-oful": {
        "models": [
            {
                "match": "m-*",
                "policy": "oful",
                "dim": 3,
                "reward_window_ms": 200,
                "default_reward": 0.0,
            }
        ]
    },
    "g-glb": {
        "models": [
            {
                "match": "m-*",
                "policy": "glb_omd",
                "dim": 3,
                "reward_window_ms": 300,
                "default_reward": 0.0,
                "hyper": {"link": "gaussian"},
            }
        ]
    },
}


def group_topics(topics: Topics, group: str, broker) -> Topics:
    """The shared inputs, and output topics of the group's own (outputs are per deployment)."""
    tag = uuid.uuid4().hex[:6]
    t = Topics(
        contexts=topics.contexts,
        rewards=topics.rewards,
        actions=f"a-{group}-{tag}",
        joined=f"j-{group}-{tag}",
        dead_letter=f"d-{group}-{tag}",
    )
    broker.create_topics([t.actions, t.joined, t.dead_letter], partitions=2)
    return t


@pytest.mark.parametrize("kind", ["topic", "directory"])
def test_two_groups_share_a_snapshot_store_and_never_read_each_others_state(
    broker, topics, tmp_path, kind
):
    if kind == "topic":
        name = f"snapshots-{uuid.uuid4().hex[:8]}"
        create_snapshot_topic(broker.bootstrap_servers, name, partitions=2)

        def store():
            return TopicStore(broker.bootstrap_servers, name)
    else:

        def store():
            return DirectoryStore(tmp_path / "snaps")

    prod, rng = producer(broker), np.random.default_rng(7)
    for i in range(N):
        key = f"m-{i % 4}"
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", key, 1_000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3)) / 2),
        )
        send(prod, topics.rewards, Reward(f"e{i}", key, 1_000 + 10 * i + 3, float(rng.random())))
    send(
        prod,
        topics.contexts,
        Context("closer", "m-0", 1_000 + 10 * N + 5_000, ("a",), np.zeros((1, 3))),
    )
    prod.flush()
    out_topics = {g: group_topics(topics, g, broker) for g in CONFIGS}

    def worker(group: str) -> Worker:
        cfg = WorkerConfig(
            bootstrap_servers=broker.bootstrap_servers,
            models=parse_models_config(CONFIGS[group]),
            group_id=group,
            topics=out_topics[group],
            idle_tick_ms=10**9,
        )
        return Worker(cfg, store())

    def run_until(workers, done, timeout_s):
        """Run ``workers`` in threads until ``done()``, then stop them; returns whether it came."""
        threads = {g: run_in_thread(w) for g, w in workers.items()}
        try:
            return (
                wait_for(lambda: done() or any(f for _, f in threads.values()), timeout_s=timeout_s)
                and done()
            )
        finally:
            for w in workers.values():
                w.stop()
            for t, _ in threads.values():
                t.join(30)
            assert not any(f for _, f in threads.values()), [f for _, f in threads.values()]

    # Both groups side by side to the end of the stream, then stopped (each snapshots its partitions).
    first = {g: worker(g) for g in CONFIGS}
    assert run_until(first, lambda: all(w.metrics["joined"] >= N for w in first.values()), 90), {
        g: w.metrics["joined"] for g, w in first.items()
    }
    saved = {g: {p: load_latest(store().scoped(g), p) for p in (0, 1)} for g in CONFIGS}
    for g, snaps in saved.items():  # each group's own learner in its own snapshots
        policies = {
            m["policy"] if "policy" in m else None
            for s in snaps.values()
            for m in s["engine"]["models"].values()
        }
        assert snaps[0] is not None and snaps[1] is not None, g
        assert sum(len(s["engine"]["models"]) for s in snaps.values()) == 4, (g, policies)

    # Restarted, each group recovers from its own latest snapshot: no fallback, nothing replayed,
    # the same models to the bit.
    again = {g: worker(g) for g in CONFIGS}
    assert run_until(again, lambda: all(len(w.partitions) == 2 for w in again.values()), 60)
    for g, w in again.items():
        assert w.metrics["snapshot_fallbacks"] == 0 and w.metrics["recovered_joined"] == 0, (
            g,
            dict(w.metrics),
        )
        for p in (0, 1):
            now = load_latest(store().scoped(g), p)["engine"]["models"]
            before = saved[g][p]["engine"]["models"]
            assert now.keys() == before.keys()
            for key in now:
                assert all(np.array_equal(now[key][f], before[key][f]) for f in now[key]), (g, key)
