"""Hvt-UCB: heavy-tailed linear bandits with a one-pass adaptive Huber (OMD) update.

Wang, Zhang, Zhao, Zhou, "Heavy-Tailed Linear Bandits: Huber Regression with One-Pass Update",
Algorithm 1. Equation numbers are the paper's.

State: theta (d), V (d x d, for the V-norm projection) and V^-1 (d x d). O(d^2) per update plus an
O(d^3) eigendecomposition in rounds where the step leaves the ball; O(K d^2) per decision. A
model's state (and its n_updates) is one row of the configuration's row store (linear_ucb.py).

Streaming: sigma_t, w_t and tau_t depend only on (X_t, V_{t-1}, beta_{t-1}, t),
never on the reward, so we compute them when the reward is applied, from the state current at that
moment, with ``t = n_updates + 1``. With no delay this is exactly Algorithm 1 (nothing changes the
state between a decision and its reward); with delays the quantities are taken at the reward's
arrival, which needs nothing stored per pending decision and is a pure function
of the update sequence, so replay reproduces it.

The horizon T is needed up front (kappa, tau_0, beta, sigma_min and delta depend on it):
``horizon`` is a planning bound, and the theory constants are computed from it once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.numerics import kernels, row_calls
from streambandit.numerics.kernels import MAX_ABS_REWARD
from streambandit.policies.base import (
    Policy,
    check_in_range,
    check_positive,
    register,
)
from streambandit.policies.linear_ucb import INV, OTHER, THETA, LinearUCBPolicy, row_array
from streambandit.policies.rows import RowStore


@register
class HvtUCB(LinearUCBPolicy):
    """Hvt-UCB (Algorithm 1): ``score = x'theta_t + beta_{t-1} ||x||_{V_{t-1}^-1}`` (eq. 11).

    Hyper-parameters:
      epsilon: moment order, the noise has a finite (1+epsilon)-th moment; in (0, 1] (default 1.0).
      nu: known bound on the noise's (1+epsilon)-th central moment, nu^(1+eps) >= E|eta|^(1+eps)
        (Corollary 1's uniform bound; default 1.0).
      S: bound on ||theta*||_2, the projection radius (default 1.0).
      L: bound on ||x||_2 (default 1.0).
      horizon: T, the planning horizon the constants are computed for (default 100_000).
      lam: V_0 = lam I; default ``None`` means ``lam = dim`` (Theorem 1).
      delta: confidence; default ``None`` means 1/(8T) (Theorem 1).
      sigma_min: floor on sigma_t; default ``None`` means 1/sqrt(T) (Theorem 1).
      alpha: OMD step parameter (default 4, the heavy-tailed analysis' value).
      beta_scale: multiplier on beta_t (default 1e-3). The theory radius is ~5e3 even at d = 2,
        which makes the learner explore almost uniformly for tens of thousands of rounds; the
        multiplier is applied both to the bonus and inside sigma_t's floor (scaling one without
        the other changes the algorithm). ``beta_scale=1`` is the exact theory.
      huber: ``False`` sets tau_t = infinity, the squared loss of the sub-Gaussian case (Sec. 4.1).
      project: ``False`` skips the projection onto the ball.

    An example: a linear model whose noise is Student-t with 2.1 degrees of freedom (a finite
    variance, barely); the Huber update still finds theta*, and a saved state restores the same
    scores (values rounded, so the example reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> theta_star = np.array([0.6, -0.3, 0.2])
    >>> p = make_policy("hvt_ucb", dim=3)
    >>> for _ in range(300):
    ...     arms = rng.normal(size=(5, 3)) / np.sqrt(3)
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(arms[i] @ theta_star + 0.1 * rng.standard_t(2.1)))
    >>> [round(float(v), 1) for v in p.theta]
    [0.6, -0.3, 0.2]
    >>> p.select(np.eye(3))
    0
    >>> q = make_policy("hvt_ucb", dim=3)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(np.eye(3)), p.scores(np.eye(3))))
    True
    """

    name = "hvt_ucb"
    _state_arrays = ("theta", "v", "vinv")
    _columns = {"theta": THETA, "vinv": INV, "v": OTHER}
    _radius_kind = kernels.RADIUS_HVT_UCB
    _const_names = (
        "_p",
        "tau0",
        "_beta_coef",
        "_beta_const",
        "_sqrt_alpha",
        "_step_params",
    )
    _play_kernel = kernels.hvt_ucb_play
    # The compiled step: Alg. 1 lines 5-8, eq. (8), (9), (17) (kernels.hvt_ucb_update).
    _update_row = staticmethod(kernels.hvt_ucb_update_row)
    _update_at = staticmethod(row_calls.hvt_ucb_update_at)
    _update_kind = row_calls.UPDATE_HVT_UCB
    _bad_reward_message = f"reward must be finite and within +-{MAX_ABS_REWARD:g}"
    __slots__ = ()

    theta = row_array(THETA, "theta_t (d,).")
    v = row_array(OTHER, "V_{t-1} (d, d), for the V-norm projection.")
    vinv = row_array(INV, "V_{t-1}^-1 (d, d).")

    def __init__(
        self,
        dim: int,
        *,
        epsilon: float = 1.0,
        nu: float = 1.0,
        S: float = 1.0,
        L: float = 1.0,
        horizon: int = 100_000,
        lam: float | None = None,
        delta: float | None = None,
        sigma_min: float | None = None,
        alpha: float = 4.0,
        beta_scale: float = 1e-3,
        huber: bool = True,
        project: bool = True,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
            raise ValueError(f"horizon must be an integer >= 1, got {horizon!r}")
        big_t = int(horizon)
        eps = check_in_range("epsilon", epsilon, 0.0, 1.0, lo_open=True)
        lam_v = float(dim) if lam is None else check_positive("lam", lam)
        delta_v = (
            1.0 / (8.0 * big_t)
            if delta is None
            else check_in_range("delta", delta, 0.0, 1.0, lo_open=True)
        )
        smin = (
            1.0 / math.sqrt(big_t) if sigma_min is None else check_positive("sigma_min", sigma_min)
        )
        self._config.update(
            epsilon=eps,
            nu=check_in_range("nu", nu, 0.0, math.inf),
            S=check_positive("S", S),
            L=check_positive("L", L),
            horizon=big_t,
            lam=lam_v,
            delta=delta_v,
            sigma_min=smin,
            alpha=check_positive("alpha", alpha),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
            huber=bool(huber),
            project=bool(project),
        )
        self._attach()

    def _new_store(self) -> RowStore:
        c, dim = self._config, self.dim
        big_t, eps, lam_v, delta_v, smin = (
            c["horizon"],
            c["epsilon"],
            c["lam"],
            c["delta"],
            c["sigma_min"],
        )
        # The theory constants, computed once from (T, delta, lambda, sigma_min, ...).
        p = (1.0 - eps) / (2.0 * (1.0 + eps))
        kappa = dim * math.log(
            1.0 + c["L"] ** 2 * big_t / (smin**2 * lam_v * c["alpha"] * dim)
        )  # Alg. 1 line 1
        log_2t2_delta = math.log(2.0 * big_t**2 / delta_v)
        tau0 = (
            math.sqrt(2.0 * kappa)
            * math.log(3.0 * big_t) ** p
            / log_2t2_delta ** (1.0 / (1.0 + eps))
        )  # eq. 15
        beta_coef = 107.0 * log_2t2_delta * tau0  # eq. 10, first term's constant
        beta_const = math.sqrt(lam_v * (2.0 + 4.0 * c["S"] ** 2))  # eq. 10, second term
        sqrt_alpha = math.sqrt(c["alpha"])
        # What the compiled step (kernels.hvt_ucb_update) takes, in its order.
        step_params = (
            c["beta_scale"],
            beta_coef,
            beta_const,
            p,
            tau0,
            sqrt_alpha,
            c["nu"],
            c["sigma_min"],
            c["alpha"],
            float(c["huber"]),
            float(c["project"]),
            c["S"],
        )
        consts = {
            "_p": p,
            "tau0": tau0,
            "_beta_coef": beta_coef,
            "_beta_const": beta_const,
            "_sqrt_alpha": sqrt_alpha,
            "_step_params": step_params,
        }
        # theta_1 = 0; V_0 = lambda I; no float scalars.
        initial = (
            np.zeros(dim),
            np.eye(dim) / lam_v,
            np.eye(dim) * lam_v,
            np.zeros(0),
            np.zeros((), np.int64),
        )
        return RowStore(c, initial, np.array(step_params), consts, self._radius_kind)

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        return [{}, {"epsilon": 0.5, "nu": 2.0, "S": 0.3, "beta_scale": 1.0}]

    def beta(self, t: int) -> float:
        """beta_t of eq. (10), times beta_scale. For t = 0 we use max(t, 1)^p: with eps < 1 the
        paper's proof takes 0^p = 0, a discontinuity between beta_0 and beta_1;
        the larger value is safe for the analysis and keeps the radius non-decreasing."""
        k = self._store.consts
        radius = k["_beta_coef"] * max(t, 1) ** k["_p"] + k["_beta_const"]
        return self._config["beta_scale"] * radius

    # Decisions (LinearUCBPolicy's, eq. 11) use theta_t, V_{t-1} and beta_{t-1}, with
    # t - 1 = n_updates (kernels.hvt_ucb_beta).

    def sigma_t(self, x: np.ndarray) -> float:
        """The normalisation sigma_t the next update would use for ``x`` (Alg. 1 line 5 with the
        eq. 17 term 2 sqrt(2) ||x||_{V_{t-1}^-1}, which must always be included: without it sigma_t
        can be too small at t = 1 when epsilon < 1)."""
        x = Policy._check_x(self, x)  # with the finiteness check the compiled update does itself
        return self._sigma(math.sqrt(max(float(x @ (self.vinv @ x)), 0.0)))

    def _sigma(self, n: float) -> float:
        c = self._config
        t = self.n_updates + 1
        floor = math.sqrt(2.0 * self.beta(t - 1) / (self.tau0 * self._sqrt_alpha * t**self._p)) * n
        return max(c["nu"], c["sigma_min"], floor, 2.0 * math.sqrt(2.0) * n)
