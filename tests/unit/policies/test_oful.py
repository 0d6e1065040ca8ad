"""OFUL against the closed-form ridge solution and the Abbasi-Yadkori radius."""

import math

import numpy as np
import pytest

from streambandit import make_policy


def test_kept_inverse_and_theta_equal_ridge_after_1000_updates():
    rng = np.random.default_rng(0)
    d, lam = 8, 0.7
    p = make_policy("oful", dim=d, lam=lam)
    xs = rng.standard_normal((1000, d))
    rs = rng.standard_normal(1000)
    for x, r in zip(xs, rs):
        p.update(x, r)
    v = lam * np.eye(d) + xs.T @ xs
    np.testing.assert_allclose(p.vinv, np.linalg.inv(v), rtol=0, atol=1e-9)
    np.testing.assert_allclose(p.theta, np.linalg.solve(v, xs.T @ rs), rtol=0, atol=1e-9)
    sign, logdet = np.linalg.slogdet(v)
    assert p.logdet == pytest.approx(logdet - d * math.log(lam), rel=1e-10)


def test_theory_radius_and_constant_beta():
    rng = np.random.default_rng(1)
    d = 4
    p = make_policy("oful", dim=d, lam=2.0, noise_sd=0.5, S=3.0, delta=0.1, beta_scale=0.5)
    xs = rng.standard_normal((50, d))
    for x in xs:
        p.update(x, 1.0)
    logdet = np.linalg.slogdet(2.0 * np.eye(d) + xs.T @ xs)[1] - d * math.log(2.0)
    expected = 0.5 * (0.5 * math.sqrt(2 * math.log(10.0) + logdet) + math.sqrt(2.0) * 3.0)
    assert p.beta() == pytest.approx(expected, rel=1e-12)

    q = make_policy("oful", dim=d, beta=0.25)
    arms = rng.standard_normal((5, d))
    expected_scores = arms @ q.theta + 0.25 * np.sqrt(np.einsum("kd,de,ke->k", arms, q.vinv, arms))
    np.testing.assert_allclose(q.scores(arms), expected_scores, rtol=1e-12)
