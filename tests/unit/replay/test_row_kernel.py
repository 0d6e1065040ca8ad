"""The replay's row kernel (replay/row_kernel.py) gives the same bits as the per-call path it
replaces: the same estimates, intervals, running estimates, choices and learnt states, for each
linear UCB learner, with and without exploration, one or several targets, lagged logs, frozen
targets and per-key estimates; and it refuses bad features with the same error."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from streambandit.replay import runner
from streambandit.replay.logged import LogError
from streambandit.replay.runner import Target, replay_targets
from tests.unit.replay.test_replay_runner import D, K, models_config, worker_log


class _NotALearner:
    """Stands in for LinearUCBPolicy so that no model takes the row kernel."""


def _both_paths(monkeypatch, log, targets, **options):
    calls = {"n": 0}
    real = runner.row_kernel.decide_and_sum_targets

    def counted(*args):
        calls["n"] += len(args[1])  # a row of each of its targets
        return real(*args)

    monkeypatch.setattr(runner.row_kernel, "decide_and_sum_targets", counted)
    fused = replay_targets(log, targets, **options)
    kernel_rows, calls["n"] = calls["n"], 0
    with monkeypatch.context() as m:
        m.setattr(runner, "LinearUCBPolicy", _NotALearner)
        plain = replay_targets(log, targets, **options)
    assert calls["n"] == 0  # the reference took the per-call path throughout
    return fused, plain, kernel_rows


def _assert_same(a, b):
    for name in a:
        ra, rb = a[name], b[name]
        for f in dataclasses.fields(ra):
            if f.name == "seconds":
                continue
            va, vb = getattr(ra, f.name), getattr(rb, f.name)
            if f.name == "models":
                assert va.keys() == vb.keys()
                for key in va:
                    for k, x in va[key].items():
                        assert np.array_equal(x, vb[key][k]), (name, key, k)
            else:
                assert repr(va) == repr(vb), (name, f.name)  # floats to the bit, nan == nan


@pytest.mark.parametrize(
    "policy,hyper",
    [
        ("oful", {}),
        ("oful", {"beta": 0.3}),
        ("glb_omd", {"link": "gaussian", "dispersion": 0.01}),
        ("hvt_ucb", {}),
    ],
)
@pytest.mark.parametrize("epsilon", [0.0, 0.2])
def test_the_row_kernel_gives_the_per_call_paths_bits(monkeypatch, policy, hyper, epsilon):
    config = models_config(policy=policy, epsilon=epsilon, **hyper)
    log, _, _ = worker_log(config, 400, keys=("m-a", "m-b", "m-c"), max_delay=3)
    # Undated rows (decision version -1) take the fast path; the rest of the log keeps its
    # versions, so held-back decisions interleave with fast ones.
    log = [dataclasses.replace(d, decision_version=-1) if i % 3 else d for i, d in enumerate(log)]
    fused, plain, kernel_rows = _both_paths(monkeypatch, log, [Target("t", config)], clip=50.0)
    _assert_same(fused, plain)
    assert fused["t"].matched > 0 and kernel_rows > 0


def test_several_targets_frozen_and_learning_share_the_reward_model_alike(monkeypatch):
    config = models_config(epsilon=0.1)
    log, _, states = worker_log(config, 300)
    log = [dataclasses.replace(d, decision_version=-1) for d in log]
    targets = [
        Target("learning", config),
        Target("frozen", config, learn=False, states=states),
        Target("other", models_config(epsilon=0.0, lam=3.0)),
    ]
    fused, plain, kernel_rows = _both_paths(monkeypatch, log, targets, bootstrap=20)
    _assert_same(fused, plain)
    assert kernel_rows == len(targets) * len(log)  # every row of every target


def test_bad_features_are_refused_alike(monkeypatch):
    config = models_config()
    log, _, _ = worker_log(config, 20)
    bad = log[7].features.copy()
    bad[1, 2] = np.inf
    log = [dataclasses.replace(d, decision_version=-1) for d in log]
    log[7] = dataclasses.replace(log[7], features=bad)
    errors = []
    for patch in (False, True):
        with monkeypatch.context() as m:
            if patch:
                m.setattr(runner, "LinearUCBPolicy", _NotALearner)
            with pytest.raises(LogError) as err:
                replay_targets(log, [Target("t", config)])
            errors.append(str(err.value))
    assert errors[0] == errors[1] and "features" in errors[0]


def test_keys_past_the_per_key_bound_are_counted_alike(monkeypatch):
    monkeypatch.setattr(runner, "MAX_KEY_ESTIMATES", 1)
    config = models_config(epsilon=0.1)
    log, _, _ = worker_log(config, 200, keys=("m-a", "m-b", "m-c"))
    log = [dataclasses.replace(d, decision_version=-1) for d in log]
    fused, plain, kernel_rows = _both_paths(monkeypatch, log, [Target("t", config)])
    _assert_same(fused, plain)
    assert kernel_rows == len(log) and fused["t"].keys_without_estimates > 100


def _several_targets():
    """A linear UCB target of each learner (two sharing the exploration seed, one frozen from
    saved states), and an external target from a column of the log."""
    oful = models_config(epsilon=0.1, seed=3)
    log, _, states = worker_log(oful, 400, keys=("m-a", "m-b", "m-c"), max_delay=4)
    targets = [
        Target("oful", oful),
        Target("glb_omd", models_config("glb_omd", epsilon=0.2, seed=5, link="gaussian")),
        Target("hvt_ucb", models_config("hvt_ucb", epsilon=0.0), learn=False),
        Target("frozen", oful, learn=False, states=states),
        Target("same_seed", models_config(epsilon=0.3, seed=3, lam=3.0)),
        Target("ext"),
    ]
    return log, targets


def _together_and_alone(monkeypatch, log, targets, **options):
    """Each target's result of one pass over ``log`` with all of ``targets`` against its result
    alone, and all of them against the per-call path's; returns the most targets one compiled
    call took."""
    widest = {"n": 0}
    real = runner.row_kernel.decide_and_sum_targets

    def counted(*args):
        widest["n"] = max(widest["n"], len(args[1]))
        return real(*args)

    monkeypatch.setattr(runner.row_kernel, "decide_and_sum_targets", counted)
    counts: dict[str, int] = {}
    together = replay_targets(iter(log), targets, counts=counts, **options)
    for t in targets:
        alone = replay_targets(iter(log), [t], counts={}, **options)
        _assert_same({t.name: together[t.name]}, alone)
    with monkeypatch.context() as m:
        m.setattr(runner, "LinearUCBPolicy", _NotALearner)
        _assert_same(together, replay_targets(iter(log), targets, counts={}, **options))
    return widest["n"], together, counts


@pytest.mark.parametrize("dated", [False, True])
@pytest.mark.parametrize("bootstrap", [0, 30])
def test_several_targets_in_one_pass_get_each_alone_result_to_the_bit(
    monkeypatch, dated, bootstrap
):
    """Every field of every target's result (estimates, intervals, running estimates, decisions,
    learnt states, per-key estimates) as in a replay of that target alone: undated rows take the
    compiled call of all linear UCB targets, dated ones (held back up to max_lag) and rows sharing
    a read-only arm array the per-call path, interleaved; one key is past the per-key bound."""
    monkeypatch.setattr(runner, "MAX_KEY_ESTIMATES", 2)
    log, targets = _several_targets()
    rng = np.random.default_rng(1)
    rows = []
    for i, d in enumerate(log):
        probs = rng.dirichlet(np.ones(len(d.arm_ids)))
        d = dataclasses.replace(d, external=(("ext", probs),))
        if not dated or i % 3:
            d = dataclasses.replace(d, decision_version=-1)
        if i % 7 == 0:
            shared = d.features.copy()
            shared.flags.writeable = False
            d = dataclasses.replace(d, features=shared)
        rows.append(d)
    widest, together, _ = _together_and_alone(
        monkeypatch, rows, targets, bootstrap=bootstrap, max_lag=2, clip=20.0
    )
    assert widest == 5  # every configured target in one call
    assert together["oful"].matched > 20 and together["glb_omd"].matched > 20
    assert together["oful"].keys_without_estimates > 50
    assert (together["oful"].off_version > 0) == dated


def test_several_targets_skip_the_same_bad_rows_as_each_alone(monkeypatch):
    """Rows every target refuses (an unknown key, another dimension, a reward outside the range,
    an event id seen before), some of them keys' first rows, some later ones: skipped with the
    same counts, the other rows' results to the bit."""
    log, targets = _several_targets()
    log = [dataclasses.replace(d, decision_version=-1) for d in log]
    configured = [t for t in targets if t.models is not None]
    bad = [
        dataclasses.replace(log[0], event_id="unknown", model_key="x-a"),
        dataclasses.replace(log[1], event_id="wide", features=np.ones((K, D + 1))),
        dataclasses.replace(log[2], event_id="far", reward=1e6),
        log[3],  # a duplicate of an earlier row's id
        dataclasses.replace(
            log[4], event_id="new-key-wide", model_key="m-z", features=np.ones((K, 1))
        ),
    ]
    rows = log[:3] + [bad[0]] + log[3:60] + bad[1:] + log[60:]
    widest, together, counts = _together_and_alone(
        monkeypatch, rows, configured, skip_bad=True, reward_range=(-1e3, 1e3)
    )
    assert widest == len(configured)
    assert counts == {
        "skipped": 5,
        "skipped_model_key": 1,
        "skipped_features": 2,
        "skipped_reward": 1,
        "skipped_duplicate": 1,
    }
    assert together["oful"].events == len(log)
