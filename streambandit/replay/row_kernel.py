"""A replay row of every linear UCB target of its model key in one compiled call: each target's
scores and choice, the reward model's predictions and its update, and each target's estimators'
sums.

The runner's per-row path calls each of these from Python (``Policy.scores``,
``decision.choice_with_probabilities``, ``RidgeRewardModel.predict_then_learn``,
``OffPolicyEvaluator.add_also_to``), four compiled calls per target with Python between them.
Here they are the same compiled functions on the same arrays, so every bit is the same
(tests/unit/replay/test_row_kernel.py compares the two paths): the targets touch none of each
other's arrays, so the order across targets does not matter, and the reward model, shared by all
targets (runner._RewardModels), predicts and learns once. Each target's own update, which
differs per learner, stays the policy's call. ``python -m bench.replay`` measures the runner.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.engine.decision import choice_kernel
from streambandit.numerics import kernels
from streambandit.numerics.jit import CACHE
from streambandit.replay import sums

# decide_and_sum_targets's first result: the target at its second refused the arms' features.
ARMS_REFUSED = 1
ROW_OK = 0  # ... or the row was added (else it is sums.add_row's refusal status)


@njit(cache=CACHE, nogil=True)
def decide_and_sum_targets(
    arms,
    targets,
    digests,
    probs,
    r_inv,
    r_b,
    r_theta,
    intercept,
    r_lo,
    r_hi,
    predicted,
    action,
    propensity,
    reward,
    clip,
    lo,
    hi,
    out,
):
    """One row for the targets ``targets[j] = (theta, inv, scalars, count, i, kind, params,
    epsilon, slot, pooled, by_key)``: the model in row i of its chunk chooses among ``arms``
    (K, d) with the exploration draw of ``digests[slot]``, its probabilities into ``probs[j]``;
    the reward model's predictions into ``predicted`` and its update with the logged arm; the
    row's terms added to the target's ``pooled`` and ``by_key`` sums (sums.add_row), and
    ``out[j] = (choice, w, pi[a], sum pi q, q[a])``.

    Returns ``(ROW_OK, 0)``; ``(ARMS_REFUSED, j)`` when the arms' features are refused (nothing
    but ``probs`` changed); ``(status, j)`` with sums.add_row's status when it refuses the row
    (the targets before j added it, j and later not)."""
    scores = np.empty(arms.shape[0])
    work = np.empty(arms.shape)
    for j in range(len(targets)):
        theta, inv, scalars, count, i, kind, params, epsilon, slot, _, _ = targets[j]
        # kernels.ucb_scores_row
        beta = kernels.radius(kind, params, scalars, count, i)
        if not kernels.ucb_row(arms, theta[i], inv[i], beta, scores, work):
            return ARMS_REFUSED, j
        # decision.choice_with_probabilities
        out[j, 0] = choice_kernel(scores, epsilon, digests[slot], probs[j])
    # estimators.RidgeRewardModel.predict_then_learn
    sums.ridge_predict(r_theta, arms, intercept, predicted, r_lo, r_hi)
    sums.ridge_update(r_inv, r_b, r_theta, arms[action], reward, intercept)
    # estimators.OffPolicyEvaluator.add_also_to
    for j in range(len(targets)):
        pooled, by_key = targets[j][9], targets[j][10]
        status, w, pa, dm, qa = sums.add_row(
            pooled, by_key, probs[j], predicted, action, propensity, reward, clip, lo, hi
        )
        if status != sums.TERMS_OK:
            return status, j
        out[j, 1] = w
        out[j, 2] = pa
        out[j, 3] = dm
        out[j, 4] = qa
    return ROW_OK, 0
