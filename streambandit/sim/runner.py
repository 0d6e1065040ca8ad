"""The simulation loop: one policy against one environment, immediate rewards, exact regret.

Uses the same ``select``/``update`` calls the Kafka worker makes, so a simulated learner is the
live learner.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Protocol

import numpy as np

from streambandit.policies.base import Policy

__all__ = ["RunResult", "run_policy", "run_uniform"]


class Environment(Protocol):
    def context(self, rng: np.random.Generator) -> np.ndarray: ...
    def means(self, arms: np.ndarray) -> np.ndarray: ...
    def reward(self, rng: np.random.Generator, x: np.ndarray) -> float: ...


@dataclasses.dataclass(frozen=True)
class RunResult:
    """Per-round cumulative pseudo-regret and cumulative wall time (seconds) of one run."""

    regret: np.ndarray
    seconds: np.ndarray
    extra: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # the ``record`` series

    @property
    def final_regret(self) -> float:
        return float(self.regret[-1])


def run_policy(
    policy: Policy,
    env: Environment,
    rounds: int,
    seed: int,
    progress: Callable[[int], None] | None = None,
    record: dict[str, Callable[[], float]] | None = None,
) -> RunResult:
    """Play ``rounds`` rounds; the environment's randomness comes from ``seed`` alone.

    ``record``: series to read after each round, outside the timed calls (e.g. the policy's
    ``state_nbytes``); they come back in ``RunResult.extra``. ``progress(n)`` gets the number of
    rounds done so far.

    Two generators keep the arm sets and the reward noise independent of the policy's choices'
    count of draws, so two policies on the same seed see the same arm sets.
    """
    ctx_rng = np.random.default_rng([seed, 0])
    rew_rng = np.random.default_rng([seed, 1])
    regret = np.empty(rounds)
    seconds = np.empty(rounds)
    extra = {name: np.empty(rounds) for name in (record or {})}
    total = 0.0
    elapsed = 0.0
    for t in range(rounds):
        arms = env.context(ctx_rng)
        means = env.means(arms)
        start = time.perf_counter()
        i = policy.select(arms)
        r = env.reward(rew_rng, arms[i])
        policy.update(arms[i], r)
        elapsed += time.perf_counter() - start
        total += float(means.max() - means[i])
        regret[t] = total
        seconds[t] = elapsed
        for name, read in (record or {}).items():
            extra[name][t] = read()
        if progress is not None:
            progress(t + 1)
    return RunResult(regret=regret, seconds=seconds, extra=extra)


def run_uniform(env: Environment, rounds: int, seed: int) -> RunResult:
    """Expected regret of choosing uniformly at random, on the same arm sets as :func:`run_policy`."""
    ctx_rng = np.random.default_rng([seed, 0])
    regret = np.empty(rounds)
    total = 0.0
    for t in range(rounds):
        means = env.means(env.context(ctx_rng))
        total += float(means.max() - means.mean())
        regret[t] = total
    return RunResult(regret=regret, seconds=np.zeros(rounds))
