"""Shared numerics for the learners: rank-one inverse updates and the ellipsoid-norm projection.

Everything here is pure numpy, float64, and deterministic: the same inputs give the same bits
(no randomness, fixed iteration counts), which the snapshot-and-replay recovery relies on.
"""

from __future__ import annotations

import numpy as np

__all__ = ["sherman_morrison_update", "quad_forms", "project_to_ball_in_norm"]


def sherman_morrison_update(
    inv: np.ndarray, x: np.ndarray, weight: float = 1.0, v: np.ndarray | None = None
) -> np.ndarray:
    """Update ``inv = M^-1`` in place to ``(M + weight * x x')^-1``; returns ``M^-1 x`` (old inverse).

    Sherman-Morrison: (M + w x x')^-1 = M^-1 - w (M^-1 x)(M^-1 x)' / (1 + w x' M^-1 x).
    ``outer(v, v)`` is exactly symmetric (scaling it afterwards keeps that), so a symmetric ``inv`` stays symmetric to the bit.
    Pass ``v = M^-1 x`` when the caller has it already, to save the O(d^2) product.
    """
    if v is None:
        v = inv @ x
    denom = 1.0 + weight * float(x.dot(v))
    inv -= np.multiply.outer(v, v) * (weight / denom)
    return v


def quad_forms(arms: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """``x_k' inv x_k`` for every row of ``arms`` (K, d), clipped at 0 against rounding."""
    q = (arms @ inv * arms).sum(axis=1)
    return np.maximum(q, 0.0, out=q)


# The secular-equation solve below takes at most this many safeguarded Newton steps. Every step is
# a pure function of its inputs (no randomness, no wall-clock limit), so the same zeta and A give
# the same bits; 60 is far more than Newton on the near-linear 1/||theta(nu)|| needs.
_PROJECTION_STEPS = 60


def project_to_ball_in_norm(zeta: np.ndarray, a: np.ndarray, radius: float) -> tuple[np.ndarray, float]:
    """``argmin_{||theta||_2 <= radius} ||theta - zeta||_A`` for symmetric positive definite ``A``.

    Returns ``(theta, nu)`` where ``nu >= 0`` is the KKT multiplier: ``A (theta - zeta) = -nu theta``.
    This is the projection GLB-OMD eq. (42b) and Hvt-UCB Alg. 1 line 8 need: in the A-norm, not a
    Euclidean rescale of ``zeta`` (that is a different algorithm, see the implementation notes).

    If ``zeta`` is inside the ball it is returned unchanged (nu = 0). Otherwise the KKT conditions
    give ``(A + nu I) theta = A zeta`` with ``||theta|| = radius``. With ``A = Q diag(a) Q'`` and
    ``c = Q' zeta``, ``||theta(nu)||^2 = sum_i (a_i c_i / (a_i + nu))^2`` is strictly decreasing in
    nu, and its root lies in ``[a_min (||zeta||/r - 1), a_max (||zeta||/r - 1)]``. We solve
    ``phi(nu) = 1/||theta(nu)|| - 1/r = 0`` (nearly linear in nu, so Newton converges fast) with
    Newton steps kept inside a shrinking bracket (bisection when a step would leave it).
    """
    norm_zeta = float(np.linalg.norm(zeta))
    if norm_zeta <= radius:
        return zeta, 0.0
    evals, q = np.linalg.eigh(a)
    c = q.T @ zeta
    ac = evals * c
    excess = norm_zeta / radius - 1.0
    lo = max(float(evals[0]) * excess, 0.0)
    hi = float(evals[-1]) * excess
    nu = 0.5 * (lo + hi)
    inv_r = 1.0 / radius
    for _ in range(_PROJECTION_STEPS):
        t = ac / (evals + nu)
        n2 = float(t @ t)
        n = np.sqrt(n2)
        phi = 1.0 / n - inv_r
        # phi is increasing in nu: phi < 0 means ||theta|| > r, so the root is above nu.
        if phi < 0.0:
            lo = nu
        else:
            hi = nu
        if hi - lo <= 1e-15 * max(hi, 1.0):
            break
        # d||theta||^2/dnu = -2 sum t_i^2 / (a_i + nu); dphi/dnu = -(1/2) n^-3 d||theta||^2/dnu.
        dphi = float(t @ (t / (evals + nu))) / (n2 * n)
        step = nu - phi / dphi if dphi > 0.0 else 0.5 * (lo + hi)
        nu = step if lo < step < hi else 0.5 * (lo + hi)
    theta = q @ (ac / (evals + nu))
    # Remove the residual rounding of the root so that ||theta|| <= radius holds exactly enough
    # for the invariant checks; the rescale is by a factor within ~1e-15 of 1.
    n = float(np.linalg.norm(theta))
    if n > radius:
        theta *= radius / n
    return theta, nu
