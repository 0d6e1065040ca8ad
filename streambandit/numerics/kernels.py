"""Compiled per-event kernels of the exact learners (OFUL, GLB-OMD): numba, no Python per event.

Why: at small d the numpy per-call path spends most of its time per select + update in the
interpreter and in a dozen small numpy calls, not in the O(K d^2) arithmetic. These kernels do
the arithmetic in one compiled call, and ``*_play`` runs a whole stream of select + update steps
in one call (``python -m bench.policies`` compares them with a numpy OFUL).

Determinism (docs/design.md, determinism): every loop sums in a fixed order, nothing is compiled
with fastmath (so no reassociation and no fused multiply-add), and the one-event functions are the
same code the ``*_play`` loops call. So a model gives the same bits whether it is driven one call
at a time (the worker), a batch at a time or a stream at a time (the simulator), and
``ucb_argmax_batch`` chooses exactly what ``ucb_argmax`` chooses for each row. Matrix-vector
products run over the rows of a symmetric matrix (``y += x_j * M[j, :]``, four rows per pass),
which the compiler can vectorise without reordering any sum: element i of y still adds its terms in
the order j = 0, 1, ..., d - 1. The loops are blocked (rows, arms, the dot products of several arms
side by side) only in ways that keep every sum's order; tests/unit/numerics/test_kernel_sum_order.py
checks them against the index-order sums written out in Python, and ``python -m bench.play_bound``
measures what the blocking buys and the floor under it.

Rows: a learner's state is row ``i`` of arrays shared by every model of its configuration
(``streambandit.policies.rows``). The ``*_row`` entry points and the ``*_play`` loops take those
chunk arrays (theta, the inverse, the third array, the scalars, the update counts) and ``i``, and
take the row views inside the compiled code, where they cost nothing; the arithmetic on a row is
the same code as on a model's own arrays.

Status codes rather than exceptions: a kernel reports bad input with a negative code and leaves
the model untouched, and the Python caller raises the ValueError with a message naming the value.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

__all__ = [
    "sym_matvec",
    "dot",
    "ucb_scores",
    "ucb_argmax",
    "ucb_argmax_batch",
    "ucb_scores_row",
    "ucb_best_row",
    "ucb_argmax_batch_row",
    "ucb_select_row",
    "sherman_morrison",
    "oful_update",
    "oful_update_row",
    "oful_beta",
    "oful_play",
    "glb_omd_update",
    "glb_omd_update_row",
    "glb_omd_beta",
    "glb_omd_play",
    "reward_ok",
    "features_within_bound",
    "hvt_ucb_beta",
    "hvt_ucb_update",
    "hvt_ucb_update_row",
    "hvt_ucb_play",
    "project_to_ball_in_norm",
    "LINK_LOGISTIC",
    "LINK_POISSON",
    "LINK_GAUSSIAN",
    "RADIUS_OFUL",
    "RADIUS_GLB_OMD",
    "RADIUS_HVT_UCB",
    "OK",
    "BAD_ARMS",
    "BAD_X",
    "BAD_REWARD",
    "LINK_OVERFLOW",
    "BAD_SHAPE",
    "NO_ARMS",
    "MAX_ABS_FEATURE",
    "MAX_ABS_REWARD",
]

# The largest feature and reward magnitudes a learner accepts. Bandit features are scaled to
# ||x|| <= 1 by assumption (every paper here) and rewards are clicks, ratings or revenue; these
# bounds leave every real input far inside them, and keep every product the updates form
# (x x' scaled, r x summed, x'theta) many orders of magnitude from float64's overflow, so finite
# input can never make a model's state non-finite. Larger values are refused, not learned.
MAX_ABS_FEATURE = 1e6
MAX_ABS_REWARD = 1e9

# Status codes.
OK = 0
BAD_ARMS = -1  # NaN, infinite or out-of-bound features among the arms
BAD_X = -2  # NaN, infinite or out-of-bound features in the updated vector
BAD_REWARD = -3  # non-finite, beyond MAX_ABS_REWARD, or outside the link's range
LINK_OVERFLOW = -4  # the Poisson link's exp(x'theta) would overflow
BAD_SHAPE = -5  # arms or x not of the model's dimension
NO_ARMS = -6  # no arm to choose from

LINK_LOGISTIC, LINK_POISSON, LINK_GAUSSIAN = 0, 1, 2
# Which learner's confidence radius a row's decision uses (_radius). Every learner's ``params``
# array starts with its radius parameters: OFUL (fixed beta or -1, beta_scale, R,
# 2 log(1/delta), sqrt(lam) S); GLB-OMD (beta_scale and the t-independent parts of eq. 5), then
# its step's (link, S, eta, g); Hvt-UCB (beta_scale, eq. 10's coefficient and constant, p), then
# the rest of hvt_ucb_update's params.
RADIUS_OFUL, RADIUS_GLB_OMD, RADIUS_HVT_UCB = 0, 1, 2
# exp() overflows float64 just above 709.78; a Poisson natural parameter this large means the
# contexts were not scaled to ||x|| <= 1 (GLB-OMD Assumption 1), which the projection relies on.
MAX_POISSON_Z = 700.0

# The secular-equation solve of the projection takes at most this many safeguarded Newton steps,
# a fixed count so the same inputs give the same bits.
_PROJECTION_STEPS = 60


# -- elementary pieces ---------------------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def _feature_row_ok(x):
    # abs(nan) <= bound is False: one comparison refuses NaN, infinities and huge values. No
    # early exit: the flags' OR is a loop the compiler vectorises, several times faster than a
    # branch per feature (play checks K d features per event).
    bad = False
    for i in range(x.shape[0]):
        bad |= not abs(x[i]) <= MAX_ABS_FEATURE
    return not bad


@njit(cache=CACHE, nogil=True)
def features_within_bound(a):
    """Whether every element of ``a`` (float64, C order, any shape) is a number of magnitude at
    most MAX_ABS_FEATURE: the learners' check of features, in one pass with no temporary."""
    return _feature_row_ok(a.reshape(-1))


@njit(cache=CACHE, nogil=True)
def _reward_in_bound(r):
    return abs(r) <= MAX_ABS_REWARD


@njit(cache=CACHE, nogil=True)
def sym_matvec(m, x, out):
    """``out = m @ x`` for a symmetric ``m``, summed over j in order for every element.

    Four rows of ``m`` per pass: element i adds its four terms one after another in a register,
    the same additions in the same order as one pass per row, with a quarter of the stores and
    reloads of ``out`` (each a store-to-load round trip on element i's chain of d adds)."""
    d = x.shape[0]
    for i in range(d):
        out[i] = 0.0
    j = 0
    while j + 4 <= d:
        x0, x1, x2, x3 = x[j], x[j + 1], x[j + 2], x[j + 3]
        m0, m1, m2, m3 = m[j], m[j + 1], m[j + 2], m[j + 3]
        for i in range(d):
            out[i] = (((out[i] + x0 * m0[i]) + x1 * m1[i]) + x2 * m2[i]) + x3 * m3[i]
        j += 4
    while j < d:
        xj, mj = x[j], m[j]
        for i in range(d):
            out[i] += xj * mj[i]
        j += 1


@njit(cache=CACHE, nogil=True)
def _dot(a, b):
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i] * b[i]
    return s


dot = _dot  # ``a . b`` summed in index order, for other compiled modules (sketch/online_nystrom.py)


# Inlined into each caller at numba's IR level (same arithmetic, same order): called as a separate
# compiled function, the copy loaded from numba's on-disk cache ran slower than a fresh compile of
# the same source; inlined, both run alike (select_batch in `python -m bench.peers`).
@njit(cache=CACHE, nogil=True, inline="always")
def _ucb_row(arms, theta, inv, beta, scores, work):
    """Scores of one context's arms (K, d) into ``scores``: ``x'theta + beta ||x||_inv``, with
    ``work`` (K, d) scratch. Returns False if a feature is NaN or infinite.

    ``work[k] = inv @ arms[k]`` is built four rows of ``inv`` at a time (j outer, two arms per
    pass), as ``sym_matvec`` builds one product: the inner loop is a vectorisable axpy and every
    element still sums its terms in the order j = 0, 1, ..., d - 1 (the same bits as
    ``sym_matvec``). The two dot products of each arm (``x'theta`` and ``x'work[k]``) are chains
    of d dependent adds in index order, which cannot be vectorised without reordering the sum;
    ``_score_arms4`` runs four arms' chains side by side instead of one after another."""
    k_arms, d = arms.shape
    for k in range(k_arms):
        if not _feature_row_ok(arms[k]):
            return False
    work[:, :] = 0.0
    j = 0
    while j + 4 <= d:
        r0, r1, r2, r3 = inv[j], inv[j + 1], inv[j + 2], inv[j + 3]
        k = 0
        while k + 2 <= k_arms:  # two arms per pass: each loaded row of inv serves both
            a, b = arms[k], arms[k + 1]
            a0, a1, a2, a3 = a[j], a[j + 1], a[j + 2], a[j + 3]
            b0, b1, b2, b3 = b[j], b[j + 1], b[j + 2], b[j + 3]
            w, v = work[k], work[k + 1]
            for i in range(d):
                w[i] = (((w[i] + a0 * r0[i]) + a1 * r1[i]) + a2 * r2[i]) + a3 * r3[i]
                v[i] = (((v[i] + b0 * r0[i]) + b1 * r1[i]) + b2 * r2[i]) + b3 * r3[i]
            k += 2
        if k < k_arms:
            a = arms[k]
            a0, a1, a2, a3 = a[j], a[j + 1], a[j + 2], a[j + 3]
            w = work[k]
            for i in range(d):
                w[i] = (((w[i] + a0 * r0[i]) + a1 * r1[i]) + a2 * r2[i]) + a3 * r3[i]
        j += 4
    while j < d:
        row = inv[j]
        for k in range(k_arms):
            akj = arms[k, j]
            w = work[k]
            for i in range(d):
                w[i] += akj * row[i]
        j += 1
    k = 0
    while k + 4 <= k_arms:
        _score_arms4(arms, theta, beta, scores, work, k)
        k += 4
    while k < k_arms:
        x, w = arms[k], work[k]
        q = 0.0
        t = 0.0
        for i in range(d):
            q += x[i] * w[i]
            t += x[i] * theta[i]
        scores[k] = _score(t, q, beta)
        k += 1
    return True


@njit(cache=CACHE, nogil=True, inline="always")
def _score(x_theta, quad, beta):
    # quad forms are >= 0 in exact arithmetic; clip the rounding below zero.
    return x_theta + beta * math.sqrt(quad if quad > 0.0 else 0.0)


@njit(cache=CACHE, nogil=True, inline="always")
def _score_arms4(arms, theta, beta, scores, work, k):
    """Scores of arms k, ..., k + 3: their eight dot products, each summed in index order from
    0.0 as ``_dot`` does, run as eight independent chains in one loop (one add's latency per
    step for all eight, where chains run one after another wait d adds each)."""
    x0, x1, x2, x3 = arms[k], arms[k + 1], arms[k + 2], arms[k + 3]
    w0, w1, w2, w3 = work[k], work[k + 1], work[k + 2], work[k + 3]
    q0 = q1 = q2 = q3 = 0.0
    t0 = t1 = t2 = t3 = 0.0
    for i in range(arms.shape[1]):
        th = theta[i]
        q0 += x0[i] * w0[i]
        q1 += x1[i] * w1[i]
        q2 += x2[i] * w2[i]
        q3 += x3[i] * w3[i]
        t0 += x0[i] * th
        t1 += x1[i] * th
        t2 += x2[i] * th
        t3 += x3[i] * th
    scores[k] = _score(t0, q0, beta)
    scores[k + 1] = _score(t1, q1, beta)
    scores[k + 2] = _score(t2, q2, beta)
    scores[k + 3] = _score(t3, q3, beta)


@njit(cache=CACHE, nogil=True)
def _argmax_first(scores):
    # Ties go to the lowest index, as numpy's argmax does (Policy.select's rule).
    best = 0
    for k in range(1, scores.shape[0]):
        if scores[k] > scores[best]:
            best = k
    return best


# -- decisions -----------------------------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def ucb_scores(arms, theta, inv, beta, out):
    """Fill ``out`` (K,) with the UCB scores of ``arms`` (K, d); OK or BAD_ARMS."""
    work = np.empty(arms.shape)
    return OK if _ucb_row(arms, theta, inv, beta, out, work) else BAD_ARMS


@njit(cache=CACHE, nogil=True)
def ucb_argmax(arms, theta, inv, beta):
    """Index of the highest UCB score among ``arms`` (K, d), or BAD_ARMS."""
    work = np.empty(arms.shape)
    scores = np.empty(arms.shape[0])
    if not _ucb_row(arms, theta, inv, beta, scores, work):
        return BAD_ARMS
    return _argmax_first(scores)


@njit(cache=CACHE, nogil=True)
def ucb_argmax_batch(arms, theta, inv, beta, chosen, scores):
    """Choices for B contexts (B, K, d) against one model state (no update in between) into
    ``chosen`` (B,), their scores into ``scores`` (B, K). Returns -1 - b for the first context b
    with a non-finite feature, else OK."""
    work = np.empty(arms.shape[1:])
    for b in range(arms.shape[0]):
        if not _ucb_row(arms[b], theta, inv, beta, scores[b], work):
            return -1 - b
        chosen[b] = _argmax_first(scores[b])
    return OK


@njit(cache=CACHE, nogil=True)
def _radius(kind, params, scalars, count, i):
    """beta of row i's next decision (the learner's own radius function, see RADIUS_OFUL)."""
    if kind == RADIUS_OFUL:
        return oful_beta(params[0], params[1], params[2], params[3], params[4], scalars[i, 0])
    if kind == RADIUS_GLB_OMD:
        return glb_omd_beta(params[0], params[1], params[2], params[3], count[i])
    # Hvt-UCB eq. (11): beta_{t-1} with t - 1 = n_updates.
    return hvt_ucb_beta(params[0], params[1], params[2], params[3], count[i])


# For other compiled modules (replay/row_kernel.py, engine/compiled_pass.py): a row's radius, a
# context's UCB scores and the decision among them.
radius = _radius
ucb_row = _ucb_row
argmax_first = _argmax_first


@njit(cache=CACHE, nogil=True, inline="always")
def _arms_status(arms, theta):
    """OK for a context of K >= 1 arms of the row's dimension, else BAD_SHAPE or NO_ARMS: the
    shape checks of the Python entry points, done where the arms are read anyway."""
    if arms.shape[1] != theta.shape[1]:
        return BAD_SHAPE
    if arms.shape[0] == 0:
        return NO_ARMS
    return OK


@njit(cache=CACHE, nogil=True)
def ucb_scores_row(arms, theta, inv, other, scalars, count, i, kind, params, out):
    """``ucb_scores`` for the model in row i of a chunk (``other`` is the learner's third array,
    unused here: every row entry point takes the whole chunk). OK, or BAD_SHAPE, NO_ARMS,
    BAD_ARMS with ``out`` unwritten."""
    status = _arms_status(arms, theta)
    if status != OK:
        return status
    work = np.empty(arms.shape)
    beta = _radius(kind, params, scalars, count, i)
    return OK if _ucb_row(arms, theta[i], inv[i], beta, out, work) else BAD_ARMS


@njit(cache=CACHE, nogil=True)
def ucb_best_row(arms, theta, inv, other, scalars, count, i, kind, params):
    """``(index, score)`` of the highest UCB score among ``arms`` for the model in row i of a
    chunk (the score is ``ucb_scores_row``'s to the bit); index BAD_SHAPE, NO_ARMS or BAD_ARMS
    (``ucb_scores_row``'s statuses) on bad input."""
    status = _arms_status(arms, theta)
    if status != OK:
        return status, 0.0
    work = np.empty(arms.shape)
    scores = np.empty(arms.shape[0])
    if not _ucb_row(arms, theta[i], inv[i], _radius(kind, params, scalars, count, i), scores, work):
        return BAD_ARMS, 0.0
    k = _argmax_first(scores)
    return k, scores[k]


@njit(cache=CACHE, nogil=True)
def ucb_select_row(arms, theta, inv, other, scalars, count, i, kind, params):
    """``ucb_best_row``'s index alone (``Policy.select``: no tuple to build and take apart)."""
    status = _arms_status(arms, theta)
    if status != OK:
        return status
    work = np.empty(arms.shape)
    scores = np.empty(arms.shape[0])
    if not _ucb_row(arms, theta[i], inv[i], _radius(kind, params, scalars, count, i), scores, work):
        return BAD_ARMS
    return _argmax_first(scores)


@njit(cache=CACHE, nogil=True)
def ucb_argmax_batch_row(arms, theta, inv, other, scalars, count, i, kind, params, chosen, scores):
    """``ucb_argmax_batch`` for the model in row i of a chunk."""
    return ucb_argmax_batch(
        arms, theta[i], inv[i], _radius(kind, params, scalars, count, i), chosen, scores
    )


# -- updates -------------------------------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def sherman_morrison(inv, x, weight, v):
    """``inv <- (M + weight x x')^-1`` in place for ``inv = M^-1``, with ``v = M^-1 x`` given.
    ``(v_i v_j) c`` is the same product for (i, j) and (j, i), so a symmetric inv stays exactly
    symmetric. Returns ``x' M^-1 x``."""
    q = _dot(x, v)
    c = weight / (1.0 + weight * q)
    d = x.shape[0]
    for i in range(d):
        vi = v[i]
        for j in range(d):
            inv[i, j] -= (vi * v[j]) * c
    return q


@njit(cache=CACHE, nogil=True)
def oful_update(vinv, b, theta, x, reward, work):
    """One OFUL step in place; returns ``log(1 + x'V^-1 x)``, the increase of log det V."""
    sym_matvec(vinv, x, work)  # v = V_t^-1 x
    return _oful_step(vinv, b, theta, x, reward, work)


@njit(cache=CACHE, nogil=True, inline="always")
def _oful_step(vinv, b, theta, x, reward, v):
    """``oful_update`` given ``v = V_t^-1 x`` (``sym_matvec``'s bits). The play loops pass the
    decision's ``work[k]`` for the chosen arm, which ``_ucb_row`` built with the same sums in the
    same order, rather than computing the product again.

    ``sherman_morrison`` and ``theta = V_{t+1}^-1 b`` (``sym_matvec``) in one pass over four rows
    of ``V^-1`` at a time: each new entry is the one ``sherman_morrison`` stores, and each element
    of theta adds its terms in the order j = 0, 1, ..., d - 1, so the bits are those of the two
    calls one after the other, with one pass over ``V^-1`` instead of two."""
    d = x.shape[0]
    q = _dot(x, v)  # x'V_t^-1 x
    c = 1.0 / (1.0 + 1.0 * q)  # sherman_morrison's weight / (1 + weight q) with weight 1
    for i in range(d):
        b[i] += reward * x[i]  # b_{t+1} = b_t + r x
        theta[i] = 0.0
    # V_{t+1}^-1 = (V_t + x x')^-1 row by row, and theta_{t+1} = V_{t+1}^-1 b_{t+1} from it.
    j = 0
    while j + 4 <= d:
        m0, m1, m2, m3 = vinv[j], vinv[j + 1], vinv[j + 2], vinv[j + 3]
        v0, v1, v2, v3 = v[j], v[j + 1], v[j + 2], v[j + 3]
        b0, b1, b2, b3 = b[j], b[j + 1], b[j + 2], b[j + 3]
        for i in range(d):
            e0 = m0[i] - (v0 * v[i]) * c
            e1 = m1[i] - (v1 * v[i]) * c
            e2 = m2[i] - (v2 * v[i]) * c
            e3 = m3[i] - (v3 * v[i]) * c
            m0[i], m1[i], m2[i], m3[i] = e0, e1, e2, e3
            theta[i] = (((theta[i] + b0 * e0) + b1 * e1) + b2 * e2) + b3 * e3
        j += 4
    while j < d:
        mj, vj, bj = vinv[j], v[j], b[j]
        for i in range(d):
            e = mj[i] - (vj * v[i]) * c
            mj[i] = e
            theta[i] += bj * e
        j += 1
    # Matrix determinant lemma: det(V + x x') = det(V) (1 + x'V^-1 x).
    return math.log1p(q)


@njit(cache=CACHE, nogil=True)
def oful_update_row(theta, vinv, b, scalars, count, i, x, reward, params):
    """``oful_update`` of row i from Python, with its log det (scalars[i, 0]) and count, and the
    input checks in the order the Python ones make them: BAD_SHAPE (x not of the row's
    dimension), BAD_REWARD (beyond MAX_ABS_REWARD, or NaN), BAD_X (a feature NaN, infinite or
    beyond MAX_ABS_FEATURE), the row untouched; else OK. ``params`` is unused: every learner's
    row update takes the same arguments."""
    if x.shape[0] != theta.shape[1]:
        return BAD_SHAPE
    if not _reward_in_bound(reward):
        return BAD_REWARD
    if not _feature_row_ok(x):
        return BAD_X
    # Matrix determinant lemma: log det V_{t+1} = log det V_t + log(1 + x'V_t^-1 x).
    scalars[i, 0] += oful_update(vinv[i], b[i], theta[i], x, reward, np.empty(x.shape[0]))
    count[i] += 1
    return OK


@njit(cache=CACHE, nogil=True)
def oful_beta(fixed_beta, beta_scale, noise_sd, two_log_inv_delta, sqrt_lam_s, logdet):
    """The radius of the next decision: a fixed one, or Abbasi-Yadkori et al. (2011) Theorem 2,
    ``R sqrt(2 log(1/delta) + log det V_t - d log lam) + sqrt(lam) S``, times beta_scale."""
    if fixed_beta >= 0.0:
        return fixed_beta
    return beta_scale * (noise_sd * math.sqrt(two_log_inv_delta + logdet) + sqrt_lam_s)


@njit(cache=CACHE, nogil=True)
def oful_play(arms, rewards, theta_rows, vinv_rows, b_rows, scalars, count, i, params, chosen):
    """Select + update of the model in row i for every row of ``arms`` (n, K, d) with the chosen
    arm's entry of ``rewards`` (n, K), in order; choices into ``chosen``. Returns
    ``(steps done, status)``: on bad input at step t it stops before touching the model in that
    step."""
    n, k_arms, d = arms.shape
    theta, vinv, b = theta_rows[i], vinv_rows[i], b_rows[i]
    fixed_beta, beta_scale, noise_sd, two_log_inv_delta, sqrt_lam_s = (
        params[0],
        params[1],
        params[2],
        params[3],
        params[4],
    )
    logdet = scalars[i, 0]
    arm_work = np.empty((k_arms, d))
    scores = np.empty(k_arms)
    done, status = n, OK
    for t in range(n):
        beta = oful_beta(fixed_beta, beta_scale, noise_sd, two_log_inv_delta, sqrt_lam_s, logdet)
        if not _ucb_row(arms[t], theta, vinv, beta, scores, arm_work):
            done, status = t, BAD_ARMS
            break
        k = _argmax_first(scores)
        r = rewards[t, k]
        if not _reward_in_bound(r):
            done, status = t, BAD_REWARD
            break
        chosen[t] = k
        logdet += _oful_step(vinv, b, theta, arms[t, k], r, arm_work[k])
    scalars[i, 0] = logdet
    count[i] += done
    return done, status


# -- GLB-OMD -------------------------------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def _sigmoid(z):
    # Stable for either sign of z.
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@njit(cache=CACHE, nogil=True)
def _mu(link, z):
    if link == LINK_LOGISTIC:
        return _sigmoid(z)
    if link == LINK_POISSON:
        return math.exp(z)
    return z


@njit(cache=CACHE, nogil=True)
def _dmu(link, z):
    if link == LINK_LOGISTIC:
        return _sigmoid(z) * _sigmoid(-z)  # mu' = sigma(z) sigma(-z): no overflow for any z
    if link == LINK_POISSON:
        return math.exp(z)
    return 1.0


@njit(cache=CACHE, nogil=True)
def reward_ok(link, r):
    """The link's range for a reward: [0, 1] logistic, >= 0 Poisson, any Gaussian, all within
    MAX_ABS_REWARD."""
    if not _reward_in_bound(r):
        return False
    if link == LINK_LOGISTIC:
        return 0.0 <= r <= 1.0
    if link == LINK_POISSON:
        return r >= 0.0
    return True


@njit(cache=CACHE, nogil=True)
def glb_omd_beta(beta_scale, beta_const, beta_log_coef, beta_t_coef, n_updates):
    """beta_t of GLB-OMD eq. (5) (already a radius) with t = n_updates + 1, times beta_scale."""
    t = n_updates + 1
    return beta_scale * math.sqrt(beta_const + beta_log_coef * math.log(2.0 + beta_t_coef * t))


@njit(cache=CACHE, nogil=True)
def glb_omd_update(theta, h, hinv, x, reward, link, s_radius, eta, g, work):
    """One GLB-OMD step (Algorithm 1) in place. Returns OK, or LINK_OVERFLOW with the model
    untouched. ``work`` is scratch of length d."""
    sym_matvec(hinv, x, work)  # v = H_t^-1 X_t
    return _glb_omd_step(theta, h, hinv, x, reward, link, s_radius, eta, g, work)


@njit(cache=CACHE, nogil=True)
def _glb_omd_step(theta, h, hinv, x, reward, link, s_radius, eta, g, work):
    """``glb_omd_update`` given ``work = H_t^-1 x`` (``sym_matvec``'s bits, read only): the play
    loop passes the decision's work row for the chosen arm, built with the same sums."""
    d = x.shape[0]
    # Gradient and quadratic-model Hessian at the OLD theta_t (eq. 4), not at the new one.
    z = _dot(x, theta)
    if link == LINK_POISSON and z > MAX_POISSON_Z:
        return LINK_OVERFLOW
    p = _mu(link, z)
    s = _dmu(link, z)
    q = _dot(x, work)  # ||X_t||^2_{H_t^-1}, with work = v = H_t^-1 X_t
    w = eta * s / g
    # eq. (42a) in closed form: A_t = H_t + w x x', A_t^-1 by Sherman-Morrison (App. D), so
    # zeta = theta - eta (mu(z) - r)/g * A_t^-1 x = theta - eta (mu - r)/g * v / (1 + w q).
    coef = eta * (p - reward) / g / (1.0 + w * q)
    zeta = np.empty(d)
    for i in range(d):
        zeta[i] = theta[i] - coef * work[i]
    if _dot(zeta, zeta) > s_radius * s_radius:
        # eq. (42b): projection onto ||theta|| <= S in the A_t-norm (not Euclidean).
        a = np.empty((d, d))
        for i in range(d):
            for j in range(d):
                a[i, j] = h[i, j] + w * (x[i] * x[j])
        zeta, _ = project_to_ball_in_norm(zeta, a, s_radius)
    z_new = _dot(x, zeta)
    if link == LINK_POISSON and z_new > MAX_POISSON_Z:
        return LINK_OVERFLOW
    # Alg. 1 line 5: H_{t+1} = H_t + hess l_t(theta_{t+1}), the curvature at the NEW theta.
    wp = _dmu(link, z_new) / g
    for i in range(d):
        theta[i] = zeta[i]
        for j in range(d):
            h[i, j] += wp * (x[i] * x[j])
    sherman_morrison(hinv, x, wp, work)  # work = H_t^-1 x from above
    return OK


@njit(cache=CACHE, nogil=True)
def glb_omd_update_row(theta, hinv, h, scalars, count, i, x, reward, params):
    """``glb_omd_update`` of row i from Python, with its count and ``oful_update_row``'s input
    checks (BAD_REWARD: also outside the link's range, ``reward_ok``), else the step's status.
    ``params[4:8]``: link, S, eta, g."""
    if x.shape[0] != theta.shape[1]:
        return BAD_SHAPE
    if not reward_ok(int(params[4]), reward):
        return BAD_REWARD
    if not _feature_row_ok(x):
        return BAD_X
    status = glb_omd_update(
        theta[i],
        h[i],
        hinv[i],
        x,
        reward,
        int(params[4]),
        params[5],
        params[6],
        params[7],
        np.empty(x.shape[0]),
    )
    if status == OK:
        count[i] += 1
    return status


@njit(cache=CACHE, nogil=True)
def glb_omd_play(arms, rewards, theta_rows, hinv_rows, h_rows, scalars, count, i, params, chosen):
    """GLB-OMD select + update over a stream, like ``oful_play``; returns (steps done, status)."""
    n, k_arms, d = arms.shape
    theta, hinv, h = theta_rows[i], hinv_rows[i], h_rows[i]
    beta_scale, beta_const, beta_log_coef, beta_t_coef = params[0], params[1], params[2], params[3]
    link, s_radius, eta, g = int(params[4]), params[5], params[6], params[7]
    n_updates = count[i]
    arm_work = np.empty((k_arms, d))
    scores = np.empty(k_arms)
    done, status = n, OK
    for t in range(n):
        beta = glb_omd_beta(beta_scale, beta_const, beta_log_coef, beta_t_coef, n_updates + t)
        if not _ucb_row(arms[t], theta, hinv, beta, scores, arm_work):
            done, status = t, BAD_ARMS
            break
        k = _argmax_first(scores)
        r = rewards[t, k]
        if not reward_ok(link, r):
            done, status = t, BAD_REWARD
            break
        chosen[t] = k
        # H_t^-1 x from the decision
        status = _glb_omd_step(theta, h, hinv, arms[t, k], r, link, s_radius, eta, g, arm_work[k])
        if status != OK:
            done = t
            break
    count[i] += done
    return done, status


# -- Hvt-UCB -------------------------------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def hvt_ucb_beta(beta_scale, beta_coef, beta_const, p, t):
    """beta_t of Hvt-UCB eq. (10), times beta_scale, with max(t, 1)^p."""
    return beta_scale * (beta_coef * max(t, 1) ** p + beta_const)


@njit(cache=CACHE, nogil=True)
def hvt_ucb_update(theta, v, vinv, x, reward, n_updates, params, work):
    """One Hvt-UCB step (Algorithm 1, lines 5-8) in place. ``params``: beta_scale, beta_coef,
    beta_const, p, tau0, sqrt_alpha, nu, sigma_min, alpha, huber (0/1), project (0/1), S."""
    sym_matvec(vinv, x, work)  # V_{t-1}^-1 X_t
    _hvt_ucb_step(theta, v, vinv, x, reward, n_updates, params, work)


@njit(cache=CACHE, nogil=True)
def _hvt_ucb_step(theta, v, vinv, x, reward, n_updates, params, work):
    """``hvt_ucb_update`` given ``work = V_{t-1}^-1 x`` (``sym_matvec``'s bits, read only): the
    play loop passes the decision's work row for the chosen arm, built with the same sums."""
    beta_scale, beta_coef, beta_const, p, tau0, sqrt_alpha = (
        params[0],
        params[1],
        params[2],
        params[3],
        params[4],
        params[5],
    )
    nu, sigma_min, alpha, huber, project, s_radius = (
        params[6],
        params[7],
        params[8],
        params[9],
        params[10],
        params[11],
    )
    d = x.shape[0]
    t = n_updates + 1
    q = _dot(x, work)  # work = V_{t-1}^-1 X_t
    n = math.sqrt(q if q > 0.0 else 0.0)  # ||X_t||_{V_{t-1}^-1}
    if n == 0.0:
        # X_t = 0: w_t = 0, tau_t = inf and the gradient is zero; V does not move.
        return
    tp = t**p
    # Alg. 1 line 5 / eq. 17: sigma_t, with the 2 sqrt(2) ||X||_{V^-1} term always included.
    floor = (
        math.sqrt(
            2.0
            * hvt_ucb_beta(beta_scale, beta_coef, beta_const, p, t - 1)
            / (tau0 * sqrt_alpha * tp)
        )
        * n
    )
    sigma = max(max(nu, sigma_min), max(floor, 2.0 * math.sqrt(2.0) * n))
    w = n / (sigma * sqrt_alpha)  # Alg. 1 line 6: w_t, from V_{t-1}
    tau = tau0 * math.sqrt(1.0 + w * w) / w * tp if huber != 0.0 else math.inf
    # Alg. 1 line 7 / eq. 9: V_t = V_{t-1} + X X' / (alpha sigma^2).
    weight = 1.0 / (alpha * sigma * sigma)
    # Alg. 1 line 8 / eq. 8 in closed form: theta~ = theta + clip(z, -tau, tau) V_t^-1 X / sigma,
    # with z = (r - X'theta)/sigma at the old theta, and V_t^-1 X = V_{t-1}^-1 X / (1 + weight n^2).
    z = (reward - _dot(x, theta)) / sigma
    step = min(max(z, -tau), tau) / sigma
    c = step / (1.0 + weight * n * n)
    for i in range(d):
        for j in range(d):
            v[i, j] += weight * (x[i] * x[j])
    sherman_morrison(vinv, x, weight, work)
    new = np.empty(d)
    for i in range(d):
        new[i] = theta[i] + c * work[i]
    if project != 0.0 and _dot(new, new) > s_radius * s_radius:
        new, _ = project_to_ball_in_norm(new, v, s_radius)  # projection in the V_t-norm
    for i in range(d):
        theta[i] = new[i]


@njit(cache=CACHE, nogil=True)
def hvt_ucb_update_row(theta, vinv, v, scalars, count, i, x, reward, params):
    """``hvt_ucb_update`` of row i from Python, with its count and ``oful_update_row``'s input
    checks (BAD_SHAPE, BAD_REWARD, BAD_X, the row untouched), else OK."""
    if x.shape[0] != theta.shape[1]:
        return BAD_SHAPE
    if not _reward_in_bound(reward):
        return BAD_REWARD
    if not _feature_row_ok(x):
        return BAD_X
    hvt_ucb_update(theta[i], v[i], vinv[i], x, reward, count[i], params, np.empty(x.shape[0]))
    count[i] += 1
    return OK


@njit(cache=CACHE, nogil=True)
def hvt_ucb_play(arms, rewards, theta_rows, vinv_rows, v_rows, scalars, count, i, params, chosen):
    """Hvt-UCB select (eq. 11, beta_{t-1}) + update over a stream; returns (steps done, status)."""
    n, k_arms, d = arms.shape
    theta, vinv, v = theta_rows[i], vinv_rows[i], v_rows[i]
    n_updates = count[i]
    arm_work = np.empty((k_arms, d))
    scores = np.empty(k_arms)
    done, status = n, OK
    for t in range(n):
        beta = hvt_ucb_beta(params[0], params[1], params[2], params[3], n_updates + t)
        if not _ucb_row(arms[t], theta, vinv, beta, scores, arm_work):
            done, status = t, BAD_ARMS
            break
        k = _argmax_first(scores)
        r = rewards[t, k]
        if not _reward_in_bound(r):
            done, status = t, BAD_REWARD
            break
        chosen[t] = k
        # V_{t-1}^-1 x from the decision
        _hvt_ucb_step(theta, v, vinv, arms[t, k], r, n_updates + t, params, arm_work[k])
    count[i] += done
    return done, status


# -- the ellipsoid-norm projection ---------------------------------------------------------------


@njit(cache=CACHE, nogil=True)
def project_to_ball_in_norm(zeta, a, radius):
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
    norm_zeta = math.sqrt(_dot(zeta, zeta))
    if norm_zeta <= radius:
        return zeta, 0.0
    d = zeta.shape[0]
    evals, q = np.linalg.eigh(a)
    ac = np.empty(d)  # a_i c_i with c = Q' zeta
    for i in range(d):
        c = 0.0
        for j in range(d):
            c += q[j, i] * zeta[j]
        ac[i] = evals[i] * c
    excess = norm_zeta / radius - 1.0
    lo = max(evals[0] * excess, 0.0)
    hi = evals[d - 1] * excess
    nu = 0.5 * (lo + hi)
    inv_r = 1.0 / radius
    t = np.empty(d)
    for _ in range(_PROJECTION_STEPS):
        n2 = 0.0
        for i in range(d):
            t[i] = ac[i] / (evals[i] + nu)
            n2 += t[i] * t[i]
        n = math.sqrt(n2)
        phi = 1.0 / n - inv_r
        # phi is increasing in nu: phi < 0 means ||theta|| > r, so the root is above nu.
        if phi < 0.0:
            lo = nu
        else:
            hi = nu
        if hi - lo <= 1e-15 * max(hi, 1.0):
            break
        # d||theta||^2/dnu = -2 sum t_i^2 / (a_i + nu); dphi/dnu = -(1/2) n^-3 d||theta||^2/dnu.
        s = 0.0
        for i in range(d):
            s += t[i] * (t[i] / (evals[i] + nu))
        dphi = s / (n2 * n)
        step = nu - phi / dphi if dphi > 0.0 else 0.5 * (lo + hi)
        nu = step if lo < step < hi else 0.5 * (lo + hi)
    theta = np.empty(d)
    for i in range(d):
        t[i] = ac[i] / (evals[i] + nu)
    for i in range(d):
        s = 0.0
        for j in range(d):
            s += q[i, j] * t[j]
        theta[i] = s
    # Remove the residual rounding of the root so that ||theta|| <= radius holds exactly enough
    # for the invariant checks; the rescale is by a factor within ~1e-15 of 1.
    n = math.sqrt(_dot(theta, theta))
    if n > radius:
        for i in range(d):
            theta[i] *= radius / n
    return theta, nu
