"""Dyadic Block Sketching (paper 002, Alg. 1/4, Theorem 1) and the Woodbury queries of eq. (5),
against dense linear algebra."""

import math

import numpy as np
import pytest

from streambandit.sketch.dyadic_block import DyadicBlockSketch, max_blocks
from streambandit.sketch.woodbury import SketchedCovariance, stack_inverse


def unit_rows(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def dense_a(cov_like, lam_eff):
    """lam' I + S'S from the stacked rows, the oracle for every Woodbury query."""
    s = np.vstack([cov_like.frozen, cov_like.fd.rows])
    return lam_eff * np.eye(s.shape[1]) + s.T @ s


def assert_queries_match_dense(cov, rng):
    a = dense_a(cov, cov.lam_eff)
    s = np.vstack([cov.frozen, cov.fd.rows])
    m_dense = np.linalg.inv(s @ s.T + cov.lam_eff * np.eye(s.shape[0]))
    np.testing.assert_allclose(cov.minv, m_dense, rtol=0, atol=1e-9)
    v = rng.standard_normal(a.shape[0])
    np.testing.assert_allclose(cov.solve(v), np.linalg.solve(a, v), rtol=0, atol=1e-9)
    arms = rng.standard_normal((6, a.shape[0]))
    expected = np.einsum("kd,kd->k", arms, np.linalg.solve(a, arms.T).T)
    np.testing.assert_allclose(cov.quad_forms(arms), expected, rtol=0, atol=1e-9)
    np.testing.assert_allclose(cov.dense_inverse(), np.linalg.inv(a), rtol=0, atol=1e-9)


@pytest.mark.parametrize("robust", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_woodbury_queries_equal_the_dense_inverse_along_a_stream(robust, fast):
    rng = np.random.default_rng(1)
    d = 15
    cov = SketchedCovariance(d, 4, 0.7, robust=robust, fast=fast)
    xs = rng.standard_normal((60, d))
    for t, x in enumerate(xs):
        cov.update(x)
        if t % 7 == 3:  # between shrinks (bordered eq. 7 steps) and right after them
            assert_queries_match_dense(cov, rng)
    assert cov.shrink_total > 0.0
    closed = cov.freeze(8)  # a second, larger block over an orthogonalised frozen stack
    cov.frozen_shrink = closed
    cov.recompute()
    for x in rng.standard_normal((23, d)):
        cov.update(x)
    assert cov.frozen.shape[0] > 0 and cov.fd.rows.shape[0] > 0
    assert_queries_match_dense(cov, rng)


def test_stack_inverse_of_two_orthogonal_parts_is_the_dense_inverse():
    rng = np.random.default_rng(2)
    d = 12
    parts = []
    for r in (5, 3):
        q, _ = np.linalg.qr(rng.standard_normal((d, r)))
        parts.append(rng.uniform(0.5, 3.0, r)[:, None] * q.T)  # orthogonal rows, distinct norms
    s = np.vstack(parts)
    m = stack_inverse(parts[0], parts[1], 0.3)
    np.testing.assert_allclose(m, np.linalg.inv(s @ s.T + 0.3 * np.eye(8)), rtol=0, atol=1e-12)
    assert np.abs(m[:5, 5:]).max() > 1e-3  # the cross block is genuinely dense (eq. 3 erratum)


@pytest.mark.parametrize(
    "d, l0",
    [
        (784, 50),
        (784, 100),
        (784, 200),
        (500, 50),
        (500, 16),
        (48, 50),
        (57, 50),
        (4, 1),
        (4, 2),
        (3, 1),
    ],
)
def test_block_cap_is_invariant_2(d, l0):
    assert max_blocks(d, l0) == math.floor(math.log2(d / l0 + 1))
    assert {(784, 50): 4, (500, 50): 3, (500, 16): 5, (48, 50): 0}.get(
        (d, l0), max_blocks(d, l0)
    ) == max_blocks(d, l0)


def run(sk, xs, each=None):
    for t, x in enumerate(xs):
        sk.update(x)
        if each is not None:
            each(t, sk)


@pytest.mark.parametrize("robust", [False, True])
@pytest.mark.parametrize("fast", [True, False])
def test_error_stays_within_two_eps_on_a_full_rank_stream(robust, fast):
    """Theorem 1 on isotropic unit rows (the worst case for FD), through every block and the switch
    to exact updates: ||X'X - S'S|| (robust: S'S + alpha I) <= sum of shrinks <= 2 eps."""
    rng = np.random.default_rng(4)
    d, l0, eps = 30, 2, 10.0
    sk = DyadicBlockSketch(d, l0, eps, 1.0, robust=robust, fast=fast)
    xs = unit_rows(rng.standard_normal((130, d)))
    errors = []

    def check(t, sk):
        gram = xs[: t + 1].T @ xs[: t + 1]
        err = np.linalg.eigvalsh(sk.covariance() - gram)
        errors.append(max(-err[0], err[-1]))
        assert errors[-1] <= sk.shrink_total + 1e-9 <= 2 * eps
        if not robust:
            assert err[-1] <= 1e-9  # FD never over-estimates
        else:
            assert err[0] >= -1e-9  # robust FD never under-estimates

    run(sk, xs, check)
    assert (
        sk.bmax == 4 and sk.fallback and sk.n_closed == 4
    )  # blocks of 2, 4, 8 rows, then the one open at the switch
    ells = [sk.block_ell(i) for i in range(sk.n_closed)]
    assert ells == [2, 4, 8, 16]
    # Invariant 1 (every closed block has mass < eps l0, the rows are full rank) and the per-block
    # FD bound shrink_i <= mass_i / l_i: together they give error_i <= eps / 2^i.
    closed = sk.block_mass[:3]
    assert (closed < eps * l0).all() and (closed >= eps * l0 - 1.0 - 1e-9).all()
    assert (sk.block_shrink <= sk.block_mass / np.array(ells) + 1e-12).all()
    assert (sk.block_shrink[:3] > 0).all() and max(errors) > 1.0  # the sketch was really lossy
    # After the switch the error is frozen: every later row is added exactly.
    switch = int(sum(sk.block_mass.round()))
    assert max(errors[switch:]) - min(errors[switch:]) < 1e-8


def test_low_rank_stream_stops_at_the_first_exact_block():
    """Rank 6 in d = 64 with l0 = 1: blocks of 1, 2 and 4 rows are lossy and close at eps l0; the
    8-row block holds the rank exactly and never closes (Theorem 1's B = ceil(log2(k/l0)) = 3)."""
    rng = np.random.default_rng(5)
    d, k = 64, 6
    basis = np.linalg.qr(rng.standard_normal((d, k)))[0].T
    xs = unit_rows(rng.standard_normal((400, k)) @ basis)
    sk = DyadicBlockSketch(d, 1, 10.0, 1.0)
    run(sk, xs)
    assert not sk.fallback and sk.n_closed == 3 and sk.active_ell == 8
    assert sk.cov.fd.shrink_total == 0.0 and sk.active_rows == 400 - int(
        sk.block_mass.round().sum()
    )
    assert sk.basis.shape[0] == k  # the rank test's basis spans the data
    gram = xs.T @ xs
    assert np.linalg.norm(sk.covariance() - gram, 2) <= sk.shrink_total + 1e-9 <= 2 * 10.0
    # Memory stays at the sketch's size: at most sum l_i frozen rows plus the 16-row buffer.
    assert sk.cov.frozen.shape[0] <= 1 + 2 + 4 and sk.cov.n_rows <= 7 + 16


def test_rank_test_sentinels_b1_and_d2():
    """Rank-3 rows, blocks of l0 = 4: App. B.1 runs the rank test from 4 rows on, finds the block
    exact and keeps it open past eps l0; App. D.2 skips the test below d rows, so the size threshold
    closes the block and (cap of 2 blocks at d = 20) switches to exact updates."""
    rng = np.random.default_rng(6)
    d = 20
    xs = unit_rows(rng.standard_normal((60, 3)) @ rng.standard_normal((3, d)))
    b1 = DyadicBlockSketch(d, 4, 3.0, 1.0, rank_test="b1")
    d2 = DyadicBlockSketch(d, 4, 3.0, 1.0, rank_test="d2")
    run(b1, xs)
    run(d2, xs)
    assert (
        not b1.fallback and b1.n_closed == 0 and b1.active_mass > 3.0 * 4 and b1.shrink_total == 0.0
    )
    assert d2.fallback and d2.block_mass[0] < 3.0 * 4


def test_fallback_from_the_first_round_and_after_the_cap_is_exact():
    rng = np.random.default_rng(8)
    d = 9
    assert DyadicBlockSketch(d, 4, 8.0, 1.0).fallback  # l0 > d/3: OFUL from round 1
    sk = DyadicBlockSketch(d, 1, 2.0, 0.5, robust=True)
    xs = unit_rows(rng.standard_normal((40, d)))
    seen = 0
    while not sk.fallback:
        sk.update(xs[seen])
        seen += 1
    a_switch = np.linalg.inv(sk.vinv)  # A_hat at the switch, materialised from the sketch
    run(sk, xs[seen:])
    expected = a_switch + xs[seen:].T @ xs[seen:]  # every later row added exactly (Alg. 4 line 6)
    np.testing.assert_allclose(sk.vinv, np.linalg.inv(expected), rtol=0, atol=1e-9)
    b = rng.standard_normal(d)
    np.testing.assert_allclose(sk.solve(b), np.linalg.solve(expected, b), rtol=0, atol=1e-9)
