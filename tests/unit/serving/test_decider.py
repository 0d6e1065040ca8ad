"""The in-process Decider: the engine's rules through a rank/reward API, refusals, persistence."""

import numpy as np
import pytest

from streambandit import Decider, DecisionError
from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import Context, InputRef, Joined, Reward

MODELS = {
    "models": [
        {
            "match": "ads-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 100,
            "default_reward": 0.0,
            "epsilon": 0.2,
        },
        {
            "match": "sum-*",
            "policy": "glb_omd",
            "dim": 3,
            "reward_window_ms": 100,
            "default_reward": 0.0,
            "aggregation": "sum",
            "hyper": {"link": "gaussian"},
        },
    ]
}


def _events(n: int, seed: int = 0):
    """(kind, timestamp, event id, model key, payload) in time order: a context every 10 ms, the
    reward of every other one 5 ms later."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        key = f"ads-{i % 2}" if i % 3 else "sum-0"
        x = rng.standard_normal((4, 3))
        out.append(("context", 10 * i, f"e{i}", key, x))
        if i % 2 == 0:
            out.append(("reward", 10 * i + 5, f"e{i}", key, float(rng.uniform())))
    return out


def test_the_decider_decides_and_learns_as_the_engine_to_the_bit():
    config = parse_models_config(MODELS)
    decider, engine = Decider(MODELS), PartitionEngine(config)
    arms = ("a", "b", "c", "d")
    for offset, (kind, ts, eid, key, payload) in enumerate(_events(300)):
        if kind == "context":
            r = decider.rank(eid, key, arms, payload, timestamp_ms=ts)
            a = next(
                o
                for o in engine.on_context(
                    Context(eid, key, ts, arms, payload), InputRef(0, 0, offset)
                )
                if not isinstance(o, Joined)
            )
            assert (r.arm_id, r.arm_index, r.propensity, r.score, r.model_version) == (
                a.arm_id,
                a.arm_index,
                a.propensity,
                a.score,
                a.model_version,
            )
            assert (
                np.array_equal(r.scores, engine.models[key].scores(payload))
                and r.scores[r.arm_index] == r.score
            )
        else:
            decider.reward(eid, payload, timestamp_ms=ts)
            engine.on_reward(Reward(eid, key, ts, payload), InputRef(1, 0, offset))
    decider.advance(10_000)
    engine.advance_to(10_000)
    assert decider.models.keys() == engine.models.keys()
    for key, model in engine.models.items():
        mine, theirs = decider.models[key].state_dict(), model.state_dict()
        assert all(
            np.array_equal(mine[k], v) if isinstance(v, np.ndarray) else mine[k] == v
            for k, v in theirs.items()
        )


def test_saved_and_loaded_it_continues_exactly(tmp_path):
    events = _events(200, seed=1)
    whole, first = Decider(MODELS), Decider(MODELS)
    arms = ("a", "b", "c", "d")

    def feed(d, evs):
        got = []
        for kind, ts, eid, key, payload in evs:
            if kind == "context":
                got.append(d.rank(eid, key, arms, payload, timestamp_ms=ts)[:6])
            else:
                d.reward(eid, payload, timestamp_ms=ts)
        return got

    want = feed(whole, events)
    got = feed(first, events[:150])
    first.save(tmp_path / "decider.snap")
    second = Decider.load(MODELS, tmp_path / "decider.snap")
    got += feed(second, events[150:])
    assert got == want
    for key, model in whole.models.items():
        assert model.state_dict()["n_updates"] == second.models[key].state_dict()["n_updates"]
        assert np.array_equal(model.state_dict()["theta"], second.models[key].state_dict()["theta"])


def test_windows_close_with_the_default_reward_and_the_records_are_handed_on():
    seen = []
    d = Decider(MODELS, on_record=seen.append)
    d.rank("e1", "ads-1", {"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0]}, timestamp_ms=1_000)
    d.rank("e2", "sum-1", {"a": [1.0, 0.0, 0.0]}, timestamp_ms=1_010)
    d.reward("e2", 0.5, timestamp_ms=1_020)
    d.reward("e2", 0.25, timestamp_ms=1_030)  # aggregation "sum": held until the window closes
    assert seen == []
    closed = d.advance(1_200)
    assert [(j.event_id, j.reward, j.reward_observed) for j in closed] == [
        ("e1", 0.0, False),
        ("e2", 0.75, True),
    ]
    assert seen == closed
    assert d.models["ads-1"].n_updates == 1 and d.models["sum-1"].n_updates == 1


@pytest.mark.parametrize(
    "call, reason",
    [
        (lambda d: d.rank("e9", "ads-1", {"a": [np.nan, 0.0, 0.0]}), "non_finite_features"),
        (lambda d: d.rank("e9", "ads-1", {"a": [1.0, 0.0]}), "bad_dimension"),
        (lambda d: d.rank("e9", "ads-1", {}), "empty_arms"),
        (lambda d: d.rank("e9", "ads-1", ["a", "b"], np.zeros((3, 3))), "bad_dimension"),
        (lambda d: d.rank("e9", "ads-1", {"a": [1e300, 0.0, 0.0]}), "feature_out_of_range"),
        (lambda d: d.rank("e9", "nobody", {"a": [1.0, 0.0, 0.0]}), "unknown_model"),
        (lambda d: d.rank("e1", "ads-1", {"a": [1.0, 0.0, 0.0]}), "duplicate_event"),
        (lambda d: d.rank("", "ads-1", {"a": [1.0, 0.0, 0.0]}), "malformed"),
        (lambda d: d.rank("x" * 5000, "ads-1", {"a": [1.0, 0.0, 0.0]}), "id_too_long"),
        (lambda d: d.reward("never", 1.0), "unknown_event"),
        (lambda d: d.reward("e1", float("nan")), "non_finite_reward"),
        (lambda d: d.reward("e1", "lots"), "non_finite_reward"),
        (lambda d: d.reward("e1", 1.0, model_key="ads-2"), "model_key_mismatch"),
        (lambda d: d.rank("e9", "ads-1", {"a": [1.0, 0.0, 0.0]}, timestamp_ms=-5), "bad_timestamp"),
        # Far ahead of the clock (1,050 ms here): it would close every window at once, for good.
        (
            lambda d: d.rank("e9", "ads-1", {"a": [1.0, 0.0, 0.0]}, timestamp_ms=10**13),
            "event_time_ahead",
        ),
        (lambda d: d.reward("e1", 1.0, timestamp_ms=10**13), "event_time_ahead"),
    ],
)
def test_a_bad_call_is_refused_with_its_reason_and_decides_or_learns_nothing(
    call, reason, tmp_path
):
    d = Decider(MODELS, clock=lambda: 1_050)
    d.rank("e1", "ads-1", {"a": [1.0, 0.0, 0.0], "b": [0.0, 1.0, 0.0]}, timestamp_ms=1_000)
    d.save(tmp_path / "before")
    with pytest.raises(DecisionError) as err:
        call(d)
    assert err.value.reason == reason
    d.save(tmp_path / "after")
    before, after = (
        Decider.load(MODELS, tmp_path / "before"),
        Decider.load(MODELS, tmp_path / "after"),
    )

    def pending(x):
        return [
            (p["event_id"], p["reward"], p["n_rewards"]) for p in x.engine.snapshot()["pending"]
        ]

    # Nothing decided or learned; the call's time may move event time, as the record would in a worker.
    assert (
        pending(before) == pending(after)
        and before.engine.models.keys() == after.engine.models.keys()
    )
    assert all(m.n_updates == 0 for m in after.engine.models.values())
    # The Decider serves on: the open decision takes its reward.
    d.reward("e1", 1.0, timestamp_ms=1_060)
    assert d.models["ads-1"].n_updates == 1


def test_a_late_reward_is_refused_as_late_and_a_second_one_as_a_duplicate():
    d = Decider(MODELS)
    d.rank("e1", "ads-1", {"a": [1.0, 0.0, 0.0]}, timestamp_ms=1_000)
    d.advance(2_000)  # the window closed with the default reward
    with pytest.raises(DecisionError) as err:
        d.reward("e1", 1.0, timestamp_ms=2_001)
    assert err.value.reason == "late_reward"
    d.rank("e2", "ads-1", {"a": [1.0, 0.0, 0.0]}, timestamp_ms=2_010)
    d.reward("e2", 1.0, timestamp_ms=2_020)  # aggregation "first": joined with it
    with pytest.raises(DecisionError) as err:
        d.reward("e2", 1.0, timestamp_ms=2_030)
    assert err.value.reason == "duplicate_reward"


def test_past_max_models_a_new_key_is_refused_and_known_keys_are_served():
    d = Decider(
        {
            "models": [
                {
                    "match": "m-*",
                    "policy": "oful",
                    "dim": 2,
                    "reward_window_ms": 100,
                    "default_reward": 0.0,
                }
            ]
        },
        max_models=2,
    )
    d.rank("e1", "m-1", {"a": [1.0, 0.0]}, timestamp_ms=1)
    d.rank("e2", "m-2", {"a": [1.0, 0.0]}, timestamp_ms=2)
    with pytest.raises(DecisionError) as err:
        d.rank("e3", "m-3", {"a": [1.0, 0.0]}, timestamp_ms=3)
    assert err.value.reason == "too_many_models" and set(d.models) == {"m-1", "m-2"}
    d.rank("e4", "m-1", {"a": [1.0, 0.0]}, timestamp_ms=4)
