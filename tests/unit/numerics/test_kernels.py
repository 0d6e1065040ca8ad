"""The compiled fast path: the same bits whichever way a model is driven, and the right numbers.

Oracles: the per-call Python loop (for play and the batch calls, bit for bit), a brute-force
ridge regression (OFUL), and a plain numpy transcription of GLB-OMD's Algorithm 1 with scipy's
constrained minimiser for the projection step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import minimize

from streambandit import make_policy
from tests.unit.policies.test_policy_contract import assert_same_state

CASES = [
    ("oful", {}),
    ("oful", {"beta": 0.7, "lam": 2.0}),
    ("glb_omd", {"link": "logistic"}),
    ("glb_omd", {"link": "poisson", "S": 2.0}),
    ("glb_omd", {"link": "gaussian", "S": 1.0}),  # small S: the projection runs often
    ("hvt_ucb", {}),
]


def stream(
    seed: int, n: int, k: int, d: int, link: str = "gaussian"
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    arms = rng.normal(size=(n, k, d))
    arms /= np.maximum(1.0, np.linalg.norm(arms, axis=2, keepdims=True))  # ||x|| <= 1
    theta = rng.normal(size=d)
    theta *= 0.8 / np.linalg.norm(theta)
    z = arms @ theta
    if link == "logistic":
        rewards = (rng.random((n, k)) < 1.0 / (1.0 + np.exp(-z))).astype(float)
    elif link == "poisson":
        rewards = rng.poisson(np.exp(z)).astype(float)
    else:
        rewards = z + rng.normal(scale=0.5, size=(n, k))
    return arms, rewards


def _stream_for(name: str, params: dict, seed: int = 0, n: int = 300, k: int = 6, d: int = 5):
    return stream(seed, n, k, d, params.get("link", "gaussian"))


@pytest.mark.parametrize("name, params", CASES)
def test_play_is_the_python_loop_to_the_bit(name, params):
    arms, rewards = _stream_for(name, params)
    fast = make_policy(name, dim=arms.shape[2], **params)
    slow = make_policy(name, dim=arms.shape[2], **params)
    chosen = fast.play(arms, rewards)
    expected = []
    for t in range(len(arms)):
        i = slow.select(arms[t])
        slow.update(arms[t, i], rewards[t, i])
        expected.append(i)
    assert chosen.tolist() == expected
    assert_same_state(fast.state_dict(), slow.state_dict())
    assert fast.n_updates == len(arms)


@pytest.mark.parametrize("name, params", CASES)
def test_play_in_pieces_is_play_in_one_go(name, params):
    arms, rewards = _stream_for(name, params, seed=1)
    whole = make_policy(name, dim=arms.shape[2], **params)
    pieces = make_policy(name, dim=arms.shape[2], **params)
    a = whole.play(arms, rewards)
    b = np.concatenate(
        [pieces.play(arms[i : i + 37], rewards[i : i + 37]) for i in range(0, len(arms), 37)]
    )
    assert np.array_equal(a, b)
    assert_same_state(whole.state_dict(), pieces.state_dict())


@pytest.mark.parametrize("name, params", CASES)
def test_batch_scoring_is_per_context_scoring_to_the_bit(name, params):
    arms, rewards = _stream_for(name, params, seed=2)
    p = make_policy(name, dim=arms.shape[2], **params)
    p.play(arms[:100], rewards[:100])  # a learned state, not the prior
    batch = arms[100:]
    scores = p.scores_batch(batch)
    assert np.array_equal(scores, np.stack([p.scores(a) for a in batch]))
    assert p.select_batch(batch).tolist() == [p.select(a) for a in batch]
    assert p.select_batch(batch).dtype == np.int64
    # ties go to the lowest index, as in select
    tied = np.repeat(batch[:3, :1, :], 4, axis=1)
    assert p.select_batch(tied).tolist() == [0, 0, 0]


def test_oful_matches_brute_force_ridge_regression():
    arms, rewards = stream(3, 400, 8, 6)
    lam = 1.5
    p = make_policy("oful", dim=6, lam=lam)
    chosen = p.play(arms, rewards)
    xs = arms[np.arange(len(arms)), chosen]
    rs = rewards[np.arange(len(arms)), chosen]
    v = lam * np.eye(6) + xs.T @ xs
    np.testing.assert_allclose(p.vinv, np.linalg.inv(v), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(p.theta, np.linalg.solve(v, xs.T @ rs), rtol=1e-9, atol=1e-12)
    assert p.logdet == pytest.approx(np.linalg.slogdet(v)[1] - 6 * math.log(lam), rel=1e-10)
    # the choices are the argmax of the UCB computed from scratch at each step
    q = make_policy("oful", dim=6, lam=lam)
    for t in range(0, len(arms), 41):
        q_state = make_policy("oful", dim=6, lam=lam)
        q_state.play(arms[:t], rewards[:t])
        vt = lam * np.eye(6) + xs[:t].T @ xs[:t]
        theta_t = np.linalg.solve(vt, xs[:t].T @ rs[:t])
        widths = np.sqrt(np.einsum("kd,de,ke->k", arms[t], np.linalg.inv(vt), arms[t]))
        expected = arms[t] @ theta_t + q_state.beta() * widths
        np.testing.assert_allclose(q_state.scores(arms[t]), expected, rtol=1e-9)
    del q


def _glb_omd_reference(arms, rewards, link, s_radius, lam, eta, beta_of_t):
    """GLB-OMD Algorithm 1 in plain numpy; the projection (eq. 42b) by scipy's SLSQP."""
    d = arms.shape[2]
    mu = {"logistic": lambda z: 1 / (1 + np.exp(-z)), "gaussian": lambda z: z, "poisson": np.exp}[
        link
    ]
    dmu = {"logistic": lambda z: mu(z) * (1 - mu(z)), "gaussian": lambda z: 1.0, "poisson": np.exp}[
        link
    ]
    theta, h = np.zeros(d), lam * np.eye(d)
    chosen = []
    for t in range(len(arms)):
        hinv = np.linalg.inv(h)
        ucb = arms[t] @ theta + beta_of_t(t) * np.sqrt(
            np.einsum("kd,de,ke->k", arms[t], hinv, arms[t])
        )
        k = int(np.argmax(ucb))
        chosen.append(k)
        x, r = arms[t, k], rewards[t, k]
        z = x @ theta
        a = h + eta * dmu(z) * np.outer(x, x)
        # eq. (42a): the unconstrained minimiser of the quadratic model.
        zeta = theta - eta * (mu(z) - r) * np.linalg.solve(a, x)
        if zeta @ zeta > s_radius**2:
            res = minimize(
                lambda th: (th - zeta) @ a @ (th - zeta),
                zeta * s_radius / np.linalg.norm(zeta),
                jac=lambda th: 2 * a @ (th - zeta),
                method="SLSQP",
                constraints=[
                    {
                        "type": "ineq",
                        "fun": lambda th: s_radius**2 - th @ th,
                        "jac": lambda th: -2 * th,
                    }
                ],
                options={"ftol": 1e-15, "maxiter": 500},
            )
            zeta = res.x
        theta = zeta
        h = h + dmu(x @ theta) * np.outer(x, x)
    return np.array(chosen), theta, h


@pytest.mark.parametrize("link, s_radius", [("logistic", 3.0), ("gaussian", 0.5), ("poisson", 1.0)])
def test_glb_omd_kernel_matches_a_numpy_transcription_of_algorithm_1(link, s_radius):
    arms, rewards = stream(4, 120, 5, 4, link)
    p = make_policy("glb_omd", dim=4, link=link, S=s_radius)
    lam, eta = p.config()["lam"], p.config()["eta"]
    betas = []
    probe = make_policy("glb_omd", dim=4, link=link, S=s_radius)
    for t in range(len(arms)):
        probe.n_updates = t
        betas.append(probe.beta())
    chosen, theta, h = _glb_omd_reference(
        arms, rewards, link, s_radius, lam, eta, lambda t: betas[t]
    )
    got = p.play(arms, rewards)
    assert got.tolist() == chosen.tolist()
    np.testing.assert_allclose(p.theta, theta, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(p.h, h, rtol=1e-9)
    np.testing.assert_allclose(p.hinv, np.linalg.inv(h), rtol=1e-8, atol=1e-10)
    assert np.linalg.norm(p.theta) <= s_radius + 1e-12


@pytest.mark.parametrize("name, params", CASES)
def test_bad_input_in_play_stops_at_its_round_with_earlier_rounds_applied(name, params):
    arms, rewards = _stream_for(name, params, seed=5, n=40)
    arms[25, 2, 1] = math.nan
    p = make_policy(name, dim=arms.shape[2], **params)
    with pytest.raises(ValueError, match="round 25: arms contain NaN"):
        p.play(arms, rewards)
    q = make_policy(name, dim=arms.shape[2], **params)
    q.play(arms[:25], rewards[:25])
    assert_same_state(p.state_dict(), q.state_dict())

    arms, rewards = _stream_for(name, params, seed=5, n=40)
    rewards[30, :] = math.inf
    p = make_policy(name, dim=arms.shape[2], **params)
    with pytest.raises(ValueError, match="round 30"):
        p.play(arms, rewards)
    assert p.n_updates == 30


def test_play_checks_shapes():
    p = make_policy("oful", dim=3)
    with pytest.raises(ValueError, match=r"\(B, K, 3\)"):
        p.play(np.zeros((4, 2, 2)), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="rewards must have shape"):
        p.play(np.zeros((4, 2, 3)), np.zeros((4, 3)))
    with pytest.raises(ValueError, match="empty"):
        p.select_batch(np.zeros((4, 0, 3)))
    assert p.select_batch(np.zeros((0, 2, 3))).shape == (0,)


def test_logistic_play_refuses_a_reward_outside_0_1():
    arms, rewards = stream(6, 10, 3, 3, "logistic")
    rewards[4] = 2.0
    p = make_policy("glb_omd", dim=3, link="logistic")
    with pytest.raises(ValueError, match=r"round 4: logistic link needs a reward in \[0, 1\]"):
        p.play(arms, rewards)


def _hvt_reference(p, arms, rewards):
    """Hvt-UCB Algorithm 1 in plain numpy (eq. 8-11, 17), driven with the policy's constants."""
    c = p.config()
    d = arms.shape[2]
    theta, v = np.zeros(d), c["lam"] * np.eye(d)
    chosen = []
    for t0 in range(len(arms)):
        vinv = np.linalg.inv(v)
        beta = p._config["beta_scale"] * (p._beta_coef * max(t0, 1) ** p._p + p._beta_const)
        ucb = arms[t0] @ theta + beta * np.sqrt(np.einsum("kd,de,ke->k", arms[t0], vinv, arms[t0]))
        k = int(np.argmax(ucb))
        chosen.append(k)
        x, r, t = arms[t0, k], rewards[t0, k], t0 + 1
        n = math.sqrt(x @ vinv @ x)
        beta_prev = p._config["beta_scale"] * (p._beta_coef * max(t - 1, 1) ** p._p + p._beta_const)
        floor = math.sqrt(2 * beta_prev / (p.tau0 * math.sqrt(c["alpha"]) * t**p._p)) * n
        sigma = max(c["nu"], c["sigma_min"], floor, 2 * math.sqrt(2) * n)
        w = n / (sigma * math.sqrt(c["alpha"]))
        tau = p.tau0 * math.sqrt(1 + w * w) / w * t**p._p
        v = v + np.outer(x, x) / (c["alpha"] * sigma**2)
        z = (r - x @ theta) / sigma
        theta = theta + np.clip(z, -tau, tau) / sigma * np.linalg.solve(v, x)
        if theta @ theta > c["S"] ** 2:
            res = minimize(
                lambda th: (th - theta) @ v @ (th - theta),
                theta * c["S"] / np.linalg.norm(theta),
                jac=lambda th: 2 * v @ (th - theta),
                method="SLSQP",
                constraints=[
                    {
                        "type": "ineq",
                        "fun": lambda th: c["S"] ** 2 - th @ th,
                        "jac": lambda th: -2 * th,
                    }
                ],
                options={"ftol": 1e-15, "maxiter": 500},
            )
            theta = res.x
    return np.array(chosen), theta, v


@pytest.mark.parametrize("params", [{}, {"epsilon": 0.5, "nu": 2.0, "S": 0.3, "beta_scale": 1.0}])
def test_hvt_ucb_kernel_matches_a_numpy_transcription_of_algorithm_1(params):
    rng = np.random.default_rng(7)
    arms, _ = stream(7, 150, 5, 4)
    rewards = arms @ np.array([0.2, -0.1, 0.1, 0.05]) + rng.standard_t(
        1.5, size=arms.shape[:2]
    )  # heavy tails
    p = make_policy("hvt_ucb", dim=4, **params)
    chosen, theta, v = _hvt_reference(make_policy("hvt_ucb", dim=4, **params), arms, rewards)
    assert p.play(arms, rewards).tolist() == chosen.tolist()
    np.testing.assert_allclose(p.v, v, rtol=1e-9)
    np.testing.assert_allclose(p.vinv, np.linalg.inv(v), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(p.theta, theta, rtol=1e-6, atol=1e-7)
