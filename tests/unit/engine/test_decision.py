"""The decision rule: seeded per event, propensities that match the empirical choice frequencies."""

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.engine.decision import decide, event_rng


def test_event_rng_depends_only_on_key_event_and_seed():
    a = event_rng("m", "e1", 0).random(3)
    assert np.array_equal(a, event_rng("m", "e1", 0).random(3))
    assert not np.array_equal(a, event_rng("m", "e2", 0).random(3))
    assert not np.array_equal(a, event_rng("m", "e1", 1).random(3))
    assert not np.array_equal(a, event_rng("m2", "e1", 0).random(3))
    # The separator keeps ("ab", "c") and ("a", "bc") apart.
    assert not np.array_equal(event_rng("ab", "c", 0).random(3), event_rng("a", "bc", 0).random(3))


def test_no_exploration_is_the_policy_argmax_with_propensity_one():
    p = make_policy("oful", dim=3)
    arms = np.array([[0.1, 0, 0], [0.9, 0, 0], [0.2, 0.1, 0]])
    d = decide(p, arms, epsilon=0.0, model_key="m", event_id="e", seed=0)
    assert d.index == p.select(arms) and d.propensity == 1.0 and not d.explored
    assert d.score == pytest.approx(p.scores(arms)[d.index])


def test_exploration_frequencies_match_the_logged_propensities():
    p = make_policy("oful", dim=2)
    arms = np.array([[1.0, 0.0], [0.0, 0.5], [0.0, 0.2], [0.1, 0.1]])
    greedy = p.select(arms)
    eps, n = 0.3, 20_000
    counts = np.zeros(4)
    props = {}
    for i in range(n):
        d = decide(p, arms, epsilon=eps, model_key="m", event_id=f"e{i}", seed=7)
        counts[d.index] += 1
        props[d.index] = d.propensity
    expected = np.full(4, eps / 4)
    expected[greedy] += 1 - eps
    np.testing.assert_allclose([props[k] for k in range(4)], expected)
    # Binomial standard error at n = 20,000 is <= 0.0035; 5 of them is a safe, still sharp bound.
    np.testing.assert_allclose(counts / n, expected, atol=0.018)
    # Same event, same draw: a duplicate or a replay decides identically.
    again = [
        decide(p, arms, epsilon=eps, model_key="m", event_id="e5", seed=7).index for _ in range(3)
    ]
    assert len(set(again)) == 1


def test_the_compiled_choice_is_choose_with_probabilities_to_the_bit():
    from streambandit.engine.decision import choice_with_probabilities, choose_with_probabilities

    rng = np.random.default_rng(3)
    for i in range(3000):
        k = int(rng.integers(1, 12))
        scores = rng.normal(size=k)
        if i % 5 == 0:
            scores[rng.integers(k)] = scores.max()  # ties: the lowest index, as argmax
        eps = [0.0, 0.1, 0.5, 1.0][i % 4]
        kw = dict(epsilon=eps, model_key=f"m{i % 3}", event_id=f"e{i}", seed=i % 7)
        dec, probs = choose_with_probabilities(scores, **kw)
        index, fast = choice_with_probabilities(scores, **kw)
        assert index == dec.index and fast.tobytes() == probs.tobytes()
