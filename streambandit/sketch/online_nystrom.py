"""A Nystrom dictionary grown and thinned online, with the model kept in the embedding.

The streaming mode of BKB (policies/bkb_stream.py) keeps no pulled point: a dictionary D of at
most ``m_max`` points and, in the embedding ``z(x) = L^-1 k_D(x)`` with ``L L' = K_DD`` (Cholesky;
Sec. 3.1's ``(K_DD^1/2)^+ k_D(x)`` up to a rotation, which leaves eq. (4) unchanged):

- ``chol``  L                         (m, m), lower triangular;
- ``gram``  G = sum_s z(x_s) z(x_s)'  (m, m), ``bz`` b = sum_s z(x_s) y_s  (m,);
- ``vinv``  V^-1 = (G + lam I)^-1     (m, m).

eq. (4) is then ``mu~(x) = z' V^-1 b`` and ``sigma~^2(x) = (k(x,x) - ||z||^2) / lam + z' V^-1 z``
(1/lambda scale, as policies/bkb.py).

Why this embedding and not kernel coordinates (``k' (M + lam K)^-1 k``, which needs no root):
``M + lam K`` is ``K (N K + lam I)`` for pulls in the span, with about the square of K's condition
number; on an RBF catalog that was 1e10 and its Sherman-Morrison inverse drifted by 15% within a
hundred updates. ``V = G + lam I`` is bounded below by ``lam I`` and stays well conditioned.

Why the Cholesky root: its coordinates are Gram-Schmidt's. A point joining the dictionary leaves
every existing coordinate as it was and adds one, ``(k(x, x_new) - l' z(x)) / sqrt(r)`` with
``l = z(x_new)`` and ``r = k(x_new, x_new) - ||l||^2``, which is exactly 0 for every x in the old
span. So a join is O(m^2) (one forward solve) and borders G, b and V^-1 with zeros and ``1/lam``:
the earlier pulls are taken by their projection on the old span, exact when they lay in it (then
the model is exactly GP-UCB's posterior: tests/unit/policies/test_bkb_stream.py), and otherwise losing only
the part of each the dictionary did not represent. A pull is a rank-one update of G, b and V^-1
(Sherman-Morrison, O(m^2)).

A point leaving (:func:`shrink`) changes the basis: O(m^3), numpy/LAPACK, done only on the
resparsification schedule, which also refactors V^-1 from G and so clears the rounding that the
rank-one updates accumulate.

The O(m^2) per-update loops sum in a fixed order and use no fastmath (as numerics/kernels.py): the same
updates give the same bits whatever the BLAS; :func:`shrink`'s LAPACK calls are the exception,
as the eigendecomposition of policies/bkb.py is.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics import kernels
from streambandit.numerics.jit import CACHE

__all__ = [
    "sym_matvec",
    "quad",
    "dot",
    "trace",
    "forward_solve",
    "forward_solve_rows",
    "join",
    "observe",
    "shrink",
    "spd_inverse",
]


@njit(cache=CACHE, nogil=True)
def sym_matvec(a, x):
    """``a @ x`` for a symmetric ``a``, each element summed over j in order (kernels.sym_matvec)."""
    out = np.empty(x.shape[0])
    kernels.sym_matvec(a, x, out)
    return out


@njit(cache=CACHE, nogil=True)
def quad(a, x):
    """``(x' a x, a x)`` for a symmetric ``a``."""
    h = sym_matvec(a, x)
    return kernels.dot(x, h), h


# ``x . y`` summed in index order (numpy's dot goes to BLAS, whose order depends on the CPU).
dot = kernels.dot


@njit(cache=CACHE, nogil=True)
def trace(a):
    """The sum of ``a``'s diagonal, in index order."""
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i, i]
    return s


@njit(cache=CACHE, nogil=True)
def forward_solve_rows(upper, ks):
    """``z`` with ``L z = k`` for every row ``k`` of ``ks`` (n, m), given ``upper = L'``
    (C-contiguous): row i of the result depends on ``ks[i]`` alone.

    Each ``z_i = (k_i - L_i0 z_0 - L_i1 z_1 - ...) / L_ii`` takes its terms in the order
    j = 0, 1, ...; the loops run over the rows innermost (on a transposed copy), which the
    compiler vectorises without reordering any element's operations."""
    n, m = ks.shape
    zt = np.ascontiguousarray(ks.T)
    for j in range(m):
        pivot = upper[j, j]
        for r in range(n):
            zt[j, r] = zt[j, r] / pivot
        for i in range(j + 1, m):
            u = upper[j, i]
            for r in range(n):
                zt[i, r] -= u * zt[j, r]
    return np.ascontiguousarray(zt.T)


def forward_solve(upper: np.ndarray, k: np.ndarray) -> np.ndarray:
    """:func:`forward_solve_rows` of one vector ``k`` (m,)."""
    return forward_solve_rows(upper, k[None, :])[0]


@njit(cache=CACHE, nogil=True)
def join(chol, gram, bz, vinv, z, r, lam):
    """The dictionary with one more point, whose embedding in the old basis is ``z`` and whose
    residual is ``r = k(x, x) - ||z||^2 > 0``: ``(chol, gram, bz, vinv)`` each one larger."""
    m = z.shape[0]
    new_chol = np.zeros((m + 1, m + 1))
    new_gram = np.zeros((m + 1, m + 1))
    new_vinv = np.zeros((m + 1, m + 1))
    new_chol[:m, :m] = chol
    new_gram[:m, :m] = gram
    new_vinv[:m, :m] = vinv
    for j in range(m):
        new_chol[m, j] = z[j]
    new_chol[m, m] = np.sqrt(r)
    new_vinv[m, m] = 1.0 / lam  # the new coordinate of every earlier pull is 0: V borders with lam
    new_bz = np.zeros(m + 1)
    new_bz[:m] = bz
    return new_chol, new_gram, new_bz, new_vinv


@njit(cache=CACHE, nogil=True)
def observe(gram, bz, vinv, z, y):
    """One pull with embedding ``z`` and reward ``y``: ``G += z z'``, ``b += y z`` and
    Sherman-Morrison on ``V^-1``. In place."""
    m = z.shape[0]
    v, h = quad(vinv, z)
    den = 1.0 + v
    for i in range(m):
        for j in range(m):
            vinv[i, j] -= h[i] * h[j] / den  # h_i h_j = h_j h_i: symmetric to the bit
            gram[i, j] += z[i] * z[j]
        bz[i] += y * z[i]


def shrink(
    k_kept: np.ndarray,
    chol: np.ndarray,
    gram: np.ndarray,
    bz: np.ndarray,
    kept: np.ndarray,
    lam: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The model on the dictionary's points ``kept`` (indices, in order), ``k_kept`` their kernel
    matrix: ``(chol, gram, bz, vinv)`` in the new basis.

    Every pull's embedding is projected on the smaller span: in the new basis it is ``Q z`` with
    ``Q = L_new^-1 (rows kept of L)`` (for a point in the old span, ``k_kept(x) = L[kept] z(x)``),
    so ``G -> Q G Q'`` and ``b -> Q b``; V^-1 is refactored from G. O(m^3)."""
    # On use, not at the top: importing scipy.linalg adds ~0.2 s to every command.
    from scipy.linalg import cholesky, solve_triangular

    new_chol = cholesky(k_kept, lower=True)
    q = solve_triangular(new_chol, chol[kept], lower=True)
    new_gram = q @ gram @ q.T
    new_gram = 0.5 * (new_gram + new_gram.T)
    new_bz = q @ bz
    return (
        np.ascontiguousarray(new_chol),
        new_gram,
        new_bz,
        spd_inverse(new_gram + lam * np.eye(len(kept))),
    )


def spd_inverse(v: np.ndarray) -> np.ndarray:
    """The inverse of a symmetric positive definite ``v`` from its Cholesky factor (LAPACK potrf,
    potri), made exactly symmetric."""
    # On use, not at the top: importing scipy.linalg adds ~0.2 s to every command.
    from scipy.linalg import lapack

    factor, info = lapack.dpotrf(v, lower=True)
    if info != 0:
        raise np.linalg.LinAlgError(f"not positive definite (potrf info {info})")
    inv, info = lapack.dpotri(factor, lower=True)
    if info != 0:
        raise np.linalg.LinAlgError(f"potri info {info}")
    lower = np.tril(inv)
    return lower + np.tril(inv, -1).T
