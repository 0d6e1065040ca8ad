"""Off-policy estimators against policies whose true value is known.

The simulation: K = 4 arms with standard normal features (d = 3) per event; mean reward
``mu(x) = x . theta`` (linear), ``x . theta + x_0^2`` (nonlinear: a linear reward model is then
misspecified) or Bernoulli with ``P = sigmoid(x . theta)``. Logging is uniform (propensity 1/K) or
a softmax over another direction mixed with 30% uniform (known propensities in [0.075, 0.775]).
Targets are the greedy policy ``argmax x . theta`` (deterministic) or epsilon-greedy on it. The
true value ``E_x[sum_a pi(a|x) mu(x_a)]`` is a Monte-Carlo mean of the exact conditional values
over 400k fresh contexts (standard error < 2e-3, far below every interval width tested).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from streambandit.replay.estimators import (
    ESTIMATORS,
    EstimatorError,
    OffPolicyEvaluator,
    RidgeRewardModel,
)

K, D = 4, 3
THETA = np.array([1.0, -0.5, 0.25])
THETA_LOG = np.array([-0.6, 0.8, 0.3])  # the non-uniform logging policy's direction
NOISE = 0.5


def _mean_reward(x: np.ndarray, reward: str) -> np.ndarray:
    lin = x @ THETA
    if reward == "linear":
        return lin
    if reward == "nonlinear":
        return lin + x[..., 0] ** 2
    return 1.0 / (1.0 + np.exp(-lin))  # bernoulli


def _target_probs(x: np.ndarray, target: str) -> np.ndarray:
    greedy = (x @ THETA).argmax(axis=-1)
    probs = np.zeros(x.shape[:-1])
    np.put_along_axis(probs, greedy[..., None], 1.0, axis=-1)
    if target == "eps":
        probs = 0.7 * probs + 0.3 / K
    return probs


def _logging_probs(x: np.ndarray, logging: str) -> np.ndarray:
    if logging == "uniform":
        return np.full(x.shape[:-1], 1.0 / K)
    z = x @ THETA_LOG
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return 0.7 * e / e.sum(axis=-1, keepdims=True) + 0.3 / K


@functools.lru_cache(maxsize=None)
def true_value(target: str, reward: str) -> float:
    x = np.random.default_rng(12345).normal(size=(400_000, K, D))
    return float((_target_probs(x, target) * _mean_reward(x, reward)).sum(axis=1).mean())


def simulate(seed: int, n: int, *, logging: str, target: str, reward: str):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, K, D))
    p_log = _logging_probs(x, logging)
    u = rng.random(n)[:, None]
    action = (u > np.cumsum(p_log, axis=1)).sum(axis=1).clip(max=K - 1)
    mu = _mean_reward(x[np.arange(n), action], reward)
    if reward == "bernoulli":
        r = (rng.random(n) < mu).astype(np.float64)
    else:
        r = mu + NOISE * rng.normal(size=n)
    return x, action, p_log[np.arange(n), action], r, _target_probs(x, target)


def evaluate(
    seed: int, n: int, *, logging="uniform", target="greedy", reward="linear", clip=None, model=True
) -> OffPolicyEvaluator:
    """Streams a simulated log through the evaluator; the ridge model predicts before it learns."""
    x, action, prop, r, pi = simulate(seed, n, logging=logging, target=target, reward=reward)
    ev = OffPolicyEvaluator(clip=clip)
    m = RidgeRewardModel(D, lam=1.0)
    zeros = np.zeros(K)
    for i in range(n):
        a = int(action[i])
        q = m.predict(x[i]) if model else zeros
        ev.add(
            action=a, propensity=float(prop[i]), reward=float(r[i]), target_probs=pi[i], predicted=q
        )
        if model:
            m.update(x[i, a], float(r[i]))
    return ev


def by_name(ev: OffPolicyEvaluator) -> dict:
    return {e.name: e for e in ev.estimates()}


def test_the_simulated_logs_have_the_stated_propensities():
    x, action, prop, _, _ = simulate(0, 40_000, logging="softmax", target="greedy", reward="linear")
    p_log = _logging_probs(x, "softmax")
    assert prop.min() >= 0.075 and np.allclose(p_log.sum(axis=1), 1.0)
    # the empirical frequency of each action matches the mean propensity
    assert np.allclose(
        np.bincount(action, minlength=K) / len(action), p_log.mean(axis=0), atol=0.01
    )


# -- coverage, a big run, convergence ---------------------------------------------------------

COVERAGE = [  # logging, target, reward
    ("uniform", "greedy", "linear"),
    ("uniform", "eps", "linear"),
    ("softmax", "greedy", "linear"),
    ("softmax", "eps", "nonlinear"),
]


def test_intervals_cover_the_true_value():
    """Four scenarios x 40 independent logs of 600 events. Each 95% interval covers the truth in
    >= 32 of 40 logs per scenario and >= 85% of all of them (at a true 95% that is 5 standard
    deviations of slack; an interval half as wide as it should be covers ~67%). Seen: ips 141,
    snips 151, dr 150 of 160, replay 75 of 80. The replay estimator is only claimed on uniform logs. The DM interval is
    not claimed: it holds the reward model fixed, and the online model's own error (here about
    as large as the sampling noise at n = 600) is not in it; DM is tested for closeness instead."""
    pooled: dict[str, list[int]] = {}
    for logging, target, reward in COVERAGE:
        v = true_value(target, reward)
        names = ("ips", "snips", "dr") + (("replay",) if logging == "uniform" else ())
        covered = dict.fromkeys(names, 0)
        for seed in range(40):
            est = by_name(evaluate(1000 + seed, 600, logging=logging, target=target, reward=reward))
            for name in names:
                covered[name] += est[name].ci_low <= v <= est[name].ci_high
        assert all(c >= 32 for c in covered.values()), (logging, target, reward, covered)
        for name, c in covered.items():
            pooled.setdefault(name, []).append(c)
    for name, cs in pooled.items():
        assert sum(cs) >= 0.85 * 40 * len(cs), (name, cs)


def test_a_big_run_is_inside_every_interval_and_dm_with_the_right_model_is_close():
    v = true_value("eps", "linear")
    ev = evaluate(7, 20_000, logging="softmax", target="eps", reward="linear")
    est = by_name(ev)
    for name in ("ips", "snips", "dr"):
        e = est[name]
        assert e.ci_low <= v <= e.ci_high, (name, e, v)
        assert e.n == 20_000 and e.clipped == 0
        assert e.ci_high - e.ci_low < 0.1, e  # the interval is informative
    assert (
        abs(est["dm"].value - v) < 0.03 and est["dm"].interval == "none"
    )  # close, with no interval claimed
    # DR with a good model has a smaller interval than IPS
    assert est["dr"].ci_high - est["dr"].ci_low < 0.7 * (est["ips"].ci_high - est["ips"].ci_low)
    # on non-uniform logs the replay estimator (which ignores propensities) is biased: it is only
    # valid for uniformly logged data
    assert not est["replay"].ci_low <= v <= est["replay"].ci_high
    # the logging policy's value is the plain mean reward
    _, _, _, r, _ = simulate(7, 20_000, logging="softmax", target="eps", reward="linear")
    lv = ev.logging_value
    assert lv.value == pytest.approx(r.mean(), abs=1e-12) and lv.n == 20_000
    assert lv.ci_high - lv.value == pytest.approx(
        1.959964 * r.std(ddof=1) / math.sqrt(20_000), rel=1e-5
    )


def test_estimates_converge_as_the_log_grows():
    """The mean absolute error at n = 20k (over 5 logs) is well below the one at n = 1k, read
    from the same runs' running estimates."""
    v = true_value("greedy", "linear")
    err_small = dict.fromkeys(ESTIMATORS, 0.0)
    err_big = dict.fromkeys(ESTIMATORS, 0.0)
    for seed in range(5):
        ev = evaluate(500 + seed, 20_000, logging="uniform", target="greedy", reward="linear")
        run = ev.running()
        for name in ESTIMATORS:
            pts = dict(run[name])
            n_small = min(pts, key=lambda n: abs(n - 1000))
            assert abs(n_small - 1000) <= 50
            assert pts[20_000] == by_name(ev)[name].value  # the last point is the final estimate
            err_small[name] += abs(pts[n_small] - v) / 5
            err_big[name] += abs(pts[20_000] - v) / 5
    for name in ESTIMATORS:
        assert err_big[name] < 0.5 * err_small[name], (name, err_big, err_small)
        assert err_big[name] < 0.03, (name, err_big)


def test_running_history_is_geometric_and_bounded():
    ev = evaluate(3, 5000, model=False)
    run = ev.running()
    assert set(run) == set(ESTIMATORS)
    ns = [n for n, _ in run["ips"]]
    assert ns[0] == 1 and ns[-1] == 5000 and ns == sorted(set(ns))
    assert len(ns) < 200  # O(log n), not one point per event


def test_replay_on_uniform_logs_is_unbiased():
    """Li et al. 2011: on uniformly logged data the replay estimate of a deterministic policy
    is unbiased. 400 logs of 300 events: the mean estimate is within 3 standard errors of the
    truth, and that standard error is small enough for the check to mean something."""
    v = true_value("greedy", "linear")
    values, matched = [], []
    for seed in range(400):
        e = by_name(evaluate(20_000 + seed, 300, model=False))["replay"]
        values.append(e.value)
        matched.append(e.n)
    values = np.array(values)
    se = values.std(ddof=1) / math.sqrt(len(values))
    assert se < 0.01
    assert abs(values.mean() - v) < 3 * se, (values.mean(), v, se)
    # about 1/K of the events match; ess equals the matched count for a deterministic target
    assert abs(np.mean(matched) - 300 / K) < 3


def test_replay_matches_the_plain_matched_mean_for_a_deterministic_target():
    x, action, prop, r, pi = simulate(11, 2000, logging="uniform", target="greedy", reward="linear")
    ev = evaluate(11, 2000, model=False)
    e = by_name(ev)["replay"]
    match = pi[np.arange(2000), action] == 1.0
    assert e.n == match.sum() and e.ess == pytest.approx(match.sum())
    assert e.value == pytest.approx(r[match].mean(), rel=1e-12)
    half = 1.959964 * r[match].std(ddof=1) / math.sqrt(match.sum())
    # the delta-method interval of the ratio is the usual interval of the matched mean, to O(1/n)
    assert (e.ci_high - e.ci_low) / 2 == pytest.approx(half, rel=0.02)


def test_dr_is_consistent_when_the_reward_model_is_misspecified():
    """Rewards x.theta + x_0^2 with a linear ridge model: DM is clearly biased, DR is not."""
    v = true_value("greedy", "nonlinear")
    est = by_name(evaluate(9, 20_000, logging="softmax", target="greedy", reward="nonlinear"))
    assert abs(est["dm"].value - v) > 0.2 and not est["dm"].ci_low <= v <= est["dm"].ci_high
    assert est["dr"].ci_low <= v <= est["dr"].ci_high
    assert abs(est["dr"].value - v) < 0.1 * abs(est["dm"].value - v)


_THREE_EVENTS = [  # action, propensity, reward, target_probs, predicted
    (0, 0.5, 1.0, [1.0, 0.0], [0.2, 0.4]),
    (1, 0.25, 2.0, [0.5, 0.5], [0.0, 1.0]),
    (1, 0.8, 3.0, [1.0, 0.0], [1.0, 1.0]),
]


def test_estimators_by_hand_on_three_events():
    ev = OffPolicyEvaluator(reward_range=(-10.0, 10.0))  # wide: nothing is clamped
    for a, p, r, pi, q in _THREE_EVENTS:
        ev.add(action=a, propensity=p, reward=r, target_probs=np.array(pi), predicted=np.array(q))
    w = np.array([2.0, 2.0, 0.0])
    rr = np.array([1.0, 2.0, 3.0])
    dm = np.array([0.2, 0.5, 1.0])
    dr = dm + w * (rr - np.array([0.2, 1.0, 1.0]))
    est = by_name(ev)
    assert est["ips"].value == pytest.approx((w * rr).mean())
    assert est["snips"].value == pytest.approx((w * rr).sum() / w.sum())
    assert est["dm"].value == pytest.approx(dm.mean())
    assert est["dr"].value == pytest.approx(dr.mean())
    assert est["replay"].value == pytest.approx((1.0 * 1 + 0.5 * 2 + 0.0 * 3) / 1.5)
    assert est["replay"].n == 2
    assert est["ips"].ess == pytest.approx(16 / 8)
    s = (w * rr).std(ddof=1)
    assert est["ips"].ci_high == pytest.approx(
        (w * rr).mean() + 1.959964 * s / math.sqrt(3), rel=1e-6
    )
    # the delta method for the ratios: sd(u - R v) / (sqrt(n) mean(v))
    for name, v in (("snips", w), ("replay", np.array([1.0, 0.5, 0.0]))):
        ratio = (v * rr).sum() / v.sum()
        half = 1.959964 * (v * rr - ratio * v).std(ddof=1) / math.sqrt(3) / v.mean()
        assert est[name].ci_low == pytest.approx(ratio - half, rel=1e-6)
        assert est[name].ci_high == pytest.approx(ratio + half, rel=1e-6)


def test_values_and_bounds_are_clamped_to_the_reward_range_the_log_shows():
    """No range given: the rewards seen, 1 to 3, bound every value: dm's 0.567 (the model's
    guess) and ips's upper bound 4.26 (a normal interval over three events) cannot be right."""
    ev = OffPolicyEvaluator()
    for a, p, r, pi, q in _THREE_EVENTS:
        ev.add(action=a, propensity=p, reward=r, target_probs=np.array(pi), predicted=np.array(q))
    assert ev.ends == (1.0, 3.0, "seen")
    est = by_name(ev)
    assert est["dm"].value == 1.0
    assert est["ips"].value == 2.0 and est["ips"].ci_high == 3.0 and est["ips"].ci_low == 1.0
    for e in est.values():
        assert 1.0 <= e.value <= 3.0 and (e.name == "dm" or 1.0 <= e.ci_low <= e.ci_high <= 3.0), e
    given = OffPolicyEvaluator(reward_range=(0.0, 5.0))
    assert given.ends == (0.0, 5.0, "given")
    assert OffPolicyEvaluator().ends == (0.0, 1.0, "default")


# -- clipping ---------------------------------------------------------------------------------


def test_clipping_counts_and_biases_ips_downward():
    """Bernoulli rewards (>= 0), non-uniform logging, greedy target: weights reach ~13; clipped
    at 3 the count equals the number of raw weights above 3, and the clipped IPS is biased low."""
    v = true_value("greedy", "bernoulli")
    _, action, prop, _, pi = simulate(
        5, 20_000, logging="softmax", target="greedy", reward="bernoulli"
    )
    raw = pi[np.arange(20_000), action] / prop
    clipped = by_name(
        evaluate(
            5, 20_000, logging="softmax", target="greedy", reward="bernoulli", clip=3.0, model=False
        )
    )
    plain = by_name(
        evaluate(5, 20_000, logging="softmax", target="greedy", reward="bernoulli", model=False)
    )
    assert clipped["ips"].clipped == int((raw > 3.0).sum()) > 1000
    assert clipped["snips"].clipped == clipped["dr"].clipped == clipped["ips"].clipped
    assert plain["ips"].clipped == 0
    assert plain["ips"].ci_low <= v <= plain["ips"].ci_high
    assert clipped["ips"].value < plain["ips"].value
    assert clipped["ips"].ci_high < v  # clearly biased downward
    assert clipped["ips"].ess > plain["ips"].ess  # and less variable


# -- the reward model and input checks --------------------------------------------------------


def test_ridge_reward_model_equals_the_closed_form():
    rng = np.random.default_rng(0)
    xs, rs = rng.normal(size=(200, D)), rng.normal(size=200)
    m = RidgeRewardModel(D, lam=2.0)
    assert np.array_equal(m.predict(xs[:4]), np.zeros(4))
    for x, r in zip(xs, rs):
        m.update(x, r)
    zs = np.hstack([xs, np.ones((len(xs), 1))])  # the intercept is a constant last feature
    theta = np.linalg.solve(2.0 * np.eye(D + 1) + zs.T @ zs, zs.T @ rs)
    assert np.allclose(m.theta, theta, atol=1e-10)
    assert np.allclose(m.predict(xs[:5]), zs[:5] @ theta, atol=1e-10)
    # Centred features, mean reward 3: without the intercept the model cannot see the mean.
    rng = np.random.default_rng(1)
    xc = rng.standard_normal((2000, D))
    with_icpt, without = RidgeRewardModel(D), RidgeRewardModel(D, intercept=False)
    for x in xc:
        with_icpt.update(x, 3.0 + x @ THETA)
        without.update(x, 3.0 + x @ THETA)
    probe = rng.standard_normal((50, D))
    assert np.abs(with_icpt.predict(probe) - (3.0 + probe @ THETA)).max() < 0.05
    assert np.abs(without.predict(probe) - (3.0 + probe @ THETA)).mean() > 2.0
    with pytest.raises(EstimatorError):
        m.predict(np.ones((2, D + 1)))


def test_the_reward_model_predicts_inside_the_rewards_it_learnt_or_the_range_given():
    """A line through 0/1 clicks extrapolates past [0, 1] far out; dm and dr add predictions up,
    so the model's are kept inside the range: the rewards learnt, or the range given."""
    x = np.array([[1.0] + [0.0] * (D - 1)])
    m, given = RidgeRewardModel(D, lam=1e-3), RidgeRewardModel(D, lam=1e-3, reward_range=(0, 5))
    for v, r in ((0.0, 0.0), (1.0, 1.0)) * 50:
        m.update(x[0] * v, r)
        given.update(x[0] * v, r)
    far = np.array([[10.0] + [0.0] * (D - 1)])
    zs = np.array([[10.0] + [0.0] * (D - 1) + [1.0]])
    assert (zs @ m.theta)[0] > 9  # the line's own value
    assert m.predict(far)[0] == 1.0 and given.predict(far)[0] == 5.0
    assert m.predict(-far)[0] == 0.0
    one = RidgeRewardModel(D)
    one.update(x[0], 0.0)  # one value learnt: [0, 1] around it
    assert (
        one.predict(-1e6 * x)[0] == pytest.approx(0.0, abs=1e-12) and one.predict(1e6 * x)[0] <= 1.0
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(action=2),
        dict(action=-1),
        dict(propensity=0.0),
        dict(propensity=1.5),
        dict(propensity=float("nan")),
        dict(reward=float("inf")),
        dict(target_probs=np.array([0.7, 0.7])),
        dict(target_probs=np.array([1.0])),
        dict(predicted=np.array([0.0, float("nan")])),
    ],
)
def test_bad_events_are_refused(kwargs):
    good = dict(
        action=0,
        propensity=0.5,
        reward=1.0,
        target_probs=np.array([0.5, 0.5]),
        predicted=np.zeros(2),
    )
    ev = OffPolicyEvaluator()
    with pytest.raises(EstimatorError):
        ev.add(**{**good, **kwargs})
    assert ev.n == 0


def test_empty_and_single_event_estimates():
    ev = OffPolicyEvaluator()
    assert all(math.isnan(e.value) and e.n == 0 for e in ev.estimates())
    ev.add(
        action=0,
        propensity=0.5,
        reward=0.7,
        target_probs=np.array([1.0, 0.0]),
        predicted=np.zeros(2),
    )
    # One event of a reward that is not 0/1: no interval but the range itself, [0, 1] by default
    # around the one value seen.
    assert ev.ends == (0.0, 1.0, "default")
    for e in ev.estimates():
        assert math.isfinite(e.value)
        assert e.interval == "none" if e.name == "dm" else (e.ci_low, e.ci_high) == (0.0, 1.0), e
    one = OffPolicyEvaluator()  # one 0/1 reward: the score intervals of one trial
    one.add(
        action=0,
        propensity=0.5,
        reward=1.0,
        target_probs=np.array([1.0, 0.0]),
        predicted=np.zeros(2),
    )
    assert {e.name: e.interval for e in one.estimates()} == {
        "replay": "wilson",
        "ips": "score",
        "snips": "wilson",
        "dm": "none",
        "dr": "score-shifted",
    }
    assert 0 < one.estimates()[0].ci_low < 1 == one.estimates()[0].ci_high
    with pytest.raises(EstimatorError):
        OffPolicyEvaluator(clip=0.0)


def test_rewards_at_the_ends_of_the_float_range_give_estimates_not_a_crash():
    """A hostile log: rewards of +-1e308 and a weight of 5e8 overflow the running sums; every
    estimate is still made, each bound inside the rewards' range or undefined."""
    ev = OffPolicyEvaluator()
    for i, r in enumerate([1e308, -1e308, 0.0, 1e308]):
        ev.add(
            action=i % 2,
            propensity=1e-9 if i == 3 else 0.5,
            reward=r,
            target_probs=np.array([0.5, 0.5]),
            predicted=np.array([1e300, -1e300]),
        )
    for e in [*ev.estimates(), ev.logging_value]:
        for x in (e.value, e.ci_low, e.ci_high):
            assert math.isnan(x) or -1e308 <= x <= 1e308, e
    assert ev.warnings()
