"""BKB (Calandriello et al., COLT 2019) against exact GP-UCB, eq. (4)-(5) and its sampling rule.

Oracles: brute-force GP posteriors over the full t x t kernel matrix with repetition
(streambandit/sim/gp_ucb.py), the paper's eq. (4) built literally with scipy's sqrtm/pinv, ridge
regression for the linear kernel, and closed forms. Variances are compared on BKB's scale,
sigma~^2 = GP variance / lambda (eq. 4 carries the 1/lambda).
"""

import math

import numpy as np
import pytest
import scipy.linalg

from streambandit import make_policy
from streambandit.sim.gp_ucb import ExactGPUCB, effective_dimension, gp_posterior, kernel_matrix
from streambandit.sketch.nystrom import (
    DTCPosterior,
    Kernel,
    inclusion_probabilities,
    resample_dictionary,
    resampling_rng,
)

D = 3


def contextual_run(kernel, qbar, rounds=60, seed=0, **hyper):
    """bkb on a stream whose contexts mix fresh arms with arms of a small pool (so points repeat);
    returns the policy and the pulls with repetition."""
    rng = np.random.default_rng(seed)
    pool = rng.uniform(-1, 1, (8, D))
    p = make_policy("bkb", dim=D, kernel=kernel, qbar=qbar, **hyper)
    xs, ys = [], []
    for _ in range(rounds):
        arms = np.vstack([pool[rng.choice(8, 3, replace=False)], rng.uniform(-1, 1, (3, D))])
        x = arms[p.select(arms)]
        y = float(np.sin(3 * x[0]) + x[1] + 0.1 * rng.standard_normal())
        p.update(x, y)
        xs.append(x)
        ys.append(y)
    return p, np.array(xs), np.array(ys)


@pytest.mark.parametrize(
    "kernel, hyper", [("rbf", {"bandwidth": 0.7, "lam": 0.2}), ("linear", {"lam": 0.5})]
)
@pytest.mark.parametrize("qbar", [math.inf, 1e9])
def test_full_dictionary_is_exact_gp_ucb(kernel, hyper, qbar):
    p, xs, ys = contextual_run(kernel, qbar, **hyper)
    assert p.n_points < len(xs)  # repeats were merged into counts...
    assert p.dictionary_size == p.n_points and p.in_dict.all()  # ...and every pulled point is in S
    test = np.vstack([np.random.default_rng(9).uniform(-1.5, 1.5, (20, D)), xs[:5]])
    mu_gp, var_gp = gp_posterior(kernel, hyper.get("bandwidth", 1.0), hyper["lam"], xs, ys, test)
    mu, s2 = p.posterior(test)
    np.testing.assert_allclose(mu, mu_gp, rtol=0, atol=1e-8)
    np.testing.assert_allclose(s2, var_gp / hyper["lam"], rtol=0, atol=1e-8)  # 1/lambda scale
    # The reference learner used by the benchmark agrees with the brute force, and so do the scores.
    ref = ExactGPUCB(kernel=kernel, **hyper)
    for x, y in zip(xs, ys):
        ref.update(x, y)
    np.testing.assert_allclose(ref.posterior(test)[0], mu_gp, rtol=0, atol=1e-8)
    np.testing.assert_allclose(p.scores(test), ref.scores(test), rtol=0, atol=1e-8)


def test_full_dictionary_follows_the_exact_gp_ucb_trajectory():
    """On a fixed catalog, bkb(qbar=inf) scores every arm as exact GP-UCB does, round after round."""
    rng = np.random.default_rng(1)
    arms = rng.uniform(0, 1, (40, 2))
    f = np.sin(4 * arms[:, 0]) * np.cos(3 * arms[:, 1])
    p = make_policy("bkb", dim=2, bandwidth=0.3, lam=0.05, qbar=math.inf, noise_sd=0.2)
    ref = ExactGPUCB(bandwidth=0.3, lam=0.05, noise_sd=0.2)
    for _ in range(120):
        s = p.scores(arms)
        np.testing.assert_allclose(s, ref.scores(arms), rtol=0, atol=1e-8)
        i = int(np.argmax(s))
        y = f[i] + 0.2 * rng.standard_normal()
        p.update(arms[i], y)
        ref.update(arms[i], y)
    assert p.n_points == ref.n_points < 40


@pytest.mark.parametrize(
    "kernel, hyper", [("rbf", {"bandwidth": 0.7, "lam": 0.2}), ("linear", {"lam": 0.5})]
)
def test_sum_of_pulled_variances_is_the_effective_dimension(kernel, hyper):
    """eq. (5): sum_s sigma_t^2(x_s) over the t pulls (with multiplicity, 1/lambda scale) equals
    Tr(K_t (K_t + lam I)^-1); multiplied by lambda, the GP-scale variances sum to lam times it."""
    p, xs, ys = contextual_run(kernel, math.inf, **hyper)
    d_eff = effective_dimension(kernel, hyper.get("bandwidth", 1.0), hyper["lam"], xs)
    assert p.pulled_variance_sum == pytest.approx(d_eff, rel=1e-9)
    _, var_gp = gp_posterior(kernel, hyper.get("bandwidth", 1.0), hyper["lam"], xs, ys, xs)
    assert var_gp.sum() == pytest.approx(hyper["lam"] * d_eff, rel=1e-9)
    assert 1.0 < d_eff < len(xs)


def test_sparse_dictionary_posterior_is_eq4_written_literally():
    """A dictionary of 4 of 12 distinct points: the count-form posterior equals eq. (4) built
    per pull (with repetition) from z(x) = (K_S^{1/2})^+ k_S(x), with the mean's typo corrected
    (Z_t(X_t)' y_t); far from S the variance stays near k(x,x)/lam (DTC, not SoR)."""
    rng = np.random.default_rng(2)
    lam, bw = 0.3, 0.5
    points = rng.uniform(0, 1, (12, 2))
    counts = rng.integers(1, 5, 12)
    pulls = np.repeat(np.arange(12), counts)
    ys = rng.standard_normal(len(pulls))
    sums = np.bincount(pulls, weights=ys, minlength=12)
    in_dict = np.zeros(12, bool)
    in_dict[[0, 3, 7, 9]] = True
    post = DTCPosterior(Kernel("rbf", bw), lam, points[in_dict], points, counts, sums)

    k = lambda a, b: kernel_matrix("rbf", bw, a, b)
    root = scipy.linalg.pinv(np.real(scipy.linalg.sqrtm(k(points[in_dict], points[in_dict]))))
    z = lambda x: k(x, points[in_dict]) @ root.T  # rows z(x)'
    big_z = z(points[pulls])  # Z_t(X_t), one row per pull
    v = big_z.T @ big_z + lam * np.eye(4)
    test = np.vstack([rng.uniform(0, 1, (10, 2)), points, [[6.0, 6.0]]])
    zt = z(test)
    mu = zt @ np.linalg.solve(v, big_z.T @ ys)
    s2 = (1.0 - np.einsum("ij,ij->i", zt @ big_z.T @ big_z, np.linalg.solve(v, zt.T).T)) / lam
    got_mu, got_s2 = post.mean_s2(test)
    np.testing.assert_allclose(got_mu, mu, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got_s2, s2, rtol=0, atol=1e-10)
    np.testing.assert_allclose(post.pulled_s2, s2[10:22], rtol=0, atol=1e-10)
    assert got_s2[-1] == pytest.approx(1.0 / lam, rel=1e-9)  # SoR would give ~0 here


@pytest.mark.parametrize("dict_rows, rank", [([0, 1, 2, 3, 4, 5], 3), ([1, 4], 2)])
def test_linear_kernel_dictionary_is_ridge_on_its_span(dict_rows, rank):
    """Linear kernel: the embedding spans span(X_S) (pseudo-inverse: 6 points in R^3 have rank 3),
    and eq. (4) is ridge regression on the projected features with lam I on the whole space:
    mu~ = x' A~^-1 P X' y, sigma~^2 = x' A~^-1 x, A~ = P X'X P + lam I."""
    rng = np.random.default_rng(3)
    lam = 0.4
    xs = rng.standard_normal((15, D))
    ys = rng.standard_normal(15)
    post = DTCPosterior(Kernel("linear"), lam, xs[dict_rows], xs, np.ones(15, np.int64), ys)
    assert post.rank == rank
    basis = scipy.linalg.orth(xs[dict_rows].T)
    proj = basis @ basis.T
    a_tilde = proj @ xs.T @ xs @ proj + lam * np.eye(D)
    test = rng.standard_normal((7, D))
    mu, s2 = post.mean_s2(test)
    np.testing.assert_allclose(
        mu, test @ np.linalg.solve(a_tilde, proj @ xs.T @ ys), rtol=0, atol=1e-10
    )
    np.testing.assert_allclose(
        s2, np.einsum("ij,ji->i", test, np.linalg.solve(a_tilde, test.T)), rtol=0, atol=1e-10
    )


def test_inclusion_probabilities_and_the_seeded_draw():
    s2 = np.array([0.5, 0.05, 0.0, 2.0])
    counts = np.array([1, 3, 5, 1])
    np.testing.assert_allclose(inclusion_probabilities(s2, 4.0), [1.0, 0.2, 0.0, 1.0])
    np.testing.assert_array_equal(inclusion_probabilities(s2, math.inf), np.ones(4))
    masks = np.array(
        [resample_dictionary(s2, counts, 4.0, resampling_rng(7, step)) for step in range(4000)]
    )
    assert masks[:, [0, 3]].all() and not masks[:, 2].any()
    # Point 1 is drawn when any of its 3 copies is: 1 - 0.8^3 = 0.488 (sd of the mean 0.008).
    assert masks[:, 1].mean() == pytest.approx(1 - 0.8**3, abs=0.03)
    # A function of (seed, step) only.
    np.testing.assert_array_equal(
        resample_dictionary(s2, counts, 4.0, resampling_rng(7, 11)), masks[11]
    )
    assert not np.array_equal(
        masks[:, 1],
        [resample_dictionary(s2, counts, 4.0, resampling_rng(8, s))[1] for s in range(4000)],
    )
    # Never empty: when every draw fails, the most likely point is kept.
    tiny = resample_dictionary(
        np.array([1e-9, 3e-9, 2e-9]), np.array([1, 1, 1]), 1.0, resampling_rng(0, 0)
    )
    np.testing.assert_array_equal(tiny, [False, True, False])


def test_an_update_draws_the_dictionary_from_the_variances_before_the_pull():
    """Fig. 1: S_{t+1} is drawn over all pulled points incl. x~_{t+1}, with sigma~_t (the model
    before the pull) and the counts after it, from the generator of (seed, t)."""
    rng = np.random.default_rng(7)
    p = make_policy("bkb", dim=2, bandwidth=0.3, lam=0.1, qbar=1.5, seed=3)
    for _ in range(30):
        p.update(rng.uniform(0, 1, 2), float(rng.random()))
    for x in [
        p.points[4].copy(),
        np.array([0.37, 0.61]),
        p.points[0].copy(),
        np.array([0.9, 0.05]),
    ]:
        step = p.n_updates
        s2 = np.concatenate([p.posterior(p.points)[1], p.posterior(x[None])[1]])
        p.update(x, 1.0)
        expected = resample_dictionary(s2[: p.n_points], p.counts, 1.5, resampling_rng(3, step))
        np.testing.assert_array_equal(p.in_dict, expected)
        assert 0 < p.dictionary_size < p.n_points


def test_first_pull_seeds_the_dictionary_and_scores_do_not_consume_randomness():
    p = make_policy("bkb", dim=2, lam=0.5, qbar=2.0)
    arms = np.array([[0.1, 0.2], [0.5, -0.3], [0.9, 0.9]])
    np.testing.assert_allclose(p.posterior(arms)[1], 1.0 / 0.5)  # prior: k(x,x) / lam
    assert p.select(arms) == 0  # equal RBF prior scores: the lowest index
    p.update(arms[0], 1.0)
    assert p.dictionary_size == 1  # S_1 = {x~_1} (p = min(1, qbar k / lam) = 1)
    q = make_policy("bkb", dim=2, lam=0.5, qbar=2.0)
    q.update(arms[0], 1.0)
    rng = np.random.default_rng(4)
    for _ in range(40):
        x, r = rng.uniform(-1, 1, 2), float(rng.random())
        p.scores(rng.uniform(-1, 1, (5, 2)))  # decisions in between must not change the state
        p.update(x, r)
        q.update(x, r)
    for k, v in p.state_dict().items():
        assert (
            (v.tobytes() == q.state_dict()[k].tobytes())
            if isinstance(v, np.ndarray)
            else v == q.state_dict()[k]
        )


def test_beta_rules_in_closed_form():
    p, xs, _ = contextual_run("linear", math.inf, lam=0.5, noise_sd=0.3, F=2.0, delta=0.2)
    d_eff = effective_dimension("linear", 1.0, 0.5, xs)
    t = len(xs)
    assert p.beta() == pytest.approx(
        math.sqrt(0.5) * 2.0 + 0.3 * math.sqrt(math.log(t) * d_eff + math.log(5.0)), rel=1e-9
    )
    q, xs, _ = contextual_run(
        "linear",
        math.inf,
        lam=0.5,
        noise_sd=0.3,
        F=2.0,
        delta=0.2,
        beta_rule="theory",
        eps=0.5,
        beta_scale=0.1,
    )
    kappa2 = float((xs * xs).sum(axis=1).max())  # linear kernel: max k(x, x) over the pulls
    log_term = 1.0 + math.log(1.0 + kappa2 * t / 0.5)
    d_eff = effective_dimension("linear", 1.0, 0.5, xs)
    theory = (
        2 * 0.3 * math.sqrt(3.0 * log_term * d_eff + math.log(5.0))
        + (1 + 1 / math.sqrt(0.5)) * math.sqrt(0.5) * 2.0
    )
    assert q.beta() == pytest.approx(0.1 * theory, rel=1e-9)
    assert make_policy("bkb", dim=D, beta=0.7).beta() == 0.7


def test_fixed_catalog_dictionary_tracks_d_eff_and_the_work_stays_flat():
    """A = 150 fixed arms, t = 500. The state holds at most A points; the dictionary size m stays
    between d_eff and qbar * sum sigma~^2 (the bounds of its expectation, sum_i 1 - (1 - p_i)^n_i);
    from t = 125 to 500 m, hence the O((A + u) m^2) work of a round, grows far less than 4x, where
    textbook GP-UCB's t x t system grows 4x (16x the flops). Regret against exact GP-UCB and the
    measured times are in bench/bkb.py."""
    rng = np.random.default_rng(5)
    arms = rng.uniform(0, 1, (150, 2))
    f = kernel_matrix("rbf", 0.25, arms, rng.uniform(0, 1, (6, 2))) @ rng.standard_normal(6)
    noise = 0.2 * rng.standard_normal(500)
    p = make_policy("bkb", dim=2, qbar=4.0, seed=1, bandwidth=0.25, lam=0.05, noise_sd=0.2)
    seen = {}
    for t in range(1, 501):
        i = p.select(arms)
        p.update(arms[i], f[i] + noise[t - 1])
        if t in (125, 500):
            pulls = np.repeat(p.points, p.counts, axis=0)
            seen[t] = (
                p.dictionary_size,
                p.n_points,
                effective_dimension("rbf", 0.25, 0.05, pulls),
                p.pulled_variance_sum,
            )
            u = p.n_points
            assert u <= 150 and p.state_nbytes() == 8 * u * 2 + 17 * u + 8
    for t, (m, u, d_eff, ssum) in seen.items():
        assert 0.8 * d_eff <= m <= 4.0 * ssum and m <= u, (t, seen[t])
    (m0, u0, _, _), (m1, u1, _, _) = seen[125], seen[500]
    assert m1 <= 2 * m0 and ((150 + u1) * m1**2) / ((150 + u0) * m0**2) < 4.0, seen  # textbook: 16


def test_state_is_bounded_by_the_catalog_and_checked_on_load():
    catalog = np.random.default_rng(6).uniform(-1, 1, (10, D))
    p = make_policy("bkb", dim=D, qbar=2.0)
    for t in range(300):
        p.update(catalog[t % 10], 0.5)
    assert p.n_points == 10 and p.counts.tolist() == [30] * 10
    assert p.state_nbytes() == 8 * 10 * D + 17 * 10 + 8
    state = p.state_dict()
    for key, value, message in [
        ("counts", np.full(10, 29, np.int64), "n_updates"),
        ("reward_sums", np.zeros(9), "reward_sums"),
        ("points", np.vstack([catalog[:9], catalog[:1]]), "twice"),
        ("in_dict", np.zeros(10, bool), "in_dict"),
        ("points", np.zeros((10, D + 1)), "points"),
    ]:
        broken = dict(state, **{key: value})
        with pytest.raises(ValueError, match=message):
            make_policy("bkb", dim=D, qbar=2.0).load_state_dict(broken)
