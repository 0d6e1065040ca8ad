"""The outputs BatchProcessor.release hands over: each on the partition of the record that wrote
it, keyed by its model key's UTF-8 bytes (from the processor's cache of encoded model keys, whose
reference is ``str.encode``), in the order the records were processed, across hand-overs."""

import collections

import numpy as np
import pytest
from confluent_kafka import Message

from streambandit import reasons
from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.merge import InputMerger
from streambandit.engine.partition import PartitionEngine
from streambandit.stream import batch
from streambandit.stream.batch import BatchProcessor, PartitionState
from streambandit.wire import Action, Context, DeadLetter, Joined, Reward, decode, encode

TOPICS = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")
# Non-ASCII model keys: their UTF-8 bytes differ from their characters (and from Latin-1).
KEYS = ("m-1", "mü", "m键🙂", "mé-2")


def processor(partitions: int) -> BatchProcessor:
    models = parse_models_config(
        {
            "models": [
                {
                    "match": "m*",
                    "policy": "oful",
                    "dim": 2,
                    "reward_window_ms": 10**6,
                    "default_reward": 0.0,
                }
            ]
        }
    )
    cfg = WorkerConfig(
        bootstrap_servers="unused",
        models=models,
        topics=TOPICS,
        merge_wait_ms=0,
        idle_tick_ms=10**9,
    )
    b = BatchProcessor(cfg, collections.Counter())
    for p in range(partitions):
        b.partitions[p] = PartitionState(PartitionEngine(cfg.models), InputMerger(0), {0: 0, 1: 0})
    return b


def traffic(n: int, partitions: int) -> list[Message]:
    """n contexts and a reward for each, every record keyed by its model key's UTF-8 bytes, on the
    partition its event id names."""
    offsets: collections.Counter = collections.Counter()
    msgs = []
    for i in range(n):
        p, key = i % partitions, KEYS[i % len(KEYS)]
        ctx = Context(f"e{p}-{i}", key, 1_000 + i, ("a", "b"), np.eye(2) + i)
        rew = Reward(f"e{p}-{i}", key, 1_000 + i, float(i % 3))
        for topic, ev in (("c", ctx), ("r", rew)):
            msgs.append(
                Message(
                    topic=topic,
                    partition=p,
                    offset=offsets[(topic, p)],
                    key=key.encode("utf-8"),
                    value=encode(ev),
                    timestamp=(1, ev.timestamp_ms),
                )
            )
            offsets[(topic, p)] += 1
    return msgs


@pytest.mark.parametrize("emit_every", [3, 256])
def test_each_output_is_on_its_records_partition_keyed_by_its_model_keys_utf8(
    emit_every, monkeypatch
):
    monkeypatch.setattr(batch, "EMIT_EVERY", emit_every)
    parts, n = 2, 40
    b = processor(parts)
    out: list = []
    b.process(traffic(n, parts), 10**13, {p: (False, False) for p in range(parts)}, out.extend)
    actions = [(p, k, decode(v)) for t, p, k, v in out if t == "a"]
    joined = [(p, k, decode(v)) for t, p, k, v in out if t == "j"]
    assert {t for t, *_ in out} == {"a", "j"}  # no dead letter: every key matched
    assert len(actions) == n and len(joined) == n
    for p, key, rec in actions + joined:
        assert type(rec) in (Action, Joined)
        assert key == rec.model_key.encode("utf-8")
        assert rec.event_id.startswith(f"e{p}-")  # the partition of the record that wrote it
    # Each topic's records in processing order: per partition, in input order.
    for p in range(parts):
        ids = [f"e{p}-{i}" for i in range(p, n, parts)]
        assert [r.event_id for q, _, r in actions if q == p] == ids
        assert [r.event_id for q, _, r in joined if q == p] == ids


def test_a_key_that_is_not_the_model_keys_utf8_bytes_is_dead_lettered():
    b = processor(1)
    ctx = Context("e1", "mü", 1_000, ("a", "b"), np.eye(2))
    msgs = [
        Message(topic="c", partition=0, offset=i, key=k, value=encode(ctx), timestamp=(1, 1_000))
        for i, k in enumerate(("mü".encode("latin-1"), "mü".encode("utf-8")))
    ]
    out: list = []
    b.process(msgs, 10**13, {0: (False, False)}, out.extend)
    assert [(t, p, k) for t, p, k, _ in out] == [
        ("d", 0, "mü".encode("latin-1")),
        ("a", 0, b"m\xc3\xbc"),
    ]
    dl = decode(out[0][3])
    assert isinstance(dl, DeadLetter) and dl.reason == reasons.KEY_MISMATCH


def test_the_key_cache_gives_str_encodes_bytes_and_errors():
    keys = batch._KeyBytes()
    for s in (*KEYS, "", "\x00", "ключ"):
        assert keys[s] == s.encode() and keys[s] is keys[s]
    with pytest.raises(UnicodeEncodeError):
        keys["m\ud800"]  # a lone surrogate: as "m\ud800".encode() raises


def test_the_key_cache_is_emptied_past_its_bound(monkeypatch):
    monkeypatch.setattr(batch, "KEY_BYTES_MAX", 2)
    b = processor(1)
    behind = {0: (False, False)}
    for i in range(3):
        b.process(traffic(len(KEYS), 1)[2 * i : 2 * i + 2], 10**13, behind, lambda _: None)
    assert len(b._key_bytes) == 3  # past the bound: emptied at the next batch
    out: list = []
    b.process(traffic(len(KEYS), 1)[6:], 10**13, behind, out.extend)
    assert list(b._key_bytes) == [KEYS[3]]
    assert [(t, k) for t, _, k, _ in out] == [("a", KEYS[3].encode()), ("j", KEYS[3].encode())]
