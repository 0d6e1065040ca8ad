"""Hvt-UCB against weighted ridge regression, the paper's identities, and its closed-form constants."""

import math

import numpy as np
import pytest

from streambandit import make_policy


def stream(seed, n, d, outliers=False):
    rng = np.random.default_rng(seed)
    xs = rng.standard_normal((n, d))
    xs /= np.linalg.norm(xs, axis=1, keepdims=True)
    rs = xs @ (rng.standard_normal(d) / math.sqrt(d)) + rng.standard_t(2.1, size=n)
    if outliers:
        rs[::7] *= 100.0
    return xs, rs


def test_alpha_one_no_huber_no_projection_is_weighted_ridge():
    d, lam = 5, 2.0
    p = make_policy(
        "hvt_ucb", dim=d, alpha=1.0, huber=False, project=False, lam=lam, nu=0.7, horizon=500
    )
    xs, rs = stream(0, 300, d)
    sigmas = []
    for k, (x, r) in enumerate(zip(xs, rs), start=1):
        sigmas.append(p.sigma_t(x))
        p.update(x, r)
        if k in (1, 25, 300):
            w = 1.0 / np.square(sigmas)
            v = lam * np.eye(d) + (xs[:k] * w[:, None]).T @ xs[:k]
            np.testing.assert_allclose(
                p.theta, np.linalg.solve(v, (xs[:k] * w[:, None]).T @ rs[:k]), rtol=0, atol=1e-10
            )
            np.testing.assert_allclose(p.v, v, rtol=0, atol=1e-10)
    # The weights were not all equal: sigma_t really varied with ||x||_{V^-1}, so the test is of
    # a weighted, not a plain, ridge regression.
    assert max(sigmas) > 1.05 * min(sigmas)


@pytest.mark.parametrize("alpha", [1.0, 4.0])
def test_after_each_update_the_normalised_norm_identity_holds(alpha):
    d = 4
    p = make_policy(
        "hvt_ucb", dim=d, alpha=alpha, epsilon=0.6, nu=1.3, horizon=1000, beta_scale=1.0
    )
    xs, rs = stream(1, 200, d, outliers=True)
    for x, r in zip(xs, rs):
        n = math.sqrt(x @ p.vinv @ x)  # ||X_t||_{V_{t-1}^-1}
        sigma = p.sigma_t(x)
        w = n / (sigma * math.sqrt(alpha))
        # The eq. 17 term keeps alpha w^2 = ||X/sigma||^2_{V_{t-1}^-1} <= 1/8.
        assert alpha * w * w <= 1 / 8 + 1e-12
        p.update(x, r)
        lhs = (x / sigma) @ p.vinv @ (x / sigma)  # ||X_t / sigma_t||^2_{V_t^-1}
        assert lhs == pytest.approx(alpha * w * w / (1 + w * w), rel=1e-9)
        assert np.linalg.norm(p.theta) <= 1.0 + 1e-12  # the projection keeps ||theta|| <= S


def test_huber_step_is_clipped_at_tau():
    d = 3
    p = make_policy(
        "hvt_ucb", dim=d, epsilon=0.5, nu=1.0, horizon=1000, project=False, beta_scale=1.0
    )
    xs, rs = stream(2, 20, d)
    for x, r in zip(xs, rs):
        p.update(x, r)
    x = xs[0]
    t = p.n_updates + 1
    n = math.sqrt(x @ p.vinv @ x)
    sigma = p.sigma_t(x)
    w = n / (sigma * 2.0)
    epsilon = 0.5
    pexp = (1 - epsilon) / (2 * (1 + epsilon))
    tau = p.tau0 * math.sqrt(1 + w * w) / w * t**pexp  # Alg. 1 line 6
    theta = p.theta.copy()
    p.update(x, 1e9)  # an outlier: z >> tau, so the step is clipped at +tau
    expected = theta + tau / sigma * (p.vinv @ x)
    np.testing.assert_allclose(p.theta, expected, rtol=1e-10, atol=1e-12)


def test_constants_match_the_closed_forms():
    # The paper's experiment: d = 2, T = 18000, L = S = 1, lambda = d, sigma_min = 1/sqrt(T),
    # delta = 1/(8T), alpha = 4, eps = 0.99. The note evaluates tau0 = 1.442, beta_1 = 4968, beta_T = 5092.
    p = make_policy("hvt_ucb", dim=2, epsilon=0.99, nu=1.31, horizon=18000, beta_scale=1.0)
    assert p.tau0 == pytest.approx(1.442, abs=1e-3)
    assert p.beta(1) == pytest.approx(4968, rel=1e-3)
    assert p.beta(18000) == pytest.approx(5092, rel=1e-3)
    q = make_policy("hvt_ucb", dim=2, epsilon=1.0, horizon=18000, beta_scale=1.0)
    assert q.beta(1) == q.beta(18000) == pytest.approx(4982, rel=1e-3)  # eps = 1: p = 0, constant


def test_zero_context_is_a_no_op_on_the_estimate():
    p = make_policy("hvt_ucb", dim=3)
    before = p.state_dict()
    p.update(np.zeros(3), 5.0)
    assert np.array_equal(p.theta, before["theta"]) and np.array_equal(p.v, before["v"])
    assert p.n_updates == 1


@pytest.mark.parametrize(
    "bad", [{"epsilon": 0.0}, {"epsilon": 1.5}, {"horizon": 0}, {"nu": -1.0}, {"alpha": 0.0}]
)
def test_bad_hyper_parameters_are_rejected(bad):
    with pytest.raises(ValueError):
        make_policy("hvt_ucb", dim=2, **bad)
