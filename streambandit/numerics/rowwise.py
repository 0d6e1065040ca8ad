"""Row-independent products: every row of a result is a function of its own input row alone.

Why not numpy's ``@``: a matrix product goes to BLAS, which blocks the rows and gives a block's
tail rows (and a one-row product) to other code, with other vector widths and other summation
orders. An arm's score then depends in its last bit on how many arms come with it and where it
stands among them, and which rows take which path depends on the CPU. ``Policy.select`` breaks
ties by the lowest index, so identical arms must score identically, whatever the machine.

Here every element is summed over ``k = 0, 1, ...`` in that order, and nothing is compiled with
fastmath, so there is no reassociation and no fused multiply-add. The compiler may vectorise
across the output columns (``out[i, :] += a[i, k] * b[k, :]``), which computes each element with
exactly the scalar operations: the bits of a row do not depend on the other rows, on the row's
position, on the batch size or on the CPU's vector width.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

__all__ = ["matmul", "matvec", "rowdot", "sq_distances"]


@njit(cache=CACHE, nogil=True)
def _matmul(a, b, out):
    n, kk = a.shape
    m = b.shape[1]
    k4 = kk - kk % 4
    for i in range(n):
        row = out[i]
        for j in range(m):
            row[j] = 0.0
        # Four k at a time, added one after the other in k's order: the same sums as one k at a
        # time, with a quarter of the loads and stores of the output row.
        for k in range(0, k4, 4):
            a0, a1, a2, a3 = a[i, k], a[i, k + 1], a[i, k + 2], a[i, k + 3]
            b0, b1, b2, b3 = b[k], b[k + 1], b[k + 2], b[k + 3]
            for j in range(m):
                row[j] = (((row[j] + a0 * b0[j]) + a1 * b1[j]) + a2 * b2[j]) + a3 * b3[j]
        for k in range(k4, kk):
            aik = a[i, k]
            bk = b[k]
            for j in range(m):
                row[j] += aik * bk[j]


@njit(cache=CACHE, nogil=True)
def _matvec(a, v, out):
    n, kk = a.shape
    for i in range(n):
        s = 0.0
        for k in range(kk):
            s += a[i, k] * v[k]
        out[i] = s


@njit(cache=CACHE, nogil=True)
def _rowdot(a, b, out):
    n, kk = a.shape
    for i in range(n):
        s = 0.0
        for k in range(kk):
            s += a[i, k] * b[i, k]
        out[i] = s


@njit(cache=CACHE, nogil=True)
def _sq_distances(a, bt, out):
    # bt is b transposed (d, m), so the inner loop runs over b's rows and vectorises.
    n, kk = a.shape
    m = bt.shape[1]
    for i in range(n):
        row = out[i]
        for j in range(m):
            row[j] = 0.0
        for k in range(kk):
            aik = a[i, k]
            bk = bt[k]
            for j in range(m):
                diff = aik - bk[j]
                row[j] += diff * diff


def _c(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float64)


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for 2-d ``a`` (n, k) and ``b`` (k, m), row by row in a fixed order."""
    a, b = _c(a), _c(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs (n, k) @ (k, m), got {a.shape} @ {b.shape}")
    out = np.empty((a.shape[0], b.shape[1]))
    _matmul(a, b, out)
    return out


def matvec(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``a @ v`` for ``a`` (n, k) and ``v`` (k,), each element summed over k in order."""
    a, v = _c(a), _c(v)
    if a.ndim != 2 or v.shape != (a.shape[1],):
        raise ValueError(f"matvec needs (n, k) @ (k,), got {a.shape} @ {v.shape}")
    out = np.empty(a.shape[0])
    _matvec(a, v, out)
    return out


def rowdot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a * b).sum(axis=1)`` for two (n, k) arrays, each row summed over k in order."""
    a, b = _c(a), _c(b)
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(
            f"rowdot needs two arrays of one (n, k) shape, got {a.shape} and {b.shape}"
        )
    out = np.empty(a.shape[0])
    _rowdot(a, b, out)
    return out


def sq_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``||a_i - b_j||^2`` for ``a`` (n, d) and ``b`` (m, d): (n, m), summed over the coordinates
    in order. Computed from the differences, so it is never negative and a zero distance is 0."""
    a, b = _c(a), _c(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"sq_distances needs (n, d) and (m, d), got {a.shape} and {b.shape}")
    out = np.empty((a.shape[0], b.shape[0]))
    _sq_distances(a, np.ascontiguousarray(b.T), out)
    return out
