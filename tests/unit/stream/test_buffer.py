"""BatchProcessor.buffer: a batch whose every record is admitted by time is buffered by column
(one sort of the partition and source keys); any other batch one record at a time. Both must
leave the mergers exactly as the record-by-record path does."""

import collections

import numpy as np
from confluent_kafka import Message

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.merge import InputMerger
from streambandit.engine.partition import PartitionEngine
from streambandit.stream.batch import BatchProcessor, PartitionState
from streambandit.wire import Context, Reward, encode

TOPICS = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")


def processor() -> BatchProcessor:
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
    cfg = WorkerConfig(bootstrap_servers="unused", models=models, topics=TOPICS, merge_wait_ms=0)
    b = BatchProcessor(cfg, collections.Counter())
    for p in (0, 1):  # partition 2 is not held: its records are dropped
        b.partitions[p] = PartitionState(PartitionEngine(cfg.models), InputMerger(0), {0: 0, 1: 0})
    return b


def batch(n: int, seed: int) -> list[Message]:
    rng = np.random.default_rng(seed)
    offsets: collections.Counter = collections.Counter()
    out = []
    for i in range(n):
        p, topic = int(rng.integers(0, 3)), "cr"[int(rng.integers(0, 2))]
        t = int(rng.integers(0, 10**6))
        ev = (
            Context(f"e{i}", f"m{p}", t, ("a", "b"), rng.standard_normal((2, 2)))
            if topic == "c"
            else Reward(f"e{i}", f"m{p}", t, float(i))
        )
        out.append(
            Message(
                topic=topic,
                partition=p,
                offset=offsets[topic, p],
                key=ev.model_key.encode() if i % 5 else None,
                value=encode(ev),
                timestamp=(1, t + int(rng.integers(-5, 5))) if i % 7 else (0, 0),
            )
        )
        offsets[topic, p] += 1
    return out


def held(b: BatchProcessor) -> list:
    """Every buffered record of every held partition, as plain values, and the arrival marks."""
    out = []
    for p, part in sorted(b.partitions.items()):
        m = part.merger
        for q in m._queues:
            for t, src, offset, (ev, ref) in q:
                out.append(
                    (p, t, src, offset, type(ev), ev.event_id, ev.model_key, ev.timestamp_ms)
                    + (ref.source, ref.partition, ref.offset, ref.key, ref.value, ref.timestamp_ms)
                )
        out.append((p, [list(a) for a in m._arrivals], list(m._pushed), part.last_input_wall_ms))
    return out


def test_a_batch_buffered_by_column_is_buffered_as_record_by_record():
    for seed in range(5):
        msgs = batch(200, seed)
        # A record that does not decode, on the partition not held, sends the whole batch
        # through the record-by-record path without changing what the held partitions get.
        bad = Message(topic="c", partition=2, offset=10**6, key=None, value=b"x", timestamp=(0, 0))
        by_column, one_by_one = processor(), processor()
        by_column.buffer(msgs, 7)
        one_by_one.buffer(msgs + [bad], 7)
        assert held(by_column) == held(one_by_one)
        assert sum(len(part.merger._queues[0]) for part in by_column.partitions.values()) > 0
