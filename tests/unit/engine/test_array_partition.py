"""engine/array_partition.py against engine/partition.py: the same outputs, byte for byte, record
for record, and the same snapshot bytes, on streams that take every path (early, duplicate, late,
unknown and out-of-range rewards, evictions, refusals of every kind, ticks), across snapshots
restored by either engine and crashes recovered from the logs."""

import collections

import numpy as np
import pytest

from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.partition import Action, Context, Joined, PartitionEngine, Rejected, Reward
from streambandit.wire import InputRef, encode
from streambandit.wire.snapshot import pack_snapshot

from .test_engine_recovery import CONFIG, LIMITS, Tick, make_inputs, new_logs, recover, step

HEADER = {
    "partition": 0,
    "created_ms": 0,
    "contexts_offset": 0,
    "rewards_offset": 0,
    "actions_offset": 0,
    "joined_offset": 0,
    "dead_letter_offset": 0,
}


def snapshot_bytes(engine, models=None) -> bytes:
    snap = engine.snapshot(models)
    for e in snap["early"]:  # test_engine_recovery's inputs are ("in", i), not records
        if not isinstance(e["source"], InputRef):
            e["source"] = InputRef(0, 0, e["source"][1])
    return pack_snapshot({**HEADER, "engine": snap})


def as_bytes(out) -> list:
    """Outputs as what the worker writes of them (a refusal: its reason, detail and input)."""
    got = []
    for o in out:
        if isinstance(o, (Action, Joined)):
            got.append(encode(o))
        else:
            assert isinstance(o, Rejected)
            src = encode(o.source) if isinstance(o.source, Action) else o.source
            got.append((o.reason, o.detail, src))
    return got


def hostile_inputs(seed: int, n: int = 500) -> list:
    """make_inputs' stream with what a client can get wrong mixed in: unknown models, ids past
    the bound, repeated arm ids, the wrong dimension, a reward under another model's key, a
    reward that is not finite, events far ahead of their record, more models than allowed."""
    rng = np.random.default_rng(1000 + seed)
    out = []
    for i, ev in enumerate(make_inputs(seed, n)):
        out.append((ev, None))
        r = rng.random()
        ts = getattr(ev, "timestamp_ms", 0)
        arms = rng.standard_normal((3, 6))
        if r < 0.01:
            out.append((Context(f"u{i}", "nobody", ts, ("a", "b", "c"), arms), None))
        elif r < 0.02:
            out.append((Context("x" * 100, "first-a", ts, ("a", "b", "c"), arms), None))
        elif r < 0.03:
            out.append((Context(f"d{i}", "first-a", ts, ("a", "a", "c"), arms), None))
        elif r < 0.04:
            out.append((Context(f"w{i}", "sum-a", ts, ("a", "b", "c"), arms[:, :4]), None))
        elif r < 0.05 and isinstance(ev, Reward):
            out.append((Reward(ev.event_id, "last-b", ts, 1.0), None))
        elif r < 0.06:
            out.append((Reward(f"e{i}", "first-a", ts, float("nan")), None))
        elif r < 0.07:  # an event time far past its record's timestamp
            out.append((Context(f"f{i}", "first-a", ts + 10**9, ("a", "b", "c"), arms), ts))
        elif r < 0.08:  # a new model key each time: max_models refuses past the bound
            out.append((Context(f"m{i}", f"first-{i}", ts, ("a", "b", "c"), arms), None))
    return out


def feed(engine, ev, i, record_ms):
    source = InputRef(int(isinstance(ev, Reward)), 0, i, b"k", b"v", record_ms or 0)
    if isinstance(ev, Context):
        return engine.on_context(ev, source)
    if isinstance(ev, Reward):
        return engine.on_reward(ev, source)
    assert isinstance(ev, Tick)
    return engine.advance_to(ev.timestamp_ms, source)


@pytest.mark.parametrize("seed", range(4))
def test_every_output_and_snapshot_is_the_python_engines(seed):
    limits = {**LIMITS, "max_id_bytes": 64, "max_models": 8, "max_event_time_ahead_ms": 60_000}
    inputs = hostile_inputs(seed)
    python, arrays = PartitionEngine(CONFIG, **limits), ArrayPartitionEngine(CONFIG, **limits)
    rng = np.random.default_rng(seed)
    seen, evicted = set(), collections.Counter()
    for i, (ev, record_ms) in enumerate(inputs):
        want = feed(python, ev, i, record_ms)
        got = feed(arrays, ev, i, record_ms)
        assert as_bytes(got) == as_bytes(want), i
        seen |= {o.reason for o in want if isinstance(o, Rejected)}
        if rng.random() < 0.02:
            assert snapshot_bytes(arrays) == snapshot_bytes(python), i
            held = arrays.early_ids
            assert sorted(held.key(e).decode() for e in held.in_order()) == sorted(arrays.early)
            changed = python.take_changed()
            assert arrays.take_changed() == changed
            assert snapshot_bytes(arrays, changed) == snapshot_bytes(python, changed)
        if rng.random() < 0.01:  # each restored from the other's snapshot (counters restart)
            evicted.update(python.counters)
            snap_p, snap_a = python.snapshot(), arrays.snapshot()
            python = PartitionEngine.restore(CONFIG, snap_a, **limits)
            arrays = ArrayPartitionEngine.restore(CONFIG, snap_p, **limits)
    last = python.advance_to(10**12)
    assert as_bytes(arrays.advance_to(10**12)) == as_bytes(last)
    assert snapshot_bytes(arrays) == snapshot_bytes(python)
    assert len(arrays.pending) == len(python.pending) == 0
    # The stream took the paths it is for.
    assert {
        "unknown_model",
        "id_too_long",
        "duplicate_arm_id",
        "bad_dimension",
        "model_key_mismatch",
        "non_finite_reward",
        "event_time_ahead",
        "too_many_models",
        "duplicate_event",
        "late_reward",
        "unknown_event",
        "reward_out_of_range",
    } <= seen, seen
    evicted.update(python.counters)
    assert evicted["evicted_pending"] and evicted["evicted_early"]


@pytest.mark.parametrize("seed", range(3))
def test_crashes_recovered_from_the_logs_end_as_the_python_engine_does(seed):
    inputs = make_inputs(seed)
    rng = np.random.default_rng(200 + seed)
    engines = {
        "python": PartitionEngine(CONFIG, **LIMITS),
        "arrays": ArrayPartitionEngine(CONFIG, **LIMITS),
    }
    logs = {k: new_logs() for k in engines}
    snaps = {k: (e.snapshot(), {"input": 0, "actions": 0, "joined": 0, "dead_letter": 0})
             for k, e in engines.items()}  # fmt: skip
    i = 0
    for crash_at in sorted(rng.choice(np.arange(1, len(inputs)), size=4, replace=False)):
        while i < crash_at:
            for k, e in engines.items():
                step(e, inputs[i], ("in", i), logs[k])
            i += 1
            if rng.random() < 0.01:
                for k, e in engines.items():
                    snaps[k] = (
                        e.snapshot(),
                        {"input": i, **{n: len(v) for n, v in logs[k].items()}},
                    )
        engines["python"] = recover(snaps["python"], logs["python"], inputs, committed=i)
        engines["arrays"] = recover(
            snaps["arrays"], logs["arrays"], inputs, committed=i, engine_class=ArrayPartitionEngine
        )
        assert snapshot_bytes(engines["arrays"]) == snapshot_bytes(engines["python"]), i
    while i < len(inputs):
        for k, e in engines.items():
            step(e, inputs[i], ("in", i), logs[k])
        i += 1
    assert snapshot_bytes(engines["arrays"]) == snapshot_bytes(engines["python"])
    for n in ("actions", "joined"):
        assert as_bytes(logs["arrays"][n]) == as_bytes(logs["python"][n])
    assert logs["arrays"]["dead_letter"] == logs["python"]["dead_letter"]
