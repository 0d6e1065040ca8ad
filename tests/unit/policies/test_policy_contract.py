"""One contract every registered policy must satisfy, generated from each class's own
``_test_params()``: a new learner gets these checks by registering itself."""

import math

import numpy as np
import pytest

from streambandit import POLICIES, make_policy

DIM = 4
CASES = [
    pytest.param(name, params, id=f"{name}-{i}")
    for name, cls in sorted(POLICIES.items())
    for i, params in enumerate(cls._test_params())
]


def interactions(seed, n):
    """A reproducible stream of (unit-norm arms, 0/1 reward): valid input for every link."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        arms = rng.standard_normal((5, DIM))
        arms /= np.linalg.norm(arms, axis=1, keepdims=True)
        yield arms, float(rng.random() < 0.5)


def play(p, seed, n):
    choices = []
    for arms, reward in interactions(seed, n):
        i = p.select(arms)
        choices.append(i)
        p.update(arms[i], reward)
    return choices


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k] and type(a[k]) is type(b[k]), k


@pytest.mark.parametrize("name, params", CASES)
def test_state_holds_only_arrays_and_scalars(name, params):
    p = make_policy(name, dim=DIM, **params)
    play(p, 0, 20)
    for k, v in p.state_dict().items():
        assert isinstance(k, str)
        assert isinstance(v, np.ndarray) or v is None or type(v) in (bool, int, float, str), (
            k,
            type(v),
        )


@pytest.mark.parametrize("name, params", CASES)
def test_save_load_continue_equals_never_saving(name, params):
    a = make_policy(name, dim=DIM, **params)
    play(a, 1, 40)
    b = make_policy(name, dim=DIM, **params)
    b.load_state_dict(a.state_dict())
    # The loaded copy must not alias the original's arrays.
    ca, cb = play(a, 2, 60), play(b, 2, 60)
    assert ca == cb
    assert_same_state(a.state_dict(), b.state_dict())


@pytest.mark.parametrize("name, params", CASES)
def test_deterministic_given_the_same_sequence(name, params):
    a, b = make_policy(name, dim=DIM, **params), make_policy(name, dim=DIM, **params)
    assert play(a, 3, 80) == play(b, 3, 80)
    assert_same_state(a.state_dict(), b.state_dict())


@pytest.mark.parametrize("name, params", CASES)
def test_inputs_are_not_mutated(name, params):
    p = make_policy(name, dim=DIM, **params)
    rng = np.random.default_rng(4)
    for _ in range(30):
        arms = rng.standard_normal((6, DIM)) / 2
        before = arms.copy()
        i = p.select(arms)
        x = arms[i]
        p.update(x, 1.0)
        assert np.array_equal(arms, before)


@pytest.mark.parametrize("name, params", CASES)
def test_scores_and_select_agree(name, params):
    p = make_policy(name, dim=DIM, **params)
    play(p, 5, 10)
    arms = np.random.default_rng(5).standard_normal((7, DIM)) / 2
    s = p.scores(arms)
    assert s.shape == (7,) and np.isfinite(s).all()
    assert p.select(arms) == int(np.argmax(s))
    best = int(np.argmax(s))
    assert p.select(np.vstack([arms[best], arms[best], arms[best]])) == 0  # ties: lowest index


@pytest.mark.parametrize("name, params", CASES)
@pytest.mark.parametrize(
    "arms, message",
    [
        (np.ones((3, DIM + 1)), "shape"),
        (np.ones(DIM), "shape"),
        (np.ones((0, DIM)), "empty"),
        (np.array([[math.nan] * DIM]), "NaN"),
        (np.array([[math.inf] * DIM]), "NaN or infinite"),
    ],
)
def test_bad_arms_raise_value_error(name, params, arms, message):
    p = make_policy(name, dim=DIM, **params)
    with pytest.raises(ValueError, match=message):
        p.select(arms)


@pytest.mark.parametrize("name, params", CASES)
def test_bad_updates_raise_and_leave_the_state_alone(name, params):
    p = make_policy(name, dim=DIM, **params)
    play(p, 6, 5)
    before = p.state_dict()
    for x, r in [
        (np.full(DIM, math.nan), 1.0),
        (np.ones(DIM + 1), 1.0),
        (np.ones(DIM) / DIM, math.nan),
        (np.ones(DIM) / DIM, math.inf),
        (np.ones(DIM) / DIM, "a lot"),
    ]:
        with pytest.raises(ValueError):
            p.update(x, r)
    assert_same_state(before, p.state_dict())


@pytest.mark.parametrize("name, params", CASES)
def test_mismatched_state_is_rejected(name, params):
    p = make_policy(name, dim=DIM, **params)
    state = p.state_dict()
    with pytest.raises(ValueError, match="dim"):
        make_policy(name, dim=DIM + 1, **params).load_state_dict(state)
    other = next(n for n in POLICIES if n != name)
    with pytest.raises(ValueError, match="policy"):
        make_policy(other, dim=DIM).load_state_dict(state)
    changed = dict(state)
    key = next(
        k
        for k in state
        if k.startswith("config.") and k != "config.seed" and isinstance(state[k], float)
    )
    changed[key] = state[key] * 2 + 1
    with pytest.raises(ValueError, match="configuration"):
        make_policy(name, dim=DIM, **params).load_state_dict(changed)
    array_key = next(k for k, v in state.items() if isinstance(v, np.ndarray))
    broken = dict(state)
    broken[array_key] = np.zeros(3)
    fresh = make_policy(name, dim=DIM, **params)
    with pytest.raises(ValueError, match=array_key):
        fresh.load_state_dict(broken)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_make_policy_rejects_bad_construction(name):
    with pytest.raises(ValueError, match="dim"):
        make_policy(name, dim=0)
    with pytest.raises(ValueError, match="no hyper-parameter"):
        make_policy(name, dim=2, not_a_parameter=1)
    if "lam" in POLICIES[name].hyper_parameters():
        with pytest.raises(ValueError, match="lam"):
            make_policy(name, dim=2, lam=0.0)


def test_unknown_policy_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="known policies: .*oful"):
        make_policy("linucb++", dim=2)


@pytest.mark.parametrize("name, params", CASES)
def test_config_rebuilds_an_identical_policy(name, params):
    p = make_policy(name, dim=DIM, **params)
    q = make_policy(name, dim=DIM, **p.config())
    assert q.config() == p.config()
    q.load_state_dict(p.state_dict())
    assert p.state_nbytes() > 0


@pytest.mark.parametrize("name, params", CASES)
def test_models_of_one_configuration_share_it_but_not_their_state(name, params):
    a = make_policy(name, dim=DIM, **params)
    b = make_policy(name, dim=DIM, **params)
    assert a._config is b._config  # one copy per configuration, not per model
    play(a, 0, 7)
    assert b.n_updates == 0
    assert_same_state(b.state_dict(), make_policy(name, dim=DIM, **params).state_dict())
    assert a.config() == b.config() and a.config() is not a._config  # callers get a copy
    assert make_policy(name, dim=DIM + 1, **params)._config is not a._config


@pytest.mark.parametrize("name, params", CASES)
def test_best_is_the_choice_and_its_score(name, params):
    """``best`` (the decision rule's call when it does not explore) is ``select`` and that arm's
    entry of ``scores``, to the bit, at every step of a stream; ties go to the lowest index."""
    p = make_policy(name, dim=DIM, **params)
    for arms, reward in interactions(7, 30):
        i, score = p.best(arms)
        s = p.scores(arms)
        assert i == p.select(arms) == int(s.argmax())
        assert type(i) is int and type(score) is float and score == s[i]
        p.update(arms[i], reward)
    tied = np.tile(arms[:1], (3, 1))
    assert p.best(tied)[0] == 0
    with pytest.raises(ValueError, match="NaN or infinite"):
        p.best(np.full((2, DIM), np.nan))


# Larger shapes than the contract's DIM, at each learner's defaults: a sketch that has shrunk,
# a BKB dictionary of several points, dimensions where BLAS would switch kernels.
ROW_CASES = [
    pytest.param(name, params, DIM, id=f"{name}-{i}")
    for name, cls in sorted(POLICIES.items())
    for i, params in enumerate(cls._test_params())
] + [pytest.param(name, {}, d, id=f"{name}-d{d}") for name in sorted(POLICIES) for d in (33, 200)]


def trained(name, params, dim, n):
    p = make_policy(name, dim=dim, **params)
    rng = np.random.default_rng(11)
    for _ in range(n):
        arms = rng.standard_normal((4, dim))
        arms /= np.linalg.norm(arms, axis=1, keepdims=True)
        p.update(arms[p.select(arms)], float(rng.random() < 0.5))
    return p


@pytest.mark.parametrize("name, params, dim", ROW_CASES)
def test_an_arms_score_depends_on_that_arm_alone(name, params, dim):
    """Identical arms score identically and the first is chosen, for any number of arms; and an
    arm scores the same bits alone, among 64 others, at any position and memory offset. The second
    check fails on any CPU when scores go through a BLAS product (whose tail rows, and one-row
    products, take other code), so this test does not depend on the machine that runs it."""
    p = trained(name, params, dim, 40 if name == "bkb" else 150)
    rng = np.random.default_rng(12)
    for k in (2, 3, 5, 8, 17, 64):
        row = rng.standard_normal(dim)
        tied = np.tile(row / np.linalg.norm(row), (k, 1))
        s = p.scores(tied)
        assert (s == s[0]).all(), (k, s - s[0])
        assert p.select(tied) == 0 and p.best(tied)[0] == 0
        assert (p.select_batch(tied[None]) == 0).all()
    block = rng.standard_normal((65, dim))
    block /= np.linalg.norm(block, axis=1, keepdims=True)
    arms = block[1:]  # starts one row in: another memory alignment than a fresh array
    together = p.scores(arms)
    alone = np.array([p.scores(np.array(arms[i : i + 1]))[0] for i in range(len(arms))])
    assert together.tobytes() == alone.tobytes()
    assert p.scores(arms[::-1].copy()).tobytes() == together[::-1].tobytes()
    assert p.scores_batch(np.stack([arms[:8], arms[8:16]])).tobytes() == together[:16].tobytes()


@pytest.mark.parametrize("name, params", CASES)
def test_the_versioned_calls_are_best_and_update_with_n_updates(name, params):
    """best_versioned is (*best, n_updates) and update_versioned is update returning n_updates
    as it was before it, to the bit, through the compiled path and through the checks in Python
    (a list of arms, an int reward); a refused update raises as update does and changes nothing."""
    a, b = make_policy(name, dim=DIM, **params), make_policy(name, dim=DIM, **params)
    for t, (arms, reward) in enumerate(interactions(9, 12)):
        given = arms.tolist() if t % 3 == 1 else arms
        i, score = a.best(arms)
        assert b.best_versioned(given) == (i, score, a.n_updates)
        version = a.n_updates
        a.update(arms[i], reward)
        assert b.update_versioned(arms[i], int(reward) if t % 3 == 2 else reward) == version
        assert b.n_updates == a.n_updates == version + 1
        assert_same_state(a.state_dict(), b.state_dict())
    before = b.state_dict()
    with pytest.raises(ValueError):
        b.update_versioned(np.full(DIM, math.nan), 1.0)
    with pytest.raises(ValueError):
        b.best_versioned(np.ones((3, DIM + 1)))
    assert_same_state(before, b.state_dict())
