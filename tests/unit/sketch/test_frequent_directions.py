"""Frequent Directions and robust FD against their error bounds (Lemma 1, Lemma 4 of paper 002) and
against a literal row-by-row transcription of Algorithm 2."""

import numpy as np
import pytest

from streambandit.sketch.frequent_directions import FrequentDirections, fd_shrink


def heavy_tail_matrix(rng, n, d, power):
    """n x d rows with singular values decaying like i^-power (power 0: isotropic, full rank)."""
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    return rng.standard_normal((n, d)) * (np.arange(1, d + 1) ** -power) @ q.T


def tail_bound(x, ell):
    """min over k < ell of ||X - X_k||_F^2 / (ell - k): Delta of Lemma 1, from the exact SVD."""
    s2 = np.linalg.svd(x, compute_uv=False) ** 2
    tails = np.concatenate([[s2.sum()], s2.sum() - np.cumsum(s2)])  # tails[k] = ||X - X_k||_F^2
    return [tails[k] / (ell - k) for k in range(ell)]


def sketch(x, ell, **kw):
    fd = FrequentDirections(x.shape[1], ell, **kw)
    for row in x:
        fd.append(row)
    return fd


CASES = [
    (n, d, ell, power, fast)
    for (n, d) in [(200, 30), (97, 12)]
    for ell in (3, 8)
    for power in (0.0, 0.5, 1.5)
    for fast in (True, False)
]


@pytest.mark.parametrize("n, d, ell, power, fast", CASES)
def test_fd_error_is_within_lemma_1_for_every_k(n, d, ell, power, fast):
    rng = np.random.default_rng(n * d + ell)
    x = heavy_tail_matrix(rng, n, d, power)
    fd = sketch(x, ell, fast=fast)
    err = x.T @ x - fd.rows.T @ fd.rows
    evals = np.linalg.eigvalsh(err)
    scale = np.linalg.norm(x) ** 2 * 1e-12
    assert evals[0] >= -scale, "FD must under-estimate: X'X - S'S is PSD"
    spectral = evals[-1]
    assert spectral > 1e-6, "the stream must actually have been shrunk"
    # The certificate: the accumulated shrink bounds the error, and Lemma 1 bounds the shrink.
    assert spectral <= fd.shrink_total + scale
    for k, bound in enumerate(tail_bound(x, ell)):
        assert spectral <= fd.shrink_total + scale <= bound + 2 * scale, f"k = {k}"
    assert fd.rows.shape[0] < fd.capacity and fd.capacity == (2 * ell if fast else ell)


@pytest.mark.parametrize("fast", [True, False])
def test_robust_fd_over_estimates_within_lemma_4(fast):
    rng = np.random.default_rng(7)
    x = heavy_tail_matrix(rng, 150, 20, 0.3)
    ell = 5
    fd = sketch(x, ell, robust=True, fast=fast)
    assert fd.alpha == fd.shrink_total > 0.0  # Alg. 3: alpha accumulates the FULL shrink
    over = fd.covariance() - x.T @ x  # S'S + alpha I - X'X
    evals = np.linalg.eigvalsh(over)
    scale = np.linalg.norm(x) ** 2 * 1e-12
    assert evals[0] >= -scale, "robust FD must over-estimate X'X"
    assert evals[-1] <= fd.alpha + scale
    assert evals[-1] <= min(tail_bound(x, ell)) + scale  # Lemma 4
    # The same stream through plain FD gives the same S: alpha is the only difference.
    np.testing.assert_array_equal(sketch(x, ell, fast=fast).rows, fd.rows)


def test_fd_is_exact_when_the_stream_fits_in_the_sketch():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((120, 4)) @ rng.standard_normal((4, 40))  # rank 4
    for fast, ell in [(True, 4), (False, 5)]:  # fast keeps l rows exactly, plain l - 1
        fd = sketch(x, ell, fast=fast)
        assert fd.shrink_total <= 1e-20 * np.linalg.norm(x) ** 2
        np.testing.assert_allclose(
            fd.rows.T @ fd.rows, x.T @ x, rtol=0, atol=1e-9 * np.linalg.norm(x) ** 2
        )
    lossy = sketch(x, 3)
    assert lossy.shrink_total > 1.0  # one row short of the rank: the shrink is real


def algorithm_2(x, ell):
    """Algorithm 2 as printed: insert x into the (zero) last row of an l x d S, SVD every row,
    subtract sigma_l^2 from every squared singular value."""
    s = np.zeros((ell, x.shape[1]))
    total = 0.0
    for row in x:
        s[-1] = row
        _, sig, vt = np.linalg.svd(s, full_matrices=False)
        shrink = sig[ell - 1] ** 2
        total += shrink
        s = np.sqrt(np.maximum(sig**2 - shrink, 0.0))[:, None] * vt
    return s, total


def test_plain_variant_equals_algorithm_2_row_by_row():
    rng = np.random.default_rng(11)
    x = heavy_tail_matrix(rng, 80, 15, 0.5)
    ref, ref_total = algorithm_2(x, 6)
    fd = sketch(x, 6, fast=False)
    np.testing.assert_allclose(fd.rows.T @ fd.rows, ref.T @ ref, rtol=0, atol=1e-9)
    assert fd.shrink_total == pytest.approx(ref_total, rel=1e-10)


def test_fast_variant_shrinks_by_sigma_l_plus_1_once_per_l_rows():
    rng = np.random.default_rng(12)
    x = rng.standard_normal((10, 8))
    fd = FrequentDirections(8, 5)
    shrunk = [fd.append(row) for row in x]
    assert shrunk == [False] * 9 + [True]  # the 2l-row buffer fills at row 10
    s = np.linalg.svd(x, compute_uv=False)
    assert fd.shrink_total == pytest.approx(s[5] ** 2, rel=1e-12)
    np.testing.assert_allclose(
        np.linalg.svd(fd.rows, compute_uv=False) ** 2, s[:5] ** 2 - s[5] ** 2, rtol=1e-10
    )
    new, delta = fd_shrink(np.eye(3), 3)  # fewer singular values than kept rows: no shrink
    assert delta == 0.0 and new.shape == (3, 3)
