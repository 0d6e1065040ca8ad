"""A replay row of a linear UCB target in one compiled call: the target's scores and choice, the
reward model's predictions and its update, and the estimators' sums.

The runner's per-row path called each of these from Python (``Policy.scores``,
``decision.choice_with_probabilities``, ``RidgeRewardModel.predict_then_learn``,
``OffPolicyEvaluator.add_also_to``), four compiled calls with Python between them. Here they are
the same compiled functions called in the same order on the same arrays, so every bit is the
same (tests/unit/replay/test_row_kernel.py compares the two paths); the target's own update, which
differs per learner, stays the policy's call. ``python -m bench.replay`` measures the runner.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.engine.decision import choice_kernel
from streambandit.numerics import kernels
from streambandit.numerics.jit import CACHE
from streambandit.replay import sums

BAD_ARMS = kernels.BAD_ARMS


@njit(cache=CACHE, nogil=True)
def decide_and_sum_row(
    arms,
    theta,
    inv,
    scalars,
    count,
    i,
    kind,
    params,
    epsilon,
    digest,
    probs,
    learn_reward_model,
    r_inv,
    r_b,
    r_theta,
    intercept,
    r_lo,
    r_hi,
    predicted,
    pooled,
    by_key,
    action,
    propensity,
    reward,
    clip,
    lo,
    hi,
):
    """One row: the target's choice among ``arms`` (K, d) for the model in row i of its chunk
    and its probabilities into ``probs``; the reward model's predictions into ``predicted`` and
    its update with the logged arm (when ``learn_reward_model``; else ``predicted`` holds them
    already); the row's terms added to ``pooled`` and ``by_key`` (sums.add_row).

    Returns ``(choice, status, w, pi[a], sum pi q, q[a])``: choice BAD_ARMS (nothing changed)
    when an arm's features are refused; status is sums.add_row's (nothing added unless OK)."""
    # kernels.ucb_scores_row
    scores = np.empty(arms.shape[0])
    work = np.empty(arms.shape)
    beta = kernels.radius(kind, params, scalars, count, i)
    if not kernels.ucb_row(arms, theta[i], inv[i], beta, scores, work):
        return BAD_ARMS, 0, 0.0, 0.0, 0.0, 0.0
    # decision.choice_with_probabilities
    choice = choice_kernel(scores, epsilon, digest, probs)
    # estimators.RidgeRewardModel.predict_then_learn
    if learn_reward_model:
        sums.ridge_predict(r_theta, arms, intercept, predicted, r_lo, r_hi)
        sums.ridge_update(r_inv, r_b, r_theta, arms[action], reward, intercept)
    # estimators.OffPolicyEvaluator.add_also_to
    status, w, pa, dm, qa = sums.add_row(
        pooled, by_key, probs, predicted, action, propensity, reward, clip, lo, hi
    )
    return choice, status, w, pa, dm, qa
