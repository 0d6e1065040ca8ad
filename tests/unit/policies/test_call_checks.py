"""The compiled learners' per-call checks: select, best, scores and update check the shape, the
reward and the values inside their one compiled call. Each bad input still raises the error the
checks in Python raise (the same words, in the same order) and leaves the model as it was, whether
it comes as a float64 C-contiguous array (the compiled check) or as anything else (checked in
Python first)."""

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.policies.base import BAD_ARMS_MESSAGE, BAD_X_MESSAGE

DIM = 4
LEARNERS = [
    pytest.param("oful", {}, id="oful"),
    pytest.param("glb_omd", {"link": "logistic"}, id="glb_omd-logistic"),
    pytest.param("glb_omd", {"link": "gaussian"}, id="glb_omd-gaussian"),
    pytest.param("hvt_ucb", {}, id="hvt_ucb"),
]
REWARD_BOUND = "reward must be finite and within +-1e+09, got"


def trained(name, params):
    p = make_policy(name, dim=DIM, **params)
    rng = np.random.default_rng(3)
    for _ in range(5):
        arms = rng.standard_normal((3, DIM)) / 2
        p.update(arms[p.select(arms)], 0.5)
    return p


def as_given(a: np.ndarray, form: str):
    """``a`` as the compiled check takes it, or in a form the Python checks convert first."""
    if form == "array":
        return np.ascontiguousarray(a, dtype=np.float64)
    if form == "strided":  # float64, not C-contiguous
        wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]))
        wide[..., ::2] = a
        return wide[..., ::2]
    return a.tolist()


def refuses(p, call, message: str) -> None:
    before = p.state_dict()
    with pytest.raises(ValueError) as e:
        call()
    assert str(e.value) == message
    after = p.state_dict()
    assert before.keys() == after.keys()
    for k, v in before.items():
        assert np.array_equal(after[k], v), k


@pytest.mark.parametrize("form", ["array", "strided", "list"])
@pytest.mark.parametrize("name, params", LEARNERS)
def test_a_bad_update_raises_the_checks_error_and_changes_nothing(name, params, form):
    p = trained(name, params)
    x = np.full(DIM, 0.25)
    short = as_given(x[:-1], form)
    nan_x = as_given(np.where(np.arange(DIM) == 1, np.nan, x), form)
    huge_x = as_given(np.where(np.arange(DIM) == 2, 2e6, x), form)
    good = as_given(x, form)
    refuses(p, lambda: p.update(short, 0.5), f"x must have shape ({DIM},), got ({DIM - 1},)")
    refuses(p, lambda: p.update(nan_x, 0.5), BAD_X_MESSAGE)
    refuses(p, lambda: p.update(huge_x, 0.5), BAD_X_MESSAGE)
    refuses(p, lambda: p.update(good, float("nan")), f"{REWARD_BOUND} nan")
    refuses(p, lambda: p.update(good, 2e9), f"{REWARD_BOUND} 2000000000.0")
    refuses(p, lambda: p.update(good, "many"), "reward must be a number, got 'many'")
    # In the order the checks make them: the shape before the reward, the reward before values.
    refuses(
        p, lambda: p.update(short, float("inf")), f"x must have shape ({DIM},), got ({DIM - 1},)"
    )
    refuses(p, lambda: p.update(nan_x, float("inf")), f"{REWARD_BOUND} inf")
    if params.get("link") == "logistic":
        refuses(p, lambda: p.update(good, 1.5), "logistic link needs a reward in [0, 1], got 1.5")
        refuses(
            p, lambda: p.update(nan_x, -0.5), "logistic link needs a reward in [0, 1], got -0.5"
        )


@pytest.mark.parametrize("form", ["array", "strided", "list"])
@pytest.mark.parametrize("name, params", LEARNERS)
def test_bad_arms_raise_the_checks_error_in_every_decision(name, params, form):
    p = trained(name, params)
    arms = np.full((3, DIM), 0.25)
    cases = [
        (as_given(arms[:, :-1], form), f"arms must have shape (K, {DIM}), got (3, {DIM - 1})"),
        (np.empty((0, DIM)), "arms is empty: there must be at least one arm to choose from"),
        (as_given(np.where(arms == arms[0, 0], np.inf, arms), form), BAD_ARMS_MESSAGE),
        (as_given(np.where(np.eye(3, DIM) == 1, -3e6, arms), form), BAD_ARMS_MESSAGE),
        (as_given(np.where(np.eye(3, DIM) == 1, np.nan, arms), form), BAD_ARMS_MESSAGE),
    ]
    for bad, message in cases:
        for call in (p.select, p.best, p.scores):
            refuses(p, lambda: call(bad), message)
    refuses(p, lambda: p.select(arms[0]), f"arms must have shape (K, {DIM}), got ({DIM},)")


@pytest.mark.parametrize("name, params", LEARNERS)
def test_every_form_of_the_same_input_gives_the_same_bits(name, params):
    rng = np.random.default_rng(5)
    arms = rng.standard_normal((20, 3, DIM)) / 2
    rewards = rng.random(20)
    runs = {}
    for form in ("array", "strided", "list"):
        p = make_policy(name, dim=DIM, **params)
        chosen, scores = [], []
        for t in range(20):
            a = as_given(arms[t], form)
            i, s = p.best(a)
            assert i == p.select(a)
            assert s == p.scores(a)[i]
            chosen.append(i)
            scores.append(s)
            p.update(as_given(arms[t, i], form), rewards[t])
        runs[form] = chosen, scores, p.state_dict()
    first = runs["array"]
    for form, (chosen, scores, state) in runs.items():
        assert chosen == first[0] and scores == first[1], form
        for k, v in first[2].items():
            assert np.array_equal(state[k], v), (form, k)
