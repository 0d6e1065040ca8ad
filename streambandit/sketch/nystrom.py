"""The Nystrom dictionary and DTC posterior of BKB.

Calandriello, Carratino, Lazaric, Valko, Rosasco, "Gaussian Process Optimization with Adaptive
Sketching: Scalable and No Regret", COLT 2019.

Pure numpy/scipy, float64. Three pieces:

* :class:`Kernel`: the GP covariance k on feature vectors (RBF or linear).
* :func:`resample_dictionary`: Fig. 1's inner loop, posterior-variance (ridge leverage score)
  sampling of the inducing points, drawn afresh over every pulled point.
* :class:`DTCPosterior`: the Nystrom embedding ``z(x) = (K_S^{1/2})^+ k_S(x)`` (Sec. 3.1) and the
  approximate posterior of eq. (4), in the count form of Sec. 3.2 (distinct points with pull
  counts and reward sums), fitted once per dictionary.

Variance scale: every ``s2`` here is BKB's sigma~^2, the GP posterior variance
DIVIDED BY lambda (a lambda-ridge leverage score). It is the scale of the UCB, of the inclusion
probability ``min(1, qbar * s2)`` and of beta~; multiply by lambda for GP units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from streambandit.numerics import rowwise

__all__ = [
    "KERNELS",
    "Kernel",
    "DTCPosterior",
    "inclusion_probabilities",
    "resample_dictionary",
    "resampling_rng",
]

KERNELS = ("rbf", "linear")

# Tags the resampling stream so that a BKB seed never shares draws with another use of the seed.
_RESAMPLE_STREAM = 0xB4B


@dataclass(frozen=True)
class Kernel:
    """``k(x, x') = exp(-||x - x'||^2 / (2 bandwidth^2))`` (``rbf``) or ``x . x'`` (``linear``;
    the bandwidth is unused). Both are bounded on bounded arms, as the paper requires (Sec. 2)."""

    name: str
    bandwidth: float = 1.0

    def __post_init__(self) -> None:
        if self.name not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {self.name!r}")
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0.0):
            raise ValueError(f"bandwidth must be a finite number > 0, got {self.bandwidth!r}")

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The (len(a), len(b)) kernel matrix, row by row (``streambandit.numerics.rowwise``): row i depends
        on ``a[i]`` alone, so identical arms get identical kernel rows wherever they stand."""
        if self.name == "linear":
            return rowwise.matmul(a, np.ascontiguousarray(b.T))
        out = rowwise.sq_distances(a, b)
        out *= -0.5 / self.bandwidth**2
        return np.exp(out, out=out)

    def diag(self, a: np.ndarray) -> np.ndarray:
        """``k(x, x)`` for every row of ``a``."""
        if self.name == "linear":
            return rowwise.rowdot(a, a)
        return np.ones(a.shape[0])


def inclusion_probabilities(s2: np.ndarray, qbar: float) -> np.ndarray:
    """Fig. 1: ``p~_{t+1,i} = qbar * sigma~_t^2(x~_i)``, clipped to 1 (the paper allows p~ > 1
    "with abuse of notation"). ``qbar = inf`` includes every point."""
    if math.isinf(qbar):
        return np.ones_like(s2)
    return np.minimum(qbar * s2, 1.0)


def resampling_rng(seed: int, step: int) -> np.random.Generator:
    """The generator of the dictionary draw at update number ``step``: a function of the
    configured seed and the step only (docs/design.md, determinism), so replaying the same updates redraws the
    same dictionaries and nothing about the generator needs saving."""
    return np.random.default_rng(
        np.random.SeedSequence([seed & 0xFFFF_FFFF_FFFF_FFFF, step, _RESAMPLE_STREAM])
    )


def resample_dictionary(
    s2: np.ndarray, counts: np.ndarray, qbar: float, rng: np.random.Generator
) -> np.ndarray:
    """Fig. 1, lines "for i = 1..t+1": a fresh dictionary over the pulled points, as a bool mask.

    ``s2[i]`` is sigma~_t^2 at distinct pulled point i (previous step's posterior: approximations
    (a) and (b) of Sec. 3.1) and ``counts[i]`` its pulls including the one being added. All
    ``counts[i]`` copies of a point share p_i, and the dictionary's span only depends on whether
    at least one copy is drawn, so the point enters with probability ``1 - (1 - p_i)^n_i``: one
    uniform per distinct point instead of one per pull.

    All draws can fail when qbar is small; the point most likely to be drawn (lowest index on a
    tie) is then kept, so the dictionary is never empty.
    """
    p = inclusion_probabilities(s2, qbar)
    keep = 1.0 - (1.0 - p) ** counts
    mask = rng.random(s2.shape[0]) < keep
    if s2.shape[0] and not mask.any():
        mask[int(np.argmax(keep))] = True
    return mask


def _root_pinv(k_ss: np.ndarray) -> np.ndarray:
    """``R`` (m, r) with ``z(x) = R' k_S(x)``: Sec. 3.1's ``(K_S^{1/2})^+ k_S(x)`` up to a rotation.

    With ``K_S = U diag(s) U'``, ``(K_S^{1/2})^+ = U_r diag(s_r^{-1/2}) U_r'`` over the eigenvalues
    kept. Dropping the leading ``U_r`` rotates every z by the same orthogonal map, which leaves
    mu~ and sigma~ unchanged, and gives r = numerical rank coordinates.
    Eigenvalues below ``s_max * m * eps`` are treated as 0 (the pseudo-inverse; duplicated or
    collinear points add nothing): never a Cholesky of K_S.
    """
    m = k_ss.shape[0]
    if m == 0:
        return np.zeros((0, 0))
    s, u = np.linalg.eigh(k_ss)
    keep = s > max(float(s[-1]), 0.0) * m * np.finfo(np.float64).eps
    return u[:, keep] / np.sqrt(s[keep])


class DTCPosterior:
    """BKB's approximate posterior (eq. 4) for a fixed dictionary S, fitted from count statistics.

    ``points`` (u, d) are the distinct pulled points, ``counts`` their pulls and ``reward_sums``
    the sums of their rewards: exact sufficient statistics, since (Sec. 3.2)
    ``Z_t' Z_t = sum_i n_i z_i z_i'`` and ``Z_t' y_t = sum_i r_i z_i`` over the pulls with
    repetition. After fitting, :attr:`pulled_s2` holds sigma~^2 at every pulled point (the next
    resampling's input) and :meth:`mean_s2` scores any new point.

    Per fit: O(u m d) kernel evaluations, O(m^3) eigendecomposition, O(u m r + u r^2 + m r^2).
    Per scored point: O(m d) kernel evaluations and O(m r) (one row of k_S(x) times ``score_map``).
    r <= m is the numerical rank of K_S.
    """

    __slots__ = ("kernel", "lam", "dict_points", "score_map", "pulled_s2")

    def __init__(
        self,
        kernel: Kernel,
        lam: float,
        dict_points: np.ndarray,
        points: np.ndarray,
        counts: np.ndarray,
        reward_sums: np.ndarray,
        root: np.ndarray | None = None,
    ) -> None:
        """``root`` may pass the :func:`_root_pinv` of ``kernel(dict_points, dict_points)``
        when the caller has it from the same dictionary (it is a pure function of it)."""
        self.kernel = kernel
        self.lam = float(lam)
        self.dict_points = dict_points
        # Sec. 3.1: the embedding z(x) = R' k_S(x) of the dictionary.
        root = _root_pinv(kernel(dict_points, dict_points)) if root is None else root
        r = root.shape[1]
        k_ps = kernel(points, dict_points)
        z = k_ps @ root  # Z_P: the embedded distinct pulled points
        # Sec. 3.1: V_t = Z_t' Z_t + lam I, with Z_t' Z_t = Z_P' diag(n) Z_P (count form, Sec. 3.2).
        v = (z * counts[:, None].astype(np.float64)).T @ z
        v[np.diag_indices(r)] += self.lam
        # On use, not at the top: importing scipy.linalg adds ~0.2 s to every command.
        from scipy.linalg import solve_triangular

        chol = np.linalg.cholesky(v)  # V = L L', eigenvalues >= lam: well conditioned
        # eq. (4) mean, typo corrected: w = V^-1 Z_t(X_t)' y_t with Z_t' y_t = Z_P' r.
        y = solve_triangular(chol, z.T @ reward_sums, lower=True, check_finite=False)
        w = solve_triangular(chol, y, lower=True, trans="T", check_finite=False)
        # mu~(x) = z(x)' w = k_S(x)' (R w); z(x)' V^-1 z(x) = ||L^-1 R' k_S(x)||^2 = ||W' k_S(x)||^2
        # with W = R L^-T. Scoring is one product of k_S(x) with [R | W | R w].
        whiten = solve_triangular(chol, root.T, lower=True, check_finite=False).T
        self.score_map = np.hstack([root, whiten, (root @ w)[:, None]])
        self.pulled_s2 = self._mean_s2(k_ps, kernel.diag(points))[1]

    @property
    def size(self) -> int:
        """m, the number of dictionary points."""
        return self.dict_points.shape[0]

    @property
    def rank(self) -> int:
        """r, the embedding dimension (numerical rank of K_S)."""
        return (self.score_map.shape[1] - 1) // 2

    @property
    def root(self) -> np.ndarray:
        """R (m, r) of :func:`_root_pinv`, a pure function of the dictionary (a view)."""
        return self.score_map[:, : self.rank]

    def mean_s2(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """eq. (4): (mu~_t(x), sigma~_t^2(x)) for every row of x, sigma~^2 on the 1/lambda scale."""
        return self._mean_s2(self.kernel(x, self.dict_points), self.kernel.diag(x))

    def _mean_s2(self, k_xs: np.ndarray, kdiag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """eq. (4) from k_S(x): the variance ``(1/lam) (k(x,x) - z' Z'Z V^-1 z)`` is computed as
        ``(k(x,x) - ||z||^2) / lam + z' V^-1 z`` (since ``Z'Z V^-1 = I - lam V^-1``).

        The first term is the DTC residual that keeps the exact k(x,x): it is what stops variance
        starvation far from S. It must not be dropped (that is the SoR variance z' V^-1 z, which
        starves far from the dictionary). Rounding can push it slightly below 0; it is clamped.
        """
        # Row by row (streambandit.numerics.rowwise), so a point's mean and variance do not depend on the
        # other points scored with it: identical arms score identically on any CPU.
        r = self.rank
        proj = rowwise.matmul(k_xs, self.score_map)  # rows [z(x)' | (L^-1 z(x))' | mu~(x)]
        z, g = proj[:, :r], proj[:, r : 2 * r]
        residual = kdiag - rowwise.rowdot(z, z)
        np.maximum(residual, 0.0, out=residual)
        return proj[:, 2 * r], residual / self.lam + rowwise.rowdot(g, g)

    def nbytes(self) -> int:
        """Bytes of the fitted arrays: 8 (m d + 2 m r + m + u)."""
        return int(sum(getattr(self, k).nbytes for k in ("dict_points", "score_map", "pulled_s2")))
