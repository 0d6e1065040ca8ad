"""Streaming BKB against exact GP-UCB (the oracle), its bounds, its resparsification and its state."""

import math

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.sim.gp_ucb import ExactGPUCB, kernel_matrix
from streambandit.sketch import online_nystrom as onl

BW, LAM, XI = 0.3, 0.01, 0.1


def _unit(rng, n, d):
    a = rng.standard_normal((n, d))
    return a / np.linalg.norm(a, axis=1, keepdims=True)


@pytest.mark.parametrize("fresh", [False, True], ids=["catalog", "fresh-arms"])
def test_with_every_pull_in_the_span_it_is_exact_gp_ucb(fresh):
    """qbar = inf and room for every distinct pull: the projection loses nothing, so the posterior,
    beta~ and every choice are exact GP-UCB's (sim/gp_ucb.py, its own algebra)."""
    rng = np.random.default_rng(1)
    p = make_policy(
        "bkb_stream", dim=2, bandwidth=BW, lam=LAM, noise_sd=XI, qbar=math.inf, m_max=400
    )
    g = ExactGPUCB(bandwidth=BW, lam=LAM, noise_sd=XI)
    catalog = rng.uniform(0, 1, (40, 2))
    for t in range(120):
        arms = rng.uniform(0, 2, (8, 2)) if fresh else catalog
        (mu, s2), (mu_g, s2_g) = p.posterior(arms), g.posterior(arms)
        # To rounding, which the kernel matrix's condition number (near 1e8 here) amplifies.
        assert np.allclose(mu, mu_g, atol=1e-7) and np.allclose(s2, s2_g, rtol=1e-7, atol=1e-7), t
        assert p.beta() == pytest.approx(g.beta(), rel=1e-6)
        i = p.select(arms)
        assert i == g.select(arms), t
        r = float(np.sin(6 * arms[i, 0]) + XI * rng.standard_normal())
        p.update(arms[i], r)
        g.update(arms[i], r)
    # A repeated point is in the span: it never joins twice.
    assert p.dictionary_size == g.n_points


def test_new_arms_every_round_keep_the_state_bounded_by_the_budget():
    rng = np.random.default_rng(2)
    d, m_max = 5, 12
    p = make_policy("bkb_stream", dim=d, m_max=m_max, qbar=8.0, min_gap=5, resparsify_at=0.2)
    bound = 8 * (m_max * d + 3 * m_max**2 + 2 * m_max + 5)
    theta = rng.standard_normal(d)
    for _ in range(800):
        arms = _unit(rng, 10, d)
        i = p.select(arms)
        p.update(arms[i], float(arms[i] @ theta))
        assert p.dictionary_size <= m_max and p.state_nbytes() <= bound
    assert p.dictionary_size >= m_max - 4  # the budget is used
    assert p.resparsifications >= 10  # and renewed on the schedule
    assert all(np.isfinite(v).all() for v in p.state_dict().values() if isinstance(v, np.ndarray))


def test_a_resparsified_model_is_the_pulls_projected_on_the_kept_points():
    """online_nystrom.shrink against the brute force: the pulls' embeddings in the kept points'
    basis, summed."""
    rng = np.random.default_rng(3)
    p = make_policy("bkb_stream", dim=2, bandwidth=0.5, lam=0.1, qbar=math.inf, m_max=100)
    pulls, rewards = [], []
    for _ in range(60):
        x, r = rng.uniform(0, 1, 2), float(rng.standard_normal())
        p.update(x, r)
        pulls.append(x)
        rewards.append(r)
    kept = np.array([0, 2, 3, 7, 11, p.dictionary_size - 1])
    points = p.dictionary[kept]
    chol, gram, bz, vinv = onl.shrink(
        kernel_matrix("rbf", 0.5, points, points), p.chol, p.gram, p.bz, kept, 0.1
    )
    z = np.linalg.solve(chol, kernel_matrix("rbf", 0.5, points, np.array(pulls)))  # (m', t)
    assert np.allclose(chol @ chol.T, kernel_matrix("rbf", 0.5, points, points), atol=1e-12)
    assert np.allclose(gram, z @ z.T, atol=1e-8)
    assert np.allclose(bz, z @ np.array(rewards), atol=1e-8)
    assert np.allclose(vinv, np.linalg.inv(z @ z.T + 0.1 * np.eye(len(kept))), atol=1e-8)


def test_the_compiled_solves_equal_a_triangular_solve_and_each_row_stands_alone():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((30, 30))
    lower = np.linalg.cholesky(a @ a.T + 30 * np.eye(30))
    ks = rng.standard_normal((7, 30))
    z = onl.forward_solve_rows(np.ascontiguousarray(lower.T), ks)
    assert np.allclose(z, np.linalg.solve(lower, ks.T).T, atol=1e-12)
    for i in range(7):
        assert np.array_equal(onl.forward_solve(np.ascontiguousarray(lower.T), ks[i]), z[i])


def test_a_hostile_state_is_refused_and_leaves_the_policy_as_it_was():
    rng = np.random.default_rng(5)
    p = make_policy("bkb_stream", dim=3, m_max=6)
    for _ in range(20):
        x = _unit(rng, 1, 3)[0]
        p.update(x, 1.0)
    good = p.state_dict()
    m = good["dictionary"].shape[0]
    cases = {
        "too many points": {
            **good,
            "dictionary": np.zeros((7, 3)),
            "chol": np.eye(7),
            "gram": np.zeros((7, 7)),
            "vinv": np.eye(7),
            "bz": np.zeros(7),
            "incl": np.ones(7),
        },
        "shapes disagree": {**good, "gram": np.zeros((m + 1, m + 1))},
        "not finite": {**good, "bz": np.full(m, np.nan)},
        "not a root": {**good, "chol": -np.eye(m)},
        "not probabilities": {**good, "incl": np.zeros(m)},
        "negative sum": {**good, "missed_s2": -1.0},
    }
    fresh = make_policy("bkb_stream", dim=3, m_max=6)
    for name, state in cases.items():
        with pytest.raises(ValueError):
            fresh.load_state_dict(state)
        assert fresh.dictionary_size == 0 and fresh.n_updates == 0, name
    fresh.load_state_dict(good)
    arms = _unit(rng, 5, 3)
    assert np.array_equal(fresh.scores(arms), p.scores(arms))


def test_the_budget_and_schedule_are_checked():
    for bad in (
        {"m_max": 0},
        {"m_max": 10**6},
        {"m_max": 2.5},
        {"min_gap": 0},
        {"qbar": 0.0},
        {"resparsify_at": -1.0},
    ):
        with pytest.raises(ValueError):
            make_policy("bkb_stream", dim=2, **bad)
    assert make_policy("bkb_stream", dim=2, m_max=100).config()["min_gap"] == 25


def test_exact_bkb_is_bounded_when_asked_and_the_worker_requires_the_bound():
    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import WorkerConfig

    p = make_policy("bkb", dim=2, max_points=3)
    for x in ([0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 0.0]):  # three distinct points, one again
        p.update(x, 1.0)
    before = p.state_dict()
    with pytest.raises(ValueError, match="max_points = 3"):
        p.update([0.5, 0.5], 1.0)
    assert all(
        np.array_equal(before[k], v) if isinstance(v, np.ndarray) else before[k] == v
        for k, v in p.state_dict().items()
    )  # refused whole

    def models(hyper):
        return parse_models_config(
            {
                "models": [
                    {
                        "match": "m",
                        "policy": "bkb",
                        "dim": 2,
                        "reward_window_ms": 10,
                        "default_reward": 0.0,
                        "hyper": hyper,
                    }
                ]
            }
        )

    with pytest.raises(ValueError, match="bkb_stream"):
        WorkerConfig(bootstrap_servers="x:1", models=models({}))
    WorkerConfig(bootstrap_servers="x:1", models=models({"max_points": 500}))
