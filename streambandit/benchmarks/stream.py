"""The synthetic stream every learner in the benchmark sees: d features per arm, K arms, and a
reward for every (event, arm) pair, so any sequence of choices can be scored without a simulator.

Model (linear-Gaussian, the model OFUL and the Gaussian-link GLB-OMD assume):

    theta*  uniform on the unit sphere in R^d            (||theta*|| = 1 = S)
    x_{t,k} uniform on the unit sphere in R^d            (||x|| = 1, GLB-OMD Assumption 1)
    mu_{t,k} = x_{t,k}' theta*                            (expected reward, kept for regret)
    r_{t,k}  = mu_{t,k} + eps,  eps ~ N(0, noise_sd^2)    (noise_sd = 0.1 by default)

Regret of a choice sequence c: sum_t max_k mu_{t,k} - mu_{t,c_t} (pseudo-regret: expected
rewards, so it does not depend on the noise draw). Everything comes from one seeded
``numpy.random.Generator``: the same (n, d, K, noise_sd, seed) gives the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Stream", "make_stream", "regret", "cumulative_regret", "oracle_choices"]

DEFAULT_NOISE_SD = 0.1


@dataclass(frozen=True, kw_only=True)
class Stream:
    """A generated stream; arrays are float64 and C-contiguous."""

    arms: np.ndarray  # (n, K, d) arm features
    rewards: np.ndarray  # (n, K) observed reward had that arm been chosen
    mean_rewards: np.ndarray  # (n, K) expected reward, for regret
    theta: np.ndarray  # (d,) theta*
    noise_sd: float
    seed: int

    @property
    def n(self) -> int:
        return self.arms.shape[0]

    @property
    def n_arms(self) -> int:
        return self.arms.shape[1]

    @property
    def dim(self) -> int:
        return self.arms.shape[2]


def _unit_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape)
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    return x


def make_stream(
    n: int, dim: int, n_arms: int, *, noise_sd: float = DEFAULT_NOISE_SD, seed: int = 0
) -> Stream:
    """The stream of the module docstring, ``n`` events of ``n_arms`` arms in R^``dim``."""
    if n < 1 or dim < 1 or n_arms < 1:
        raise ValueError(f"n, dim and n_arms must be >= 1, got {n}, {dim}, {n_arms}")
    if not noise_sd >= 0.0:
        raise ValueError(f"noise_sd must be >= 0, got {noise_sd!r}")
    rng = np.random.default_rng(seed)
    theta = _unit_rows(rng, (dim,))
    arms = _unit_rows(rng, (n, n_arms, dim))
    mean = arms @ theta
    rewards = mean + noise_sd * rng.standard_normal((n, n_arms))
    return Stream(
        arms=arms,
        rewards=rewards,
        mean_rewards=mean,
        theta=theta,
        noise_sd=float(noise_sd),
        seed=seed,
    )


def _check_choices(stream: Stream, chosen: np.ndarray) -> np.ndarray:
    c = np.asarray(chosen)
    if c.ndim != 1 or c.shape[0] > stream.n:
        raise ValueError(f"chosen must be 1-d with at most {stream.n} entries, got shape {c.shape}")
    c = c.astype(np.int64)
    if c.size and (c.min() < 0 or c.max() >= stream.n_arms):
        raise ValueError(f"chosen arms must be in [0, {stream.n_arms}), got [{c.min()}, {c.max()}]")
    return c


def cumulative_regret(stream: Stream, chosen: np.ndarray) -> np.ndarray:
    """Regret after each of the first ``len(chosen)`` events: (len(chosen),) float64."""
    c = _check_choices(stream, chosen)
    mu = stream.mean_rewards[: c.size]
    per_event = mu.max(axis=1) - mu[np.arange(c.size), c]
    return np.cumsum(per_event)


def regret(stream: Stream, chosen: np.ndarray) -> float:
    """Pseudo-regret of the choices on the first ``len(chosen)`` events."""
    cum = cumulative_regret(stream, chosen)
    return float(cum[-1]) if cum.size else 0.0


def oracle_choices(stream: Stream) -> np.ndarray:
    """The choices of the policy that knows theta*: regret 0 by construction."""
    return stream.mean_rewards.argmax(axis=1).astype(np.int64)
