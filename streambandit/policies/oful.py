"""OFUL / LinUCB with exact ridge regression: the reference every other learner is measured against.

Abbasi-Yadkori, Pal, Szepesvari, "Improved Algorithms for Linear Stochastic Bandits", NeurIPS 2011.
State: ``V^-1`` kept by Sherman-Morrison, ``b = sum r x``, ``theta = V^-1 b`` and
``log det(V) - d log(lambda)``, which the data-dependent radius of their Theorem 2 needs and which
the same rank-one step updates exactly (matrix determinant lemma). O(d^2) per update, O(K d^2) per
decision, d^2 + 2 d + 2 numbers per model (V^-1, b, theta, and two scalars).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit import kernels
from streambandit.policies.base import check_in_range, check_positive, register
from streambandit.policies.linear_ucb import LinearUCBPolicy


@register
class OFUL(LinearUCBPolicy):
    """Ridge regression plus the elliptical bonus: ``score = x'theta + beta_t ||x||_{V^-1}``.

    Hyper-parameters:
      lam: ridge regulariser, ``V_0 = lam I`` (default 1.0).
      beta: a constant confidence radius; ``None`` (default) uses the Abbasi-Yadkori radius
        ``beta_t = noise_sd sqrt(2 log(1/delta) + log det(V_t) - d log lam) + sqrt(lam) S``
        (Theorem 2 of the paper) times ``beta_scale``.
      noise_sd: R, the sub-Gaussian scale of the reward noise (default 1.0).
      S: bound on ||theta*||_2 (default 1.0).
      delta: confidence level of the radius (default 0.05).
      beta_scale: multiplier on the theory radius (default 1.0: the theory radius itself).
    """

    name = "oful"
    _state_arrays = ("vinv", "b", "theta")
    _state_scalars = ("n_updates", "logdet")

    def __init__(
        self,
        dim: int,
        *,
        lam: float = 1.0,
        beta: float | None = None,
        noise_sd: float = 1.0,
        S: float = 1.0,
        delta: float = 0.05,
        beta_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        self._config.update(
            lam=check_positive("lam", lam),
            beta=None if beta is None else check_in_range("beta", beta, 0.0, math.inf),
            noise_sd=check_in_range("noise_sd", noise_sd, 0.0, math.inf),
            S=check_in_range("S", S, 0.0, math.inf),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
        )
        lam_v = self._config["lam"]
        self.vinv = np.eye(dim) / lam_v
        self.b = np.zeros(dim)
        self.theta = np.zeros(dim)
        self.logdet = 0.0  # log det(V_t) - d log(lam)
        self._log_inv_delta = math.log(1.0 / self._config["delta"])
        self._sqrt_lam_s = math.sqrt(lam_v) * self._config["S"]
        # The radius's parameters as the kernels take them (a negative fixed beta: the theory one).
        c = self._config
        self._beta_args = (-1.0 if c["beta"] is None else c["beta"], c["beta_scale"], c["noise_sd"],
                           2.0 * self._log_inv_delta, self._sqrt_lam_s)

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        return [{}, {"beta": 0.5, "lam": 2.0}]

    def beta(self) -> float:
        """The confidence radius used by the next decision: a fixed ``beta``, or Abbasi-Yadkori
        et al. (2011), Theorem 2, times ``beta_scale``."""
        return kernels.oful_beta(*self._beta_args, self.logdet)

    def _ucb_parts(self) -> tuple[np.ndarray, np.ndarray, float]:
        return self.theta, self.vinv, kernels.oful_beta(*self._beta_args, self.logdet)

    def _update(self, x: np.ndarray, reward: float) -> None:
        dlogdet = kernels.oful_update_checked(self.vinv, self.b, self.theta, x, reward)
        if dlogdet != dlogdet:  # NaN: the kernel found a non-finite feature and changed nothing
            raise ValueError("x contains NaN or infinite features")
        # Matrix determinant lemma: det(V + x x') = det(V) (1 + x'V^-1 x).
        self.logdet += dlogdet

    def play(self, arms: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        a, r = self._check_play(arms, rewards)
        chosen = np.zeros(len(a), dtype=np.int64)
        done, self.logdet, status = kernels.oful_play(a, r, self.vinv, self.b, self.theta, self.logdet,
                                                      *self._beta_args, chosen)
        self.n_updates += done
        if status != kernels.OK:
            what = "arms contain NaN or infinite features" if status == kernels.BAD_ARMS else "the chosen arm's reward is not finite"
            raise ValueError(f"round {done}: {what}")
        return chosen
