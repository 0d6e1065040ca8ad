"""The decision side shared by the exact linear-index learners (OFUL, GLB-OMD, Hvt-UCB).

Each scores an arm as ``x'theta + beta ||x||_{M^-1}`` with a maintained inverse ``M^-1``; only
what theta, M^-1 and beta are differs. Scoring runs in the compiled kernels of
``streambandit.kernels``, one call per context (or per batch of contexts), so select, select_batch
and scores give the same bits (the kernels' determinism note says why).
"""

from __future__ import annotations

import abc

import numpy as np

from streambandit import kernels
from streambandit.policies.base import Policy

__all__ = ["LinearUCBPolicy"]

_NON_FINITE_ARMS = "arms contain NaN or infinite features"


class LinearUCBPolicy(Policy):
    """A policy whose index is ``x'theta + beta ||x||_{M^-1}``; subclasses give the three parts."""

    @abc.abstractmethod
    def _ucb_parts(self) -> tuple[np.ndarray, np.ndarray, float]:
        """``(theta, M^-1, beta)`` of the next decision (C-contiguous float64 arrays)."""

    def _check_x(self, x: np.ndarray) -> np.ndarray:
        # The compiled updates check the values themselves and change nothing when one is not
        # finite, so the generic update only needs the shape here.
        return self._check_x_shape(x)

    def scores(self, arms: np.ndarray) -> np.ndarray:
        a = self._check_arms_shape(arms)
        theta, inv, beta = self._ucb_parts()
        out = np.empty(a.shape[0])
        if kernels.ucb_scores(a, theta, inv, beta, out) != kernels.OK:
            raise ValueError(_NON_FINITE_ARMS)
        return out

    def select(self, arms: np.ndarray) -> int:
        a = self._check_arms_shape(arms)
        theta, inv, beta = self._ucb_parts()
        i = kernels.ucb_argmax(a, theta, inv, beta)
        if i < 0:
            raise ValueError(_NON_FINITE_ARMS)
        return i

    def _batch(self, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = self._check_arms_batch(arms)
        theta, inv, beta = self._ucb_parts()
        chosen = np.zeros(a.shape[0], dtype=np.int64)
        scores = np.empty(a.shape[:2])
        status = kernels.ucb_argmax_batch(a, theta, inv, beta, chosen, scores)
        if status != kernels.OK:
            raise ValueError(f"context {-1 - status}: {_NON_FINITE_ARMS}")
        return chosen, scores

    def scores_batch(self, arms: np.ndarray) -> np.ndarray:
        return self._batch(arms)[1]

    def select_batch(self, arms: np.ndarray) -> np.ndarray:
        return self._batch(arms)[0]
