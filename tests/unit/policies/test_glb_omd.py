"""GLB-OMD against a generic constrained solver of its OMD subproblem (eq. 3), and against ridge
regression in the Gaussian case."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.special import expit

from streambandit import make_policy

LINKS = {
    "logistic": (expit, lambda z: expit(z) * expit(-z)),
    "poisson": (np.exp, np.exp),
    "gaussian": (lambda z: z, lambda z: 1.0),
}


def omd_subproblem_solution(theta, h, x, r, link, eta, g, radius):
    """argmin_{||theta'|| <= S} <grad, theta'-theta> + 1/2 ||theta'-theta||^2_hess + 1/(2 eta) ||theta'-theta||^2_H
    with gradient and Hessian of the GLM loss at theta (eq. 3-4), solved by SLSQP."""
    mu, dmu = LINKS[link]
    z = x @ theta
    grad = (mu(z) - r) / g * x
    hess = dmu(z) / g * np.outer(x, x)
    m = hess + h / eta

    def f(t):
        dlt = t - theta
        return grad @ dlt + 0.5 * dlt @ m @ dlt

    start = theta if theta @ theta <= radius**2 else theta * radius / np.linalg.norm(theta)
    res = minimize(
        f,
        x0=start,
        jac=lambda t: grad + m @ (t - theta),
        constraints=[{"type": "ineq", "fun": lambda t: radius**2 - t @ t, "jac": lambda t: -2 * t}],
        method="SLSQP",
        options={"ftol": 1e-16, "maxiter": 1000},
    )
    return res.x, grad, m


def warmed_policy(link, radius, seed, d=4, n=30):
    rng = np.random.default_rng(seed)
    p = make_policy("glb_omd", dim=d, link=link, S=radius)
    mu, _ = LINKS[link]
    for _ in range(n):
        x = rng.standard_normal(d)
        x /= np.linalg.norm(x)
        y = float(mu(x @ np.full(d, 0.4)))
        r = (
            float(rng.random() < y)
            if link == "logistic"
            else float(rng.poisson(y))
            if link == "poisson"
            else y
        )
        p.update(x, r)
    return p, rng


@pytest.mark.parametrize("link", ["logistic", "poisson", "gaussian"])
@pytest.mark.parametrize("seed", range(4))
def test_one_update_equals_numerical_omd_step(link, seed):
    # S = 10 keeps the step inside the ball; a small S and x along theta force the projection.
    small = 0.05 if link == "logistic" else 0.3
    for radius, reward, inside in (
        (10.0, 1.0, True),
        (small, 1.0 if link == "logistic" else 5.0, False),
    ):
        p, rng = warmed_policy(link, radius, seed)
        x = rng.standard_normal(p.dim) + (
            0.0 if inside else 3.0 * p.theta / np.linalg.norm(p.theta)
        )
        x /= np.linalg.norm(x)
        theta, h = p.theta.copy(), p.h.copy()
        expected, grad, m = omd_subproblem_solution(
            theta, h, x, reward, link, p.config()["eta"], 1.0, radius
        )
        p.update(x, reward)
        assert (np.linalg.norm(p.theta) < radius - 1e-9) == inside
        np.testing.assert_allclose(p.theta, expected, atol=1e-6)
        if not inside:
            # KKT of the constrained subproblem: grad F(theta') = -nu theta' with nu >= 0.
            grad_f = grad + m @ (p.theta - theta)
            nu = -(grad_f @ p.theta) / radius**2
            assert nu >= 0.0
            assert np.linalg.norm(grad_f + nu * p.theta) <= 1e-8 * max(1.0, np.linalg.norm(grad_f))


def test_projection_uses_the_a_norm_not_euclidean_rescale():
    p, rng = warmed_policy("logistic", 0.05, seed=0)
    x = rng.standard_normal(p.dim) + 3.0 * p.theta / np.linalg.norm(p.theta)
    x /= np.linalg.norm(x)
    w = p.config()["eta"] * (expit(x @ p.theta) * expit(-(x @ p.theta)))
    v = p.hinv @ x
    zeta = p.theta - p.config()["eta"] * (expit(x @ p.theta) - 1.0) * v / (1 + w * (x @ v))
    assert np.linalg.norm(zeta) > 0.05
    p.update(x, 1.0)
    assert not np.allclose(p.theta, zeta * 0.05 / np.linalg.norm(zeta), atol=1e-6)


def test_gaussian_link_without_projection_is_ridge_regression():
    rng = np.random.default_rng(5)
    d, lam, sigma2 = 6, 1.5, 0.5
    p = make_policy("glb_omd", dim=d, link="gaussian", S=1e6, lam=lam, dispersion=sigma2)
    assert p.config()["eta"] == 1.0  # R = 0 for the Gaussian link
    xs = rng.standard_normal((400, d)) / math.sqrt(d)
    rs = xs @ rng.standard_normal(d) + 0.3 * rng.standard_normal(400)
    for k, (x, r) in enumerate(zip(xs, rs), start=1):
        p.update(x, r)
        if k in (1, 10, 400):
            v = lam * np.eye(d) + xs[:k].T @ xs[:k] / sigma2
            np.testing.assert_allclose(
                p.theta, np.linalg.solve(v, xs[:k].T @ rs[:k] / sigma2), rtol=0, atol=1e-10
            )
            np.testing.assert_allclose(p.h, v, rtol=0, atol=1e-10)
    np.testing.assert_allclose(p.hinv @ p.h, np.eye(d), atol=1e-10)


def test_beta_is_equation_5():
    p = make_policy("glb_omd", dim=5, link="poisson", S=2.0, delta=0.1, beta_scale=0.5)
    lam, eta, c_mu = 5.0, 3.0, math.exp(2.0)
    for _ in range(7):
        p.update(np.full(5, 0.1), 1.0)
    t = 8
    expected = math.sqrt(
        4 * lam * 4 + 2 * eta * math.log(10) + 6 * 5 * eta**2 * math.log(2 + 2 * c_mu * t / lam)
    )
    assert p.beta() == pytest.approx(0.5 * expected, rel=1e-12)


@pytest.mark.parametrize(
    "link, reward, message",
    [
        ("logistic", 1.5, r"\[0, 1\]"),
        ("logistic", -0.1, r"\[0, 1\]"),
        ("poisson", -1.0, ">= 0"),
        ("gaussian", math.nan, "finite"),
    ],
)
def test_rewards_outside_the_link_range_are_rejected(link, reward, message):
    p = make_policy("glb_omd", dim=3, link=link)
    with pytest.raises(ValueError, match=message):
        p.update(np.ones(3) / 3, reward)
    assert p.n_updates == 0


def test_unknown_link_is_rejected():
    with pytest.raises(ValueError, match="link must be one of"):
        make_policy("glb_omd", dim=3, link="probit")
