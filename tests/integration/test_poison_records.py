"""Poison records on the real broker: each would once stop a partition for good. Each is now
dead-lettered with its reason, the good records around it are decided and learned normally, and
the worker never stops.

- a 3 MB record of random bytes on contexts: its dead letter, holding it whole, was over the
  producer's size limit, so the transaction failed and was retried ~30 times a second, forever;
- a valid context with a 1.2 MB event id: its action was over the limit, the same loop;
- a context dated in the year 3000, and a watermark tick written by a client (with no group, or
  naming the worker's group): the watermark jumped there, every open decision got the default
  reward and every later reward was refused.
"""

import hashlib
import time

import numpy as np
import pytest
from confluent_kafka import Producer

from streambandit import reasons
from streambandit.wire import Context, Reward, Tick, encode

from .helpers import committed_offsets, is_tansu, outputs, run_in_thread, wait_for

pytestmark = pytest.mark.integration

WINDOW_MS = 60_000
GROUP = "g-poison"


def allow_large_records(broker, topic: str, max_bytes: int) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(
                "max.message.bytes", str(max_bytes), incremental_operation=AlterConfigOpType.SET
            )
        ],
    )
    admin = broker.admin()
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def test_poison_records_are_dead_lettered_and_the_stream_goes_on(broker, topics, tmp_path):
    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import WorkerConfig
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import Worker

    models = parse_models_config(
        {
            "models": [
                {
                    "match": "m",
                    "policy": "oful",
                    "dim": 3,
                    "reward_window_ms": WINDOW_MS,
                    "default_reward": 0.0,
                }
            ]
        }
    )
    # stall_report_s = 1: a healthy run must not report a stall even when it looks every 0.25 s.
    w = Worker(
        WorkerConfig(
            bootstrap_servers=broker.bootstrap_servers,
            models=models,
            group_id=GROUP,
            topics=topics,
            idle_tick_ms=10**9,
            stall_report_s=1.0,
        ),
        DirectoryStore(tmp_path / "snaps"),
    )
    if not is_tansu(broker):
        # Apache Kafka refuses records over a topic's max.message.bytes (1 MB by default; Tansu
        # has no such limit): an application that sends large contexts raises it on the topic.
        allow_large_records(broker, topics.contexts, 8_000_000)
    t, failure = run_in_thread(w)
    refused: list = []
    # A client producer that may send large records (the worker's own producer keeps the default limit).
    prod = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "message.max.bytes": 8_000_000,
            "partitioner": "murmur2_random",
            "on_delivery": lambda err, msg: err is not None and refused.append(err),
        }
    )
    now = int(time.time() * 1000)
    rng = np.random.default_rng(5)
    good: list[str] = []

    def context(event_id: str, ts: int) -> None:
        prod.produce(
            topics.contexts,
            key=b"m",
            value=encode(Context(event_id, "m", ts, ("a", "b"), rng.standard_normal((2, 3)) / 2)),
        )

    def reward(event_id: str, ts: int, value: float = 1.0) -> None:
        prod.produce(topics.rewards, key=b"m", value=encode(Reward(event_id, "m", ts, value)))

    def some_good(tag: str, ts: int) -> None:
        for i in range(5):
            context(f"{tag}-{i}", ts + i)
            reward(f"{tag}-{i}", ts + i + 1)
            good.append(f"{tag}-{i}")

    huge = rng.bytes(3_000_000)
    long_id = "x" * 1_200_000
    try:
        some_good("a", now)
        prod.produce(topics.contexts, key=b"m", value=huge)
        some_good("b", now + 100)
        prod.produce(
            topics.contexts,
            key=b"m",
            value=encode(Context(long_id, "m", now + 150, ("a", "b"), np.zeros((2, 3)))),
        )
        some_good("c", now + 200)
        context("year-3000", 32_503_680_000_000)
        some_good("d", now + 300)
        prod.produce(topics.rewards, key=b"m", value=encode(Tick(2**63 - 1)))  # no group: foreign
        some_good("e", now + 400)
        prod.produce(
            topics.rewards, key=b"m", value=encode(Tick(2**63 - 1, GROUP))
        )  # forged: too far ahead
        some_good("f", now + 500)
        # The window closes in event time: rewards that came in their window were joined with
        # their value, not with the default a far-future watermark would have given them.
        context("closer", now + 500 + 2 * WINDOW_MS)
        assert prod.flush(30) == 0 and not refused, refused
        # Every context's offset committed: the joins are counted when their batch is made, and
        # a stop before its commit would leave that batch to the next start.
        n_contexts = len(good) + 4  # the 3 MB record, the long id, the year 3000, the closer
        assert wait_for(
            lambda: (
                failure
                or sum(committed_offsets(broker, GROUP, topics.contexts).values()) >= n_contexts
            ),
            timeout_s=90,
        )
        assert not failure, failure
    finally:
        w.stop()
        t.join(30)
    assert not failure, failure
    assert w.metrics["stalls_reported"] == 0
    out = outputs(broker, topics, GROUP)
    assert sorted(a.event_id for a in out["actions"]) == sorted(good + ["closer"])
    joined = {j.event_id: j for j in out["joined"]}
    assert sorted(joined) == sorted(good), sorted(joined)
    wrong = [
        (j.event_id, j.reward_observed, j.reward)
        for j in joined.values()
        if not (j.reward_observed and j.reward == 1.0)
    ]
    assert not wrong, wrong
    by_reason = {}
    for d in out["dead_letter"]:
        by_reason.setdefault(d.reason, []).append(d)
    assert sorted(by_reason) == sorted(
        [reasons.MALFORMED, reasons.ID_TOO_LONG, reasons.EVENT_TIME_AHEAD, reasons.FOREIGN_TICK]
    )
    [malformed] = by_reason[reasons.MALFORMED]
    assert huge.startswith(malformed.value) and len(malformed.value) < len(huge)
    assert (
        hashlib.sha256(huge).hexdigest() in malformed.detail and "3000000 bytes" in malformed.detail
    )
    [too_long] = by_reason[reasons.ID_TOO_LONG]
    assert "1200000 bytes" in too_long.detail
    assert (
        len(by_reason[reasons.EVENT_TIME_AHEAD]) == 2
    )  # the year-3000 context and the forged tick
    assert len(by_reason[reasons.FOREIGN_TICK]) == 1


def test_a_worker_without_partitions_while_work_waits_says_so(broker, topics, tmp_path, caplog):
    """The worker's stall check against the real broker: it holds no partition (never subscribed
    here), its group's inputs have records it has not committed, and after stall_report_s it logs
    one error line saying so."""
    import logging

    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import WorkerConfig
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import Worker

    models = parse_models_config(
        {
            "models": [
                {
                    "match": "m",
                    "policy": "oful",
                    "dim": 3,
                    "reward_window_ms": 1000,
                    "default_reward": 0.0,
                }
            ]
        }
    )
    w = Worker(
        WorkerConfig(
            bootstrap_servers=broker.bootstrap_servers,
            models=models,
            group_id="g-stall",
            topics=topics,
            stall_report_s=0.5,
        ),
        DirectoryStore(tmp_path / "snaps"),
    )
    prod = Producer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(5):
        prod.produce(
            topics.contexts,
            key=b"m",
            value=encode(Context(f"s{i}", "m", 1000 + i, ("a",), np.zeros((1, 3)))),
        )
    prod.flush(10)
    w._join_group()  # its group consumer, as start() makes it, never subscribed here
    # As after an empty assignment (more members than partitions): not a rebalance that does not
    # end, which this worker, never polled, would otherwise be reported as (tests/unit/stream/
    # test_stall.py has both).
    w._rebalancing = False
    try:
        with caplog.at_level(logging.ERROR, logger="streambandit"):
            w._check_stalls()
            assert w.metrics["stalls_reported"] == 0  # not for long enough yet
            time.sleep(0.6)
            w._next_stall_check = 0.0
            w._check_stalls()
        assert w.metrics["stalls_reported"] == 1
        # (how many records: the embedded broker undercounts a non-transactional batch, docs/notes/tansu.md)
        assert any(
            "holds no partition" in r.getMessage() and "not yet committed" in r.getMessage()
            for r in caplog.records
        )
    finally:
        w.close()
