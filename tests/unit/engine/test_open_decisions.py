"""engine/open_decisions.py: the open decisions in arrays hold what the Python engine's pending
dict holds, in its order, and give back its snapshot's ``pending`` list field for field."""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.open_decisions import ARM, OpenDecisions
from streambandit.engine.partition import Context, PartitionEngine, Reward

WINDOWS = {"m": 100, "w": 40}


def config():
    return parse_models_config(
        {
            "models": [
                {"match": "m*", "policy": "oful", "dim": 3, "reward_window_ms": 100, "default_reward": 0.0,
                 "aggregation": "sum"},
                {"match": "w*", "policy": "glb_omd", "dim": 5, "reward_window_ms": 40, "default_reward": 0.5,
                 "aggregation": "last", "epsilon": 0.2},
            ]
        }
    )  # fmt: skip


def same_rows(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            if k == "features":
                assert g[k].dtype == w[k].dtype and g[k].tobytes() == w[k].tobytes()
            else:
                assert type(g[k]) is type(w[k]) and g[k] == w[k], (k, g[k], w[k])


def test_a_python_engines_pending_list_round_trips_field_for_field():
    eng = PartitionEngine(config())
    rng = np.random.default_rng(3)
    for i in range(200):
        key = ("m1", "m2", "w1")[i % 3]
        dim = 5 if key[0] == "w" else 3
        k = int(rng.integers(1, 5))
        arms = tuple(f"arm-{int(a)}" for a in rng.choice(7, size=k, replace=False))
        eng.on_context(Context(f"e{i}", key, i, arms, rng.standard_normal((k, dim))))
        if i % 4 == 1:  # some decisions have rewards so far (sum, last), some none
            eng.on_reward(Reward(f"e{i - 1}", ("m1", "m2", "w1")[(i - 1) % 3], i, float(i)))
    want = eng.snapshot()["pending"]
    assert len(want) > 50 and any(r["reward"] is not None for r in want)
    keys = ["m1", "m2", "w1"]
    opened = OpenDecisions(keys, max_dim=1)  # widened by the first 5-dimensional decision
    seq = opened.add_rows(
        want,
        {k: i for i, k in enumerate(keys)},
        lambda r: r["decision_timestamp_ms"] + WINDOWS[r["model_key"][0]],
    )
    assert seq == len(want) + 1
    same_rows(opened.rows(), want)
    # Each open decision is found by its id; each distinct arm id is held once.
    for r in want:
        e = opened.find(r["event_id"])
        assert e >= 0 and opened.row(e)["event_id"] == r["event_id"]
    assert len(opened.arm_ids) == len({r["arm_id"] for r in want})


@pytest.mark.parametrize("seed", range(3))
def test_opening_and_closing_in_any_order_agree_with_a_dict(seed):
    rng = np.random.default_rng(seed)
    opened, oracle = OpenDecisions(["m"], max_dim=2, capacity=1), {}
    for step in range(3000):
        if oracle and rng.random() < 0.45:
            eid = list(oracle)[int(rng.integers(len(oracle)))]
            opened.close(opened.find(eid))
            del oracle[eid]
        else:
            eid = f"e{step}"
            row = {
                "event_id": eid,
                "model_key": "m",
                "arm_id": f"a{int(rng.integers(5))}",
                "arm_index": int(rng.integers(5)),
                "score": float(rng.standard_normal()),
                "propensity": float(rng.random()),
                "model_version": step,
                "decision_timestamp_ms": step,
                "features": rng.standard_normal(2),
                "trigger_source": 0,
                "trigger_offset": step,
                "reward": None,
                "n_rewards": 0,
            }
            opened.add_rows([row], {"m": 0}, lambda r: r["decision_timestamp_ms"] + 10)
            oracle[eid] = row
        if step % 300 == 0:
            same_rows(opened.rows(), list(oracle.values()))
            live_arms = {r["arm_id"] for r in oracle.values()}
            assert {opened.arm_ids.key(e).decode() for e in opened.arm_ids.in_order()} == live_arms
            for a in opened.arm_ids.in_order():  # each arm's count is the decisions naming it
                named = sum(1 for e in opened.ids.in_order() if opened.ints[e, ARM] == a)
                assert opened.arm_refs[a] == named
    for eid in list(oracle):
        opened.close(opened.find(eid))
    assert len(opened) == 0 and len(opened.arm_ids) == 0
