"""Intervals that mean what they say: Wilson's interval against its defining equation and the
exact (Clopper-Pearson) one, the zero-reward log, coverage over 200 independent logs with a known
truth, the bootstrap, the reward range, the warnings and DM's missing interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from streambandit.replay.estimators import DR_SUCCESSES, EstimatorError, OffPolicyEvaluator
from streambandit.replay.intervals import PoissonBootstrap, scaled_wilson, wilson

from .test_estimators import K, by_name, evaluate, simulate, true_value

Z95 = 1.959963984540054


@pytest.mark.parametrize("k, n", [(0, 200), (1, 200), (37, 200), (200, 200), (3, 10), (0, 1)])
def test_wilson_solves_its_score_equation_and_is_near_the_exact_interval(k, n):
    lo, hi = wilson(k / n, n, Z95)
    p_hat = k / n
    for end in (lo, hi):  # each end either solves (p_hat - p)^2 = z^2 p (1 - p) / n or is 0 or 1
        assert end in (0.0, 1.0) or (p_hat - end) ** 2 == pytest.approx(
            Z95**2 * end * (1 - end) / n, rel=1e-9
        )
    assert lo <= p_hat <= hi
    exact_lo = stats.beta.ppf(0.025, k, n - k + 1) if k > 0 else 0.0
    exact_hi = stats.beta.ppf(0.975, k + 1, n - k) if k < n else 1.0
    if n >= 200:  # within a fraction of a percentage point of Clopper-Pearson at n = 200
        assert abs(lo - exact_lo) < 0.01 and abs(hi - exact_hi) < 0.01, (lo, hi, exact_lo, exact_hi)


def test_scaled_wilson_is_wilson_on_the_proportion_of_value_to_scale():
    a, b = scaled_wilson(0.3, 4.0, 500, Z95)
    c, d = wilson(0.075, 500, Z95)
    assert (a, b) == pytest.approx((4 * c, 4 * d))


def zero_reward_log(n=200, seed=0, logging="uniform"):
    """n events, K = 4 arms, no reward ever above 0; a fixed target."""
    rng = np.random.default_rng(seed)
    ev = OffPolicyEvaluator()
    for _ in range(n):
        p = np.full(K, 1 / K) if logging == "uniform" else np.array([0.55, 0.25, 0.15, 0.05])
        a = int(rng.choice(K, p=p))
        target = np.zeros(K)
        target[int(rng.integers(K))] = 1.0
        ev.add(
            action=a, propensity=float(p[a]), reward=0.0, target_probs=target, predicted=np.zeros(K)
        )
    return ev


def test_a_log_with_no_reward_gets_intervals_that_are_not_a_point():
    ev = zero_reward_log()
    est = by_name(ev)
    for name in ("replay", "ips", "snips", "dr"):
        e = est[name]
        assert e.value == 0.0 and e.ci_low == 0.0 and e.ci_high > 0.0, e
    # snips and replay: Wilson over their effective sample size, as for 0 successes in that many trials
    assert est["snips"].ci_high == pytest.approx(wilson(0.0, est["snips"].ess, Z95)[1])
    assert est["replay"].ci_high == pytest.approx(wilson(0.0, est["replay"].n, Z95)[1])
    assert est["dr"].interval == "score-shifted" and est["ips"].interval == "score"
    lv = ev.logging_value
    assert lv.interval == "wilson" and lv.ci_high == pytest.approx(
        1 - 0.025 ** (1 / 200), rel=0.05
    )  # exact's ~0.018


def _arm_0_target(ev: OffPolicyEvaluator, n: int, reward, predicted) -> OffPolicyEvaluator:
    """``n`` events logged 50/50 over two arms in turn, evaluated for a target that always plays
    arm 0; ``reward(i, arm)`` and ``predicted(arm)`` give each event's reward and predictions."""
    for i in range(n):
        a = i % 2
        ev.add(
            action=a,
            propensity=0.5,
            reward=reward(i, a),
            target_probs=np.array([1.0, 0.0]),
            predicted=predicted(a),
        )
    return ev


def test_dr_with_no_success_spans_ips_s_interval_and_the_same_at_its_own_value():
    """No matched event earned anything (the target plays arm 0, never clicked); the reward
    model guesses 0.02 for arm 0 on the rows where arm 1 was logged: dr's value, 0.01, is the
    model's guess, which the log cannot check, so its interval keeps ips's [0, ...] as well as the
    same width above the guess."""
    ev = _arm_0_target(
        OffPolicyEvaluator(),
        300,
        lambda i, a: float(a == 1 and i % 6 == 1),
        lambda a: np.array([0.02 if a == 1 else 0.0, 0.05]),
    )
    est = by_name(ev)
    ips, dr = est["ips"], est["dr"]
    assert ips.value == 0.0 and dr.value == pytest.approx(0.01) and dr.interval == "score-shifted"
    assert dr.ci_low == 0.0 == ips.ci_low
    assert dr.ci_high == pytest.approx(dr.value + ips.ci_high)


def test_coverage_over_200_independent_logs_with_a_known_truth():
    """A fixed greedy target, Bernoulli rewards (P = sigmoid(x . theta)), softmax logging with
    known propensities, 200 logs of 1,500 events: the 95% intervals of ips, snips and dr cover
    the true value (a Monte-Carlo mean over 400,000 contexts) in 93-97% of the logs."""
    v = true_value("greedy", "bernoulli")
    covered = dict.fromkeys(("ips", "snips", "dr"), 0)
    for seed in range(200):
        est = by_name(evaluate(seed, 1500, logging="softmax", target="greedy", reward="bernoulli"))
        for name in covered:
            covered[name] += est[name].ci_low <= v <= est[name].ci_high
    assert all(186 <= c <= 194 for c in covered.values()), covered


def _spread_log(rng, n: int, ctr: float, evaluator: OffPolicyEvaluator) -> float:
    """A log whose propensities spread from 1e-3 to 0.99 (Dirichlet(0.3) over 10 arms per
    request, floored at 1e-3), Bernoulli rewards of mean ``ctr`` times 0.5-1.5 per arm, a uniform
    target; the reward model is each arm's mean reward so far. The target's true value."""
    k = 10
    probs = np.clip(rng.dirichlet(np.full(k, 0.3), size=n), 1e-3, None)
    probs /= probs.sum(1, keepdims=True)
    base = rng.uniform(0.5, 1.5, k) * ctr
    arms = (probs.cumsum(1) > rng.random((n, 1))).argmax(1)
    rewards = (rng.random(n) < base[arms]).astype(float)
    target = np.full(k, 1.0 / k)
    total, count = np.zeros(k), np.zeros(k)
    for i in range(n):
        a = int(arms[i])
        q = np.where(count > 0, total / np.maximum(count, 1.0), 0.0)
        evaluator.add_also_to(None, a, float(probs[i, a]), float(rewards[i]), target, q)
        total[a] += rewards[i]
        count[a] += 1.0
    return float(base.mean())


@pytest.mark.parametrize("ctr", [0.1, 0.01])
def test_ips_covers_on_a_log_whose_propensities_spread_from_1e3_to_099(ctr):
    """The few successes of such a log mostly carry small weights: a variance from them alone
    (the mean weight of a success seen) covered the truth in 60-80% of such logs. The weight a
    success carries as the reward model expects it, from every row, restores the level
    (bench/ope_coverage.py measures more settings)."""
    rng = np.random.default_rng(36)
    covered = 0
    for _ in range(200):
        ev = OffPolicyEvaluator(running_growth=math.inf)
        truth = _spread_log(rng, 4_000, ctr, ev)
        ips = by_name(ev)["ips"]
        covered += ips.ci_low <= truth <= ips.ci_high
    assert 182 <= covered <= 198, covered  # 95% of 200 is 190, the standard error 3


def _log_with_a_model():
    """A two-arm log, target 50/50, the model predicting 0.12 and 0.18: the evaluator that read
    it and the rows' weights, rewards and predictions of the logged arm."""
    rng = np.random.default_rng(3)
    ev = OffPolicyEvaluator()
    w, r, qa = [], [], []
    for _ in range(400):
        p = np.array([0.98, 0.02]) if rng.random() < 0.5 else np.array([0.3, 0.7])
        a = int(rng.random() < p[1])
        reward = float(rng.random() < (0.1 if a == 0 else 0.2))
        q = np.array([0.12, 0.18])
        ev.add_also_to(None, a, float(p[a]), reward, np.array([0.5, 0.5]), q)
        w.append(0.5 / p[a])
        r.append(reward)
        qa.append(q[a])
    return ev, np.array(w), np.array(r), np.array(qa)


def test_the_ips_score_interval_takes_the_success_weight_the_model_expects_from_every_row():
    ev, w, r, qa = _log_with_a_model()
    k = (w * w * qa).sum() / (w * qa).sum()  # intervals.py: E[w^2 r] / E[w r] as the model sees it
    lo, hi = scaled_wilson((w * r).mean(), k, len(w), Z95)
    ips = by_name(ev)["ips"]
    assert ips.interval == "score"
    assert (ips.ci_low, ips.ci_high) == pytest.approx((lo, hi), rel=1e-12)


def test_dr_s_interval_takes_the_success_weight_the_model_expects_from_every_row():
    ev, w, r, qa = _log_with_a_model()
    n = len(w)
    dm = np.full(n, 0.15)
    terms = dm + w * (r - qa)
    # Var(u + w r) with u = dm - w q, where E[w^2 r] and E[w^2 r q] take one w as k, the mean
    # weight of a success as the model expects it; the larger of that and the sample variance.
    k = (w * w * qa).sum() / (w * qa).sum()
    u, v1 = dm - w * qa, (w * r).mean()
    cov = (dm * w * r).mean() - k * (w * r * qa).mean() - u.mean() * v1
    var_k = n / (n - 1) * (u.var() + k * v1 - v1 * v1 + 2 * cov)
    # The terms' own variance weighs in as the successes' effective number n_s grows.
    n_s = (w * r).sum() ** 2 / ((w * r) ** 2).sum()
    trust = n_s / (n_s + DR_SUCCESSES)
    var = trust * max(var_k, terms.var(ddof=1)) + (1 - trust) * var_k
    # ...and the ends take the proportions of ips's score interval around its value.
    a, b = scaled_wilson(v1, k, n, Z95)
    per_sd = math.sqrt(var / n) / math.sqrt((k * v1 - v1 * v1) / n)
    dr = by_name(ev)["dr"]
    assert dr.interval == "model" and dr.value == pytest.approx(terms.mean(), rel=1e-12)
    assert (dr.ci_low, dr.ci_high) == pytest.approx(
        (terms.mean() - (v1 - a) * per_sd, terms.mean() + (b - v1) * per_sd), rel=1e-9
    )
    assert b - v1 > v1 - a  # skewed upward, as a mean of rare heavy terms is


def test_two_reward_values_other_than_0_and_1_are_scored_on_the_range_they_show():
    """Revenue 0 or 5: the range [0, 5] is inferred, the intervals are score intervals on it,
    and a target whose matched events all earned 0 still gets an interval above 0."""
    ev = _arm_0_target(  # arm 0 never earned
        OffPolicyEvaluator(),
        300,
        lambda i, a: 5.0 if a == 1 and i % 6 == 1 else 0.0,
        lambda a: np.zeros(2),
    )
    assert ev.ends == (0.0, 5.0, "seen") and ev.scored
    est = by_name(ev)
    for name in ("replay", "ips", "snips"):
        e = est[name]
        assert e.value == 0.0 and e.ci_low == 0.0 and 0.0 < e.ci_high < 5.0, e
    assert est["ips"].interval == "score" and est["snips"].interval == "wilson"
    assert est["snips"].ci_high == pytest.approx(5 * wilson(0.0, 150, Z95)[1])


def test_the_bootstrap_never_gives_a_zero_width_interval_to_a_log_with_variance():
    """No matched event earned anything, other events did: every replicate of replay, ips and
    snips is 0; the score interval stands in for the percentile one."""
    ev = _arm_0_target(
        OffPolicyEvaluator(bootstrap=200),
        400,
        lambda i, a: float(a == 1 and i % 4 == 1),
        lambda a: np.array([0.0, 0.5]),
    )
    est = by_name(ev)
    for name in ("replay", "ips", "snips"):
        assert est[name].value == 0.0 and est[name].ci_high > 0.0, est[name]
        assert est[name].interval in ("wilson", "score"), est[name]
    # dr's terms are all 0 too (the model predicts 0 for arm 0): ips's score interval, moved
    assert est["dr"].interval == "score-shifted" and est["dr"].ci_high > est["dr"].ci_low
    assert ev.logging_value.interval == "bootstrap"


def test_one_event_with_much_of_the_weight_is_warned_of():
    ev = OffPolicyEvaluator()
    for i in range(1000):
        p = 0.001 if i == 500 else 0.5
        ev.add(
            action=1 if i == 500 else 0,
            propensity=p,
            reward=float(i % 3 == 0),
            target_probs=np.array([0.5, 0.5]),
            predicted=np.full(2, 0.3),
        )
    [heavy] = [w for w in ev.warnings() if "carries" in w]
    assert heavy.startswith("one event carries 33% of the importance weight (weight 500)")
    assert not any("carries" in w for w in zero_reward_log(n=2000).warnings())


def _rare_arm_log(arm_1_rows: int, n: int = 400, target=(0.0, 1.0)) -> OffPolicyEvaluator:
    """Two arms logged 0.99 / 0.01 (arm 1 in the first ``arm_1_rows`` rows), a target that
    chooses arm 1 (with ``target``'s probabilities), every other reward 1."""
    ev = OffPolicyEvaluator()
    for i in range(n):
        a = int(i < arm_1_rows)
        ev.add(
            action=a,
            propensity=0.01 if a else 0.99,
            reward=float(i % 2),
            target_probs=np.array(target),
            predicted=np.full(2, 0.5),
        )
    return ev


def test_weights_short_of_their_mean_widen_ips_by_the_unseen_share_at_any_reward():
    """A target's weights average 1. On a log where the target's arm was never logged (1.8%
    of such 400-row logs, 0.99^400), ips sees nothing of its value: the whole weight is unseen
    and the interval is the whole range. With its arm logged at its rate (4 rows of weight 100: a
    mean of exactly 1) nothing is unseen; at half its rate the shortfall (0.5) is within the
    weights' own noise, and nothing is widened either."""
    never = _rare_arm_log(0)
    assert never.unseen_weight == 1.0
    ips = by_name(never)["ips"]
    assert ips.value == 0.0 and (ips.ci_low, ips.ci_high) == (0.0, 1.0)
    [short] = [w for w in never.warnings() if "average" in w]
    assert short.startswith("the importance weights average 0 where they average 1")
    # Half on arm 0: its rows weigh 0.5 / 0.99 each, all alike (no noise), the rest unseen.
    halves = _rare_arm_log(0, target=(0.5, 0.5))
    assert halves.unseen_weight == pytest.approx(1.0 - 0.5 / 0.99, rel=1e-7)  # streamed sums
    at_rate = _rare_arm_log(4)
    assert at_rate.unseen_weight == 0.0 and not any("average" in w for w in at_rate.warnings())
    w = np.array([100.0] * 2 + [0.0] * 398)
    assert 1.0 - w.mean() - Z95 * w.std(ddof=1) / math.sqrt(400) < 0.0
    assert _rare_arm_log(2).unseen_weight == 0.0


def test_dm_has_no_interval():
    e = by_name(evaluate(0, 300))["dm"]
    assert (
        math.isfinite(e.value)
        and math.isnan(e.ci_low)
        and math.isnan(e.ci_high)
        and e.interval == "none"
    )


def test_the_bootstrap_agrees_with_the_normal_intervals_on_a_large_log_and_is_seeded():
    def run(bootstrap, seed=0):
        x, action, prop, r, pi = simulate(7, 4000, logging="softmax", target="eps", reward="linear")
        ev = OffPolicyEvaluator(bootstrap=bootstrap, seed=seed)
        for i in range(len(r)):
            ev.add(
                action=int(action[i]),
                propensity=float(prop[i]),
                reward=float(r[i]),
                target_probs=pi[i],
                predicted=np.zeros(K),
            )
        return by_name(ev), ev.logging_value

    normal, nlog = run(0)
    boot, blog = run(300)
    for name in ("ips", "snips", "dr", "replay"):
        n, b = normal[name], boot[name]
        assert b.interval == "bootstrap" and b.value == n.value
        # the widths agree within 20% (300 replicates: the percentile ends are noisy to ~10%)
        assert (b.ci_high - b.ci_low) == pytest.approx(n.ci_high - n.ci_low, rel=0.2), name
    assert (blog.ci_high - blog.ci_low) == pytest.approx(nlog.ci_high - nlog.ci_low, rel=0.2)
    assert run(300)[0]["ips"] == boot["ips"]  # the same seed, the same interval
    assert run(300, seed=1)[0]["ips"] != boot["ips"]


def test_the_poisson_bootstrap_is_the_percentile_of_its_replicates():
    b = PoissonBootstrap(50, seed=3)
    xs = np.arange(20, dtype=float)
    for x in xs:
        b.add({"x": x, "one": 1.0})
    rng = np.random.default_rng(np.random.SeedSequence([3, 0x0B007]))  # the same draws, by hand
    counts = np.array([rng.poisson(1.0, 50) for _ in xs])
    means = (counts * xs[:, None]).sum(0) / counts.sum(0)
    assert b.mean("x", 0.9) == pytest.approx(tuple(np.quantile(means, [0.05, 0.95])))
    assert b.ratio("x", "one", 0.9) == pytest.approx(b.mean("x", 0.9))
    for bad in (5, 10_001, 10**9):  # a hostile --bootstrap must not allocate gigabytes
        with pytest.raises(ValueError, match="10 to 10000 replicates"):
            PoissonBootstrap(bad)
    with pytest.raises(EstimatorError, match="10 to 10000 replicates"):
        OffPolicyEvaluator(bootstrap=10**9)


def test_a_reward_range_scores_two_valued_rewards_and_refuses_a_reward_outside():
    ev = OffPolicyEvaluator(reward_range=(-1.0, 1.0))
    for i in range(100):
        ev.add(
            action=0,
            propensity=0.5,
            reward=-1.0 if i % 10 else 1.0,
            target_probs=np.array([1.0, 0.0]),
            predicted=np.zeros(2),
        )
    est = by_name(ev)
    # replay over the 100 matched events: 10% at the top, i.e. -0.8 on [-1, 1]
    assert est["replay"].value == pytest.approx(-0.8) and est["replay"].interval == "wilson"
    lo, hi = wilson(0.1, 100, Z95)
    assert (est["replay"].ci_low, est["replay"].ci_high) == pytest.approx(
        (-1 + 2 * lo, -1 + 2 * hi)
    )
    with pytest.raises(EstimatorError, match=r"outside the reward range \[-1, 1\]"):
        ev.add(
            action=0,
            propensity=0.5,
            reward=1.5,
            target_probs=np.array([1.0, 0.0]),
            predicted=np.zeros(2),
        )
    with pytest.raises(EstimatorError, match="lo < hi"):
        OffPolicyEvaluator(reward_range=(1.0, 1.0))


def test_rewards_of_more_than_two_values_keep_the_normal_intervals():
    est = by_name(evaluate(0, 500, reward="linear"))
    assert est["ips"].interval == "normal" and est["snips"].interval == "delta"


def test_warnings_name_a_small_sample_few_matches_and_replay_on_a_non_uniform_log():
    small = zero_reward_log(n=40, logging="skewed").warnings()
    assert any(w.startswith("effective sample size") for w in small)
    assert any(w.startswith("only ") and "replay" in w for w in small)
    assert any("not uniform" in w and "replay" in w for w in small)
    assert zero_reward_log(n=2000).warnings() == []
