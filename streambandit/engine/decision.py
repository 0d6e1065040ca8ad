"""The decision rule: the policy's choice, optionally mixed with uniform exploration, with the
propensity that off-policy evaluation needs. The worker's engine and the replay runner both call
it, so a replay decides exactly as the live worker did.

Randomness is drawn from a generator seeded by a hash of (model key, event id, configured seed)
(docs/design.md, determinism): the same event always gets the same draw, in the live worker,
after a crash and in replay, whatever else was processed in between. The generator is numpy's
PCG64 (:func:`event_rng`); :func:`choose` computes its two draws with the compiled equivalent in
``numerics/event_draw.py``, which gives the same bits without building a generator per event.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from numba import njit

from streambandit.numerics.event_draw import event_seed, explore_draw
from streambandit.numerics.jit import CACHE
from streambandit.policies.base import Policy

__all__ = [
    "Decision",
    "event_rng",
    "decide",
    "choose",
    "choose_with_probabilities",
    "choice_with_probabilities",
    "action_probabilities",
]


@dataclasses.dataclass(slots=True)
class Decision:
    """The chosen arm's index, its policy score and the probability of choosing it."""

    index: int
    score: float
    propensity: float
    explored: bool


def event_rng(model_key: str, event_id: str, seed: int) -> np.random.Generator:
    """A generator that depends only on (model key, event id, seed): numpy's PCG64 seeded with
    the event's 128-bit hash (``event_draw.event_seed``)."""
    return np.random.Generator(
        np.random.PCG64(int.from_bytes(event_seed(model_key, event_id, seed), "little"))
    )


def choose(
    scores: np.ndarray,
    *,
    epsilon: float,
    model_key: str,
    event_id: str,
    seed: int,
    position: int = 0,
) -> Decision:
    """Epsilon-greedy over a score vector.

    With probability ``epsilon`` the arm is drawn uniformly, otherwise it is the argmax (ties to
    the lowest index); the propensity of the chosen arm is ``(1 - epsilon) [i == greedy] +
    epsilon / K``. With ``epsilon <= 0`` no random number is drawn and the propensity is 1.

    ``position`` k > 0 (a slot of a slate, for replay): the greedy arm is the k-th by score (ties
    to the lower index) and the draw the same, so each slot is epsilon-greedy over the ranking:
    a uniformly random permutation, chosen with probability ``epsilon``, puts each arm at slot k
    with probability 1 / K, the draw's.
    """
    if position == 0 and epsilon > 0.0 and scores.dtype is _F64:
        index, score, propensity, explored = _explore_kernel(
            scores, float(epsilon), event_seed(model_key, event_id, seed)
        )
        return Decision(index, score, propensity, explored)
    return _choose(scores, _greedy(scores, position), epsilon, model_key, event_id, seed)


_F64 = np.dtype(np.float64)


@njit(cache=CACHE, nogil=True)
def _explore_kernel(scores, epsilon, digest):
    """``_choose`` at the top slot with ``epsilon > 0`` (the greedy arm by ``np.argmax``, as
    ``_greedy``): ``(index, score, propensity, explored)``, the same operations in order, in one
    compiled call (a decision's per-call path, and engine/compiled_pass.py's draw)."""
    k = scores.shape[0]
    greedy = np.argmax(scores)
    explored, drawn = explore_draw(digest, epsilon, k)
    index = drawn if explored else greedy
    propensity = (1.0 - epsilon) * (index == greedy) + epsilon / k
    return index, scores[index], propensity, explored


def choose_with_probabilities(
    scores: np.ndarray,
    *,
    epsilon: float,
    model_key: str,
    event_id: str,
    seed: int,
    position: int = 0,
) -> tuple[Decision, np.ndarray]:
    """:func:`choose` and :func:`action_probabilities` of one score vector, ranked once (what a
    replay needs of every event)."""
    greedy = _greedy(scores, position)
    return (
        _choose(scores, greedy, epsilon, model_key, event_id, seed),
        _probabilities(scores.shape[0], greedy, epsilon),
    )


NO_DRAW = bytes(16)  # the digest when epsilon <= 0 (no draw is made)


explore_kernel = _explore_kernel  # for compiled callers


def choice_with_probabilities(
    scores: np.ndarray, *, epsilon: float, model_key: str, event_id: str, seed: int
) -> tuple[int, np.ndarray]:
    """The index :func:`choose_with_probabilities` chooses at the top slot and its probabilities,
    to the bit, in one compiled call (a replay's per-row path: no Decision object)."""
    digest = event_seed(model_key, event_id, seed) if epsilon > 0.0 else NO_DRAW
    probs = np.empty(scores.shape[0])
    return choice_kernel(scores, float(epsilon), digest, probs), probs


@njit(cache=CACHE, nogil=True)
def choice_kernel(scores, epsilon, digest, probs):
    """``_choose``'s index and ``_probabilities`` into ``probs``, the same operations in order;
    ``digest``: ``event_seed``'s of the event when epsilon > 0, else :data:`NO_DRAW`. Compiled
    callers (replay/row_kernel.py) call it too."""
    k = scores.shape[0]
    greedy = np.argmax(scores)
    probs.fill(epsilon / k if epsilon > 0.0 else 0.0)
    probs[greedy] += 1.0 - epsilon
    if epsilon <= 0.0:
        return greedy
    explored, drawn = explore_draw(digest, epsilon, k)
    return drawn if explored else greedy


def _greedy(scores: np.ndarray, position: int) -> int:
    return int(scores.argmax()) if position == 0 else _ranked(scores, position)


def _choose(
    scores: np.ndarray, greedy: int, epsilon: float, model_key: str, event_id: str, seed: int
) -> Decision:
    if epsilon <= 0.0:
        return Decision(greedy, float(scores[greedy]), 1.0, False)
    k = scores.shape[0]
    # event_rng(...).random() < epsilon, then .integers(k): the same bits, compiled.
    explored, drawn = explore_draw(event_seed(model_key, event_id, seed), float(epsilon), k)
    index = drawn if explored else greedy
    propensity = (1.0 - epsilon) * (index == greedy) + epsilon / k
    return Decision(index, float(scores[index]), float(propensity), explored)


def _ranked(scores: np.ndarray, position: int) -> int:
    """The arm at ``position`` of the ranking by score, highest first, ties to the lower index."""
    if not 0 <= position < scores.shape[0]:
        raise ValueError(f"position {position} is not a slot of {scores.shape[0]} arms")
    return int(np.argsort(-scores, kind="stable")[position])


def decide(
    policy: Policy,
    arms: np.ndarray,
    *,
    epsilon: float,
    model_key: str,
    event_id: str,
    seed: int,
    scores: list[np.ndarray] | None = None,
) -> Decision:
    """:func:`choose` over the policy's scores of ``arms``. Without exploration the policy scores
    the arms once for the choice and its score (``Policy.best``: the same index and bits as the
    argmax of ``scores``). With ``scores`` (a list), every arm's score is appended to it, the
    scores the choice was made from when it explores (a caller that returns them with the
    decision scores the arms once)."""
    if epsilon <= 0.0:
        greedy, score = policy.best(arms)
        if scores is not None:
            scores.append(policy.scores(arms))
        return Decision(greedy, score, 1.0, False)
    s = policy.scores(arms)
    if scores is not None:
        scores.append(s)
    return choose(s, epsilon=epsilon, model_key=model_key, event_id=event_id, seed=seed)


def action_probabilities(scores: np.ndarray, epsilon: float, position: int = 0) -> np.ndarray:
    """The probability of each arm under :func:`choose` (at ``position``): ``epsilon / K`` each,
    plus ``1 - epsilon`` on the greedy arm (the distribution off-policy estimators weigh a target
    by)."""
    return _probabilities(scores.shape[0], _greedy(scores, position), epsilon)


def _probabilities(k: int, greedy: int, epsilon: float) -> np.ndarray:
    probs = np.empty(k)
    probs.fill(
        epsilon / k if epsilon > 0.0 else 0.0
    )  # np.full's own overhead is a replay's per-row cost
    probs[greedy] += 1.0 - epsilon
    return probs
