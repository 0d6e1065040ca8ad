"""The sketched covariance ``A_hat = lam' I + S'S`` and its inverse through the Woodbury identity.

Wen et al., "Revisiting Matrix Sketching in Linear Bandits ... Dyadic Block Sketching"
(arXiv:2410.10258v2), Sec. 2.3, eqs. (3), (5) and (7).

For any r x d stack S (here: the frozen rows of closed blocks over the rows of the active FD sketch)

    A_hat^-1 = (I_d - S' M S) / lam',      M = (S S' + lam' I_r)^-1                        (eq. 5)

so ``A_hat^-1 v`` and ``x' A_hat^-1 x`` cost O(d r + r^2) and no d x d matrix is ever formed.
``lam' = lambda`` for FD and ``lambda + alpha`` (alpha summed over every block) for robust FD.

Eq. (3) as printed puts the blocks' *inverses* M~, M* on the diagonal of the matrix it inverts and
drops alpha; the correct form (erratum) is simply ``M = (S S' + lam' I)^-1`` over the whole
stack, which is dense, not diagonal. It is rebuilt after every FD shrink (from a Cholesky factor,
symmetrised) and grown by the bordered inverse of eq. (7) when a raw row is appended.
"""

from __future__ import annotations

import numpy as np

from streambandit.numerics import rowwise
from streambandit.sketch.frequent_directions import FrequentDirections, numerical_rank_cut, svd_rows

__all__ = ["SketchedCovariance", "orthogonal_compaction", "stack_inverse"]


def stack_inverse(frozen: np.ndarray, active: np.ndarray, lam: float) -> np.ndarray:
    """``M = (S S' + lam I)^-1`` for ``S = [frozen; active]`` where each part has orthogonal rows.

    Eq. (3) corrected: the Gram blocks ``frozen frozen'`` and ``active active'`` are
    diagonal (orthogonal rows: the frozen stack is SVD-compacted, the active sketch was just shrunk
    to ``Sigma V'``), so only the cross block costs O(d r_frozen r_active). With one part empty M is
    the diagonal of Alg. 2/3's last line.
    """
    n_f = np.einsum("ij,ij->i", frozen, frozen)
    n_a = np.einsum("ij,ij->i", active, active)
    if frozen.shape[0] == 0 or active.shape[0] == 0:
        return np.diag(
            1.0 / (np.concatenate([n_f, n_a]) + lam)
        )  # Alg. 2 "M <- diag{1/(lam + sigma_j^2 - sigma)}"
    r_f = frozen.shape[0]
    gram = np.diag(np.concatenate([n_f, n_a]) + lam)
    cross = frozen @ active.T
    gram[:r_f, r_f:] = cross
    gram[r_f:, :r_f] = cross.T
    # On use, not at the top: importing scipy.linalg adds ~0.2 s to every command.
    import scipy.linalg

    factor = scipy.linalg.cho_factor(gram, lower=True)
    m = scipy.linalg.cho_solve(factor, np.eye(gram.shape[0]))
    return 0.5 * (m + m.T)  # keep M exactly symmetric


def orthogonal_compaction(rows: np.ndarray) -> np.ndarray:
    """Rows ``Sigma V'`` with the same ``S'S`` as ``rows`` and one row per nonzero singular value
    (lossless up to rounding). Used when a block is frozen."""
    if rows.shape[0] == 0:
        return rows.copy()
    s, vt = svd_rows(rows)
    s = numerical_rank_cut(s, rows.shape)
    live = s > 0.0
    return s[live][:, None] * vt[live]


class SketchedCovariance:
    """``A_hat = lam' I + S'S`` for ``S = [frozen; fd.rows]``, with ``M = (S S' + lam' I)^-1`` kept.

    ``frozen`` holds the (orthogonalised) rows of closed blocks and never changes between freezes;
    ``fd`` is the active block's FD / robust FD sketch. A single fixed-size sketch (SOFUL, CBSCFD) is
    the case with nothing frozen.

    Attributes:
      frozen: (r_f, d) orthogonal rows of the closed blocks.
      frozen_shrink: total FD shrink of the closed blocks (their alphas, for robust FD).
      fd: the active block's sketch.
    """

    def __init__(self, dim: int, ell: int, lam: float, *, robust: bool, fast: bool) -> None:
        self.dim = int(dim)
        self.lam = float(lam)
        self.robust = bool(robust)
        self.fast = bool(fast)
        self.frozen = np.zeros((0, self.dim))
        self.frozen_shrink = 0.0
        self.fd = FrequentDirections(self.dim, ell, robust=robust, fast=fast)
        self._m = np.zeros((0, 0))  # allocated at the first row: an unused sketch holds no memory
        self._r = 0

    # -- state --------------------------------------------------------------------------------

    @property
    def lam_eff(self) -> float:
        """lam' of eq. (5): lambda, plus every block's alpha for robust FD."""
        if not self.robust:
            return self.lam
        return self.lam + (self.frozen_shrink + self.fd.shrink_total)

    @property
    def shrink_total(self) -> float:
        """Sum of all FD shrinks, frozen blocks and active one (E_t of the confidence radius)."""
        return self.frozen_shrink + self.fd.shrink_total

    @property
    def minv(self) -> np.ndarray:
        """M (r x r), a view of a buffer grown by doubling."""
        return self._m[: self._r, : self._r]

    @minv.setter
    def minv(self, value: np.ndarray) -> None:
        self._m = np.array(value, dtype=np.float64, order="C")  # grown at the next append
        self._r = value.shape[0]

    @property
    def n_rows(self) -> int:
        """r, the rows of the stack."""
        return self._r

    @property
    def nbytes(self) -> int:
        """Bytes held by S and M (their buffers, including room grown for later rows)."""
        return int(self.frozen.nbytes + self.fd.nbytes + self._m.nbytes)

    def restore(
        self,
        frozen: np.ndarray,
        active: np.ndarray,
        minv: np.ndarray,
        frozen_shrink: float,
        active_shrink: float,
        ell: int,
    ) -> "SketchedCovariance":
        """A new sketch with this one's configuration and the given state (a loaded snapshot);
        ValueError if the pieces do not fit together."""
        new = SketchedCovariance(self.dim, ell, self.lam, robust=self.robust, fast=self.fast)
        r = frozen.shape[0] + active.shape[0]
        if frozen.ndim != 2 or frozen.shape[1] != self.dim:
            raise ValueError(f"frozen sketch rows must be (r, {self.dim}), got {frozen.shape}")
        if minv.shape != (r, r):
            raise ValueError(
                f"minv must be ({r}, {r}) for {r} stacked sketch rows, got {minv.shape}"
            )
        if not (frozen_shrink >= 0.0 and active_shrink >= 0.0):
            raise ValueError("sketch shrink totals must be >= 0")
        new.frozen = frozen
        new.fd.rows = active  # checks its shape against the sketch size
        new.fd.shrink_total = active_shrink
        new.frozen_shrink = frozen_shrink
        new.minv = minv
        return new

    # -- updates ------------------------------------------------------------------------------

    def update(self, x: np.ndarray) -> None:
        """Add row ``x`` to the active sketch and bring M up to date."""
        u = self._project(x)  # S^(t-1) x', before x joins S
        if self.fd.append(x):
            self.recompute()  # Alg. 4 lines 13-16: after a shrink, eq. (3) (corrected) from scratch
        else:
            self._border(u, float(x @ x))  # Alg. 4 lines 18-19: S <- [S; x], M by eq. (7)

    def recompute(self) -> None:
        """M from scratch (after an FD shrink, a freeze or a change of lam')."""
        m = stack_inverse(self.frozen, self.fd.rows, self.lam_eff)
        r = m.shape[0]
        if not r <= self._m.shape[0] <= self.frozen.shape[0] + self.fd.capacity:
            self._m = np.zeros(
                (r, r)
            )  # the buffer is sized to the stack; appends grow it (_border)
        self._m[:r, :r] = m
        self._r = r

    def freeze(self, next_ell: int) -> float:
        """Close the active block and open an empty one of sketch size ``next_ell``; returns the
        closed block's total shrink (its sigma-bar; its alpha for robust FD).

        The closed block is first shrunk to its sketch size (one more FD step,
        so its error stays within FD's ``BlockSize / l``; zero when the block is exact), then the
        whole frozen stack is compacted losslessly to orthogonal rows, which keeps the frozen rows at
        most ``sum_i l_i`` (Theorem 1's space) and the frozen Gram diagonal for :func:`stack_inverse`.
        """
        fd = self.fd
        if fd.rows.shape[0] > fd.keep:
            fd.shrink(fd.keep)
        closed = fd.shrink_total
        self.frozen = orthogonal_compaction(np.vstack([self.frozen, fd.rows]))
        self.fd = FrequentDirections(self.dim, next_ell, robust=self.robust, fast=self.fast)
        return closed

    def _project(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([self.frozen @ x, self.fd.rows @ x])

    def _border(self, u: np.ndarray, x_sq: float) -> None:
        """Eq. (7): M for the stack grown by one row x, from M, phi = M S x' and
        xi = x x' - x S' phi + lam' (alpha is inside lam' for robust FD)."""
        r = self._r
        if r == self._m.shape[0]:  # grow geometrically, up to the most rows the stack can hold
            cap = min(self.frozen.shape[0] + self.fd.capacity, max(8, 2 * r))
            grown = np.zeros((cap, cap))
            grown[:r, :r] = self._m[:r, :r]
            self._m = grown
        m = self._m
        lam = self.lam_eff
        phi = m[:r, :r] @ u
        # xi = lam' (1 + x' A_hat^-1 x) >= lam' exactly; clamp the rounding.
        xi = max(lam + x_sq - float(u @ phi), lam)
        inv_xi = 1.0 / xi
        m[:r, :r] += np.multiply.outer(phi, phi) * inv_xi  # outer(phi, phi) is exactly symmetric
        m[:r, r] = -phi * inv_xi
        m[r, :r] = -phi * inv_xi
        m[r, r] = inv_xi
        self._r = r + 1

    # -- queries (eq. 5) ----------------------------------------------------------------------

    def solve(self, v: np.ndarray) -> np.ndarray:
        """``A_hat^-1 v = (v - S' M S v) / lam'`` in O(d r + r^2)."""
        r_f = self.frozen.shape[0]
        w = self.minv @ self._project(v)
        out = v - self.frozen.T @ w[:r_f] - self.fd.rows.T @ w[r_f:]
        return out / self.lam_eff

    def quad_forms(self, arms: np.ndarray) -> np.ndarray:
        """``x' A_hat^-1 x = (||x||^2 - u' M u) / lam'`` with ``u = S x``, for every row of ``arms``
        (K x d), in O(K d r + K r^2); clipped at 0 against rounding (float64 throughout).
        Row by row (``streambandit.numerics.rowwise``): an arm's value does not depend on the other arms."""
        s_t = np.hstack([self.frozen.T, self.fd.rows.T])  # S' (d, r), C-contiguous
        u = rowwise.matmul(arms, s_t)
        q = rowwise.rowdot(arms, arms) - rowwise.rowdot(rowwise.matmul(u, self.minv), u)
        q /= self.lam_eff
        return np.maximum(q, 0.0, out=q)

    def dense_inverse(self) -> np.ndarray:
        """``A_hat^-1 = (I - S' M S) / lam'`` as a dense d x d matrix (eq. 5; O(d^2 r)). Used once, when
        Dyadic Block Sketching switches to exact rank-1 updates."""
        s = np.vstack([self.frozen, self.fd.rows])
        a_inv = (np.eye(self.dim) - s.T @ (self.minv @ s)) / self.lam_eff
        return 0.5 * (a_inv + a_inv.T)

    def covariance(self) -> np.ndarray:
        """``S'S`` plus ``alpha I`` for robust FD: the dense approximation of X'X. Tests only."""
        s = np.vstack([self.frozen, self.fd.rows])
        alpha = self.shrink_total if self.robust else 0.0
        return s.T @ s + alpha * np.eye(self.dim)
