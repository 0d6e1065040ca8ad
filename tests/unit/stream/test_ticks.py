"""Watermark ticks belong to the group whose worker wrote them: a worker applies its own group's
ticks and dead-letters any other (a client's, or another group's sharing the rewards topic)."""

import collections

import numpy as np
from confluent_kafka import Message

from streambandit import reasons
from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.column_merge import ColumnMerger
from streambandit.stream.batch import BatchProcessor, PartitionState
from streambandit.wire import Context, Tick, decode, encode
from streambandit.wire.codec import write

TOPICS = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")


def processor(group: str, merge_wait_ms: int = 0) -> BatchProcessor:
    models = parse_models_config(
        {
            "models": [
                {
                    "match": "m*",
                    "policy": "oful",
                    "dim": 2,
                    "reward_window_ms": 100,
                    "default_reward": 0.0,
                }
            ]
        }
    )
    cfg = WorkerConfig(
        bootstrap_servers="unused",
        models=models,
        topics=TOPICS,
        group_id=group,
        merge_wait_ms=merge_wait_ms,
        idle_tick_ms=10**9,
    )
    b = BatchProcessor(cfg, collections.Counter())
    b.partitions[0] = PartitionState(
        ArrayPartitionEngine(cfg.models), ColumnMerger(merge_wait_ms), {0: 0, 1: 0}
    )
    return b


def run(b: BatchProcessor, records: list[tuple[str, bytes | None, bytes, int]]) -> list:
    """Process (topic, key, value, timestamp) records on partition 0; the outputs, decoded."""
    offsets: collections.Counter = collections.Counter()
    msgs = []
    for topic, key, value, ts in records:
        msgs.append(
            Message(
                topic=topic,
                partition=0,
                offset=offsets[topic],
                key=key,
                value=value,
                timestamp=(1, ts),
            )
        )
        offsets[topic] += 1
    out: list = []
    b.process(msgs, 10**13, {0: (False, False)}, lambda outputs: out.extend(outputs))
    return [(topic, decode(value)) for topic, _, _, value in out]


def test_a_tick_written_before_ticks_named_their_group_reads_with_no_group():
    assert decode(write(7, {"timestamp_ms": 5}, version=1)) == Tick(5, "")
    assert decode(encode(Tick(5, "g"))) == Tick(5, "g")


def test_only_the_groups_own_ticks_move_its_watermark():
    ctx = encode(Context("e1", "m1", 1_000, ("a", "b"), np.eye(2)))
    for group, tick_group, closes in (("g", "g", True), ("g", "other", False), ("g", "", False)):
        b = processor(group)
        out = run(
            b, [("c", b"m1", ctx, 1_000), ("r", None, encode(Tick(5_000, tick_group)), 5_000)]
        )
        engine = b.partitions[0].engine
        dead = [r for t, r in out if t == "d"]
        if closes:  # the decision's window closed at the tick: joined with the default reward
            assert engine.watermark_ms == 5_000 and not engine.pending and not dead
            assert [r.event_id for t, r in out if t == "j"] == ["e1"]
        else:
            assert (
                engine.watermark_ms == 1_000 and len(engine.pending) == 1 and "e1" in engine.pending
            )
            assert [d.reason for d in dead] == [reasons.FOREIGN_TICK] and decode(
                dead[0].value
            ).group_id == tick_group
