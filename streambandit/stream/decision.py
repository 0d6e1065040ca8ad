"""The decision rule the worker applies to a context: the policy's choice, optionally mixed with
uniform exploration, with the propensity that off-policy evaluation needs.

Randomness is drawn from a generator seeded by hash(model key, event id, configured seed)
(DESIGN.md 3.1): the same event always gets the same draw, in the live worker, after a crash and
in replay, whatever else the worker processed in between.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from streambandit.policies.base import Policy

__all__ = ["Decision", "event_rng", "decide"]


@dataclasses.dataclass(slots=True)
class Decision:
    """The chosen arm's index, its policy score and the probability of choosing it."""

    index: int
    score: float
    propensity: float
    explored: bool


def event_rng(model_key: str, event_id: str, seed: int) -> np.random.Generator:
    """A generator that depends only on (model key, event id, seed). blake2b, not ``hash()``,
    because Python's string hash is salted per process."""
    digest = hashlib.blake2b(
        b"\x00".join((model_key.encode(), event_id.encode(), str(int(seed)).encode())), digest_size=16
    ).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest, "little")))


def decide(policy: Policy, arms: np.ndarray, *, epsilon: float, model_key: str, event_id: str, seed: int) -> Decision:
    """Epsilon-greedy over the policy's choice.

    With probability ``epsilon`` the arm is drawn uniformly, otherwise it is the policy's argmax;
    the propensity of the chosen arm is ``(1 - epsilon) [i == greedy] + epsilon / K``. With
    ``epsilon == 0`` no random number is drawn and the propensity is 1.
    """
    if epsilon <= 0.0:
        greedy, score = policy.best(arms)
        return Decision(greedy, score, 1.0, False)
    scores = policy.scores(arms)
    greedy = int(scores.argmax())
    k = scores.shape[0]
    rng = event_rng(model_key, event_id, seed)
    explored = bool(rng.random() < epsilon)
    index = int(rng.integers(k)) if explored else greedy
    propensity = (1.0 - epsilon) * (index == greedy) + epsilon / k
    return Decision(index, float(scores[index]), float(propensity), explored)
