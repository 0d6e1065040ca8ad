"""The full-pass baselines against scipy oracles, and the GLB-OMD / Hvt-UCB experiments at size="tiny"."""

from __future__ import annotations

import time

import numpy as np
import pytest
import scipy.optimize
import scipy.special

from streambandit.sim.baselines import GLMUCBRefit, HuberRefit
from streambandit.sim.environments import random_unit_vector, unit_rows
from streambandit.sim.experiments import glb_omd_logistic, glb_omd_poisson, hvt_ucb


def _glm_data(link, n, seed):
    rng = np.random.default_rng(seed)
    xs = unit_rows(rng.standard_normal((n, 4)))
    theta = 2.0 * random_unit_vector(rng, 4)
    z = xs @ theta
    rs = (
        (rng.random(n) < scipy.special.expit(z)).astype(float)
        if link == "logistic"
        else rng.poisson(np.exp(z)).astype(float)
    )
    return xs, rs


@pytest.mark.parametrize("link", ["logistic", "poisson"])
def test_glm_refit_estimate_is_scipy_mle(link):
    xs, rs = _glm_data(link, 150, 3)
    p = GLMUCBRefit(4, link=link, S=2.0)
    for x, r in zip(xs, rs):
        p.update(x, r)
    lam = 4.0

    # Oracle: the regularised negative log-likelihood written out independently, minimised from 0
    # by a different method (BFGS with numerical gradients).
    def nll(th):
        z = xs @ th
        m = np.log1p(np.exp(z)) if link == "logistic" else np.exp(z)
        return np.sum(m - rs * z) + 0.5 * lam * th @ th

    ref = scipy.optimize.minimize(nll, np.zeros(4), method="BFGS", options={"gtol": 1e-10}).x
    assert np.allclose(p.theta, ref, atol=1e-5)
    # The confidence matrix is the regularised Hessian at the estimate.
    w = (
        scipy.special.expit(xs @ ref) * scipy.special.expit(-(xs @ ref))
        if link == "logistic"
        else np.exp(xs @ ref)
    )
    h = lam * np.eye(4) + (xs * w[:, None]).T @ xs
    assert np.allclose(p.hinv, np.linalg.inv(h), rtol=1e-4, atol=1e-8)


def test_glm_refit_select_is_ucb_argmax():
    xs, rs = _glm_data("logistic", 30, 1)
    p = GLMUCBRefit(4, link="logistic", S=2.0)
    for x, r in zip(xs, rs):
        p.update(x, r)
    arms = unit_rows(np.random.default_rng(9).standard_normal((7, 4)))
    ucb = arms @ p.theta + p.beta() * np.sqrt(np.einsum("kd,de,ke->k", arms, p.hinv, arms))
    assert p.select(arms) == int(np.argmax(ucb))


def test_huber_refit_estimate_is_direct_huber_minimiser():
    rng = np.random.default_rng(5)
    theta = random_unit_vector(rng, 2)
    arms = rng.uniform(-1, 1, (20, 2))
    arms /= np.linalg.norm(arms, axis=1).max()
    p = HuberRefit(2, epsilon=0.99, nu=1.31, horizon=300)
    for t in range(200):
        x = arms[p.select(arms)] if t % 2 else arms[t % 20]
        p.update(
            x, float(x @ theta + 20.0 * rng.standard_t(2.1))
        )  # noise far above nu: clipping active
    xs = p._x.data
    r, sig, tau = p._rst.data.T
    assert np.all(np.isfinite(tau)) and np.all(sig > 0)
    # Some samples must lie outside the quadratic region, or this would only test least squares.
    z = (r - xs @ p.theta) / sig
    assert np.any(np.abs(z) > tau)

    def obj(th):
        return 0.5 * p.lam * th @ th + np.sum(scipy.special.huber(tau, (r - xs @ th) / sig))

    ref = scipy.optimize.minimize(
        obj,
        np.zeros(2),
        method="Nelder-Mead",
        options={"xatol": 1e-10, "fatol": 1e-14, "maxiter": 20000},
    ).x
    assert np.allclose(p.theta, ref, atol=1e-5)
    assert obj(p.theta) <= obj(ref) + 1e-9


def test_huber_refit_uses_hvt_ucb_sigma_tau_and_bonus():
    from streambandit.policies import make_policy

    rng = np.random.default_rng(2)
    arms = unit_rows(rng.standard_normal((10, 2)))
    p = HuberRefit(2, epsilon=0.99, nu=1.31, horizon=100)
    h = make_policy("hvt_ucb", dim=2, epsilon=0.99, nu=1.31, horizon=100)
    for t in range(30):
        x = arms[t % 10]
        r = float(rng.standard_normal())
        assert p._sigma_tau(x)[0] == pytest.approx(h.sigma_t(x))
        p.update(x, r)
        h.update(x, r)
    assert np.allclose(p._hvt.vinv, h.vinv)


class _Progress:
    def __init__(self):
        self.n = 0

    def __call__(self, n):
        assert n > 0
        self.n += n


@pytest.mark.parametrize("module", [glb_omd_logistic, glb_omd_poisson, hvt_ucb])
def test_experiment_tiny(module):
    prog = _Progress()
    start = time.perf_counter()
    res = module.run(size="tiny", seeds=None, progress=prog)
    elapsed = time.perf_counter() - start
    assert elapsed < 20.0
    assert res.name == module.NAME
    assert prog.n == module.total_rounds(size="tiny", seeds=None)
    settings = sorted({c.setting for c in res.curves})
    learners = sorted({c.learner for c in res.curves})
    assert len(settings) >= 2 and len(learners) == 3
    rounds = module.SIZES["tiny"][0]
    assert len(res.curves) == len(settings) * len(learners) * module.SIZES["tiny"][1]
    for c in res.curves:
        assert c.regret.shape == (rounds,) and c.seconds.shape == (rounds,)
        assert np.all(np.isfinite(c.regret)) and np.all(np.isfinite(c.seconds))
        assert np.all(np.diff(c.regret) >= -1e-9) and np.all(np.diff(c.seconds) >= 0)
    assert res.summary and res.choices
    for s in settings:
        assert s in res.summary


@pytest.mark.parametrize("module", [glb_omd_logistic, glb_omd_poisson, hvt_ucb])
def test_total_rounds_counts_seeds(module):
    assert module.total_rounds(size="tiny", seeds=2) == 2 * module.total_rounds(
        size="tiny", seeds=1
    )
    with pytest.raises(ValueError):
        module.total_rounds(size="huge", seeds=None)
