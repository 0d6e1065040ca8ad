"""GLB-OMD: generalized linear bandits with a one-pass online-mirror-descent update.

Zhang, Xu, Zhao, Sugiyama, "Generalized Linear Bandits: Almost Optimal Regret with One-Pass
Update" (2025), Algorithm 1. Equation numbers below are the paper's.

State: theta (d), H (d x d, needed for the A-norm projection) and H^-1 (d x d, for the UCB and the
closed-form step). O(d^2) per update plus an O(d^3) eigendecomposition only in rounds where the
step leaves the ball; O(K d^2) per decision; nothing grows with t. A model's state (and its
n_updates) is one row of the configuration's row store (linear_ucb.py, rows.py).

Streaming note: ``t`` in beta_t counts incorporated rewards (n_updates + 1), so
the radius is a function of the update sequence alone and replay reproduces it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.numerics import kernels, row_calls
from streambandit.numerics.kernels import MAX_ABS_REWARD
from streambandit.policies.base import (
    BAD_ARMS_MESSAGE,
    BAD_X_MESSAGE,
    check_in_range,
    check_positive,
    register,
)
from streambandit.policies.linear_ucb import INV, OTHER, THETA, LinearUCBPolicy, row_array
from streambandit.policies.rows import RowStore

# Per link: self-concordance constant R (Assumption 3), C_mu = sup mu' on [-S, S] as a function
# of S (Assumption 2; note table 1.4), and the link's code in the compiled kernels.
_LINKS = {
    "logistic": (1.0, lambda s: 0.25, kernels.LINK_LOGISTIC),
    "poisson": (1.0, lambda s: math.exp(s), kernels.LINK_POISSON),
    "gaussian": (0.0, lambda s: 1.0, kernels.LINK_GAUSSIAN),
}


@register
class GLBOMD(LinearUCBPolicy):
    """GLB-OMD (Algorithm 1): ``score = x'theta_t + beta_t ||x||_{H_t^-1}`` (eq. 6).

    Hyper-parameters:
      link: ``"logistic"`` (rewards in [0, 1]), ``"poisson"`` (counts, rewards >= 0) or
        ``"gaussian"`` (any real reward).
      S: known bound on ||theta*||_2, the radius of Theta (default 3.0). Contexts are assumed
        scaled to ||x||_2 <= 1 (Assumption 1).
      lam: H_1 = lam I. Default ``None`` means ``lam = dim``, the paper's experimental setting
        (App. F.1); Theorem 1's far larger value is available by passing it.
      eta: OMD step size; default ``None`` means the theory value ``1 + R S``.
      delta: confidence level in beta_t (default 0.05).
      dispersion: g(tau) of the exponential family: 1 for logistic and Poisson, sigma^2 for the
        Gaussian link (default 1.0).
      beta_scale: multiplier on the eq. (5) radius (default 1.0, the theory radius).

    An example: clicks (0/1) from a logistic model; the estimate takes theta*'s signs, and a saved
    state restores the same scores (signs and booleans, so the example reads the same on any
    machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> theta_star = np.array([2.0, -1.0, 0.5])
    >>> p = make_policy("glb_omd", dim=3, link="logistic", beta_scale=0.1)
    >>> for _ in range(2000):
    ...     arms = rng.normal(size=(5, 3)) / np.sqrt(3)
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(rng.random() < 1 / (1 + np.exp(-arms[i] @ theta_star))))
    >>> np.sign(p.theta).astype(int).tolist()
    [1, -1, 1]
    >>> p.select(np.eye(3))
    0
    >>> q = make_policy("glb_omd", dim=3, link="logistic", beta_scale=0.1)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(np.eye(3)), p.scores(np.eye(3))))
    True
    """

    name = "glb_omd"
    _state_arrays = ("theta", "h", "hinv")
    _columns = {"theta": THETA, "hinv": INV, "h": OTHER}
    _radius_kind = kernels.RADIUS_GLB_OMD
    _const_names = (
        "_link",
        "_link_code",
        "_s",
        "_eta",
        "_g",
        "_step_args",
        "_beta_const",
        "_beta_log_coef",
        "_beta_t_coef",
    )
    _play_kernel = kernels.glb_omd_play
    # The compiled step: eq. (4), (42a), (42b) and Alg. 1 line 5 (kernels.glb_omd_update).
    _update_row = staticmethod(kernels.glb_omd_update_row)
    _update_at = staticmethod(row_calls.glb_omd_update_at)
    _update_kind = row_calls.UPDATE_GLB_OMD
    __slots__ = ()

    theta = row_array(THETA, "theta_t (d,), in the ball ||theta|| <= S.")
    h = row_array(OTHER, "H_t (d, d), for the A-norm projection.")
    hinv = row_array(INV, "H_t^-1 (d, d).")

    def __init__(
        self,
        dim: int,
        *,
        link: str = "logistic",
        S: float = 3.0,
        lam: float | None = None,
        eta: float | None = None,
        delta: float = 0.05,
        dispersion: float = 1.0,
        beta_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        if link not in _LINKS:
            raise ValueError(f"glb_omd link must be one of {', '.join(_LINKS)}, got {link!r}")
        r_sc = _LINKS[link][0]
        s = check_positive("S", S)
        self._config.update(
            link=link,
            S=s,
            lam=float(dim) if lam is None else check_positive("lam", lam),
            eta=1.0 + r_sc * s if eta is None else check_positive("eta", eta),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            dispersion=check_positive("dispersion", dispersion),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
        )
        self._attach()

    def _new_store(self) -> RowStore:
        c, dim = self._config, self.dim
        _, c_mu_of, link_code = _LINKS[c["link"]]
        s, lam_v, eta_v, g = c["S"], c["lam"], c["eta"], c["dispersion"]
        c_mu = c_mu_of(s)
        # The t-independent parts of eq. (5).
        beta_const = 4.0 * lam_v * s * s + 2.0 * eta_v * math.log(1.0 / c["delta"])
        beta_log_coef = 6.0 * dim * eta_v * eta_v
        beta_t_coef = 2.0 * c_mu / (lam_v * g)
        consts = {
            "_link": c["link"],
            "_link_code": link_code,
            "_s": s,
            "_eta": eta_v,
            "_g": g,
            "_step_args": (link_code, s, eta_v, g),
            "_beta_const": beta_const,
            "_beta_log_coef": beta_log_coef,
            "_beta_t_coef": beta_t_coef,
        }
        params = np.array(
            [c["beta_scale"], beta_const, beta_log_coef, beta_t_coef, link_code, s, eta_v, g]
        )
        # theta_1 = 0, a point of Theta (Alg. 1 line 1); H_1 = lambda I; no float scalars.
        initial = (
            np.zeros(dim),
            np.eye(dim) / lam_v,
            np.eye(dim) * lam_v,
            np.zeros(0),
            np.zeros((), np.int64),
        )
        return RowStore(c, initial, params, consts, self._radius_kind)

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        return [
            {"link": "logistic"},
            {"link": "poisson", "S": 2.0},
            {"link": "gaussian", "S": 10.0},
        ]

    # -- decisions -----------------------------------------------------------------------------

    def beta(self) -> float:
        """beta_t of eq. (5) (already a radius: not square-rooted again), times beta_scale."""
        p = self._store.params
        return kernels.glb_omd_beta(p[0], p[1], p[2], p[3], self.n_updates)

    # The decisions are LinearUCBPolicy's with this radius: eq. (6), the UCB lives in the
    # linear-predictor space; mu is increasing, so ranking on it is ranking on the optimistic mean.

    # -- update --------------------------------------------------------------------------------

    def _check_reward(self, reward: Any) -> float:
        r = super()._check_reward(reward)
        link = self._config["link"]
        if link == "logistic" and not 0.0 <= r <= 1.0:
            raise ValueError(f"logistic link needs a reward in [0, 1], got {r!r}")
        if link == "poisson" and r < 0.0:
            raise ValueError(f"poisson link needs a reward >= 0, got {r!r}")
        return r

    def reward_range(self) -> tuple[float, float]:
        lo, hi = super().reward_range()
        link = self._config["link"]
        if link == "logistic":
            return (0.0, 1.0)
        return (0.0, hi) if link == "poisson" else (lo, hi)

    def _status_message(self, status: int) -> str:
        try:
            self._raise_for(status)
        except ValueError as e:
            return str(e)
        raise AssertionError(f"status {status} is not an error")

    def _raise_for(self, status: int) -> None:
        if status == kernels.OK:
            return
        if status == kernels.BAD_X:
            raise ValueError(BAD_X_MESSAGE)
        if status == kernels.BAD_ARMS:
            raise ValueError(BAD_ARMS_MESSAGE)
        if status == kernels.BAD_REWARD:
            link = self._config["link"]
            lo = {"logistic": "in [0, 1]", "poisson": ">= 0", "gaussian": "finite"}[link]
            raise ValueError(f"{link} link needs a reward {lo} and within +-{MAX_ABS_REWARD:g}")
        if status == kernels.LINK_OVERFLOW:
            raise ValueError("x'theta overflows the Poisson link; scale contexts to ||x||_2 <= 1")
