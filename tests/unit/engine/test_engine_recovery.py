"""Crash and exact recovery of the partition engine, without a broker: the logs are lists.

A run processes a stream of inputs (contexts, rewards - early, late, duplicate, out of range -
and watermark ticks) and appends what it emits to three logs (actions, joined, dead-letter). A
crashed run loses its in-memory engine; recovery loads the last snapshot and the logs written
after it. The recovered run must end with the same models (to the bit) and the same logs as a
run that was never interrupted.
"""

import dataclasses

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.partition import Action, Context, Joined, PartitionEngine, Rejected, Reward
from streambandit.sim.ads import AdTraffic

CONFIG = parse_models_config(
    {
        "models": [
            {
                "match": "sum-*",
                "policy": "glb_omd",
                "dim": 6,
                "reward_window_ms": 400,
                "default_reward": 0.0,
                "aggregation": "sum",
                "epsilon": 0.1,
                "hyper": {"link": "poisson", "S": 3.0, "beta_scale": 0.1},
            },
            {
                "match": "first-*",
                "policy": "oful",
                "dim": 6,
                "reward_window_ms": 300,
                "default_reward": 0.0,
                "aggregation": "first",
                "epsilon": 0.0,
            },
            {
                "match": "last-*",
                "policy": "hvt_ucb",
                "dim": 6,
                "reward_window_ms": 500,
                "default_reward": 0.5,
                "aggregation": "last",
                "epsilon": 0.2,
            },
        ]
    }
)
LIMITS = {"max_pending": 30, "max_early_rewards": 2, "max_recent": 400}


@dataclasses.dataclass(frozen=True)
class Tick:
    timestamp_ms: int


def make_inputs(seed, n_contexts=700):
    """A messy, timestamped input stream in processing order; the source of input i is ('in', i)."""
    rng = np.random.default_rng(seed)
    traffic = AdTraffic(dim=6, k=4, seed=seed)
    keys = ["sum-a", "first-a", "last-a", "sum-b", "first-b"]
    events = []  # (timestamp, tie, event)
    for i in range(n_contexts):
        ts = 10 * i
        req = traffic.request(rng)
        key = keys[int(rng.integers(len(keys)))]
        eid = f"e{i}"
        # Some contexts reach the worker late (a forced merge release, a slow producer): they are
        # processed after records with later timestamps, so the watermark is ahead of them.
        arrival = ts + (int(rng.integers(100, 900)) if rng.random() < 0.05 else 0)
        events.append((arrival, 0, Context(eid, key, ts, req.ad_ids, req.features)))
        if rng.random() < 0.03:
            events.append(
                (ts + 1, 0, Context(eid, key, ts + 1, req.ad_ids, req.features))
            )  # duplicate
        for _ in range(int(rng.integers(0, 3))):
            delay = int(rng.integers(-30, 700))  # negative: early; beyond the window: late
            value = (
                float(rng.integers(0, 3)) if rng.random() > 0.05 else -1.0
            )  # out of range for Poisson
            events.append((ts + delay, 1, Reward(eid, key, ts + delay, value)))
        if rng.random() < 0.05:
            events.append((ts + 5, 1, Reward(f"ghost{i}", key, ts + 5, 1.0)))  # context never comes
        if rng.random() < 0.02:
            events.append((ts + 2000, 2, Tick(ts + 2000)))  # an idle partition's watermark tick
    events.sort(key=lambda e: (e[0], e[1]))  # the processing order
    return [e for _, _, e in events]


def step(engine, event, source, logs):
    if isinstance(event, Context):
        out = engine.on_context(event, source)
    elif isinstance(event, Reward):
        out = engine.on_reward(event, source)
    else:
        out = engine.advance_to(event.timestamp_ms)
    for o in out:
        if isinstance(o, Action):
            logs["actions"].append(o)
        elif isinstance(o, Joined):
            logs["joined"].append(o)
        else:
            assert isinstance(o, Rejected)
            source = ("action", o.source.event_id) if isinstance(o.source, Action) else o.source
            logs["dead_letter"].append((o.reason, source))


def new_logs():
    return {"actions": [], "joined": [], "dead_letter": []}


def run_uninterrupted(inputs):
    engine, logs = PartitionEngine(CONFIG, **LIMITS), new_logs()
    for i, ev in enumerate(inputs):
        step(engine, ev, ("in", i), logs)
    return engine, logs


def recover(snap, logs, inputs, committed, engine_class=PartitionEngine):
    """Load the snapshot and bring it to the committed input position from the logs."""
    state, pos = snap
    engine = engine_class.restore(CONFIG, state, **LIMITS)
    after = slice(pos["input"], committed)
    rewards = [
        (ev, ("in", i))
        for i, ev in enumerate(inputs)
        if after.start <= i < after.stop and isinstance(ev, Reward)
    ]
    dead = logs["dead_letter"][pos["dead_letter"] :]
    timestamps = [ev.timestamp_ms for ev in inputs[after]]
    engine.recover_from_logs(
        joined=logs["joined"][pos["joined"] :],
        actions=logs["actions"][pos["actions"] :],
        rewards=rewards,
        dead_lettered={src for _, src in dead},
        closed_event_ids={src[1] for reason, src in dead if reason == "update_failed"},
        max_input_timestamp_ms=max(timestamps, default=-(2**63)),
    )
    return engine


def assert_same_models(a, b):
    assert a.models.keys() == b.models.keys()
    for key in a.models:
        sa, sb = a.models[key].state_dict(), b.models[key].state_dict()
        for k in sa:
            if isinstance(sa[k], np.ndarray):
                assert sa[k].tobytes() == sb[k].tobytes(), (key, k)
            else:
                assert sa[k] == sb[k], (key, k)


def assert_same_logs(a, b):
    assert len(a["actions"]) == len(b["actions"]) and len(a["joined"]) == len(b["joined"])
    for x, y in zip(a["actions"] + a["joined"], b["actions"] + b["joined"]):
        dx, dy = dataclasses.asdict(x), dataclasses.asdict(y)
        assert dx.keys() == dy.keys()
        for k in dx:
            assert (
                (dx[k].tobytes() == dy[k].tobytes())
                if isinstance(dx[k], np.ndarray)
                else dx[k] == dy[k]
            ), k
    assert a["dead_letter"] == b["dead_letter"]


@pytest.mark.parametrize("seed", range(6))
def test_killed_at_random_moments_and_recovered_equals_uninterrupted(seed):
    inputs = make_inputs(seed)
    reference, ref_logs = run_uninterrupted(inputs)
    # The stream exercises every path the recovery must rebuild.
    reasons = {r for r, _ in ref_logs["dead_letter"]}
    assert {"duplicate_event", "late_reward", "unknown_event", "reward_out_of_range"} <= reasons
    assert any(not j.reward_observed for j in ref_logs["joined"]) and any(
        j.reward_observed for j in ref_logs["joined"]
    )
    assert reference.counters["evicted_pending"] > 0 and reference.counters["evicted_early"] > 0

    rng = np.random.default_rng(100 + seed)
    engine, logs = PartitionEngine(CONFIG, **LIMITS), new_logs()
    snap = (engine.snapshot(), {"input": 0, "actions": 0, "joined": 0, "dead_letter": 0})
    i = 0
    crashes = sorted(rng.choice(np.arange(1, len(inputs)), size=4, replace=False))
    for crash_at in crashes:
        while i < crash_at:
            step(engine, inputs[i], ("in", i), logs)
            i += 1
            if rng.random() < 0.01:  # a periodic snapshot at a record boundary
                snap = (engine.snapshot(), {"input": i, **{k: len(v) for k, v in logs.items()}})
        # Crash: the engine's memory is gone; logs and the last snapshot survive.
        engine = recover(snap, logs, inputs, committed=i)
    while i < len(inputs):
        step(engine, inputs[i], ("in", i), logs)
        i += 1

    assert_same_models(engine, reference)
    assert_same_logs(logs, ref_logs)
    assert engine.pending.keys() == reference.pending.keys()
    assert engine.watermark_ms == reference.watermark_ms


def test_recovery_refuses_logs_that_do_not_fit_the_snapshot():
    inputs = make_inputs(0, n_contexts=200)
    engine, logs = run_uninterrupted(inputs)
    fresh = PartitionEngine.restore(CONFIG, PartitionEngine(CONFIG, **LIMITS).snapshot(), **LIMITS)
    with pytest.raises(Exception, match="version"):
        fresh.recover_from_logs(
            joined=logs["joined"][5:],
            actions=[],
            rewards=[],
            dead_lettered=set(),
            closed_event_ids=set(),
            max_input_timestamp_ms=0,
        )


def test_the_watermark_is_recovered_from_the_inputs_not_only_from_the_joins():
    """A tick moves the watermark to 1000 but closes only a window ending at 100 (the joined log
    says 100). A late context (t = 50) after the crash must be joined at once, as it is live."""
    inputs = [
        Context("e0", "first-a", 0, ("a",), np.full((1, 6), 0.1)),
        Tick(1000),
        Context("e1", "first-a", 50, ("a",), np.full((1, 6), 0.2)),
    ]
    reference, ref_logs = run_uninterrupted(inputs)
    engine, logs = PartitionEngine(CONFIG, **LIMITS), new_logs()
    snap = (engine.snapshot(), {"input": 0, "actions": 0, "joined": 0, "dead_letter": 0})
    for i in range(2):
        step(engine, inputs[i], ("in", i), logs)
    engine = recover(snap, logs, inputs, committed=2)
    assert engine.watermark_ms == 1000
    step(engine, inputs[2], ("in", 2), logs)
    assert [j.event_id for j in logs["joined"]] == ["e0", "e1"]
    assert_same_logs(logs, ref_logs)
    assert_same_models(engine, reference)


def test_a_restored_engine_counts_from_zero():
    """Counters are what an engine did since it was built or restored, as a process's metrics are:
    restored from a snapshot they would count twice the decisions recovery then re-applies."""
    e = PartitionEngine(CONFIG, **LIMITS)
    for event in make_inputs(seed=3, n_contexts=50):
        if isinstance(event, Context):
            e.on_context(event, None)
    assert e.counters["actions"] > 0
    restored = PartitionEngine.restore(CONFIG, e.snapshot(), **LIMITS)
    assert not restored.counters
    assert restored.models.keys() == e.models.keys() and restored.pending.keys() == e.pending.keys()
