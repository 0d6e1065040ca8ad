"""The kernels' sums are the index-order sums, to the bit.

The kernels block their loops (four rows of a matrix per pass, two arms per pass, four arms' dot
products side by side, the update fused into one pass over V^-1) for speed; every sum must still
add its terms one after another in index order, so a model's numbers do not depend on how the
loops are arranged. The oracle here is that order written out as plain Python loops over Python
floats (IEEE double, one rounding per operation, like the compiled code without fastmath).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.numerics import kernels

# d and K around the block sizes (4 rows, 2 and 4 arms): every remainder path runs.
SHAPES = [(1, 1), (3, 2), (4, 4), (5, 3), (7, 5), (8, 9), (20, 10)]


def ref_dot(a, b):
    s = 0.0
    for i in range(len(a)):
        s += a[i] * b[i]
    return s


def ref_matvec(m, x):
    """``m @ x`` as ``sum_j x[j] m[j][i]``, j in order, from 0.0 (sym_matvec's definition)."""
    d = len(x)
    out = [0.0] * d
    for j in range(d):
        for i in range(d):
            out[i] += x[j] * m[j][i]
    return out


def ref_scores(arms, theta, inv, beta):
    scores = []
    for x in arms:
        q = ref_dot(x, ref_matvec(inv, x))
        scores.append(ref_dot(x, theta) + beta * math.sqrt(q if q > 0.0 else 0.0))
    return scores


def ref_oful_update(vinv, b, x, reward):
    """One OFUL step on lists: Sherman-Morrison with v = V^-1 x, b += r x, theta = V^-1 b."""
    d = len(x)
    v = ref_matvec(vinv, x)
    q = ref_dot(x, v)
    c = 1.0 / (1.0 + 1.0 * q)
    for i in range(d):
        for j in range(d):
            vinv[i][j] -= (v[i] * v[j]) * c
    for i in range(d):
        b[i] += reward * x[i]
    return ref_matvec(vinv, b), math.log1p(q)


def random_inputs(rng, d, k):
    arms = rng.normal(size=(k, d))
    arms[rng.random((k, d)) < 0.1] = 0.0  # zeros (and -0.0 below): the 0.0 + ... starts matter
    arms[rng.random((k, d)) < 0.05] = -0.0
    a = rng.normal(size=(d, d))
    inv = a @ a.T / d + np.eye(d)
    # A non-symmetric matrix too: the kernels read inv[j, i], not inv[i, j].
    inv_asym = inv + 1e-3 * rng.normal(size=(d, d))
    return arms, rng.normal(size=d), inv, inv_asym


def bits(a) -> bytes:
    return np.asarray(a, dtype=np.float64).tobytes()


@pytest.mark.parametrize("d, k", SHAPES)
def test_sym_matvec_is_the_index_order_sum(d, k):
    rng = np.random.default_rng(d * 100 + k)
    for _ in range(5):
        _, x, inv, inv_asym = random_inputs(rng, d, k)
        for m in (inv, inv_asym):
            out = np.empty(d)
            kernels.sym_matvec(m, x, out)
            assert bits(out) == bits(ref_matvec(m.tolist(), x.tolist()))


@pytest.mark.parametrize("d, k", SHAPES)
def test_ucb_scores_are_the_index_order_sums(d, k):
    rng = np.random.default_rng(d * 100 + k + 1)
    for _ in range(5):
        arms, theta, inv, inv_asym = random_inputs(rng, d, k)
        for m in (inv, inv_asym):
            scores = np.empty(k)
            assert kernels.ucb_scores(arms, theta, m, 0.7, scores) == kernels.OK
            expected = ref_scores(arms.tolist(), theta.tolist(), m.tolist(), 0.7)
            assert np.array_equal(scores, expected)
            assert bits(scores) == bits(expected)
            chosen, batch = np.empty(3, np.int64), np.empty((3, k))
            kernels.ucb_argmax_batch(np.stack([arms] * 3), theta, m, 0.7, chosen, batch)
            assert bits(batch) == bits([expected] * 3)


@pytest.mark.parametrize("d, k", SHAPES)
def test_a_bad_feature_anywhere_refuses_the_arms(d, k):
    rng = np.random.default_rng(7)
    arms, theta, inv, _ = random_inputs(rng, d, k)
    for bad in (math.nan, math.inf, -math.inf, 2 * kernels.MAX_ABS_FEATURE):
        for kk, i in {(0, 0), (k - 1, d - 1), (k // 2, d // 2)}:
            a = arms.copy()
            a[kk, i] = bad
            assert kernels.ucb_scores(a, theta, inv, 1.0, np.empty(k)) == kernels.BAD_ARMS
    edge = np.full((k, d), kernels.MAX_ABS_FEATURE)
    assert kernels.ucb_scores(edge, theta, inv, 1.0, np.empty(k)) == kernels.OK


@pytest.mark.parametrize("d, k", SHAPES)
def test_oful_update_is_the_index_order_step(d, k):
    rng = np.random.default_rng(d * 100 + k + 2)
    _, _, inv, _ = random_inputs(rng, d, k)
    vinv, b, theta = inv.copy(), rng.normal(size=d), np.empty(d)
    r_vinv, r_b = inv.tolist(), b.tolist()
    for _ in range(5):
        x, reward = rng.normal(size=d), float(rng.normal())
        inc = kernels.oful_update(vinv, b, theta, x, reward, np.empty(d))
        r_theta, r_inc = ref_oful_update(r_vinv, r_b, x.tolist(), reward)
        assert bits(vinv) == bits(r_vinv)
        assert bits(b) == bits(r_b)
        assert bits(theta) == bits(r_theta)
        assert inc == r_inc


@pytest.mark.parametrize("d, k", [(5, 3), (8, 9), (20, 10)])
def test_oful_play_is_the_index_order_loop(d, k):
    """play (whose update reuses the decision's V^-1 x) against select + update written out."""
    rng = np.random.default_rng(d + k)
    n = 40
    arms = rng.normal(size=(n, k, d))
    arms /= np.linalg.norm(arms, axis=2, keepdims=True)
    rewards = rng.normal(size=(n, k))
    policy = make_policy("oful", dim=d, noise_sd=0.1)
    chosen = policy.play(arms, rewards)

    fixed, scale, sd, two_log, sqrt_lam_s = policy._store.params[:5]
    vinv, b, theta, logdet = np.eye(d).tolist(), [0.0] * d, [0.0] * d, 0.0
    expected = []
    for t in range(n):
        beta = scale * (sd * math.sqrt(two_log + logdet) + sqrt_lam_s)
        assert fixed < 0.0  # the theory radius
        scores = ref_scores(arms[t].tolist(), theta, vinv, beta)
        i = max(range(k), key=lambda j: (scores[j], -j))  # first maximum
        expected.append(i)
        theta, inc = ref_oful_update(vinv, b, arms[t, i].tolist(), float(rewards[t, i]))
        logdet += inc
    state = policy.state_dict()
    assert chosen.tolist() == expected
    assert bits(state["theta"]) == bits(theta)
    assert bits(state["vinv"]) == bits(vinv)
    assert bits(state["b"]) == bits(b)
    assert state["logdet"] == logdet
