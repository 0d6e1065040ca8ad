"""The dbs-linucb and bkb experiments (streambandit/sim/experiments/{dbs_linucb,bkb}.py): smoke runs
at size "tiny" and the digits bandit's construction."""

import math
import time

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.sim.experiments import bkb, dbs_linucb


@pytest.mark.parametrize("module", [dbs_linucb, bkb], ids=["dbs-linucb", "bkb"])
def test_tiny_run_is_fast_and_its_curves_are_finite_and_complete(module):
    done = []
    start = time.perf_counter()
    result = module.run(size="tiny", seeds=None, progress=done.append)
    assert time.perf_counter() - start < 10.0
    assert result.name == module.NAME
    assert sum(done) == module.total_rounds(size="tiny", seeds=None)
    assert result.curves and result.summary and result.choices
    lengths = {}
    for c in result.curves:
        T = len(c.regret)
        lengths.setdefault(c.setting, set()).add(T)
        assert c.regret.shape == c.seconds.shape == (T,)
        assert np.isfinite(c.regret).all() and np.isfinite(c.seconds).all()
        assert (np.diff(c.regret) >= -1e-12).all() and (np.diff(c.seconds) >= 0).all()
        for v in c.extra.values():
            assert v.shape == (T,) and np.isfinite(v).all()
    assert all(len(v) == 1 for v in lengths.values())
    # every learner on every setting and seed
    settings = {c.setting for c in result.curves}
    learners = {c.learner for c in result.curves}
    seeds = {c.seed for c in result.curves}
    assert len(result.curves) == len(settings) * len(learners) * len(seeds)


def test_dbs_experiment_covers_both_settings_and_reports_memory():
    result = dbs_linucb.run(size="tiny", seeds=1, progress=lambda n: None)
    assert {c.setting for c in result.curves} == {"heavy-tail d=40", "digits"}
    learners = {c.learner for c in result.curves}
    assert "oful" in learners and any(x.startswith("dbs_linucb") for x in learners)
    assert any(x.startswith("soful") for x in learners) and any(
        x.startswith("cbscfd") for x in learners
    )
    for c in result.curves:
        assert (c.extra["memory_bytes"] > 0).all()
    oful = next(c for c in result.curves if c.learner == "oful")
    assert oful.extra["memory_bytes"][-1] >= 40 * 40 * 8  # the d x d inverse


def test_bkb_experiment_reports_the_dictionary_size():
    result = bkb.run(size="tiny", seeds=1, progress=lambda n: None)
    c = next(c for c in result.curves if c.learner == "bkb")
    d = c.extra["dictionary_size"]
    assert d[0] >= 1 and (d <= np.arange(1, len(d) + 1)).all()


@pytest.fixture(scope="module")
def digits():
    return dbs_linucb.load_digits_data()


@pytest.mark.parametrize("target", [0, 3, 9])
def test_digits_reward_is_one_exactly_for_the_target_label(digits, target):
    images, labels = digits
    assert images.shape == (1797, 64) and np.allclose(np.linalg.norm(images, axis=1), 1.0)
    env = dbs_linucb.DigitsEnvironment(images, labels, target)
    rng, rrng = np.random.default_rng(1), np.random.default_rng(2)
    for _ in range(50):
        arms = env.context(rng)
        assert arms.shape == (10, 64)
        assert sorted(env.last_labels) == list(range(10))  # one image per label
        means = env.means(arms)
        assert means.sum() == 1.0 and means[env.last_labels == target] == 1.0
        for k in range(10):
            assert (
                env.reward(rrng, arms[k])
                == (1.0 if env.last_labels[k] == target else 0.0)
                == means[k]
            )


def test_digits_arm_position_is_shuffled(digits):
    env = dbs_linucb.DigitsEnvironment(*digits, target=0)
    rng = np.random.default_rng(0)
    positions = {
        int(np.flatnonzero(env.last_labels == 0)[0])
        for _ in range(40)
        if env.context(rng) is not None
    }
    assert len(positions) > 3


class _Oracle:
    """Knows the labels: picks the arm whose image has the target label."""

    def __init__(self, env):
        self.env = env

    def select(self, arms):
        return int(np.flatnonzero(self.env.last_labels == self.env.target)[0])

    def update(self, x, reward):
        assert reward == 1.0

    def state_nbytes(self):
        return 1


def test_an_oracle_that_knows_the_labels_has_zero_regret_and_a_fixed_pick_does_not(digits):
    env = dbs_linucb.DigitsEnvironment(*digits, target=4)
    c = dbs_linucb.play(_Oracle(env), env, 200, seed=0)
    assert c.regret[-1] == 0.0

    class First(_Oracle):
        def select(self, arms):
            return 0

        def update(self, x, reward):
            pass

    c = dbs_linucb.play(First(env), env, 500, seed=0)
    assert 500 * 0.9 * 0.8 < c.regret[-1] < 500 * 0.9 * 1.2  # wrong 9 times out of 10


def test_oful_learns_the_digits_target(digits):
    env = dbs_linucb.DigitsEnvironment(*digits, target=0)
    c = dbs_linucb.play(make_policy("oful", dim=64, beta=0.1), env, 600, seed=3)
    late = c.regret[-1] - c.regret[299]
    assert late < 0.2 * 300  # far fewer mistakes than the 90% of a random pick


def test_slope_of_linear_and_sqrt_curves():
    t = np.arange(1, 1001, dtype=float)
    assert math.isclose(dbs_linucb.slope(3 * t), 1.0, rel_tol=1e-2)
    assert math.isclose(dbs_linucb.slope(np.sqrt(t)), 0.5, rel_tol=1e-2)
