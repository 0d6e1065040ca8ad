"""The estimators' compiled sums against numpy's closed forms over the same terms."""

import math

import numpy as np
import pytest

from streambandit.replay import sums
from streambandit.replay.estimators import EstimatorError, OffPolicyEvaluator, RidgeRewardModel


def _stream(n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        pi = rng.dirichlet(np.ones(k))
        q = rng.uniform(0, 1, k)
        a = int(rng.integers(k))
        p = float(rng.uniform(0.05, 1.0))
        r = float(rng.integers(2))
        yield pi, q, a, p, r


@pytest.mark.parametrize("clip", [0.0, 2.0])
def test_the_sums_equal_numpys_means_variances_and_ratios(clip):
    acc = sums.new_accumulator()
    rows = list(_stream(500, 6, 1))
    for pi, q, a, p, r in rows:
        status, pa, dm, qa = sums.event_terms(pi, q, a, p, r)
        assert status == sums.TERMS_OK
        sums.add_event(acc, pa, p, r, 6, dm, qa, clip, 0.0, 1.0)
    pa = np.array([pi[a] for pi, _, a, _, _ in rows])
    p = np.array([row[3] for row in rows])
    r = np.array([row[4] for row in rows])
    w = pa / p
    if clip:
        assert acc[sums.CLIPPED] == np.sum(w > clip)
        w = np.minimum(w, clip)
    dm = np.array([pi @ q for pi, q, _, _, _ in rows])
    dr = dm + w * (r - np.array([q[a] for _, q, a, _, _ in rows]))
    for o, x in ((sums.IPS, w * r), (sums.DM, dm), (sums.DR, dr), (sums.LOGGED, r)):
        assert acc[o] == len(rows)
        assert acc[o + 1] == pytest.approx(x.mean(), rel=1e-12)
        assert acc[o + 2] == pytest.approx(((x - x.mean()) ** 2).sum(), rel=1e-10)
    for o, u, v in ((sums.REPLAY, pa * r, pa), (sums.SNIPS, w * r, w)):
        got = dict(zip(sums.RATIO_FIELDS, acc[o : o + 9]))
        assert got["n"] == len(rows) and got["nonzero"] == np.count_nonzero(v)
        assert (got["mu"], got["mv"]) == pytest.approx((u.mean(), v.mean()), rel=1e-12)
        assert got["suu"] == pytest.approx(((u - u.mean()) ** 2).sum(), rel=1e-10)
        assert got["svv"] == pytest.approx(((v - v.mean()) ** 2).sum(), rel=1e-10)
        assert got["suv"] == pytest.approx(((u - u.mean()) * (v - v.mean())).sum(), rel=1e-10)
        assert (got["sv"], got["sv2"]) == pytest.approx((v.sum(), (v * v).sum()), rel=1e-12)
    assert acc[sums.MANY] == 0.0 and {acc[sums.R_A], acc[sums.R_B]} == set(r)
    assert (acc[sums.RMIN], acc[sums.RMAX], acc[sums.UNIFORM]) == (r.min(), r.max(), 0.0)
    assert (acc[sums.SW], acc[sums.SW2], acc[sums.SWR], acc[sums.SW2R]) == pytest.approx(
        (w.sum(), (w * w).sum(), (w * r).sum(), (w * w * r).sum())
    )
    qa = np.clip([q[a] for _, q, a, _, _ in rows], 0.0, 1.0)  # clamped to the range given
    assert (acc[sums.SWQ], acc[sums.SW2Q], acc[sums.SW2Q2]) == pytest.approx(
        ((w * qa).sum(), (w * w * qa).sum(), (w * w * qa * qa).sum())
    )
    assert acc[sums.WMAX] == w.max()


def test_without_a_range_the_predictions_are_clamped_to_the_rewards_seen_so_far():
    acc = sums.new_accumulator()
    nan = float("nan")
    # (reward, prediction): before two values are seen the range is [0, 1] and the value seen;
    # then the least and the largest reward seen.
    for r, q in ((0.0, 3.0), (5.0, 7.0), (5.0, -1.0), (2.0, 4.0)):
        sums.add_event(acc, 1.0, 1.0, r, 1, 0.0, q, 0.0, nan, nan)
    assert acc[sums.SWQ] == 1.0 + 5.0 + 0.0 + 4.0
    assert acc[sums.MANY] == 1.0 and (acc[sums.RMIN], acc[sums.RMAX]) == (0.0, 5.0)


def test_the_checks_of_an_event():
    pi, q = np.array([0.5, 0.5]), np.zeros(2)
    assert sums.event_terms(pi, q, 2, 0.5, 1.0)[0] == sums.TERMS_BAD_ACTION
    assert sums.event_terms(pi, q, -1, 0.5, 1.0)[0] == sums.TERMS_BAD_ACTION
    for p in (0.0, 1.5, math.nan):
        assert sums.event_terms(pi, q, 0, p, 1.0)[0] == sums.TERMS_BAD_PROPENSITY
    for r in (math.inf, math.nan):
        assert sums.event_terms(pi, q, 0, 0.5, r)[0] == sums.TERMS_BAD_REWARD
    for bad in ([0.5, 0.6], [1.5, -0.5], [math.nan, 1.0], [1.0, math.nan], [math.inf, 0.0]):
        assert sums.event_terms(np.array(bad), q, 0, 0.5, 1.0)[0] == sums.TERMS_BAD_PROBS, bad
    # A NaN prediction on an arm of probability 0 still makes the event unusable.
    assert (
        sums.event_terms(np.array([1.0, 0.0]), np.array([0.0, math.nan]), 0, 0.5, 1.0)[0]
        == sums.TERMS_BAD_PREDICTIONS
    )
    assert sums.event_terms(pi, np.array([1.0, 3.0]), 1, 0.5, 1.0) == (sums.TERMS_OK, 0.5, 2.0, 3.0)


def test_a_pooled_and_a_key_evaluator_fed_at_once_equal_each_fed_alone():
    pooled, key = OffPolicyEvaluator(), OffPolicyEvaluator()
    alone = OffPolicyEvaluator()
    for pi, q, a, p, r in _stream(300, 4, 2):
        pooled.add_also_to(key, a, p, r, pi, q)
        alone.add(action=a, propensity=p, reward=r, target_probs=pi, predicted=q)
    assert pooled.estimates() == alone.estimates() == key.estimates()
    assert pooled.running() == alone.running()
    with pytest.raises(EstimatorError, match="probability vector"):
        pooled.add_also_to(key, 0, 0.5, 1.0, np.array([0.2, 0.2]), np.zeros(2))
    assert pooled.n == key.n == 300  # the refused event added nothing


def test_the_ridge_update_keeps_the_inverse_symmetric_and_equal_to_the_solve():
    rng = np.random.default_rng(4)
    m = RidgeRewardModel(5, lam=0.5)
    zs, rs = [], []
    for _ in range(300):
        x, r = rng.standard_normal(5), float(rng.standard_normal())
        m.update(x, r)
        zs.append(np.append(x, 1.0))
        rs.append(r)
    z = np.array(zs)
    inv = np.linalg.inv(0.5 * np.eye(6) + z.T @ z)
    assert np.array_equal(m._inv, m._inv.T)
    assert np.allclose(m._inv, inv, atol=1e-12)
    assert np.allclose(m.theta, inv @ (z.T @ np.array(rs)), atol=1e-10)


def test_an_evaluator_without_running_history_keeps_only_the_current_point():
    plain, silent = OffPolicyEvaluator(), OffPolicyEvaluator(running_growth=math.inf)
    for pi, q, a, p, r in _stream(200, 3, 5):
        plain.add_also_to(silent, a, p, r, pi, q)
    assert silent.estimates() == plain.estimates()
    assert all(len(points) > 20 for points in plain.running().values())
    assert silent.running() == {
        name: [(200, value)] for name, [*_, (_, value)] in plain.running().items()
    }
