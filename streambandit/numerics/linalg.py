"""Shared numerics for the learners: rank-one inverse updates and the ellipsoid-norm projection.

The Python entry points of the compiled kernels (``streambandit.numerics.kernels``) that code outside the
exact learners uses (DBSLinUCB's exact mode, the doubly robust estimator). Everything is float64 and
deterministic: the same inputs give the same bits (no randomness, fixed summation orders and
iteration counts), which the snapshot-and-replay recovery relies on.
"""

from __future__ import annotations

import numpy as np

from streambandit.numerics import kernels

__all__ = ["sherman_morrison_update", "sym_matvec", "project_to_ball_in_norm"]


def sherman_morrison_update(
    inv: np.ndarray, x: np.ndarray, weight: float = 1.0, v: np.ndarray | None = None
) -> np.ndarray:
    """Update ``inv = M^-1`` in place to ``(M + weight * x x')^-1``; returns ``M^-1 x`` (old inverse).

    Sherman-Morrison: (M + w x x')^-1 = M^-1 - w (M^-1 x)(M^-1 x)' / (1 + w x' M^-1 x).
    The compiled step (``kernels.sherman_morrison``) is the one OFUL and GLB-OMD use, so a learner
    that falls back to exact updates (DBSLinUCB) stays bitwise OFUL; it keeps a symmetric ``inv``
    symmetric to the bit. Pass ``v = M^-1 x`` when the caller has it already, to save the O(d^2)
    product. ``inv`` must be a C-contiguous float64 array (it is updated in place).
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    if v is None:
        v = np.empty_like(x)
        kernels.sym_matvec(inv, x, v)
    kernels.sherman_morrison(inv, x, float(weight), np.ascontiguousarray(v, dtype=np.float64))
    return v


def sym_matvec(m: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``m @ x`` for a symmetric ``m``, summed in the kernels' fixed order (bitwise what OFUL's
    compiled step computes)."""
    out = np.empty(m.shape[0])
    kernels.sym_matvec(m, np.ascontiguousarray(x, dtype=np.float64), out)
    return out


# One implementation of the ellipsoid-norm projection, compiled, used by the GLB-OMD and Hvt-UCB
# steps and callable from Python (the tests check it against scipy).
project_to_ball_in_norm = kernels.project_to_ball_in_norm
