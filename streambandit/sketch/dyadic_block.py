"""Dyadic Block Sketching (DBS): FD / robust FD blocks whose sketch sizes double, within an error budget.

Wen, Yin, Zhang, Zhao, Zhang, Wei, "Revisiting Matrix Sketching in Linear Bandits: Achieving
Sublinear Regret via Dyadic Block Sketching" (arXiv:2410.10258v2), Sec. 3, Algorithm 1 and its fast
variant Algorithm 4 (App. B.2).

The stream is cut into consecutive blocks i = 0, 1, ...; block i is sketched by its own FD of size
``l_i = 2^i l0``. The active block closes when its squared Frobenius mass would reach ``eps * l0``
*and* the next row would make its sketch lossy (willExcessSketch). A closed block then has error
``<= eps l0 / l_i = eps / 2^i`` or none, so the whole stack has ``||X'X - S'S|| <= 2 eps`` (Thm. 1,
by decomposability, Lemma 3). Once ``floor(log2(d/l0 + 1)) - 1`` blocks are closed (Invariant 2)
the sketch stops and every later row is added exactly, by Sherman-Morrison on a d x d inverse: from
then on DBS *is* OFUL. ``eps`` is in squared-norm units.

Choices the paper leaves open, and the ones made here:

* willExcessSketch (Alg. 1 line 6) is True iff the block's raw rows plus x would have rank above
  what its sketch keeps exactly (l_i rows fast, l_i - 1 plain), i.e. iff the next FD shrink would be
  nonzero. The rank is tracked by an orthonormal basis of the block's rows, built (one SVD of the
  buffer) when the test first runs in a block and then grown by Gram-Schmidt, O(d l) per row; it is
  dropped as soon as the rank exceeds the sketch, so a full-rank stream never holds it. While the block holds
  fewer rows than its sketch size the test is skipped and taken as True (App. B.1's sentinel,
  ``rank_test="b1"``, default); ``rank_test="d2"`` skips it below d rows instead (App. D.2).
* ``fast=True`` is Algorithm 4 (2l buffers, M grown by eq. 7 between shrinks); ``fast=False`` is
  Algorithm 1 with the l-row FD of Algorithm 2.
* A closed block is shrunk to its sketch size once more and the frozen stack compacted losslessly
  (:meth:`SketchedCovariance.freeze`).
* The exact fallback materialises ``A_hat^-1 = (I - S'MS)/lam'`` once and then updates it by
  Sherman-Morrison; lam' (robust FD) is frozen from then on.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streambandit.numerics.linalg import sherman_morrison_update, sym_matvec
from streambandit.sketch.frequent_directions import svd_rows
from streambandit.sketch.woodbury import SketchedCovariance

__all__ = ["DyadicBlockSketch", "max_blocks"]

RANK_TESTS = ("b1", "d2")


def max_blocks(dim: int, l0: int) -> int:
    """Invariant 2: ``Bmax = floor(log2(d/l0 + 1))``, in exact integer arithmetic (the largest B
    with ``2^B l0 <= d + l0``)."""
    b = 0
    while (2 ** (b + 1)) * l0 <= dim + l0:
        b += 1
    return b


class DyadicBlockSketch:
    """Alg. 1 / Alg. 4 with the inverse queries of eq. (5), or exact OFUL updates after the cap.

    Attributes:
      cov: the stacked sketch ``[closed blocks; active block]`` and its Woodbury inverse.
      block_shrink, block_mass: per closed block, its total FD shrink (sigma-bar_i, the alpha_i of
        robust FD) and its BlockSize (squared Frobenius mass). After the switch to exact updates the
        block that was active then is listed too.
      active_mass, active_rows, active_excess: the active block's BlockSize, raw row count, and
        whether its rows' rank already exceeds what its sketch keeps (sticky).
      basis: orthonormal rows spanning the active block's raw rows, once the rank test runs and
        while that rank fits in the sketch.
      fallback, vinv: whether the exact mode is on, and ``A_hat^-1`` (d x d) in it.
    """

    def __init__(
        self,
        dim: int,
        l0: int,
        eps: float,
        lam: float,
        *,
        robust: bool = False,
        fast: bool = True,
        rank_test: str = "b1",
        rank_tol: float = 1e-10,
    ) -> None:
        if rank_test not in RANK_TESTS:
            raise ValueError(f"rank_test must be one of {RANK_TESTS}, got {rank_test!r}")
        self.dim = int(dim)
        self.l0 = int(l0)
        self.eps = float(eps)
        self.lam = float(lam)
        self.robust = bool(robust)
        self.fast = bool(fast)
        self.rank_test = rank_test
        self.rank_tol = float(rank_tol)
        self.bmax = max_blocks(self.dim, self.l0)
        self.cov = SketchedCovariance(
            self.dim, self.block_ell(0), self.lam, robust=self.robust, fast=self.fast
        )
        self.block_shrink = np.zeros(0)
        self.block_mass = np.zeros(0)
        self.active_mass = 0.0
        self.active_rows = 0
        self.active_excess = False
        self.basis = np.zeros((0, self.dim))
        self.fallback = False
        self.vinv = np.zeros((0, 0))
        if self._cap_reached():  # l0 > d/3: Bmax <= 1 and DBS is OFUL from round 1
            self._start_fallback()

    # -- structure ----------------------------------------------------------------------------

    def block_ell(self, i: int) -> int:
        """Sketch size of block i: ``2^i l0`` (Alg. 1 line 11), capped at d."""
        return min(self.l0 * 2**i, self.dim)

    @property
    def n_closed(self) -> int:
        """Closed blocks (len(L) of Alg. 1); in the exact mode, also the block active at the switch."""
        return int(self.block_shrink.shape[0])

    @property
    def active_ell(self) -> int:
        return self.block_ell(self.n_closed)

    @property
    def shrink_total(self) -> float:
        """E_t = sum of all blocks' shrinks, the sketch's certified spectral error (<= 2 eps, Thm. 1)."""
        if self.fallback:
            return float(np.sum(self.block_shrink))
        return self.cov.shrink_total

    @property
    def lam_eff(self) -> float:
        """lam' = lambda (FD) or lambda + the sum of every block's alpha (robust FD)."""
        return self.lam + (self.shrink_total if self.robust else 0.0)

    @property
    def nbytes(self) -> int:
        return int(
            self.cov.nbytes
            + self.basis.nbytes
            + self.vinv.nbytes
            + self.block_shrink.nbytes
            + self.block_mass.nbytes
        )

    def _cap_reached(self) -> bool:
        return self.n_closed >= self.bmax - 1  # Alg. 1 line 3 / Alg. 4 line 5 (Invariant 2)

    # -- updates ------------------------------------------------------------------------------

    def update(self, x: np.ndarray) -> None:
        """Process one row (Alg. 4, or Alg. 1 when ``fast=False``)."""
        if not self.fallback and self._cap_reached():
            self._start_fallback()
        if self.fallback:
            sherman_morrison_update(self.vinv, x)  # Alg. 4 line 6: exact rank-1 modification
            return
        x_sq = float(x @ x)
        will_excess, unit = self._will_excess(x)  # Alg. 4 line 8
        # Alg. 4 line 9 keeps the block if BlockSize + ||x||^2 < eps l0 (strict) or not
        # willExcess; otherwise (line 21) the block closes before x joins the next one.
        if self.active_mass + x_sq >= self.eps * self.l0 and will_excess:
            self._close_active_block()  # Alg. 4 lines 22-25
        elif unit is not None:
            self._grow_basis(unit)
        self.cov.update(
            x
        )  # Alg. 4 lines 11-20 / 26-29: append, shrink when full, M by eq. (3) or (7)
        self.active_mass += x_sq  # Alg. 4 line 10 / 26: BlockSize += ||x||^2
        self.active_rows += 1
        if self.cov.fd.shrink_total > 0.0 and not self.active_excess:
            self._exceeded()  # a nonzero shrink: the block's rank is above its sketch

    def _sentinel(self) -> int:
        """Rows below which willExcessSketch is not tested: the sketch size (App. B.1) or d (D.2)."""
        return self.active_ell if self.rank_test == "b1" else self.dim

    def _will_excess(self, x: np.ndarray) -> tuple[bool, np.ndarray | None]:
        """willExcessSketch (would adding x make the active block's sketch lossy?) and, when the
        test ran, x's unit component outside the block's span (None if x is inside it)."""
        if self.active_excess:
            return True, None
        if self.active_rows < self._sentinel():
            return True, None  # App. B.1 / D.2: the test is skipped and taken as True
        if self.active_rows == self._sentinel():
            self._build_basis()  # the first test in this block
            if self.active_excess:
                return True, None
        unit = self._residual(x)
        return unit is not None and self.basis.shape[0] >= self.cov.fd.keep, unit

    def _build_basis(self) -> None:
        """An orthonormal basis of the active block's raw rows. No shrink so far was nonzero (that
        would have made the block lossy already), so the FD rows span exactly the raw rows."""
        s, vt = svd_rows(self.cov.fd.rows)
        live = s * s > self.rank_tol * (s[0] * s[0] if s.size else 0.0)
        if int(live.sum()) > self.cov.fd.keep:
            self._exceeded()
        else:
            self.basis = vt[live].copy()

    def _residual(self, x: np.ndarray) -> np.ndarray | None:
        """The unit component of x outside span(basis), or None if x is (numerically) inside it."""
        q = self.basis
        res = x - q.T @ (q @ x)
        res -= q.T @ (q @ res)  # Gram-Schmidt twice: orthogonal to rounding level
        r2 = float(res @ res)
        if r2 <= self.rank_tol * float(x @ x) or r2 == 0.0:
            return None
        return res / np.sqrt(r2)

    def _grow_basis(self, unit: np.ndarray) -> None:
        """x joins the block and raises its rank: past the sketch's exact capacity only that fact
        matters (sticky) and the basis is dropped."""
        if self.basis.shape[0] >= self.cov.fd.keep:
            self._exceeded()
        else:
            self.basis = np.vstack([self.basis, unit])

    def _exceeded(self) -> None:
        self.active_excess = True
        self.basis = np.zeros((0, self.dim))

    def _close_active_block(self) -> None:
        """Alg. 4 lines 22-25: freeze B*, append it to L, open a block of twice the sketch size."""
        next_ell = self.block_ell(self.n_closed + 1)
        closed = self.cov.freeze(next_ell)
        self.block_shrink = np.append(self.block_shrink, closed)
        self.block_mass = np.append(self.block_mass, self.active_mass)
        self.cov.frozen_shrink = float(np.sum(self.block_shrink))
        self.cov.recompute()  # the frozen stack was re-orthogonalised: M from scratch (diagonal)
        self.active_mass, self.active_rows, self.active_excess = 0.0, 0, False
        self.basis = np.zeros((0, self.dim))

    def _start_fallback(self) -> None:
        """Alg. 4 line 5-6: materialise A_hat^-1 once; the sketch is dropped."""
        self.vinv = self.cov.dense_inverse()
        if self.active_rows > 0:  # the block active at the switch keeps its error: list it
            self.block_shrink = np.append(self.block_shrink, self.cov.fd.shrink_total)
            self.block_mass = np.append(self.block_mass, self.active_mass)
        self.cov = SketchedCovariance(self.dim, 1, self.lam, robust=self.robust, fast=self.fast)
        self.active_mass, self.active_rows, self.active_excess = 0.0, 0, False
        self.basis = np.zeros((0, self.dim))
        self.fallback = True

    # -- queries ------------------------------------------------------------------------------

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``A_hat^-1 v`` (eq. 5), or ``vinv @ v`` in the exact mode."""
        if self.fallback:
            return sym_matvec(self.vinv, v)  # OFUL's theta = V^-1 b, to the bit
        return self.cov.solve(v)

    def covariance(self) -> np.ndarray:
        """The dense approximation of X'X (``A_hat - lambda I``). Tests only."""
        if self.fallback:
            return np.linalg.inv(self.vinv) - self.lam * np.eye(self.dim)
        return self.cov.covariance()

    # -- state --------------------------------------------------------------------------------

    ARRAYS = ("block_shrink", "block_mass", "frozen", "active", "minv", "basis", "vinv")
    SCALARS = ("active_shrink", "active_mass", "active_rows", "active_excess", "fallback")

    def state(self) -> dict[str, Any]:
        """Arrays (not copied) and scalars that determine this sketch, by name."""
        return {
            "block_shrink": self.block_shrink,
            "block_mass": self.block_mass,
            "frozen": self.cov.frozen,
            "active": self.cov.fd.rows,
            "minv": self.cov.minv,
            "basis": self.basis,
            "vinv": self.vinv,
            "active_shrink": self.cov.fd.shrink_total,
            "active_mass": self.active_mass,
            "active_rows": self.active_rows,
            "active_excess": self.active_excess,
            "fallback": self.fallback,
        }

    def restored(self, state: dict[str, Any]) -> "DyadicBlockSketch":
        """A sketch with this configuration and ``state``; ValueError if the state is inconsistent."""
        new = DyadicBlockSketch(
            self.dim,
            self.l0,
            self.eps,
            self.lam,
            robust=self.robust,
            fast=self.fast,
            rank_test=self.rank_test,
            rank_tol=self.rank_tol,
        )
        shrink, mass = state["block_shrink"], state["block_mass"]
        if shrink.ndim != 1 or mass.shape != shrink.shape:
            raise ValueError(
                f"block_shrink {shrink.shape} and block_mass {mass.shape} must be equal-length vectors"
            )
        fallback = state["fallback"]
        vinv = state["vinv"]
        if vinv.shape != ((self.dim, self.dim) if fallback else (0, 0)):
            raise ValueError(f"vinv has shape {vinv.shape}, which does not fit fallback={fallback}")
        basis = state["basis"]
        if basis.ndim != 2 or basis.shape[1] != self.dim:
            raise ValueError(f"basis must be (q, {self.dim}), got {basis.shape}")
        new.block_shrink, new.block_mass, new.basis, new.vinv = shrink, mass, basis, vinv
        new.active_mass, new.active_rows = state["active_mass"], state["active_rows"]
        new.active_excess, new.fallback = state["active_excess"], fallback
        if fallback:
            if state["frozen"].shape[0] or state["active"].shape[0] or state["minv"].size:
                raise ValueError("a sketch in the exact mode holds no sketch rows")
            new.cov = SketchedCovariance(self.dim, 1, self.lam, robust=self.robust, fast=self.fast)
            return new
        if shrink.shape[0] > self.bmax - 1 or self.bmax <= 1:
            raise ValueError(
                f"{shrink.shape[0]} closed blocks and still sketching: the cap is {self.bmax} blocks "
                "(Invariant 2)"
            )
        new.cov = self.cov.restore(
            state["frozen"],
            state["active"],
            state["minv"],
            float(np.sum(shrink)),
            state["active_shrink"],
            new.active_ell,
        )
        if basis.shape[0] > new.cov.fd.keep:
            raise ValueError(
                f"basis has {basis.shape[0]} rows, more than the active sketch keeps ({new.cov.fd.keep})"
            )
        return new
