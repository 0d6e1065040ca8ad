"""Hostile numbers: features and rewards drawn from the whole finite float range. A learner either
refuses an input with a ValueError, leaving its state exactly as it was, or takes it and stays
finite: its state and every later score. Nothing a client can send makes a model non-finite."""

import math

import numpy as np
import pytest

from streambandit import POLICIES, make_policy
from streambandit.numerics.kernels import MAX_ABS_FEATURE, MAX_ABS_REWARD

DIM = 4
CASES = [
    pytest.param(name, params, id=f"{name}-{i}")
    for name, cls in sorted(POLICIES.items())
    for i, params in enumerate(cls._test_params())
]
CASES += [
    pytest.param("glb_omd", {"link": link, "S": 3.0}, id=f"glb_omd-{link}")
    for link in ("poisson", "gaussian")
]


def any_float(rng, shape=()):
    """Finite floats of every magnitude, 1e-300 to 1e300 and the extremes, either sign, and zeros."""
    mag = 10.0 ** rng.uniform(-300, 300, shape)
    x = np.where(rng.random(shape) < 0.5, -mag, mag)
    pick = rng.random(shape)
    x = np.where(pick < 0.05, 0.0, x)
    x = np.where((pick >= 0.05) & (pick < 0.08), np.finfo(np.float64).max, x)
    return np.where((pick >= 0.08) & (pick < 0.1), 5e-324, x)


def finite_state(p) -> bool:
    """Every learned number is finite (the configuration may hold an inf on purpose: bkb's qbar)."""
    for k, v in p.state_dict().items():
        if k.startswith("config."):
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind == "f" and not np.isfinite(v).all():
            return False
        if isinstance(v, float) and not math.isfinite(v):
            return False
    return True


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k].tobytes() == b[k].tobytes() if isinstance(a[k], np.ndarray) else a[k] == b[k]
        for k in a
    )


@pytest.mark.parametrize("name, params", CASES)
def test_no_finite_input_makes_a_learner_non_finite(name, params):
    p = make_policy(name, dim=DIM, **params)
    rng = np.random.default_rng(7)
    taken = refused = 0
    for step in range(150):
        hostile = step % 3 == 0
        arms = any_float(rng, (5, DIM)) if hostile else rng.standard_normal((5, DIM)) / 4
        reward = float(any_float(rng)) if step % 2 == 0 else float(rng.random())
        before = p.state_dict()
        try:
            i = p.select(arms)
            scores = p.scores(arms)
        except ValueError:
            assert same_state(p.state_dict(), before)
            refused += 1
            continue
        assert np.isfinite(scores).all(), (step, scores)
        try:
            p.update(arms[i], reward)
        except ValueError:
            assert same_state(p.state_dict(), before), step
            refused += 1
            continue
        taken += 1
        assert finite_state(p), (step, arms[i], reward)
    assert taken > 20 and refused > 20
    calm = rng.standard_normal((5, DIM)) / 4
    assert np.isfinite(p.scores(calm)).all()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_bounds_are_inclusive_and_the_first_value_beyond_is_refused(name):
    p = make_policy(name, dim=2)
    edge = np.array([[MAX_ABS_FEATURE, -MAX_ABS_FEATURE]])
    assert np.isfinite(p.scores(edge)).all()
    beyond = np.array([[np.nextafter(MAX_ABS_FEATURE, np.inf), 0.0]])
    with pytest.raises(ValueError, match="beyond"):
        p.scores(beyond)
    with pytest.raises(ValueError, match="beyond"):
        p.update(beyond[0], 0.0)
    with pytest.raises(ValueError):
        p.update(np.zeros(2), np.nextafter(MAX_ABS_REWARD, np.inf))


def test_a_huge_reward_is_refused_not_raised_from_the_compiled_update():
    """glb_omd with the Poisson link raised ZeroDivisionError from its compiled update for a
    reward around 1e200 (and kept raising it on every restart of a worker that replayed it)."""
    p = make_policy("glb_omd", dim=4, link="poisson", S=3.0)
    arms = np.eye(4) / 2
    i = p.select(arms)
    before = p.state_dict()
    with pytest.raises(ValueError, match="reward"):
        p.update(arms[i], 1e200)
    assert same_state(p.state_dict(), before)


@pytest.mark.parametrize("name", ["oful", "glb_omd", "hvt_ucb"])
def test_huge_features_do_not_poison_a_model(name):
    """Features of magnitude 1e200 were taken, and every later score of the model was NaN."""
    p = make_policy(name, dim=4)
    with pytest.raises(ValueError, match="beyond"):
        p.update(np.full(4, 1e200), 0.5)
    assert np.isfinite(p.scores(np.eye(4))).all()
