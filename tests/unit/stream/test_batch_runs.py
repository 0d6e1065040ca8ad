"""BatchProcessor on columns (stream/batch.py) against the worker's loop as it is written
record by record: every record decoded into an object, pushed into its partition's merger,
released in merge order and sent to PartitionEngine's methods one at a time, its outputs encoded
one at a time. The same outputs, in the same order on every output topic, on a stream of two
partitions cut into poll batches at random, with what clients send wrong mixed in: bytes that do
not decode, records on the wrong topic, with another key or none, contexts of the old layout,
foreign and own ticks, event times far past the record's timestamp, record timestamps at the
top of int64."""

import collections

import numpy as np
import pytest
from confluent_kafka import Message

from streambandit import reasons
from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.column_merge import ColumnMerger
from streambandit.engine.merge import CONTEXTS, REWARDS, InputMerger
from streambandit.engine.partition import PartitionEngine, Rejected
from streambandit.stream.batch import BatchProcessor, PartitionState
from streambandit.wire import (
    Action,
    Context,
    DecodeError,
    InputRef,
    Joined,
    Reward,
    Tick,
    codec,
    encode,
    encode_context_v1,
)

TOPICS = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")
INT64_MAX = 2**63 - 1
AHEAD_MS = 60_000


def config() -> WorkerConfig:
    models = parse_models_config(
        {
            "models": [
                {"match": "o-*", "policy": "oful", "dim": 3, "reward_window_ms": 300,
                 "default_reward": 0.0},
                {"match": "g-*", "policy": "glb_omd", "dim": 3, "reward_window_ms": 200,
                 "aggregation": "sum", "default_reward": 0.0, "hyper": {"link": "logistic"}},
                {"match": "e-*", "policy": "oful", "dim": 3, "reward_window_ms": 300,
                 "epsilon": 0.3, "default_reward": 0.0},
            ]
        }
    )  # fmt: skip
    return WorkerConfig(
        bootstrap_servers="unused",
        models=models,
        topics=TOPICS,
        group_id="g",
        merge_wait_ms=0,
        idle_tick_ms=10**9,
        max_event_time_ahead_ms=AHEAD_MS,
    )


def stream(seed: int, n: int = 1500) -> list[tuple[str, int, bytes | None, bytes, int]]:
    """(topic, partition, key, value, record timestamp) in fetch order."""
    rng = np.random.default_rng(seed)
    keys = ["o-1", "o-2", "g-1", "e-1", "o-3"]
    out = []
    t = 1_000
    for i in range(n):
        t += int(rng.integers(0, 20))
        key = keys[int(rng.integers(len(keys)))]
        p = keys.index(key) % 2
        ctx = Context(f"ev{i}-ü", key, t, ("a", "b", "c"), rng.standard_normal((3, 3)) / 2)
        r = rng.random()
        value, kb, topic, record_ms = encode(ctx), key.encode(), "c", t
        if r < 0.02:
            value = rng.bytes(int(rng.integers(0, 40)))  # garbage
        elif r < 0.04:
            topic = "r"  # a context on the rewards topic
        elif r < 0.06:
            kb = b"other"
        elif r < 0.07:
            kb = None
        elif r < 0.09:
            value = encode_context_v1(ctx)  # the slow decoder's layout
        elif r < 0.10:
            value = encode(Context(ctx.event_id, key, t + 10 * AHEAD_MS, ctx.arm_ids, ctx.features))
        elif r < 0.11:
            record_ms = INT64_MAX  # a client's timestamp at the top of int64
        elif r < 0.12:
            record_ms = 0  # none: no bound on the event time
        out.append((topic, p, kb, value, record_ms))
        if rng.random() < 0.7:  # its reward, a little later, some after the window
            delay = int(rng.integers(1, 400))
            reward = Reward(ctx.event_id, key, t + delay, float(rng.integers(2)))
            rkey = key.encode() if rng.random() > 0.03 else b"nope"
            out.append(("r", p, rkey, encode(reward), t + delay))
        if rng.random() < 0.01:
            group = "g" if rng.random() < 0.5 else "elsewhere"
            out.append(("r", int(rng.integers(2)), None, encode(Tick(t + 50, group)), t))
        if rng.random() < 0.01:
            out.append(("r", p, key.encode(), rng.bytes(9), t))  # a reward that does not decode
    return out


def messages(records) -> list[Message]:
    offsets: collections.Counter = collections.Counter()
    msgs = []
    for topic, p, key, value, ts in records:
        msgs.append(
            Message(
                topic=topic,
                partition=p,
                offset=offsets[(topic, p)],
                key=key,
                value=value,
                timestamp=(1, ts),
            )
        )
        offsets[(topic, p)] += 1
    return msgs


def by_topic(outputs) -> dict[str, list[tuple[int, bytes | None, bytes]]]:
    out = collections.defaultdict(list)
    for topic, p, key, value in outputs:
        out[topic].append((p, key, value))
    return out


def reference(cfg: WorkerConfig, batches: list[list[Message]]) -> dict:
    """The worker's loop record by record, with the rules of BatchProcessor (dead letters by its
    own ``_other`` and ``_dead_letter``, which this test does not change)."""
    proc = BatchProcessor(cfg, collections.Counter())
    engines = {p: PartitionEngine(cfg.models, **cfg.engine_limits()) for p in (0, 1)}
    mergers = {p: InputMerger(0) for p in (0, 1)}
    parts = {p: PartitionState(engines[p], mergers[p], {0: 0, 1: 0}) for p in (0, 1)}
    source_of = {"c": CONTEXTS, "r": REWARDS}
    outputs = []
    for batch in batches:
        for m in batch:
            try:
                ev = codec.decode(m.value())
            except DecodeError as exc:
                ev = exc
            src, p = source_of[m.topic()], m.partition()
            ref = InputRef(src, p, m.offset(), m.key(), m.value(), m.timestamp()[1])
            timed = isinstance(ev, (Context, Reward, Tick))
            record_ms = ref.timestamp_ms
            if timed and not (record_ms > 0 and ev.timestamp_ms > record_ms + AHEAD_MS):
                mergers[p].push(src, m.offset(), ev.timestamp_ms, (ev, ref), 0)
            else:
                mergers[p].push(src, m.offset(), None, (ev, ref), 0)
        for p in (0, 1):
            for _, src, _, (ev, ref) in mergers[p].pop_ready(0, (False, False)):
                eng, key = engines[p], ref.key
                if type(ev) is Context and src == CONTEXTS and key == ev.model_key.encode():
                    outs = eng.on_context(ev, ref)
                elif type(ev) is Reward and src == REWARDS and key == ev.model_key.encode():
                    outs = eng.on_reward(ev, ref)
                else:
                    outs = proc._other(parts[p], ev, ref)
                for o in outs:
                    if isinstance(o, Action):
                        outputs.append(("a", p, o.model_key.encode(), encode(o)))
                    elif isinstance(o, Joined):
                        outputs.append(("j", p, o.model_key.encode(), encode(o)))
                    else:
                        assert isinstance(o, Rejected)
                        outputs.append(proc._dead_letter(p, o, ref))
    return by_topic(outputs)


@pytest.mark.parametrize("seed", range(3))
def test_runs_of_columns_give_the_record_by_record_loops_outputs(seed):
    cfg = config()
    rng = np.random.default_rng(100 + seed)
    msgs = messages(stream(seed))
    batches, at = [], 0
    while at < len(msgs):
        size = int(rng.integers(1, 700))
        batches.append(msgs[at : at + size])
        at += size
    b = BatchProcessor(cfg, collections.Counter())
    for p in (0, 1):
        b.partitions[p] = PartitionState(
            ArrayPartitionEngine(cfg.models, **cfg.engine_limits()), ColumnMerger(0), {0: 0, 1: 0}
        )
    got: list = []
    for batch in batches:
        b.process(batch, 0, {0: (False, False), 1: (False, False)}, got.extend)
    want = reference(cfg, batches)
    got_by = by_topic(got)
    assert got_by.keys() == want.keys()
    for topic in want:
        assert got_by[topic] == want[topic], topic
    # What the stream is for: decisions of every kind, joins, and every refusal it mixes in.
    counted = b.metrics
    assert counted["actions"] > 500 and counted["joined"] > 300
    for reason in (reasons.WRONG_TOPIC, reasons.KEY_MISMATCH, reasons.FOREIGN_TICK):
        assert counted[f"dead_letter.{reason}"] > 0, reason
    assert sum(v for k, v in counted.items() if k.startswith("dead_letter.")) > 50
    assert b.metrics["records_in"] == len(msgs)
    for p in (0, 1):
        assert b.partitions[p].next_offset == {
            src: max((m.offset() + 1 for m in msgs if m.partition() == p
                      and (m.topic() == "c") == (src == CONTEXTS)), default=0)
            for src in (CONTEXTS, REWARDS)
        }  # fmt: skip


def test_an_empty_poll_is_processed_as_nothing():
    """The worker hands over what a poll fetched, which may be nothing (a poll that timed out)."""
    cfg = config()
    b = BatchProcessor(cfg, collections.Counter())
    b.partitions[0] = PartitionState(
        ArrayPartitionEngine(cfg.models, **cfg.engine_limits()), ColumnMerger(0), {0: 0, 1: 0}
    )
    got: list = []
    assert b.process([], 0, {0: (False, False)}, got.extend) == 0
    assert got == [] and b.partitions[0].next_offset == {0: 0, 1: 0}
