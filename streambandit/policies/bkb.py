"""BKB, the budgeted kernelized bandit: GP-UCB on a Nystrom dictionary resampled by posterior variance.

Calandriello, Carratino, Lazaric, Valko, Rosasco, "Gaussian Process Optimization with Adaptive
Sketching: Scalable and No Regret", COLT 2019, Fig. 1. The kernel acts on
the arms' feature vectors; the dictionary and DTC posterior are in streambandit/sketch/nystrom.py.

One update, for the pulled point x~_{t+1} and its reward (Fig. 1, in this order):
1. Count the pull: the state keeps the DISTINCT pulled points (matched exactly, bit for bit up to
   0.0 == -0.0) with their pull counts and reward sums, the exact sufficient statistics of
   eq. (4) (Sec. 3.2, "use counters").
2. Redraw the dictionary from scratch over every pulled point, with the variances sigma~_t^2 of
   the model BEFORE this pull (Sec. 3.1, approximations (a) and (b)); a new point gets its
   sigma~_t^2 under that model, the others reuse the cached values. The draw uses a generator
   seeded by (seed, number of updates so far): randomness is a function of the configuration and
   the update sequence only (docs/design.md, determinism), so replay and save/load/continue reproduce it.
3. Refit eq. (4) on the new dictionary from the counters, and cache sigma~_{t+1}^2 at the pulled
   points (the next draw's input and beta~'s sum).

Before the first update the dictionary is empty and the model is the prior (mu~ = 0,
sigma~^2 = k(x, x) / lambda). The paper's x~_1 is uniform at random; here every arm of an RBF
kernel scores the same, so the first choice is arm 0 (ties go to the lowest index).

Memory per model (u distinct pulled points, m dictionary points, r <= m the embedding rank):
  state (snapshot):  8 u d + 17 u + 8 bytes  (points, counts int64, reward sums, dictionary mask
                     bool, the update counter), reported by :meth:`BKB.state_nbytes`;
  derived cache:     8 (m d + 2 m r + m + u) bytes, refit on load, :meth:`BKB.cache_nbytes`.
For a fixed catalog of A arms, u <= A: the state is bounded by the catalog and does not grow with t.
When new arm vectors arrive with every context (the contextual setting, App. A relaxation), each
pulled point is new and the state keeps every pulled point: u = t, memory O(t d) and an update
costs O(t m^2) (exact BKB is not one-pass over raw points).

Time: an update costs O(u m d) kernel evaluations + O(m^3 + u m r + u r^2); scoring K arms costs
O(K m d + K m r). m follows the effective dimension of the pulled points (Thm 3.1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.policies.base import Policy, check_in_range, check_positive, register
from streambandit.sketch.nystrom import DTCPosterior, Kernel, resample_dictionary, resampling_rng

BETA_RULES = ("practical", "theory")


@register
class BKB(Policy):
    """BKB (Fig. 1): ``score = mu~_t(x) + beta~_t sigma~_t(x)`` (eq. 4), sigma~^2 = GP variance / lambda.

    Hyper-parameters (defaults are the practical settings of the authors' code):
      kernel: ``"rbf"`` (``exp(-||x-x'||^2 / (2 bandwidth^2))``, default) or ``"linear"`` (``x.x'``).
      bandwidth: RBF length scale (default 1.0; unused by the linear kernel).
      lam: lambda, the ridge regulariser; the noise variance in the Bayesian reading (default 1.0).
      qbar: oversampling factor of the dictionary draw, ``p = min(1, qbar sigma~^2)`` (default 4.0;
        the reference code suggests 2 to 10, the theory value ~1e3 is impractical). ``inf`` keeps
        every pulled point in the dictionary: BKB is then exact GP-UCB.
      noise_sd: xi, the sub-Gaussian scale of the reward noise (default 1.0, i.e. lam = xi^2).
      F: bound on ||f||_H (default 1.0).
      delta: confidence level (default 0.1).
      beta: a constant beta~ (default ``None``: use ``beta_rule``).
      beta_rule: ``"practical"`` (default, the authors' code):
          ``beta~ = sqrt(lam) F + xi sqrt(log(t) sum_s sigma~_t^2(x~_s) + log(1/delta))``;
        ``"theory"`` (Thm 4.1 with the log term clamped):
          ``beta~ = 2 xi sqrt(alpha L_t sum_s sigma~_t^2(x~_s) + log(1/delta)) + (1 + 1/sqrt(1-eps)) sqrt(lam) F``
        with ``alpha = (1+eps)/(1-eps)`` and ``L_t = 1 + log(1 + kappa^2 t / lam)`` in place of the
        paper's log(kappa^2 t) (<= 0 for small t, and missing the /lambda of eq. 6). kappa^2 is
        the largest k(x, x) over the pulled points (it bounds ||K_t|| / t).
      eps: dictionary accuracy epsilon of the theory rule (default 0.5).
      beta_scale: multiplier on the rule's beta~ (default 1.0).
      max_points: the most distinct pulled points held (default ``None``: no bound). A pull of a
        new point beyond it is refused with a ValueError, and the worker dead-letters its reward
        (``update_failed``); the worker requires it, since without it a model whose arms change
        with every context grows without bound (``bkb_stream`` is the bounded learner for that).
    In both rules the sum runs over all t pulls with multiplicity, with the current sigma~_t.

    An example on a fixed catalog of 21 points of [0, 1] whose mean reward peaks at 0.7 (point
    14): the learner's choice ends within two points of the peak, and a saved state restores the
    same scores (booleans and integers, so the example reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> arms = np.linspace(0.0, 1.0, 21)[:, None]
    >>> p = make_policy("bkb", dim=1, bandwidth=0.2, lam=0.01, beta=0.5, max_points=21)
    >>> for _ in range(200):
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(-4 * (arms[i, 0] - 0.7) ** 2 + rng.normal(0, 0.1)))
    >>> abs(p.select(arms) - 14) <= 2, p.n_points <= 21
    (True, True)
    >>> q = make_policy("bkb", dim=1, bandwidth=0.2, lam=0.01, beta=0.5, max_points=21)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(arms), p.scores(arms)))
    True
    """

    name = "bkb"
    _state_arrays = ("points", "counts", "reward_sums", "in_dict")
    _state_arrays_resizable = _state_arrays
    _state_scalars = ("n_updates",)

    def __init__(
        self,
        dim: int,
        *,
        kernel: str = "rbf",
        bandwidth: float = 1.0,
        lam: float = 1.0,
        qbar: float = 4.0,
        noise_sd: float = 1.0,
        F: float = 1.0,
        delta: float = 0.1,
        beta: float | None = None,
        beta_rule: str = "practical",
        eps: float = 0.5,
        beta_scale: float = 1.0,
        max_points: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        if max_points is not None and (
            isinstance(max_points, bool)
            or not isinstance(max_points, (int, np.integer))
            or max_points < 1
        ):
            raise ValueError(f"max_points must be an integer >= 1 or None, got {max_points!r}")
        if beta_rule not in BETA_RULES:
            raise ValueError(f"beta_rule must be one of {', '.join(BETA_RULES)}, got {beta_rule!r}")
        q = float(qbar)
        if not (q > 0.0):  # inf is allowed: every pulled point in the dictionary
            raise ValueError(f"qbar must be > 0 (inf for exact GP-UCB), got {qbar!r}")
        self._config.update(
            kernel=str(kernel),
            bandwidth=check_positive("bandwidth", bandwidth),
            lam=check_positive("lam", lam),
            qbar=q,
            noise_sd=check_in_range("noise_sd", noise_sd, 0.0, math.inf),
            F=check_in_range("F", F, 0.0, math.inf),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            beta=None if beta is None else check_in_range("beta", beta, 0.0, math.inf),
            beta_rule=beta_rule,
            eps=check_in_range("eps", eps, 0.0, 1.0, lo_open=True),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
            max_points=None if max_points is None else int(max_points),
        )
        if self._config["eps"] >= 1.0:
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        self._kernel = Kernel(self._config["kernel"], self._config["bandwidth"])
        self.points = np.zeros((0, dim))
        self.counts = np.zeros(0, dtype=np.int64)
        self.reward_sums = np.zeros(0)
        self.in_dict = np.zeros(0, dtype=bool)
        self._refit()

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        # Small qbar and lam make the draws drop and re-add points, so resampling is exercised.
        return [
            {"bandwidth": 0.5, "lam": 0.1, "qbar": 1.0, "max_points": 1000},
            {"kernel": "linear", "lam": 0.5, "qbar": 2.0, "beta": 0.3},
            {"beta_rule": "theory", "qbar": math.inf, "beta_scale": 0.5},
        ]

    # -- diagnostics --------------------------------------------------------------------------

    @property
    def n_points(self) -> int:
        """u, the number of distinct pulled points held."""
        return self.points.shape[0]

    @property
    def dictionary_size(self) -> int:
        """m, the number of distinct points in the current dictionary S_t."""
        return self._post.size

    @property
    def embedding_rank(self) -> int:
        """r, the dimension of the Nystrom embedding (numerical rank of K_S)."""
        return self._post.rank

    @property
    def pulled_variance_sum(self) -> float:
        """``sum_{s<=t} sigma~_t^2(x~_s)`` over the pulls with multiplicity (1/lambda scale). With
        the whole pulled set as dictionary this is d_eff = Tr(K_t (K_t + lam I)^-1) (eq. 5)."""
        return self._ssum

    def posterior(self, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """eq. (4): ``(mu~_t, sigma~_t^2)`` of every arm, sigma~^2 on the 1/lambda scale."""
        return self._post.mean_s2(self._check_arms(arms))

    def beta(self) -> float:
        """beta~_t, the width used by the next decision."""
        c = self._config
        if c["beta"] is not None:
            return c["beta"]
        t = self.n_updates
        log_inv_delta = math.log(1.0 / c["delta"])
        if c["beta_rule"] == "practical":
            # Reference code: log(t) * sum_a n_a sigma~^2_a stands in for log det.
            width = math.sqrt(max(math.log(max(t, 1)) * self._ssum + log_inv_delta, 0.0))
            radius = math.sqrt(c["lam"]) * c["F"] + c["noise_sd"] * width
        else:
            # Thm 4.1, with log(kappa^2 t) replaced by 1 + log(1 + kappa^2 t / lam).
            alpha = (1.0 + c["eps"]) / (1.0 - c["eps"])
            log_term = 1.0 + math.log1p(self._kappa2 * t / c["lam"])
            radius = (
                2.0 * c["noise_sd"] * math.sqrt(alpha * log_term * self._ssum + log_inv_delta)
                + (1.0 + 1.0 / math.sqrt(1.0 - c["eps"])) * math.sqrt(c["lam"]) * c["F"]
            )
        return c["beta_scale"] * radius

    # -- decisions and updates ----------------------------------------------------------------

    def scores(self, arms: np.ndarray) -> np.ndarray:
        # eq. (4): u~_t(x) = mu~_t(x) + beta~_t sigma~_t(x).
        mu, s2 = self._post.mean_s2(self._check_arms(arms))
        return mu + self.beta() * np.sqrt(s2)

    def _update(self, x: np.ndarray, reward: float) -> None:
        step = self.n_updates
        # Variances of the model before this pull (sigma~_t), at every distinct pulled point.
        s2 = self._post.pulled_s2
        hit = np.flatnonzero((self.points == x).all(axis=1))
        bound = self._config["max_points"]
        if not hit.size and bound is not None and self.n_points >= bound:
            raise ValueError(
                f"bkb holds max_points = {bound} distinct pulled points and this pull is a new one; "
                "bkb keeps every distinct point (for arms that change with each context use bkb_stream)"
            )
        if hit.size:
            counts, sums, points, in_dict = (
                self.counts.copy(),
                self.reward_sums.copy(),
                self.points,
                self.in_dict,
            )
            counts[hit[0]] += 1
            sums[hit[0]] += reward
        else:
            points = np.vstack([self.points, x[None, :]])
            counts = np.append(self.counts, np.int64(1))
            sums = np.append(self.reward_sums, reward)
            in_dict = np.append(self.in_dict, False)
            s2 = np.append(s2, self._post.mean_s2(x[None, :])[1])
        # Fig. 1 inner loop: S_{t+1} drawn afresh with p = min(1, qbar sigma~_t^2), counts incl. this pull.
        new_dict = resample_dictionary(
            s2, counts, self._config["qbar"], resampling_rng(self._config["seed"], step)
        )
        # Same dictionary as before: the embedding root (a pure function of it) is reused.
        same = np.array_equal(np.flatnonzero(new_dict), np.flatnonzero(in_dict))
        self.points, self.counts, self.reward_sums, self.in_dict = points, counts, sums, new_dict
        self._refit(self._post.root if same else None)

    def _refit(self, root: np.ndarray | None = None) -> None:
        """Fit eq. (4) on the current dictionary from the counters; cache what scoring needs."""
        self._post = DTCPosterior(
            self._kernel,
            self._config["lam"],
            self.points[self.in_dict],
            self.points,
            self.counts,
            self.reward_sums,
            root=root,
        )
        # sum_{s<=t} sigma~_t^2(x~_s) = sum_i n_i sigma~_t^2(x_i), used by beta~ (Thm 4.1).
        self._ssum = float(self.counts @ self._post.pulled_s2)
        self._kappa2 = float(self._kernel.diag(self.points).max()) if self.n_points else 0.0

    # -- state --------------------------------------------------------------------------------

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        # The posterior is a deterministic function of the state: refitting reproduces the bits.
        self._refit()

    def _check_loaded_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        points, counts, sums, in_dict = (arrays[k] for k in self._state_arrays)
        u = points.shape[0]
        if points.shape[1] != self.dim:
            raise ValueError(
                f"state array 'points' has shape {points.shape}, expected (u, {self.dim})"
            )
        for k in ("counts", "reward_sums", "in_dict"):
            if arrays[k].shape != (u,):
                raise ValueError(
                    f"state array {k!r} has shape {arrays[k].shape}, expected ({u},) like 'points'"
                )
        if not (np.isfinite(points).all() and np.isfinite(sums).all()):
            raise ValueError("state arrays 'points' and 'reward_sums' must be finite")
        if u and (counts.min() < 1 or not in_dict.any()):
            raise ValueError("state arrays 'counts' must be >= 1 and 'in_dict' must hold a point")
        if int(counts.sum()) != scalars["n_updates"]:
            raise ValueError(
                f"state arrays 'counts' sum to {int(counts.sum())}, not n_updates = {scalars['n_updates']}"
            )
        if self._config["max_points"] is not None and u > self._config["max_points"]:
            raise ValueError(
                f"state holds {u} points, more than max_points = {self._config['max_points']}"
            )
        if np.unique(points, axis=0).shape[0] != u:
            raise ValueError("state array 'points' holds a point twice")

    def state_nbytes(self) -> int:
        """Snapshot payload: the state arrays plus the 8-byte update counter, 8 u d + 17 u + 8."""
        return super().state_nbytes() + 8 * len(self._state_scalars)

    def cache_nbytes(self) -> int:
        """Bytes of the derived posterior held in memory next to the state (refit on load)."""
        return self._post.nbytes()
