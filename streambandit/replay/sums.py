"""The estimators' running sums, one compiled call per event (estimators.py reads them).

Why compiled: an event adds to six running means and ratios, each a handful of float operations;
in Python those were most of a replay's time per row beyond the learner's (``python -m
bench.replay`` measures rows per second). The arithmetic is the same, in the same order, as the
plain Python it replaces (no fastmath: no reassociation, no fused multiply-add), so the sums are
the bits Python's floats would give.

Layout of an evaluator's accumulator array ``acc`` (float64, counts held exactly below 2^53):

- a running mean (Welford) at offset ``o``: ``n, mean, m2``;
- a running ratio ``sum u / sum v`` with its bivariate Welford sums at ``o``:
  ``n, mean u, mean v, S_uu, S_vv, S_uv, sum v, sum v^2, count of v != 0``;
- then the sums the score intervals and the reward range read, and the flag ``UNIFORM``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE
from streambandit.numerics.kernels import sym_matvec

__all__ = [
    "MEAN_N",
    "MEAN_MEAN",
    "MEAN_M2",
    "RATIO_FIELDS",
    "REPLAY",
    "SNIPS",
    "IPS",
    "DM",
    "DR",
    "LOGGED",
    "SWR",
    "SW2R",
    "SW",
    "SW2",
    "CLIPPED",
    "UNIFORM",
    "R_A",
    "R_B",
    "MANY",
    "RMIN",
    "RMAX",
    "SWQ",
    "SW2Q",
    "SW2Q2",
    "WMAX",
    "SU",
    "SUU",
    "SUW",
    "SDWR",
    "SDW",
    "SWRQ",
    "SWQR",
    "SIZE",
    "new_accumulator",
    "mean_add",
    "ratio_add",
    "add_event",
    "add_row",
    "event_terms",
    "TERMS_OK",
    "TERMS_BAD_PROBS",
    "TERMS_BAD_PREDICTIONS",
    "TERMS_BAD_ACTION",
    "TERMS_BAD_PROPENSITY",
    "TERMS_BAD_REWARD",
    "ridge_predict",
    "ridge_update",
]

MEAN_N, MEAN_MEAN, MEAN_M2 = 0, 1, 2
RATIO_FIELDS = ("n", "mu", "mv", "suu", "svv", "suv", "sv", "sv2", "nonzero")
REPLAY, SNIPS = 0, 9  # ratios
IPS, DM, DR, LOGGED = 18, 21, 24, 27  # means
# Sums on the rewards' own scale, rescaled when read (the ends may be known only at the end):
# sum w r, sum w^2 r, sum w, sum w^2.
SWR, SW2R, SW, SW2 = 30, 31, 32, 33
CLIPPED, UNIFORM = 34, 35
# The rewards seen: the first two distinct values (NaN until seen), whether a third was seen,
# the least and the largest, for score intervals and the inferred reward range.
R_A, R_B, MANY, RMIN, RMAX = 36, 37, 38, 39, 40
# sum w q, sum w^2 q, sum w^2 q^2 over every row, q the reward model's prediction of the logged
# arm clamped to the reward range (given, or seen so far): the spread a success's weight has as
# the model expects it, from every row and not only the few with a success (intervals.py).
SWQ, SW2Q, SW2Q2 = 41, 42, 43
WMAX = 44  # the largest weight used
# For dr's variance with the success weight the model expects (estimators._dr_scored), on the
# rewards' own scale: u = dm - w q (q the prediction of the logged arm, as in dr's term):
# sum u, sum u^2, sum u w, sum dm w r, sum dm w, sum w r q, sum w q.
SU, SUU, SUW, SDWR, SDW, SWRQ, SWQR = 45, 46, 47, 48, 49, 50, 51
SIZE = 52

(
    TERMS_OK,
    TERMS_BAD_PROBS,
    TERMS_BAD_PREDICTIONS,
    TERMS_BAD_ACTION,
    TERMS_BAD_PROPENSITY,
    TERMS_BAD_REWARD,
) = 0, -1, -2, -3, -4, -5


def new_accumulator() -> np.ndarray:
    acc = np.zeros(SIZE)
    acc[UNIFORM] = 1.0  # until an event says otherwise
    acc[R_A] = acc[R_B] = np.nan
    acc[RMIN], acc[RMAX] = np.inf, -np.inf
    return acc


@njit(cache=CACHE, nogil=True)
def mean_add(acc, o, x):
    """Welford's update of the running mean at offset ``o``."""
    acc[o] += 1.0
    dx = x - acc[o + 1]
    acc[o + 1] += dx / acc[o]
    acc[o + 2] += dx * (x - acc[o + 1])


@njit(cache=CACHE, nogil=True)
def ratio_add(acc, o, u, v):
    """The bivariate Welford update of the running ratio at offset ``o``."""
    acc[o] += 1.0
    n = acc[o]
    du = u - acc[o + 1]
    dv = v - acc[o + 2]
    acc[o + 1] += du / n
    acc[o + 2] += dv / n
    acc[o + 3] += du * (u - acc[o + 1])
    acc[o + 4] += dv * (v - acc[o + 2])
    acc[o + 5] += du * (v - acc[o + 2])
    acc[o + 6] += v
    acc[o + 7] += v * v
    if v != 0.0:
        acc[o + 8] += 1.0


@njit(cache=CACHE, nogil=True)
def add_event(acc, pa, p, r, k, dm, qa, clip, lo, hi):
    """One event's terms into every estimator's sums (estimators.py, module docstring); returns
    the importance weight used (clipped at ``clip`` when ``clip > 0``). ``lo``, ``hi``: the
    given reward range, or NaN for none (the model's predictions are then clamped to the range
    of the rewards seen so far, and to [0, 1] while fewer than two values have been seen)."""
    ratio_add(acc, REPLAY, pa * r, pa)  # Li et al. 2011, the match indicator's expectation pi[a]
    w = pa / p  # Horvitz-Thompson
    if clip > 0.0 and w > clip:
        w = clip
        acc[CLIPPED] += 1.0
    mean_add(acc, IPS, w * r)
    ratio_add(acc, SNIPS, w * r, w)  # Swaminathan & Joachims 2015
    mean_add(acc, DM, dm)
    mean_add(acc, DR, dm + w * (r - qa))  # Dudik et al. 2011
    mean_add(acc, LOGGED, r)
    if abs(p * k - 1.0) > 1e-9:
        acc[UNIFORM] = 0.0
    if not r == acc[R_A]:  # NaN until set
        if np.isnan(acc[R_A]):
            acc[R_A] = r
        elif np.isnan(acc[R_B]):
            acc[R_B] = r
        elif not r == acc[R_B]:
            acc[MANY] = 1.0
    acc[RMIN] = min(acc[RMIN], r)
    acc[RMAX] = max(acc[RMAX], r)
    acc[SWR] += w * r
    acc[SW2R] += w * w * r
    acc[SW] += w
    acc[SW2] += w * w
    acc[WMAX] = max(acc[WMAX], w)
    u = dm - w * qa
    acc[SU] += u
    acc[SUU] += u * u
    acc[SUW] += u * w
    acc[SDWR] += dm * w * r
    acc[SDW] += dm * w
    acc[SWRQ] += w * r * qa
    acc[SWQR] += w * qa
    if np.isnan(lo):
        lo, hi = acc[RMIN], acc[RMAX]
        if not lo < hi:
            lo, hi = min(lo, 0.0), max(hi, 1.0)
    q = min(max(qa, lo), hi)
    acc[SWQ] += w * q
    acc[SW2Q] += w * w * q
    acc[SW2Q2] += w * w * q * q
    return w


@njit(cache=CACHE, nogil=True)
def event_terms(pi, q, action, p, r):
    """``(status, pi[a], sum pi q, q[a])`` of an event, checked: ``TERMS_BAD_ACTION`` unless
    ``0 <= action < K``, ``TERMS_BAD_PROPENSITY`` unless ``0 < p <= 1``, ``TERMS_BAD_REWARD``
    for a non-finite reward, ``TERMS_BAD_PROBS`` unless ``pi`` is a probability vector (no entry
    negative or NaN, the sum 1 within 1e-6), ``TERMS_BAD_PREDICTIONS`` when a prediction is not
    finite. ``pi`` and ``q`` have the same length K >= 1 (the caller's check)."""
    if not 0 <= action < pi.shape[0]:
        return TERMS_BAD_ACTION, 0.0, 0.0, 0.0
    if not 0.0 < p <= 1.0:  # NaN too
        return TERMS_BAD_PROPENSITY, 0.0, 0.0, 0.0
    if not np.isfinite(r):
        return TERMS_BAD_REWARD, 0.0, 0.0, 0.0
    k = pi.shape[0]
    total = 0.0
    negative = False
    for i in range(k):
        if not pi[i] >= 0.0:  # NaN too
            negative = True
        total += pi[i]
    if negative or not abs(total - 1.0) <= 1e-6:  # an infinite entry makes the sum inf or NaN
        return TERMS_BAD_PROBS, 0.0, 0.0, 0.0
    dm = 0.0
    for i in range(k):
        dm += pi[i] * q[i]
    qa = q[action]
    if not (
        np.isfinite(dm) and np.isfinite(qa)
    ):  # 0 * nan and 0 * inf are nan: all of q is checked
        return TERMS_BAD_PREDICTIONS, 0.0, 0.0, 0.0
    return TERMS_OK, pi[action], dm, qa


@njit(cache=CACHE, nogil=True)
def add_row(pooled, by_key, pi, q, action, p, r, clip, lo, hi):
    """:func:`event_terms` of a row, then :func:`add_event` into the pooled sums and, when
    ``by_key`` has any entries, its model key's: one call per row of a replay.
    Returns ``(status, w, pi[a], sum pi q, q[a])``; nothing is added unless the status is OK."""
    status, pa, dm, qa = event_terms(pi, q, action, p, r)
    if status != TERMS_OK:
        return status, 0.0, 0.0, 0.0, 0.0
    k = pi.shape[0]
    w = add_event(pooled, pa, p, r, k, dm, qa, clip, lo, hi)
    if by_key.shape[0]:
        add_event(by_key, pa, p, r, k, dm, qa, clip, lo, hi)
    return status, w, pa, dm, qa


@njit(cache=CACHE, nogil=True)
def ridge_predict(theta, arms, intercept, out, lo, hi):
    """The ridge reward model's predictions (estimators.RidgeRewardModel): ``out[k] = z_k' theta``
    for every arm, ``z = [x, 1]`` when ``intercept``, clamped to ``[lo, hi]`` when ``lo <= hi``
    (a linear model's prediction past the rewards' range would push dm and dr past it too)."""
    n_arms, d = arms.shape
    for a in range(n_arms):
        s = 0.0
        for j in range(d):
            s += arms[a, j] * theta[j]
        if intercept:
            s += theta[d]
        if lo <= hi:
            s = min(max(s, lo), hi)
        out[a] = s


@njit(cache=CACHE, nogil=True)
def ridge_update(inv, b, theta, x, reward, intercept):
    """The ridge reward model learns ``(x, reward)``: Sherman-Morrison on
    ``inv = (lam I + sum z z')^-1``, ``b += r z``, ``theta = inv b``."""
    d = x.shape[0]
    n = inv.shape[0]
    z = np.empty(n)
    for j in range(d):
        z[j] = x[j]
    if intercept:
        z[d] = 1.0
    v = np.empty(n)
    sym_matvec(inv, z, v)  # inv z, row by row of the symmetric inv
    denom = 1.0
    for i in range(n):
        denom += z[i] * v[i]
    for i in range(n):
        for j in range(n):
            inv[i, j] -= v[i] * v[j] / denom  # v_i v_j = v_j v_i: inv stays symmetric to the bit
    for i in range(n):
        b[i] += reward * z[i]
    sym_matvec(inv, b, theta)
