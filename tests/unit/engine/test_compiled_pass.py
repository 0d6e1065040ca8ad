"""engine/compiled_pass.py, through ArrayPartitionEngine.process: runs of records give the Python
engine's outputs, byte for byte and record for record, and its snapshot bytes, whichever records
the pass hands back to the Python rules and wherever a run starts and ends."""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import Context, InputRef, Reward
from streambandit.wire import Tick as WireTick

from .test_array_partition import as_bytes, hostile_inputs, snapshot_bytes
from .test_engine_recovery import LIMITS, Tick


def config(explore: float):
    """test_engine_recovery's models, deciding without exploration (the compiled pass's case)
    but for ``explore`` on the last-* models."""
    common = {"dim": 6, "default_reward": 0.0}
    return parse_models_config(
        {
            "models": [
                {"match": "sum-*", "policy": "glb_omd", "reward_window_ms": 400,
                 "aggregation": "sum", "hyper": {"link": "poisson", "S": 3.0, "beta_scale": 0.1},
                 **common},
                {"match": "first-*", "policy": "oful", "reward_window_ms": 300,
                 "aggregation": "first", **common},
                {"match": "last-*", "policy": "hvt_ucb", "reward_window_ms": 500,
                 "aggregation": "last", "epsilon": explore, **common, "default_reward": 0.5},
            ]
        }
    )  # fmt: skip


def records(seed: int, n: int = 500) -> list:
    """hostile_inputs as (record, source) pairs: each with its own InputRef, ticks as records."""
    out = []
    for i, (ev, record_ms) in enumerate(hostile_inputs(seed, n)):
        if isinstance(ev, Tick):
            ev = WireTick(ev.timestamp_ms, "")
        source = InputRef(int(isinstance(ev, (Reward, WireTick))), 0, i, b"k", b"v", record_ms or 0)
        out.append((ev, source))
    return out


def python_outputs(engine, ev, source):
    if type(ev).__name__ == "Context":
        return engine.on_context(ev, source)
    if isinstance(ev, Reward):
        return engine.on_reward(ev, source)
    return engine.on_tick(ev, source)


@pytest.mark.parametrize("seed,explore,max_pending", [(0, 0.0, 30), (1, 0.0, 5), (2, 0.2, 30),
                                                      (3, 0.0, 100_000)])  # fmt: skip
def test_runs_of_records_give_the_python_engines_outputs_and_snapshot(seed, explore, max_pending):
    cfg = config(explore)
    limits = {**LIMITS, "max_pending": max_pending, "max_id_bytes": 64, "max_models": 8,
              "max_event_time_ahead_ms": 60_000}  # fmt: skip
    python, arrays = PartitionEngine(cfg, **limits), ArrayPartitionEngine(cfg, **limits)
    stream = records(seed)
    rng = np.random.default_rng(seed)
    at, compiled = 0, 0
    while at < len(stream):
        run = stream[at : at + int(rng.integers(1, 120))]
        want = [as_bytes(python_outputs(python, ev, src)) for ev, src in run]
        got, ends = arrays.process(run)
        starts = [0, *ends[:-1]]
        assert [as_bytes(got[s:e]) for s, e in zip(starts, ends)] == want, at
        assert snapshot_bytes(arrays) == snapshot_bytes(python), at
        changed = python.take_changed()
        assert arrays.take_changed() == changed
        assert snapshot_bytes(arrays, changed) == snapshot_bytes(python, changed), at
        compiled += arrays.counters["actions"]
        at += len(run)
        if rng.random() < 0.1:  # both restored from the Python engine's snapshot
            snap = python.snapshot()
            python = PartitionEngine.restore(cfg, snap, **limits)
            arrays = ArrayPartitionEngine.restore(cfg, snap, **limits)
    assert compiled > 0


def clean_records(n: int = 2000) -> list:
    """Contexts of five models, each with at most one reward inside its window: what the pass
    is for."""
    rng = np.random.default_rng(11)
    keys = ["sum-a", "first-a", "last-a", "sum-b", "first-b"]
    events = []
    for i in range(n):
        ts, key = 10 * i, keys[i % 5]
        arms = rng.standard_normal((4, 6)) / 3
        events.append((ts, 0, Context(f"e{i}", key, ts, ("a", "b", "c", "d"), arms)))
        if rng.random() < 0.7:
            delay = int(rng.integers(1, 250))
            events.append((ts + delay, 1, Reward(f"e{i}", key, ts + delay, float(rng.integers(2)))))
    events.sort(key=lambda e: (e[0], e[1]))
    return [(ev, InputRef(src, 0, i, b"k", b"v", 0)) for i, (_, src, ev) in enumerate(events)]


@pytest.mark.parametrize("explore", [0.0, 0.3])
def test_on_a_clean_stream_the_rules_in_python_see_only_each_models_first_record(
    monkeypatch, explore
):
    """The pass decides every context of a model it has, with the exploration draw when the
    model explores (the last-* models at ``explore``)."""
    seen = []
    real = ArrayPartitionEngine._one

    def counted(self, ev, source):
        seen.append(ev)
        return real(self, ev, source)

    monkeypatch.setattr(ArrayPartitionEngine, "_one", counted)
    engine, python = ArrayPartitionEngine(config(explore)), PartitionEngine(config(explore))
    stream = clean_records()
    got, _ = engine.process(stream)
    want = [o for ev, src in stream for o in python_outputs(python, ev, src)]
    assert as_bytes(got) == as_bytes(want)
    assert [ev.event_id for ev in seen] == [f"e{i}" for i in range(5)]  # each makes its model
    assert engine.counters["joined_observed"] > 1000
    propensities = {a.propensity for a in got if type(a).__name__ == "Action"}
    if explore:  # greedy (1 - 0.3 + 0.3 / 4) and explored off the greedy arm (0.3 / 4)
        assert {0.3 / 4, 1 - 0.3 + 0.3 / 4} < propensities
    else:
        assert propensities == {1.0}
