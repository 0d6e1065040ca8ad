"""GLB-OMD: generalized linear bandits with a one-pass online-mirror-descent update.

Zhang, Xu, Zhao, Sugiyama, "Generalized Linear Bandits: Almost Optimal Regret with One-Pass
Update" (2025), Algorithm 1; shared/papers/001_glb_omd.md is the implementation note. Equation
numbers below are the paper's.

State: theta (d), H (d x d, needed for the A-norm projection) and H^-1 (d x d, for the UCB and the
closed-form step). O(d^2) per update plus an O(d^3) eigendecomposition only in rounds where the
step leaves the ball; O(K d^2) per decision; nothing grows with t.

Streaming note: ``t`` in beta_t counts incorporated rewards (n_updates + 1, note section 7.3), so
the radius is a function of the update sequence alone and replay reproduces it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.linalg import project_to_ball_in_norm, quad_forms, sherman_morrison_update
from streambandit.policies.base import Policy, check_in_range, check_positive, register

# Per link: self-concordance constant R (Assumption 3) and C_mu = sup mu' on [-S, S] as a function
# of S (Assumption 2; note table 1.4).
_LINKS = {
    "logistic": (1.0, lambda s: 0.25),
    "poisson": (1.0, lambda s: math.exp(s)),
    "gaussian": (0.0, lambda s: 1.0),
}

# exp() overflows float64 just above 709.78; a Poisson natural parameter that large means the
# contexts were not scaled to ||x|| <= 1 (Assumption 1), which the projection relies on.
_MAX_POISSON_Z = 700.0


def _logistic(z: float) -> float:
    # Numerically stable sigmoid for either sign of z.
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


@register
class GLBOMD(Policy):
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
    """

    name = "glb_omd"
    _state_arrays = ("theta", "h", "hinv")

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
        r_sc, c_mu_of = _LINKS[link]
        s = check_positive("S", S)
        lam_v = float(dim) if lam is None else check_positive("lam", lam)
        eta_v = 1.0 + r_sc * s if eta is None else check_positive("eta", eta)
        self._config.update(
            link=link,
            S=s,
            lam=lam_v,
            eta=eta_v,
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            dispersion=check_positive("dispersion", dispersion),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
        )
        self.theta = np.zeros(dim)  # theta_1 = 0, a point of Theta (Alg. 1 line 1)
        self.h = np.eye(dim) * lam_v  # H_1 = lambda I
        self.hinv = np.eye(dim) / lam_v
        self._link = link
        self._s = s
        self._eta = eta_v
        self._g = self._config["dispersion"]
        c_mu = c_mu_of(s)
        # The t-independent parts of eq. (5).
        self._beta_const = 4.0 * lam_v * s * s + 2.0 * eta_v * math.log(1.0 / self._config["delta"])
        self._beta_log_coef = 6.0 * dim * eta_v * eta_v
        self._beta_t_coef = 2.0 * c_mu / (lam_v * self._g)

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        return [{"link": "logistic"}, {"link": "poisson", "S": 2.0}, {"link": "gaussian", "S": 10.0}]

    # -- link functions: mu and mu' ------------------------------------------------------------

    def _mu(self, z: float) -> float:
        if self._link == "logistic":
            return _logistic(z)
        if self._link == "poisson":
            if z > _MAX_POISSON_Z:
                raise ValueError(
                    f"x'theta = {z:.4g} overflows the Poisson link; scale contexts to ||x||_2 <= 1"
                )
            return math.exp(z)
        return z

    def _dmu(self, z: float) -> float:
        if self._link == "logistic":
            return _logistic(z) * _logistic(-z)  # mu' = sigma(z) sigma(-z), stable (note P7)
        if self._link == "poisson":
            return self._mu(z)
        return 1.0

    # -- decisions -----------------------------------------------------------------------------

    def beta(self) -> float:
        """beta_t of eq. (5) (already a radius: not square-rooted again), times beta_scale."""
        t = self.n_updates + 1
        radius = math.sqrt(self._beta_const + self._beta_log_coef * math.log(2.0 + self._beta_t_coef * t))
        return self._config["beta_scale"] * radius

    def scores(self, arms: np.ndarray) -> np.ndarray:
        a = self._check_arms(arms)
        # eq. (6): the UCB lives in the linear-predictor space; mu is increasing, so ranking on it
        # is ranking on the optimistic mean.
        return a @ self.theta + self.beta() * np.sqrt(quad_forms(a, self.hinv))

    # -- update --------------------------------------------------------------------------------

    def _check_reward(self, reward: Any) -> float:
        r = super()._check_reward(reward)
        if self._link == "logistic" and not 0.0 <= r <= 1.0:
            raise ValueError(f"logistic link needs a reward in [0, 1], got {r!r}")
        if self._link == "poisson" and r < 0.0:
            raise ValueError(f"poisson link needs a reward >= 0, got {r!r}")
        return r

    def _update(self, x: np.ndarray, reward: float) -> None:
        g, eta = self._g, self._eta
        # Gradient and quadratic-model Hessian at the OLD theta_t (eq. 4; note pitfall P2).
        z = float(x @ self.theta)
        p, s = self._mu(z), self._dmu(z)
        v = self.hinv @ x  # H_t^-1 X_t
        q = float(x @ v)  # ||X_t||^2_{H_t^-1}
        w = eta * s / g
        # eq. (42a) in closed form: A_t = H_t + w x x', A_t^-1 by Sherman-Morrison (App. D), so
        # zeta = theta - eta (mu(z) - r)/g * A_t^-1 x = theta - eta (mu - r)/g * v / (1 + w q).
        zeta = self.theta - (eta * (p - reward) / g / (1.0 + w * q)) * v
        if float(zeta @ zeta) > self._s * self._s:
            # eq. (42b): projection onto ||theta|| <= S in the A_t-norm (not Euclidean).
            a = self.h + w * np.outer(x, x)
            zeta, _ = project_to_ball_in_norm(zeta, a, self._s)
        self.theta = zeta
        # Alg. 1 line 5: H_{t+1} = H_t + hess l_t(theta_{t+1}), the curvature at the NEW theta.
        wp = self._dmu(float(x @ zeta)) / g
        self.h += wp * np.outer(x, x)
        sherman_morrison_update(self.hinv, x, wp, v=v)  # v = H_t^-1 x from above
