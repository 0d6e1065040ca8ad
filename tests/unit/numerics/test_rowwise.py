"""The row-independent products against two oracles: numpy (to rounding) and a plain Python loop
that sums in the same order (to the bit: no reassociation, no fused multiply-add)."""

import numpy as np
import pytest

from streambandit.numerics import rowwise


def in_order(terms):
    s = 0.0
    for t in terms:
        s += t
    return s


@pytest.mark.parametrize(
    "n, k, m", [(1, 1, 1), (3, 7, 5), (17, 33, 9), (64, 200, 3), (0, 4, 2), (2, 0, 3)]
)
def test_products_match_numpy_and_an_in_order_python_sum(n, k, m):
    rng = np.random.default_rng(n * 1000 + k * 10 + m)
    a, b, c = rng.standard_normal((n, k)), rng.standard_normal((k, m)), rng.standard_normal((m, k))
    v, a2 = rng.standard_normal(k), rng.standard_normal((n, k))
    got = rowwise.matmul(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
    assert got.tolist() == [
        [in_order(a[i, q] * b[q, j] for q in range(k)) for j in range(m)] for i in range(n)
    ]
    assert rowwise.matvec(a, v).tolist() == [
        in_order(a[i, q] * v[q] for q in range(k)) for i in range(n)
    ]
    assert rowwise.rowdot(a, a2).tolist() == [
        in_order(a[i, q] * a2[i, q] for q in range(k)) for i in range(n)
    ]
    d2 = rowwise.sq_distances(a, c)
    np.testing.assert_allclose(
        d2, ((a[:, None, :] - c[None, :, :]) ** 2).sum(-1), rtol=1e-12, atol=1e-12
    )
    assert d2.tolist() == [
        [in_order((a[i, q] - c[j, q]) ** 2 for q in range(k)) for j in range(m)] for i in range(n)
    ]


def test_a_row_does_not_depend_on_its_neighbours_or_its_offset():
    rng = np.random.default_rng(0)
    b = rng.standard_normal((37, 11))
    block = rng.standard_normal((65, 37))
    whole = rowwise.matmul(block[1:], b)
    for i in range(64):
        assert rowwise.matmul(block[1 + i : 2 + i], b).tobytes() == whole[i].tobytes()
    tied = np.tile(block[3], (50, 1))
    assert (rowwise.matmul(tied, b) == rowwise.matmul(tied, b)[0]).all()


def test_non_contiguous_inputs_and_shape_errors():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 8)), rng.standard_normal((5, 8))
    assert (
        rowwise.matmul(a[:, ::2], b[:, ::2].T).tolist()
        == rowwise.matmul(a[:, ::2].copy(), b[:, ::2].T.copy()).tolist()
    )
    with pytest.raises(ValueError, match="matmul"):
        rowwise.matmul(a, b)
    with pytest.raises(ValueError, match="matvec"):
        rowwise.matvec(a, np.ones(3))
    with pytest.raises(ValueError, match="rowdot"):
        rowwise.rowdot(a, b)
    with pytest.raises(ValueError, match="sq_distances"):
        rowwise.sq_distances(a, np.ones((2, 3)))
