"""Full-pass baselines for the one-pass learners: they refit over ALL past data every round.

These exist for the paper experiments (``streambandit.sim.experiments``): GLB-OMD and Hvt-UCB
claim the regret of a full-pass estimator at a constant per-round cost. The baselines here are
that full-pass estimator with the same UCB shape ``x'theta + beta ||x||_{M^-1}``, so their
per-round time grows with t (that is the point). Pure numpy/scipy; duck-typed learners with the
``select(arms)`` / ``update(x, r)`` calls that :func:`streambandit.sim.runner.run_policy` makes.
They are NOT registered in ``streambandit.policies.POLICIES`` (not deployable learners).

- :class:`GLMUCBRefit`: GLM-UCB that refits the (ridge-regularised) maximum-likelihood estimate
  every round with scipy, warm-started from the previous estimate. Its confidence matrix is
  ``H(theta_hat) = lam I + sum_s mu'(x_s'theta_hat) x_s x_s'`` (recomputed over all data) and its
  radius is GLB-OMD's eq. (5) radius, so the two learners differ only in the estimator.
- :class:`HuberRefit`: HEAVY-OFUL-style adaptive Huber regression re-solved over all past data
  every round (eq. 6 of the Hvt-UCB paper), with the per-sample normalisation sigma_s and
  robustification tau_s computed exactly as Hvt-UCB computes them, and Hvt-UCB's V and beta for
  the bonus, so again only the estimator differs.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.optimize
import scipy.special

from streambandit.policies.hvt_ucb import HvtUCB

__all__ = ["GLMUCBRefit", "HuberRefit", "glm_nll", "huber_objective"]

_C_MU = {"logistic": lambda s: 0.25, "poisson": lambda s: math.exp(s)}
_R = {"logistic": 1.0, "poisson": 1.0}


def _mu(link: str, z: np.ndarray) -> np.ndarray:
    if link == "logistic":
        return scipy.special.expit(z)
    return np.exp(np.minimum(z, 700.0))


def _dmu(link: str, z: np.ndarray) -> np.ndarray:
    if link == "logistic":
        return scipy.special.expit(z) * scipy.special.expit(-z)
    return np.exp(np.minimum(z, 700.0))


def _log_partition(link: str, z: np.ndarray) -> np.ndarray:
    if link == "logistic":
        return np.logaddexp(0.0, z)
    return np.exp(np.minimum(z, 700.0))


def glm_nll(theta: np.ndarray, xs: np.ndarray, rs: np.ndarray, link: str, lam: float) -> float:
    """Ridge-regularised negative log-likelihood ``sum_s m(x_s'theta) - r_s x_s'theta + lam/2 ||theta||^2``."""
    z = xs @ theta
    return float(np.sum(_log_partition(link, z) - rs * z) + 0.5 * lam * float(theta @ theta))


def huber_objective(
    theta: np.ndarray,
    xs: np.ndarray,
    rs: np.ndarray,
    sigmas: np.ndarray,
    taus: np.ndarray,
    lam: float,
) -> float:
    """``lam/2 ||theta||^2 + sum_s f_{tau_s}((r_s - x_s'theta)/sigma_s)`` (Hvt-UCB paper eq. 6)."""
    z = (rs - xs @ theta) / sigmas
    return float(0.5 * lam * float(theta @ theta) + np.sum(scipy.special.huber(taus, z)))


class _Growing:
    """Rows appended one at a time into a doubling buffer (amortised O(1) append)."""

    def __init__(self, width: int) -> None:
        self._buf = np.empty((64, width))
        self.n = 0

    def append(self, row) -> None:
        if self.n == self._buf.shape[0]:
            self._buf = np.concatenate([self._buf, np.empty_like(self._buf)])
        self._buf[self.n] = row
        self.n += 1

    @property
    def data(self) -> np.ndarray:
        return self._buf[: self.n]


class GLMUCBRefit:
    """GLM-UCB with a maximum-likelihood refit over all past data each round.

    ``theta_hat_t = argmin_theta sum_{s<t} (m(x_s'theta) - r_s x_s'theta) + lam/2 ||theta||^2`` by
    scipy's ``trust-exact`` (Newton with a trust region: exact gradient and Hessian), warm-started
    at the previous estimate; ``H_t = lam I + sum_s mu'(x_s'theta_hat_t) x_s x_s'``;
    ``score = x'theta_hat + beta_t ||x||_{H_t^-1}`` with beta_t = GLB-OMD's eq. (5) (lam = d,
    eta = 1 + R S, delta) times ``beta_scale``. Time and memory per round are O(t d^2).
    """

    name = "glm_ucb_refit"

    def __init__(
        self,
        dim: int,
        *,
        link: str = "logistic",
        S: float = 3.0,
        lam: float | None = None,
        delta: float = 0.05,
        beta_scale: float = 1.0,
        gtol: float = 1e-8,
    ) -> None:
        if link not in _C_MU:
            raise ValueError(f"link must be one of {', '.join(_C_MU)}, got {link!r}")
        self.dim = dim
        self.link = link
        self.lam = float(dim) if lam is None else float(lam)
        self.gtol = gtol
        eta = 1.0 + _R[link] * S
        self._beta_const = 4.0 * self.lam * S * S + 2.0 * eta * math.log(1.0 / delta)
        self._beta_log_coef = 6.0 * dim * eta * eta
        self._beta_t_coef = 2.0 * _C_MU[link](S) / self.lam
        self.beta_scale = beta_scale
        self.theta = np.zeros(dim)
        self.hinv = np.eye(dim) / self.lam
        self._x = _Growing(dim)
        self._r = _Growing(1)
        self.n_updates = 0
        self.fit_iterations = 0  # total optimiser iterations, for diagnostics

    def beta(self) -> float:
        t = self.n_updates + 1
        return self.beta_scale * math.sqrt(
            self._beta_const + self._beta_log_coef * math.log(2.0 + self._beta_t_coef * t)
        )

    def scores(self, arms: np.ndarray) -> np.ndarray:
        q = np.einsum("kd,de,ke->k", arms, self.hinv, arms)
        return arms @ self.theta + self.beta() * np.sqrt(np.maximum(q, 0.0))

    def select(self, arms: np.ndarray) -> int:
        return int(np.argmax(self.scores(np.asarray(arms, dtype=float))))

    # -- the refit -------------------------------------------------------------------------------

    def _fun(self, theta, xs, rs):
        z = xs @ theta
        f = float(
            np.sum(_log_partition(self.link, z) - rs * z) + 0.5 * self.lam * float(theta @ theta)
        )
        g = xs.T @ (_mu(self.link, z) - rs) + self.lam * theta
        return f, g

    def _hess(self, theta, xs, rs):
        w = _dmu(self.link, xs @ theta)
        return (xs * w[:, None]).T @ xs + self.lam * np.eye(self.dim)

    def fit(self) -> np.ndarray:
        """Refit the regularised MLE over all stored data (warm start at the current estimate)."""
        xs, rs = self._x.data, self._r.data[:, 0]
        res = scipy.optimize.minimize(
            self._fun,
            self.theta,
            args=(xs, rs),
            jac=True,
            hess=self._hess,
            method="trust-exact",
            options={"gtol": self.gtol},
        )
        self.fit_iterations += int(res.nit)
        return res.x

    def update(self, x: np.ndarray, r: float) -> None:
        self._x.append(np.asarray(x, dtype=float))
        self._r.append([float(r)])
        self.n_updates += 1
        self.theta = self.fit()
        self.hinv = np.linalg.inv(self._hess(self.theta, self._x.data, None))

    def memory_bytes(self) -> int:
        return int(self._x.n * (self.dim + 1) * 8 + 2 * self.dim * self.dim * 8)


class HuberRefit:
    """Full-pass adaptive Huber regression re-solved over all past data each round (HEAVY-OFUL-style).

    ``theta_hat_t = argmin_theta lam/2 ||theta||^2 + sum_{s<t} f_{tau_s}((r_s - x_s'theta)/sigma_s)``
    by scipy L-BFGS-B (the Huber loss is C^1), warm-started at the previous estimate. sigma_s and
    tau_s are computed at decision time exactly as Hvt-UCB does (Alg. 1 lines 5-6, with the eq. 17
    term), from an internal :class:`~streambandit.policies.hvt_ucb.HvtUCB` (same hyper-parameters)
    that also supplies V_{t-1} and beta_{t-1} for the bonus ``beta_{t-1} ||x||_{V_{t-1}^-1}``. The
    internal learner's own one-pass iterate is never used for decisions. Time per round O(t d) per
    optimiser iteration; memory O(t d).
    """

    name = "huber_refit"

    def __init__(self, dim: int, *, gtol: float = 1e-9, **hvt_kwargs) -> None:
        self.dim = dim
        self._hvt = HvtUCB(dim, **hvt_kwargs)
        self.lam = float(self._hvt._config["lam"])
        self.gtol = gtol
        self.theta = np.zeros(dim)
        self._x = _Growing(dim)
        self._rst = _Growing(3)  # r, sigma, tau
        self.n_updates = 0
        self.fit_iterations = 0

    def scores(self, arms: np.ndarray) -> np.ndarray:
        h = self._hvt
        q = np.einsum("kd,de,ke->k", arms, h.vinv, arms)
        return arms @ self.theta + h.beta(h.n_updates) * np.sqrt(np.maximum(q, 0.0))

    def select(self, arms: np.ndarray) -> int:
        return int(np.argmax(self.scores(np.asarray(arms, dtype=float))))

    def _sigma_tau(self, x: np.ndarray) -> tuple[float, float]:
        h = self._hvt
        t = h.n_updates + 1
        n = math.sqrt(max(float(x @ (h.vinv @ x)), 0.0))
        if n == 0.0:
            return max(h._config["nu"], h._config["sigma_min"]), math.inf
        sigma = h._sigma(n)
        w = n / (sigma * h._sqrt_alpha)
        tau = h.tau0 * math.sqrt(1.0 + w * w) / w * t**h._p if h._config["huber"] else math.inf
        return sigma, tau

    @staticmethod
    def _fun(theta, xs, rs, sig, tau, lam):
        z = (rs - xs @ theta) / sig
        az = np.abs(z)
        inside = az <= tau
        f = 0.5 * lam * float(theta @ theta) + float(
            np.sum(np.where(inside, 0.5 * z * z, tau * az - 0.5 * tau * tau))
        )
        psi = np.clip(z, -tau, tau)
        g = lam * theta - xs.T @ (psi / sig)
        return f, g

    def fit(self) -> np.ndarray:
        xs = self._x.data
        rst = self._rst.data
        res = scipy.optimize.minimize(
            self._fun,
            self.theta,
            args=(xs, rst[:, 0], rst[:, 1], rst[:, 2], self.lam),
            jac=True,
            method="L-BFGS-B",
            options={"gtol": self.gtol, "ftol": 1e-15, "maxiter": 500},
        )
        self.fit_iterations += int(res.nit)
        return res.x

    def update(self, x: np.ndarray, r: float) -> None:
        x = np.asarray(x, dtype=float)
        sigma, tau = self._sigma_tau(x)
        self._x.append(x)
        self._rst.append([float(r), sigma, tau])
        self._hvt.update(x, r)  # advances V, t and beta exactly as Hvt-UCB would
        self.n_updates += 1
        self.theta = self.fit()

    def memory_bytes(self) -> int:
        return int(self._x.n * (self.dim + 3) * 8 + 2 * self.dim * self.dim * 8)
