"""Oracle tests of the shared numerics: dense inverses and a generic constrained solver."""

import numpy as np
import pytest
from scipy.optimize import minimize

from streambandit.numerics.linalg import (
    project_to_ball_in_norm,
    sherman_morrison_update,
    sym_matvec,
)


def random_spd(rng, d, cond=100.0):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    evals = np.geomspace(1.0, cond, d)
    return (q * evals) @ q.T


def test_sherman_morrison_matches_dense_inverse():
    rng = np.random.default_rng(0)
    d = 6
    m = random_spd(rng, d)
    inv = np.linalg.inv(m)
    inv = 0.5 * (inv + inv.T)  # start exactly symmetric, as the policies do (I / lambda)
    for _ in range(50):
        x = rng.standard_normal(d)
        w = float(rng.uniform(0.1, 3.0))
        v = sherman_morrison_update(inv, x, w)
        m = m + w * np.outer(x, x)
        np.testing.assert_allclose(
            v, np.linalg.solve(m - w * np.outer(x, x), x), rtol=1e-9, atol=1e-12
        )
    np.testing.assert_allclose(inv, np.linalg.inv(m), rtol=1e-9, atol=1e-12)
    assert np.array_equal(inv, inv.T), "a symmetric inverse must stay exactly symmetric"


def test_sym_matvec_equals_the_matrix_product():
    rng = np.random.default_rng(1)
    m = random_spd(rng, 6)
    x = rng.standard_normal(6)
    np.testing.assert_allclose(sym_matvec(m, x), m @ x, rtol=1e-12)
    # summed over j in order: with integer-valued data the float result is exact
    mi, xi = rng.integers(-9, 9, (5, 5)).astype(float), rng.integers(-9, 9, 5).astype(float)
    mi = mi + mi.T
    assert sym_matvec(mi, xi).tolist() == (mi @ xi).tolist()


def test_projection_is_identity_inside_the_ball():
    rng = np.random.default_rng(2)
    zeta = np.array([0.3, -0.2, 0.1])
    theta, nu = project_to_ball_in_norm(zeta, random_spd(rng, 3), 1.0)
    assert theta is zeta and nu == 0.0


@pytest.mark.parametrize("seed", range(10))
def test_projection_matches_scipy_and_satisfies_kkt(seed):
    rng = np.random.default_rng(seed)
    d = 5
    a = random_spd(rng, d, cond=float(rng.uniform(1, 1e3)))
    radius = float(rng.uniform(0.5, 3.0))
    zeta = rng.standard_normal(d)
    zeta *= radius * float(rng.uniform(1.05, 20.0)) / np.linalg.norm(zeta)
    theta, nu = project_to_ball_in_norm(zeta, a, radius)

    # KKT: A (theta - zeta) + nu theta = 0, nu > 0, ||theta|| = r (the constraint is active).
    assert nu > 0.0
    assert np.linalg.norm(theta) == pytest.approx(radius, rel=1e-12)
    residual = a @ (theta - zeta) + nu * theta
    assert np.linalg.norm(residual) <= 1e-9 * np.linalg.norm(a @ zeta)

    # A generic solver of the same problem agrees.
    res = minimize(
        lambda t: 0.5 * (t - zeta) @ a @ (t - zeta),
        x0=zeta * radius / np.linalg.norm(zeta),
        jac=lambda t: a @ (t - zeta),
        constraints=[{"type": "ineq", "fun": lambda t: radius**2 - t @ t, "jac": lambda t: -2 * t}],
        method="SLSQP",
        options={"ftol": 1e-15, "maxiter": 500},
    )
    # SLSQP stops short of the optimum on ill-conditioned A (scipy >= 1.16 by up to ~3e-6), so the
    # oracle is its objective: ours is no worse, and the two points are close.
    f = lambda t: 0.5 * (t - zeta) @ a @ (t - zeta)
    assert f(theta) <= f(res.x) * (1 + 1e-9) + 1e-12
    np.testing.assert_allclose(theta, res.x, atol=1e-4)
    # And the result is not the Euclidean rescale (a different algorithm) unless A is isotropic.
    assert not np.allclose(theta, zeta * radius / np.linalg.norm(zeta), atol=1e-6)


def test_projection_is_deterministic():
    rng = np.random.default_rng(3)
    a = random_spd(rng, 8)
    zeta = rng.standard_normal(8) * 5
    t1, _ = project_to_ball_in_norm(zeta.copy(), a.copy(), 1.5)
    t2, _ = project_to_ball_in_norm(zeta.copy(), a.copy(), 1.5)
    assert t1.tobytes() == t2.tobytes()
