"""Exact GP-UCB: the baseline BKB is compared with in the simulator (sim/experiments/bkb.py) and the
benchmark, and the oracle of tests/unit/policies/test_bkb.py. It shares no code with policies/bkb.py.

Calandriello et al., COLT 2019, eq. (1)-(3). Its own kernels
(scipy cdist), its own algebra.

Scale convention: :func:`gp_posterior` returns the GP-scale variance of eq. (2); :class:`ExactGPUCB`
returns sigma_t^2 / lambda (the 1/lambda scale BKB uses for sigma~^2), so that the
two learners can be compared number for number.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.linalg import cho_factor, cho_solve, solve_triangular
from scipy.spatial.distance import cdist

__all__ = ["ExactGPUCB", "effective_dimension", "gp_posterior", "kernel_diag", "kernel_matrix"]


def kernel_matrix(kernel: str, bandwidth: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """k(a_i, b_j): ``exp(-||a-b||^2 / (2 bandwidth^2))`` or ``a.b``."""
    if kernel == "linear":
        return a @ b.T
    return np.exp(-cdist(a, b, "sqeuclidean") / (2.0 * bandwidth**2))


def kernel_diag(kernel: str, a: np.ndarray) -> np.ndarray:
    return (a * a).sum(axis=1) if kernel == "linear" else np.ones(len(a))


def gp_posterior(
    kernel: str, bandwidth: float, lam: float, xs: np.ndarray, ys: np.ndarray, test: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Brute force eq. (1)-(2) over the full t x t kernel matrix of the pulls WITH repetition:
    ``mu = k_t(x)' (K_t + lam I)^-1 y_t``, ``sigma^2 = k(x,x) - k_t(x)' (K_t + lam I)^-1 k_t(x)``
    (GP scale)."""
    factor = cho_factor(kernel_matrix(kernel, bandwidth, xs, xs) + lam * np.eye(len(xs)))
    kt = kernel_matrix(kernel, bandwidth, xs, test)
    mu = kt.T @ cho_solve(factor, ys)
    var = kernel_diag(kernel, test) - (kt * cho_solve(factor, kt)).sum(axis=0)
    return mu, var


def effective_dimension(kernel: str, bandwidth: float, lam: float, xs: np.ndarray) -> float:
    """eq. (5): ``d_eff(lam, X_t) = Tr(K_t (K_t + lam I)^-1)`` over the pulls with repetition."""
    k = kernel_matrix(kernel, bandwidth, xs, xs)
    return float(np.trace(np.linalg.solve(k + lam * np.eye(len(xs)), k)))


class ExactGPUCB:
    """GP-UCB (eq. 3) with the exact posterior, kept as distinct points with pull counts.

    With N = diag(counts), r = reward sums and ``M = N^1/2 K_u N^1/2 + lam I`` (u x u), the
    posterior of eq. (1)-(2) over the t pulls is ``mu(x) = g' L^-1 N^-1/2 r`` and
    ``sigma^2(x) = k(x,x) - ||g||^2`` with ``g = L^-1 N^1/2 k_u(x)``, ``L L' = M`` (push-through
    identity; exact, not an approximation). Refactored from scratch on every update: O(u^3),
    and O(K u^2) to score K arms. u <= t distinct points.

    beta is the same practical rule as BKB's default, with the exact sum of variances.
    """

    def __init__(
        self,
        *,
        kernel: str = "rbf",
        bandwidth: float = 1.0,
        lam: float = 1.0,
        noise_sd: float = 1.0,
        F: float = 1.0,
        delta: float = 0.1,
        beta: float | None = None,
    ) -> None:
        self.kernel, self.bandwidth, self.lam = kernel, bandwidth, lam
        self.noise_sd, self.F, self.delta, self.fixed_beta = noise_sd, F, delta, beta
        self.points: list[np.ndarray] = []
        self.index: dict[bytes, int] = {}
        self.counts = np.zeros(0)
        self.sums = np.zeros(0)
        self.t = 0
        self._fit()

    @property
    def n_points(self) -> int:
        return len(self.points)

    def _fit(self) -> None:
        u = len(self.points)
        self._x = np.array(self.points).reshape(u, -1) if u else None
        if u == 0:
            self._chol, self._alpha, self.ssum = np.zeros((0, 0)), np.zeros(0), 0.0
            return
        sq = np.sqrt(self.counts)
        m = sq[:, None] * kernel_matrix(self.kernel, self.bandwidth, self._x, self._x) * sq[None, :]
        m[np.diag_indices(u)] += self.lam
        self._chol = np.linalg.cholesky(m)
        self._alpha = solve_triangular(self._chol, self.sums / sq, lower=True)
        self.ssum = float(self.counts @ self.posterior(self._x)[1])

    def posterior(self, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mu_t, sigma_t^2 / lam) of every arm."""
        kd = kernel_diag(self.kernel, arms)
        if not self.points:
            return np.zeros(len(arms)), kd / self.lam
        k = kernel_matrix(self.kernel, self.bandwidth, self._x, arms)
        g = solve_triangular(self._chol, np.sqrt(self.counts)[:, None] * k, lower=True)
        return g.T @ self._alpha, np.maximum(kd - (g * g).sum(axis=0), 0.0) / self.lam

    def beta(self) -> float:
        if self.fixed_beta is not None:
            return self.fixed_beta
        return math.sqrt(self.lam) * self.F + self.noise_sd * math.sqrt(
            math.log(max(self.t, 1)) * self.ssum + math.log(1.0 / self.delta)
        )

    def scores(self, arms: np.ndarray) -> np.ndarray:
        mu, s2 = self.posterior(arms)
        return mu + self.beta() * np.sqrt(s2)

    def select(self, arms: np.ndarray) -> int:
        return int(np.argmax(self.scores(arms)))

    def update(self, x: np.ndarray, reward: float) -> None:
        key = np.asarray(x, dtype=np.float64).tobytes()
        i = self.index.get(key)
        if i is None:
            self.index[key] = len(self.points)
            self.points.append(np.array(x, dtype=np.float64))
            self.counts = np.append(self.counts, 1.0)
            self.sums = np.append(self.sums, reward)
        else:
            self.counts[i] += 1.0
            self.sums[i] += reward
        self.t += 1
        self._fit()
