"""Frequent Directions (FD) and robust FD with a row buffer: the sketches Dyadic Block Sketching stacks.

Wen, Yin, Zhang, Zhao, Zhang, Wei, "Revisiting Matrix Sketching in Linear Bandits: Achieving
Sublinear Regret via Dyadic Block Sketching" (arXiv:2410.10258v2), Algorithms 2 and 3 (App. B.1)
and the buffered "efficient implementation" of Remark 1 / App. B.2.

The buffered form appends raw rows and runs one SVD when the buffer is full:

* ``fast=True`` (the paper's experiments, Remark 1): a buffer of 2l rows, shrunk by
  ``sigma_{l+1}^2`` back to at most l rows, i.e. one SVD per l rows. The paper leaves the shrink
  index open; ``sigma_{l+1}`` is the usual fast-FD choice.
* ``fast=False`` (Algorithms 2/3 exactly): a buffer of l rows shrunk by ``sigma_l^2``, keeping
  l - 1 rows. Algorithm 2 runs an SVD for every row, but while fewer than l rows are held its shrink
  ``sigma_l^2`` is 0 and the SVD only rotates S, which leaves ``S'S`` (all any query uses) unchanged;
  so the SVD is run only when the buffer is full.

Guarantee (Lemma 1; Ghashami et al. 2016): if each shrink subtracts ``sigma_{keep+1}^2`` and keeps at
most ``keep`` rows, every shrink removes at least ``(keep+1) delta`` of squared Frobenius mass, so
``0 <= X'X - S'S <= (sum of delta) I`` and ``sum delta <= ||X - X_k||_F^2 / (keep + 1 - k)`` for
every ``k <= keep``: with keep = l (fast) or l - 1 (plain) this is Lemma 1's ``/(l - k)``.

Robust FD (Algorithm 3; Chen et al. 2020's SCFD, *not* the delta/2 RFD of Luo et al.)
keeps ``alpha`` = the FULL accumulated shrink and approximates ``X'X`` by ``S'S + alpha I``, which
then over-estimates: ``0 <= S'S + alpha I - X'X <= alpha I`` (Lemma 4).
"""

from __future__ import annotations

import numpy as np

__all__ = ["FrequentDirections", "fd_shrink", "numerical_rank_cut", "svd_rows"]


def svd_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Singular values (descending) and right singular vectors of ``rows`` (n x d).

    LAPACK's gesdd occasionally fails to converge; gesvd is the slower, robust fallback. U is never
    needed.
    """
    try:
        _, s, vt = np.linalg.svd(rows, full_matrices=False)
    except np.linalg.LinAlgError:
        # On use, not at the top: importing scipy.linalg adds ~0.2 s to every command.
        import scipy.linalg

        _, s, vt = scipy.linalg.svd(rows, full_matrices=False, lapack_driver="gesvd")
    return s, vt


def numerical_rank_cut(s: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """``s`` with the singular values that are rounding noise of an exactly rank-deficient matrix set to 0.

    The cut is numpy's matrix_rank default, ``max(shape) * eps * sigma_1``: below it a direction is
    not distinguishable from zero in float64, so dropping it does not change ``S'S`` beyond rounding.
    """
    if s.size == 0:
        return s
    tol = max(shape) * np.finfo(np.float64).eps * s[0]
    return np.where(s > tol, s, 0.0)


def fd_shrink(rows: np.ndarray, keep: int) -> tuple[np.ndarray, float]:
    """One FD shrink of a buffer: ``(S_new, delta)`` with at most ``keep`` orthogonal rows.

    Alg. 2/3: ``[U, Sigma, V] = svd(S)``, ``delta = sigma_{keep+1}^2``,
    ``S <- sqrt(Sigma^2 - delta I) V'``. Rows whose new value is 0 (the (keep+1)-th and beyond, ties,
    and numerically-zero directions) are dropped so that the stack carries no zero rows.
    """
    s, vt = svd_rows(rows)
    s = numerical_rank_cut(s, rows.shape)
    delta = (
        float(s[keep] ** 2) if s.size > keep else 0.0
    )  # Alg. 2 "sigma <- sigma_l^2" (index keep+1)
    s2 = s[:keep] ** 2 - delta  # Alg. 2 "S <- sqrt(Sigma_l^2 - sigma I) V_l'"; >= 0 as s is sorted
    live = s2 > 0.0
    return np.sqrt(s2[live])[:, None] * vt[:keep][live], delta


class FrequentDirections:
    """A buffered FD (``robust=False``) or robust FD (``robust=True``) sketch of a stream of rows.

    Attributes:
      rows: the current sketch S (n x d), a view of a buffer of up to ``capacity`` rows (grown by
        doubling, so rows are written in place rather than re-stacked every round, and a block that
        receives few rows holds little memory).
      shrink_total: sum of every shrink ``delta`` so far (the paper's sigma-bar); ``||X'X - S'S|| <=``
        this, and for robust FD it is alpha.
    """

    def __init__(self, dim: int, ell: int, *, robust: bool = False, fast: bool = True) -> None:
        if ell < 1:
            raise ValueError(f"sketch size must be >= 1, got {ell}")
        self.dim = int(dim)
        self.ell = int(ell)
        self.robust = bool(robust)
        self.fast = bool(fast)
        # Remark 1: 2l-row buffer, shrink to l rows; Alg. 2: l-row buffer, shrink to l - 1 rows.
        self.capacity = 2 * self.ell if self.fast else self.ell
        self.keep = self.ell if self.fast else self.ell - 1
        self._buf = np.zeros(
            (0, self.dim)
        )  # allocated at the first row: an unused sketch holds no memory
        self._n = 0
        self.shrink_total = 0.0

    @property
    def rows(self) -> np.ndarray:
        return self._buf[: self._n]

    @rows.setter
    def rows(self, value: np.ndarray) -> None:
        if value.ndim != 2 or value.shape[1] != self.dim or value.shape[0] >= self.capacity:
            raise ValueError(
                f"FD rows must be (n < {self.capacity}, {self.dim}), got {value.shape}"
            )
        self._buf = np.array(
            value, dtype=np.float64, order="C"
        )  # grown to capacity at the next append
        self._n = value.shape[0]

    @property
    def alpha(self) -> float:
        """Robust FD's alpha (Alg. 3 ``alpha <- alpha + sigma``: the full shrink); 0 for plain FD."""
        return self.shrink_total if self.robust else 0.0

    @property
    def nbytes(self) -> int:
        """Bytes held: the whole preallocated buffer."""
        return int(self._buf.nbytes)

    def append(self, x: np.ndarray) -> bool:
        """Add row ``x``; returns True when the buffer filled and was shrunk (S changed beyond one
        appended row, so anything derived from S must be recomputed)."""
        if self._n == self._buf.shape[0]:  # grow geometrically up to the capacity
            grown = np.zeros((min(self.capacity, max(8, 2 * self._n)), self.dim))
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n] = x  # Alg. 2 "append x_t to the last row of S"
        self._n += 1
        if self._n < self.capacity:
            return False
        self.shrink(self.keep)
        return True

    def shrink(self, keep: int) -> float:
        """Shrink the buffer to at most ``keep`` rows now (an FD step: the guarantee holds for a shrink
        at any time); returns its delta."""
        new, delta = fd_shrink(self.rows, keep)
        self.shrink_total += delta  # Alg. 3 "alpha <- alpha + sigma"
        self._buf[: new.shape[0]] = new
        self._buf[new.shape[0] : self._n] = 0.0
        self._n = new.shape[0]
        return delta

    def covariance(self) -> np.ndarray:
        """The dense d x d approximation of X'X: ``S'S`` (FD) or ``S'S + alpha I`` (robust FD). Tests only."""
        s = self.rows
        return s.T @ s + self.alpha * np.eye(self.dim)
