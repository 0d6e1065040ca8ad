"""Off-policy estimators of a target policy's value from logged bandit data, in one pass.

For each logged event ``i`` the caller gives the logged action ``a_i``, its propensity ``p_i``
under the logging policy, the reward ``r_i``, the target policy's action probabilities
``pi_i`` (K,) for that event and a reward model's predictions ``q_i`` (K,) made *before* the
model saw the event. With the importance weight ``w_i = pi_i[a_i] / p_i`` (optionally clipped at
``clip``, Ionides 2008 / Bottou et al. 2013) the estimators are:

- ``replay`` (Li, Chu, Langford, Wang 2011, "Unbiased offline evaluation of contextual-bandit-based
  news article recommendation algorithms"): the mean reward over the events where the target's
  choice equals the logged action. For a deterministic target (``max pi_i == 1``) an event is
  matched when ``pi_i[a_i] == 1``. For a stochastic target we do **not** draw (a draw would make
  the estimate depend on a random stream and add variance); we use the draw's expectation: the
  event counts with weight ``m_i = pi_i[a_i]``, and the estimate is ``sum m r / sum m``. With
  0/1 weights this is exactly Li et al.'s matched mean. It ignores propensities, so it is
  unbiased only when the logging policy is uniform over the arms (its stated assumption);
  on non-uniform logs use IPS/SNIPS/DR.
- ``ips``: Horvitz & Thompson (1952) inverse propensity scoring, ``mean(w r)``.
- ``snips``: self-normalized IPS (Swaminathan & Joachims 2015, "The self-normalized estimator
  for counterfactual learning"), ``sum w r / sum w``.
- ``dm``: direct method, ``mean(sum_a pi_i[a] q_i[a])``.
- ``dr``: doubly robust (Dudik, Langford, Li 2011, "Doubly robust policy evaluation and
  learning"), ``mean(dm_i + w_i (r_i - q_i[a_i]))``: unbiased when the propensities are right,
  whatever the reward model, and low-variance when the model is good.

Intervals (``confidence``, 95% by default) are normal approximations:

- ips, dm, dr and the logging policy's value: ``mean +- z * s / sqrt(n)`` with ``s`` the sample
  standard deviation of the per-event terms (Welford's streaming update);
- snips and replay (ratio estimators ``R = sum u / sum v``): the delta method,
  ``Var(R) ~= (S_uu - 2 R S_uv + R^2 S_vv) / (n vbar^2)`` with the sample (co)variances ``S`` of
  ``u = w r`` (resp. ``m r``) and ``v = w`` (resp. ``m``), also streamed (bivariate Welford);
- dm's interval holds the reward model fixed: it reflects the sampling noise of the contexts,
  neither the model's bias nor its estimation error, so it is too narrow whenever the model is
  not (yet) right, and covers the truth less often than its level says (which is why
  tests/unit/test_estimators.py tests DM for closeness, not coverage). Prefer dr's interval.

With fewer than two events (matched events for replay) an interval is ``(-inf, inf)``; with
none the value is NaN. Memory is O(1) per estimator, plus O(log n) points of :meth:`running`.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from streambandit.errors import StreambanditError
from streambandit.linalg import sherman_morrison_update

__all__ = ["Estimate", "RidgeRewardModel", "OffPolicyEvaluator", "EstimatorError", "ESTIMATORS"]

ESTIMATORS = ("replay", "ips", "snips", "dm", "dr")


class EstimatorError(StreambanditError, ValueError):
    """An input to an estimator that is not a valid event (bad propensity, shapes, probabilities)."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """An estimate of a policy's value with a two-sided normal-approximation interval.

    ``n``: events used (replay: matched events, those with a non-zero match weight);
    ``ess``: effective sample size of the weights, ``(sum w)^2 / sum w^2`` (replay: of the match
    weights, i.e. the matched count for a deterministic target; dm and the logging value: ``n``);
    ``clipped``: events whose importance weight was clipped (0 when clipping is off).
    """

    name: str
    value: float
    ci_low: float
    ci_high: float
    n: int
    ess: float
    clipped: int


class RidgeRewardModel:
    """Ridge regression of the reward on the chosen arm's features, for the direct method.

    ``theta = (lam I + sum z z')^-1 sum r z`` with ``z = [x, 1]`` when ``intercept`` (the default):
    without the constant, centred features and a non-zero mean reward leave the model predicting
    ~0 and the direct method badly biased. Kept as the inverse (Sherman-Morrison, O(d^2) per
    update). Predictions before any update are 0.
    """

    def __init__(self, dim: int, lam: float = 1.0, *, intercept: bool = True) -> None:
        if dim < 1 or not lam > 0:
            raise EstimatorError(f"RidgeRewardModel needs dim >= 1 and lam > 0, got {dim}, {lam}")
        self.dim = int(dim)
        self.lam = float(lam)
        self.intercept = bool(intercept)
        n = self.dim + self.intercept
        self._inv = np.eye(n) / self.lam
        self._b = np.zeros(n)
        self._theta = np.zeros(n)
        self.n = 0

    @property
    def theta(self) -> np.ndarray:
        """The coefficients; with an intercept, the last one is it."""
        return self._theta.copy()

    def _z(self, f: np.ndarray) -> np.ndarray:
        return np.concatenate([f, np.ones(f.shape[:-1] + (1,))], axis=-1) if self.intercept else f

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(K, d) -> (K,) predicted rewards."""
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.dim:
            raise EstimatorError(f"features of shape {f.shape}, expected (K, {self.dim})")
        return self._z(f) @ self._theta

    def update(self, x: np.ndarray, reward: float) -> None:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.dim,):
            raise EstimatorError(f"x of shape {x.shape}, expected ({self.dim},)")
        z = self._z(x)
        sherman_morrison_update(self._inv, z)
        self._b += float(reward) * z
        self._theta = self._inv @ self._b
        self.n += 1


class _Mean:
    """Welford's running mean and sum of squared deviations."""

    __slots__ = ("n", "mean", "m2")

    def __init__(self) -> None:
        self.n, self.mean, self.m2 = 0, 0.0, 0.0

    def add(self, x: float) -> None:
        self.n += 1
        dx = x - self.mean
        self.mean += dx / self.n
        self.m2 += dx * (x - self.mean)

    def estimate(self, name: str, z: float, ess: float | None = None, clipped: int = 0) -> Estimate:
        n = self.n
        if n == 0:
            return Estimate(name, math.nan, math.nan, math.nan, 0, 0.0, clipped)
        if n < 2:
            lo, hi = -math.inf, math.inf
        else:
            half = z * math.sqrt(self.m2 / (n - 1) / n)
            lo, hi = self.mean - half, self.mean + half
        return Estimate(name, self.mean, lo, hi, n, float(n) if ess is None else ess, clipped)


class _Ratio:
    """Streaming ratio ``sum u / sum v`` with a delta-method variance (bivariate Welford).

    Also keeps ``sum v`` and ``sum v^2`` (for the effective sample size) and the number of
    events with ``v != 0``.
    """

    __slots__ = ("n", "mu", "mv", "suu", "svv", "suv", "sv", "sv2", "nonzero")

    def __init__(self) -> None:
        self.n = self.nonzero = 0
        self.mu = self.mv = self.suu = self.svv = self.suv = self.sv = self.sv2 = 0.0

    def add(self, u: float, v: float) -> None:
        self.n += 1
        du = u - self.mu
        dv = v - self.mv
        self.mu += du / self.n
        self.mv += dv / self.n
        self.suu += du * (u - self.mu)
        self.svv += dv * (v - self.mv)
        self.suv += du * (v - self.mv)
        self.sv += v
        self.sv2 += v * v
        self.nonzero += v != 0.0

    @property
    def ess(self) -> float:
        return self.sv * self.sv / self.sv2 if self.sv2 > 0 else 0.0

    def value(self) -> float:
        return self.mu / self.mv if self.mv > 0 else math.nan

    def estimate(self, name: str, z: float, n_used: int, clipped: int = 0) -> Estimate:
        r = self.value()
        if math.isnan(r):
            return Estimate(name, math.nan, math.nan, math.nan, n_used, self.ess, clipped)
        if self.n < 2 or self.nonzero < 2:
            return Estimate(name, r, -math.inf, math.inf, n_used, self.ess, clipped)
        s = (self.suu - 2.0 * r * self.suv + r * r * self.svv) / (self.n - 1)
        half = z * math.sqrt(max(s, 0.0) / self.n) / self.mv
        return Estimate(name, r, r - half, r + half, n_used, self.ess, clipped)


class OffPolicyEvaluator:
    """Streams logged events into the five estimators (module docstring) and the logging value.

    ``clip``: cap on the importance weight ``w`` used by ips, snips and dr (None: no cap);
    each capped event is counted in ``Estimate.clipped``. ``confidence``: the intervals' level.
    ``running_growth``: :meth:`running` records a point whenever the event count has grown by
    this factor since the last one (at least one event), so the history stays O(log n).
    """

    def __init__(self, *, clip: float | None = None, confidence: float = 0.95,
                 running_growth: float = 1.05) -> None:
        if clip is not None and not clip > 0:
            raise EstimatorError(f"clip must be > 0 or None, got {clip!r}")
        if not 0.0 < confidence < 1.0:
            raise EstimatorError(f"confidence must be in (0, 1), got {confidence!r}")
        if not running_growth > 1.0:
            raise EstimatorError(f"running_growth must be > 1, got {running_growth!r}")
        self.clip = None if clip is None else float(clip)
        self.confidence = float(confidence)
        self._z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
        self._growth = float(running_growth)
        self._replay = _Ratio()
        self._snips = _Ratio()
        self._ips = _Mean()
        self._dm = _Mean()
        self._dr = _Mean()
        self._logged = _Mean()
        self._clipped = 0
        self._next = 1
        self._running: dict[str, list[tuple[int, float]]] = {name: [] for name in ESTIMATORS}

    @property
    def n(self) -> int:
        return self._ips.n

    def add(self, *, action: int, propensity: float, reward: float, target_probs: np.ndarray,
            predicted: np.ndarray) -> None:
        """One logged event. ``target_probs``: (K,) the target policy's action probabilities for
        it; ``predicted``: (K,) reward predictions made before the model saw this event."""
        pi = np.asarray(target_probs, dtype=np.float64)
        q = np.asarray(predicted, dtype=np.float64)
        if pi.ndim != 1 or pi.shape[0] == 0 or q.shape != pi.shape:
            raise EstimatorError(f"target_probs {pi.shape} and predicted {q.shape} must both be (K,) with K >= 1")
        k = pi.shape[0]
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)) or not 0 <= action < k:
            raise EstimatorError(f"action {action!r} is not in [0, {k})")
        p = float(propensity)
        if not 0.0 < p <= 1.0:  # also rejects NaN
            raise EstimatorError(f"propensity {propensity!r} is not in (0, 1]")
        r = float(reward)
        if not math.isfinite(r):
            raise EstimatorError(f"non-finite reward {reward!r}")
        # min() is NaN when any entry is, and the sum is not finite when any entry is infinite
        if not (pi.min() >= 0.0 and abs(float(pi.sum()) - 1.0) <= 1e-6):
            raise EstimatorError(f"target_probs is not a probability vector: {pi!r}")
        dm = float(pi @ q)
        qa = float(q[action])
        if not (math.isfinite(dm) and math.isfinite(qa)):  # 0 * nan and 0 * inf are nan: all of q is checked
            raise EstimatorError(f"non-finite reward predictions: {q!r}")

        pa = float(pi[action])
        # Li et al. 2011 replay, with the match indicator replaced by its expectation pi[a].
        self._replay.add(pa * r, pa)
        # Horvitz-Thompson importance weight, optionally clipped.
        w = pa / p
        if self.clip is not None and w > self.clip:
            w = self.clip
            self._clipped += 1
        self._ips.add(w * r)
        self._snips.add(w * r, w)  # Swaminathan & Joachims 2015
        self._dm.add(dm)
        self._dr.add(dm + w * (r - qa))  # Dudik et al. 2011
        self._logged.add(r)
        if self.n >= self._next:
            self._record()
            self._next = max(self.n + 1, int(self.n * self._growth))

    def _record(self) -> None:
        n = self.n
        for e in self._all():
            pts = self._running[e.name]
            if not pts or pts[-1][0] != n:
                pts.append((n, e.value))

    def _all(self) -> list[Estimate]:
        z = self._z
        return [
            self._replay.estimate("replay", z, self._replay.nonzero),
            self._ips.estimate("ips", z, ess=self._snips.ess, clipped=self._clipped),
            self._snips.estimate("snips", z, self._snips.n, clipped=self._clipped),
            self._dm.estimate("dm", z),
            self._dr.estimate("dr", z, ess=self._snips.ess, clipped=self._clipped),
        ]

    def estimates(self) -> list[Estimate]:
        """The five estimates, in the order replay, ips, snips, dm, dr."""
        return self._all()

    def running(self) -> dict[str, list[tuple[int, float]]]:
        """Per estimator, ``(events seen, estimate)`` at geometrically spaced counts and at the
        current count, for a plot of the running estimates."""
        if self.n:
            self._record()
        return {name: list(pts) for name, pts in self._running.items()}

    @property
    def logging_value(self) -> Estimate:
        """The logging policy's own value: the mean logged reward, with its normal interval."""
        return self._logged.estimate("logging", self._z)
