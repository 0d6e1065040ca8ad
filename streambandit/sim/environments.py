"""Synthetic bandit environments with a known parameter, so regret can be computed exactly.

An environment hands out an arm set per round and draws a reward for the arm played; its
``means(arms)`` gives the expected rewards, from which the pseudo-regret (the papers' metric) is
computed, never from the noisy rewards. All randomness comes from the generator passed in.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["GLMEnvironment", "unit_rows", "random_unit_vector"]


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows of ``a`` scaled to unit Euclidean norm."""
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def random_unit_vector(rng: np.random.Generator, dim: int) -> np.ndarray:
    """A direction drawn uniformly from the unit sphere in R^dim."""
    v = rng.standard_normal(dim)
    return v / np.linalg.norm(v)


@dataclasses.dataclass
class GLMEnvironment:
    """Rewards ``r = mu(x' theta*) + noise`` (linear link) or drawn from a GLM (logistic, poisson).

    Attributes:
      theta: the true parameter theta*.
      link: ``"linear"`` (additive noise), ``"logistic"`` (Bernoulli rewards) or ``"poisson"``.
      arms: a fixed (K, d) arm set, or ``None`` to draw ``n_arms`` fresh unit-norm arms each round.
      noise: for the linear link: ``"gaussian"`` or ``"student_t"``; ``noise_scale`` multiplies it.
      df: degrees of freedom of the Student-t noise.
    """

    theta: np.ndarray
    link: str = "linear"
    arms: np.ndarray | None = None
    n_arms: int = 10
    noise: str = "gaussian"
    noise_scale: float = 1.0
    df: float = 2.1

    def __post_init__(self) -> None:
        if self.link not in ("linear", "logistic", "poisson"):
            raise ValueError(f"unknown link {self.link!r}")
        if self.noise not in ("gaussian", "student_t"):
            raise ValueError(f"unknown noise {self.noise!r}")

    @property
    def dim(self) -> int:
        return int(self.theta.shape[0])

    def context(self, rng: np.random.Generator) -> np.ndarray:
        """The arm set of the next round."""
        if self.arms is not None:
            return self.arms
        return unit_rows(rng.standard_normal((self.n_arms, self.dim)))

    def means(self, arms: np.ndarray) -> np.ndarray:
        """Expected reward of each arm."""
        z = arms @ self.theta
        if self.link == "logistic":
            return 1.0 / (1.0 + np.exp(-z))
        if self.link == "poisson":
            return np.exp(z)
        return z

    def reward(self, rng: np.random.Generator, x: np.ndarray) -> float:
        """A reward drawn for playing feature vector ``x``."""
        z = float(x @ self.theta)
        if self.link == "logistic":
            return float(rng.random() < 1.0 / (1.0 + math.exp(-z)))
        if self.link == "poisson":
            return float(rng.poisson(math.exp(z)))
        if self.noise == "student_t":
            return z + self.noise_scale * float(rng.standard_t(self.df))
        return z + self.noise_scale * float(rng.standard_normal())
