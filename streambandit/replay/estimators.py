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

Intervals (``confidence``, 95% by default) are, for rewards that are all at the two ends of the
reward range (0/1 clicks; the range is ``reward_range``, or else the least and the largest reward
seen), score intervals that do not collapse when few rewards are 1 (``intervals.py``: Wilson's
for the weighted means replay, snips and the logging value over their effective sample size; its
scaled form for ips, whose variance factor, the mean weight of a success, is taken from every
row as the reward model expects it, not from the few successes seen, which on logs with spread
propensities mostly carry small weights), and for dr an interval with the variance of its terms
where a success's weight is the reward model's (the terms' own variance weighing in as successes
grow many), its ends in the proportions of ips's score interval (``model``), or, while no success
of weight > 0 has been seen, ips's interval and the same moved to dr's value (``score-shifted``).
``python -m bench.ope_coverage`` measures their coverage on logs whose propensities spread from
1e-3 to 0.99. Otherwise, or for rewards of more than two values, normal approximations:

- ips, dm, dr and the logging policy's value: ``mean +- z * s / sqrt(n)`` with ``s`` the sample
  standard deviation of the per-event terms (Welford's streaming update);
- snips and replay (ratio estimators ``R = sum u / sum v``): the delta method,
  ``Var(R) ~= (S_uu - 2 R S_uv + R^2 S_vv) / (n vbar^2)`` with the sample (co)variances ``S`` of
  ``u = w r`` (resp. ``m r``) and ``v = w`` (resp. ``m``), also streamed (bivariate Welford);
- dm has **no interval**: a normal interval over its terms holds the reward model fixed, so it
  reflects the sampling noise of the contexts, neither the model's bias nor its estimation
  error, and covered the truth far less often than its level said. Its error is the model's,
  which the log cannot bound; dr is the estimate with an interval that uses the model.

Slates. A row of a slate (``position`` >= 0) is one slot: its propensity and the target's
probabilities are the arm's at that slot, so ips, snips and dr above are the **independent
per-position** estimators (each slot a separate decision; unbiased for the value per slot when a
slot's reward depends only on the arm shown there, Li et al. 2018, "Offline evaluation of ranking
policies with click models", their item-position model). Rows that carry a ``slate_id`` also get
``cascade``, the **cascade** estimator (reward-interaction IPS, McInerney et al. 2020; Kiyohara et
al. 2022): a user reads the slate from the top, so slot k's reward depends on the arms at slots
1..k, and slot k is weighted by the product of the slots' weights up to it,
``W_k = prod_{j<=k} w_j``. Its value is ``sum_slates sum_k W_k r_k / rows`` (per slot, the scale
of the others) with a delta-method interval over slates. The product is the ratio of the top-k
prefix's probabilities when each row's propensity is its arm's probability *given the arms above
it* (exact for a target that ranks deterministically, and for logging policies that fill slots
independently; for logs that give only marginal probabilities per slot, such as the Open Bandit
Dataset's, it is an approximation, said in the report). A slate's rows must be consecutive in the
log; a slate id that changes, or a position that repeats, ends the slate.

With ``bootstrap=B`` every interval but dm's is instead the percentile interval of B Poisson
bootstrap replicates of the stream (``intervals.PoissonBootstrap``): O(B) memory and time per
event; where every replicate gives the same value (two-valued rewards, none of them a success
among the matched events) the score interval is kept, not a width of 0. A bootstrap, like every
interval here, treats the target's probabilities as given: for a
target that learns during the replay they are one learning path's (``runner.py``).

Every value and bound is clamped to the reward range (:attr:`OffPolicyEvaluator.ends`): a
policy's value is a mean reward, so an ips value past the range's end, or a normal interval
reaching past it, cannot be right. With fewer than two events (matched events for replay) an
interval is the whole range; with none the value is NaN. Memory is O(1) per estimator, plus
O(log n) points of :meth:`running`.
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from streambandit.errors import StreambanditError
from streambandit.replay import sums
from streambandit.replay.intervals import (
    MAX_REPLICATES,
    MIN_REPLICATES,
    PoissonBootstrap,
    scaled_wilson,
    wilson,
)

__all__ = [
    "Estimate",
    "RidgeRewardModel",
    "OffPolicyEvaluator",
    "EstimatorError",
    "ESTIMATORS",
    "raise_for_terms",
]

ESTIMATORS = ("replay", "ips", "snips", "dm", "dr")  # and "cascade", for logs of slates
_NO_SUMS = np.zeros(0)  # sums.add_row's "no second evaluator"


# dr's interval leans on its terms' own variance once the successes it rests on number about this
# many (effectively), on the reward model's before (_dr_scored; bench/ope_coverage.py).
DR_SUCCESSES = 30.0


class EstimatorError(StreambanditError, ValueError):
    """An input to an estimator that is not a valid event (bad propensity, shapes, probabilities)."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """An estimate of a policy's value with a two-sided normal-approximation interval.

    ``n``: events used (replay: matched events, those with a non-zero match weight);
    ``ess``: effective sample size of the weights, ``(sum w)^2 / sum w^2`` (replay: of the match
    weights, i.e. the matched count for a deterministic target; dm and the logging value: ``n``);
    ``clipped``: events whose importance weight was clipped (0 when clipping is off);
    ``interval``: how the interval was made: ``normal``, ``delta`` (normal, by the delta method),
    ``wilson``, ``score`` (scaled Wilson), ``model`` (dr's, with the reward model's success weight),
    ``score-shifted`` (dr on ips's score interval), ``bootstrap``, or ``none`` (NaN bounds).
    """

    name: str
    value: float
    ci_low: float
    ci_high: float
    n: int
    ess: float
    clipped: int
    interval: str = "normal"


class RidgeRewardModel:
    """Ridge regression of the reward on the chosen arm's features, for the direct method.

    ``theta = (lam I + sum z z')^-1 sum r z`` with ``z = [x, 1]`` when ``intercept`` (the default):
    without the constant, centred features and a non-zero mean reward leave the model predicting
    ~0 and the direct method badly biased. Kept as the inverse (Sherman-Morrison, O(d^2) per
    update). Predictions before any update are 0; after, they are clamped to the reward range:
    ``reward_range`` when given, else the least and the largest reward learnt (widened to [0, 1]
    while one value has been seen), so that dm and dr, which add the predictions up, cannot be
    pushed past the range by a linear model's extrapolation.
    """

    def __init__(
        self,
        dim: int,
        lam: float = 1.0,
        *,
        intercept: bool = True,
        reward_range: tuple[float, float] | None = None,
    ) -> None:
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
        self._given = reward_range is not None
        # lo > hi: no clamp (no reward learnt yet)
        self._lo, self._hi = reward_range if reward_range is not None else (math.inf, -math.inf)
        self._seen = (math.inf, -math.inf)

    @property
    def theta(self) -> np.ndarray:
        """The coefficients; with an intercept, the last one is it."""
        return self._theta.copy()

    def _learnt(self, reward: float) -> None:
        if self._given:
            return
        lo, hi = min(self._seen[0], reward), max(self._seen[1], reward)
        self._seen = (lo, hi)
        self._lo, self._hi = (lo, hi) if lo < hi else (min(lo, 0.0), max(hi, 1.0))

    def predict(self, features: np.ndarray) -> np.ndarray:
        """(K, d) -> (K,) predicted rewards."""
        f = np.asarray(features, dtype=np.float64)
        if f.ndim != 2 or f.shape[1] != self.dim:
            raise EstimatorError(f"features of shape {f.shape}, expected (K, {self.dim})")
        out = np.empty(f.shape[0])
        sums.ridge_predict(self._theta, f, self.intercept, out, self._lo, self._hi)
        return out

    def predict_then_learn(self, features: np.ndarray, action: int, reward: float) -> np.ndarray:
        """:meth:`predict` of ``features``, then :meth:`update` with the row ``action`` of them:
        a logged event's predictions made before the model sees it, and the model learns it."""
        if features.ndim != 2 or features.shape[1] != self.dim or features.dtype != np.float64:
            raise EstimatorError(
                f"features of shape {features.shape} {features.dtype}, expected (K, {self.dim}) float64"
            )
        out = np.empty(features.shape[0])
        sums.ridge_predict(self._theta, features, self.intercept, out, self._lo, self._hi)
        sums.ridge_update(
            self._inv, self._b, self._theta, features[action], float(reward), self.intercept
        )
        self.n += 1
        self._learnt(float(reward))
        return out

    def kernel_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, float, float]:
        """What a compiled caller needs to predict then learn as :meth:`predict_then_learn`
        does (replay/row_kernel.py): ``(inv, b, theta, intercept, lo, hi)``; it calls
        :meth:`learnt` after."""
        return self._inv, self._b, self._theta, self.intercept, self._lo, self._hi

    def learnt(self, reward: float) -> None:
        """The bookkeeping of :meth:`predict_then_learn` after a compiled caller's update."""
        self.n += 1
        self._learnt(reward)

    def update(self, x: np.ndarray, reward: float) -> None:
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.dim,):
            raise EstimatorError(f"x of shape {x.shape}, expected ({self.dim},)")
        sums.ridge_update(self._inv, self._b, self._theta, x, float(reward), self.intercept)
        self.n += 1
        self._learnt(float(reward))


class _Mean:
    """A running mean and sum of squared deviations (Welford), held at ``acc[o:o + 3]``
    (sums.py: the evaluator keeps all its sums in one array, updated by one compiled call)."""

    __slots__ = ("acc", "o")

    def __init__(self, acc: np.ndarray, o: int) -> None:
        self.acc, self.o = acc, o

    @property
    def n(self) -> int:
        return int(self.acc[self.o])

    @property
    def mean(self) -> float:
        return float(self.acc[self.o + 1])

    @property
    def m2(self) -> float:
        return float(self.acc[self.o + 2])

    def estimate(self, name: str, z: float, ess: float | None = None, clipped: int = 0) -> Estimate:
        """The mean with its normal interval."""
        n = self.n
        if n == 0:
            return Estimate(name, math.nan, math.nan, math.nan, 0, 0.0, clipped)
        if n < 2:
            lo, hi = -math.inf, math.inf
        else:
            var = self.m2 / (n - 1) / n
            # Terms near the float range overflow Welford's sums to inf or NaN: no interval then
            # (the reward range's ends, after clamping), never a crash.
            half = z * math.sqrt(var) if var >= 0 and math.isfinite(var) else math.inf
            lo, hi = self.mean - half, self.mean + half
        return Estimate(name, self.mean, lo, hi, n, float(n) if ess is None else ess, clipped)


class _Ratio:
    """A running ratio ``sum u / sum v`` with a delta-method variance (bivariate Welford), held at
    ``acc[o:o + 9]`` (sums.RATIO_FIELDS): also ``sum v`` and ``sum v^2`` (for the effective
    sample size) and the number of events with ``v != 0``. Without an array, its own."""

    __slots__ = ("acc", "o")

    def __init__(self, acc: np.ndarray | None = None, o: int = 0) -> None:
        self.acc = np.zeros(len(sums.RATIO_FIELDS)) if acc is None else acc
        self.o = o

    def __getattr__(self, name: str) -> float:
        try:
            return float(self.acc[self.o + sums.RATIO_FIELDS.index(name)])
        except ValueError:
            raise AttributeError(name) from None

    @property
    def n(self) -> int:
        return int(self.acc[self.o])

    @property
    def nonzero(self) -> int:
        return int(self.acc[self.o + 8])

    def add(self, u: float, v: float) -> None:
        sums.ratio_add(self.acc, self.o, float(u), float(v))

    def copy(self) -> _Ratio:
        return _Ratio(self.acc[self.o : self.o + len(sums.RATIO_FIELDS)].copy())

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
        return Estimate(name, r, r - half, r + half, n_used, self.ess, clipped, "delta")


def raise_for_terms(
    status: int, action: int, p: float, r: float, pi: np.ndarray, q: np.ndarray
) -> None:
    """The EstimatorError of a status of ``sums.event_terms`` other than OK."""
    if status == sums.TERMS_OK:
        return
    raise EstimatorError(
        {
            sums.TERMS_BAD_ACTION: f"action {action!r} is not in [0, {pi.shape[0]})",
            sums.TERMS_BAD_PROPENSITY: f"propensity {p!r} is not in (0, 1]",
            sums.TERMS_BAD_REWARD: f"non-finite reward {r!r}",
            sums.TERMS_BAD_PROBS: f"target_probs is not a probability vector: {pi!r}",
            sums.TERMS_BAD_PREDICTIONS: f"non-finite reward predictions: {q!r}",
        }[status]
    )


class OffPolicyEvaluator:
    """Streams logged events into the five estimators (module docstring) and the logging value.

    ``clip``: cap on the importance weight ``w`` used by ips, snips and dr (None: no cap);
    each capped event is counted in ``Estimate.clipped``. ``confidence``: the intervals' level.
    ``running_growth``: :meth:`running` records a point whenever the event count has grown by
    this factor since the last one (at least one event), so the history stays O(log n);
    ``math.inf``: no history but the current point (an evaluator whose running estimates nobody
    plots, such as a model key's, then pays nothing for them).
    """

    def __init__(
        self,
        *,
        clip: float | None = None,
        confidence: float = 0.95,
        running_growth: float = 1.05,
        reward_range: tuple[float, float] | None = None,
        bootstrap: int = 0,
        seed: int = 0,
    ) -> None:
        if clip is not None and not clip > 0:
            raise EstimatorError(f"clip must be > 0 or None, got {clip!r}")
        if reward_range is not None:
            lo, hi = (float(v) for v in reward_range)
            if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
                raise EstimatorError(
                    f"reward_range must be two finite numbers lo < hi, got {reward_range!r}"
                )
            reward_range = (lo, hi)
        if bootstrap and not MIN_REPLICATES <= bootstrap <= MAX_REPLICATES:
            raise EstimatorError(
                f"bootstrap needs {MIN_REPLICATES} to {MAX_REPLICATES} replicates (0: none), "
                f"got {bootstrap!r}"
            )
        self.reward_range = reward_range
        # The range handed to the compiled sums: NaN for none (they then use the rewards seen).
        self._given = reward_range or (math.nan, math.nan)
        self._boot = PoissonBootstrap(bootstrap, seed) if bootstrap else None
        if not 0.0 < confidence < 1.0:
            raise EstimatorError(f"confidence must be in (0, 1), got {confidence!r}")
        if not running_growth > 1.0:
            raise EstimatorError(f"running_growth must be > 1, got {running_growth!r}")
        self.clip = None if clip is None else float(clip)
        self.confidence = float(confidence)
        self._z = NormalDist().inv_cdf(0.5 + confidence / 2.0)
        self._growth = float(running_growth)
        # Every sum of the five estimators and the logging value, and the flags: whether every
        # reward seen is at one of the two ends (score intervals) and every propensity 1/K (what
        # the replay estimator assumes). One array, one compiled call per event (sums.py).
        self._acc = acc = sums.new_accumulator()
        self._replay = _Ratio(acc, sums.REPLAY)
        self._snips = _Ratio(acc, sums.SNIPS)
        self._ips = _Mean(acc, sums.IPS)
        self._dm = _Mean(acc, sums.DM)
        self._dr = _Mean(acc, sums.DR)
        self._logged = _Mean(acc, sums.LOGGED)
        self._cascade = _Ratio()  # per slate: u = sum_k W_k r_k, v = its rows
        self._slate: list[tuple[int, float, float]] = []  # the current slate's (position, w, r)
        self._slate_id = ""
        self._slates = False  # whether any row had a slate id
        self._next: float = (
            1 if self._growth < math.inf else math.inf
        )  # the count of the next running point
        self._running: dict[str, list[tuple[int, float]]] = {
            name: [] for name in (*ESTIMATORS, "cascade")
        }

    @property
    def n(self) -> int:
        return self._ips.n

    @property
    def _clipped(self) -> int:
        return int(self._acc[sums.CLIPPED])

    def add(
        self,
        *,
        action: int,
        propensity: float,
        reward: float,
        target_probs: np.ndarray,
        predicted: np.ndarray,
        slate_id: str = "",
        position: int = -1,
    ) -> None:
        """One logged event. ``target_probs``: (K,) the target policy's action probabilities for
        it; ``predicted``: (K,) reward predictions made before the model saw this event;
        ``slate_id`` and ``position``: the slate and slot of a slate's row (module docstring)."""
        self.add_terms(
            self.terms(
                action=action,
                propensity=propensity,
                reward=reward,
                target_probs=target_probs,
                predicted=predicted,
            ),
            slate_id,
            position,
        )

    def terms(
        self,
        *,
        action: int,
        propensity: float,
        reward: float,
        target_probs: np.ndarray,
        predicted: np.ndarray,
    ) -> tuple[float, float, float, int, float, float]:
        """An event checked and reduced to what the estimators read, ``(pi[a], p, r, K, dm, q[a])``:
        an evaluator of a subset of the events (one model key's) adds the same terms."""
        pi = np.asarray(target_probs, dtype=np.float64)
        q = np.asarray(predicted, dtype=np.float64)
        if pi.ndim != 1 or pi.shape[0] == 0 or q.shape != pi.shape:
            raise EstimatorError(
                f"target_probs {pi.shape} and predicted {q.shape} must both be (K,) with K >= 1"
            )
        if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
            raise EstimatorError(f"action {action!r} is not an arm index")
        p, r = float(propensity), float(reward)
        if self.reward_range is not None and not self.reward_range[0] <= r <= self.reward_range[1]:
            raise EstimatorError(
                f"reward {reward!r} outside the reward range "
                f"[{self.reward_range[0]:g}, {self.reward_range[1]:g}]"
            )
        status, pa, dm, qa = sums.event_terms(pi, q, int(action), p, r)
        raise_for_terms(status, action, p, r, pi, q)
        k = pi.shape[0]
        return pa, p, r, k, dm, qa

    def add_terms(
        self,
        terms: tuple[float, float, float, int, float, float],
        slate_id: str = "",
        position: int = -1,
    ) -> None:
        """Add an event reduced by :meth:`terms` (of this evaluator or one with the same settings)."""
        pa, p, r, k, dm, qa = terms
        lo, hi = self._given
        w = sums.add_event(self._acc, pa, p, r, k, dm, qa, self.clip or 0.0, lo, hi)
        self._added(slate_id, position, pa, p, r, w, dm, qa)

    def add_also_to(
        self,
        other: OffPolicyEvaluator | None,
        action: int,
        propensity: float,
        reward: float,
        target_probs: np.ndarray,
        predicted: np.ndarray,
        slate_id: str = "",
        position: int = -1,
    ) -> None:
        """:meth:`add` of one event to this evaluator and to ``other`` (one of the same settings
        that sees a subset of the events, such as one model key's; None: this one alone), checked
        once, in one compiled call: a replay's path per row. ``target_probs`` and ``predicted``
        are float64 arrays of the same length."""
        lo, hi = self._given
        p, r = float(propensity), float(reward)
        if self.reward_range is not None and not lo <= r <= hi:
            raise EstimatorError(f"reward {reward!r} outside the reward range [{lo:g}, {hi:g}]")
        status, w, pa, dm, qa = sums.add_row(
            self._acc,
            self.key_sums(other),
            target_probs,
            predicted,
            int(action),
            p,
            r,
            self.clip or 0.0,
            lo,
            hi,
        )
        self.row_added(
            other,
            (status, w, pa, dm, qa),
            action,
            p,
            r,
            target_probs,
            predicted,
            slate_id,
            position,
        )

    @property
    def sums(self) -> np.ndarray:
        """The running sums (sums.py's layout), which sums.add_row adds a row to."""
        return self._acc

    @property
    def given(self) -> tuple[float, float]:
        """The reward range given (NaN, NaN when none), as sums.add_row takes it."""
        return self._given

    @staticmethod
    def key_sums(other: OffPolicyEvaluator | None) -> np.ndarray:
        """The sums array sums.add_row adds a row to besides the pooled one (none: empty)."""
        return _NO_SUMS if other is None else other._acc

    def row_added(
        self,
        other: OffPolicyEvaluator | None,
        added: tuple[int, float, float, float, float],
        action: int,
        p: float,
        r: float,
        target_probs: np.ndarray,
        predicted: np.ndarray,
        slate_id: str = "",
        position: int = -1,
    ) -> None:
        """What follows sums.add_row's ``added = (status, w, pi[a], sum pi q, q[a])`` for this
        evaluator and ``other``: the error of a refused row, else each one's slate, bootstrap and
        running estimates (:meth:`add_also_to`, and the replay's row kernel)."""
        status, w, pa, dm, qa = added
        raise_for_terms(status, action, p, r, target_probs, predicted)
        self._added(slate_id, position, pa, p, r, w, dm, qa)
        if other is not None:
            other._added(slate_id, position, pa, p, r, w, dm, qa)

    def sums_added(
        self, other: OffPolicyEvaluator | None, w: float, pa: float, p: float, r: float, dm: float,
        qa: float,
    ) -> None:  # fmt: skip
        """:meth:`row_added` of a row outside slates that sums.add_row accepted (its ``w``,
        ``pi[a]``, ``sum pi q`` and ``q[a]``, propensity ``p`` and reward ``r``)."""
        self._added("", -1, pa, p, r, w, dm, qa)
        if other is not None:
            other._added("", -1, pa, p, r, w, dm, qa)

    def _added(
        self,
        slate_id: str,
        position: int,
        pa: float,
        p: float,
        r: float,
        w: float,
        dm: float,
        qa: float,
    ) -> None:
        """What follows an event's sums (``add_terms``, or ``sums.add_row`` for a pooled and a
        per-key evaluator at once): its slate, the bootstrap and the running estimates."""
        if slate_id:
            self._slate_row(slate_id, position, pa / p, r)
        elif self._slate:
            self._end_slate()
        if self._boot is not None:
            self._boot.add(
                {"mr": pa * r, "m": pa, "wr": w * r, "w": w, "dr": dm + w * (r - qa), "r": r}
            )
        if self._acc[sums.IPS] >= self._next:  # the event count, read without a property's cost
            n = self.n
            self._record()
            self._next = max(n + 1, int(n * self._growth))  # never reached with growth inf

    def _slate_row(self, slate_id: str, position: int, w: float, r: float) -> None:
        self._slates = True
        if slate_id != self._slate_id or any(pos == position for pos, _, _ in self._slate):
            self._end_slate()
        self._slate_id = slate_id
        self._slate.append((position, w, r))

    def _end_slate(self, into: _Ratio | None = None) -> None:
        """Add the current slate's term to ``into`` (the cascade's sums, and then the slate is
        done) or to a copy the caller reads without ending the slate."""
        if not self._slate:
            return
        weight, term = 1.0, 0.0
        for _, w, r in sorted(self._slate):  # top slot first
            weight *= w
            term += (min(weight, self.clip) if self.clip is not None else weight) * r
        (into or self._cascade).add(term, float(len(self._slate)))
        if into is None:
            self._slate, self._slate_id = [], ""

    def _record(self) -> None:
        n = self.n
        for e in self._all():
            pts = self._running[e.name]
            if not pts or pts[-1][0] != n:
                pts.append((n, e.value))

    def _all(self) -> list[Estimate]:
        z = self._z
        out = [
            self._replay.estimate("replay", z, self._replay.nonzero),
            self._ips.estimate("ips", z, ess=self._snips.ess, clipped=self._clipped),
            self._snips.estimate("snips", z, self._snips.n, clipped=self._clipped),
            dataclasses.replace(
                self._dm.estimate("dm", z), ci_low=math.nan, ci_high=math.nan, interval="none"
            ),
            self._dr.estimate("dr", z, ess=self._snips.ess, clipped=self._clipped),
        ]
        if self.scored:
            out = self._scored(out)
        if self._boot is not None:
            # A percentile interval of a log whose matched rewards are all one value is that
            # value, width 0, however few rows it rests on: the score interval is kept there.
            out = [self._bootstrapped(e, fallback=self.scored) for e in out]
        out = [self._with_unseen_weight(e) if e.name == "ips" else e for e in out]
        if self._slates:
            cascade = self._cascade.copy()
            self._end_slate(into=cascade)  # the slate still open counts as it stands
            out.append(cascade.estimate("cascade", z, self.n))
        return [self._clamped(e) for e in out]

    @property
    def unseen_weight(self) -> float:
        """The importance weight the log is short of beyond chance: ``1 - mean(w)`` less ``z``
        standard errors of the weights' mean, when positive; else 0 (and 0 with clipping, which
        lowers the mean by design). Less the noise, so that a log short by chance is widened by
        little.

        A target's weights have mean 1 wherever the logging policy gives its actions a chance
        (``E[w] = sum_a pi(a)``). A mean far below 1, further than the weights' own spread
        explains, says that the rows that carry the rest are rare and heavy and none was logged:
        a target that mostly chooses what the logging policy rarely did, on a log too short to
        show it. ips's terms then miss that share of the value, and nothing in the log says what
        rewards those rows have."""
        n = self.n
        if n < 2 or self.clip is not None:
            return 0.0
        m = float(self._acc[sums.SW]) / n
        var = max(float(self._acc[sums.SW2]) / n - m * m, 0.0) * n / (n - 1)
        return max(0.0, 1.0 - m - self._z * math.sqrt(var / n))

    def _with_unseen_weight(self, e: Estimate) -> Estimate:
        """ips's interval widened by what the unseen weight (:attr:`unseen_weight`) can add to
        its value: between that share of the reward range's low end and of its high end, whatever
        the interval was (bench/ope_coverage_learners.py: a learner on propensities spread down to
        1e-3, whose heavy rows a 2,000-event log often lacks)."""
        short = self.unseen_weight
        if not short > 0 or not math.isfinite(e.value):
            return e
        lo, hi, _ = self.ends
        return dataclasses.replace(e, ci_low=e.ci_low + short * lo, ci_high=e.ci_high + short * hi)

    def _clamped(self, e: Estimate) -> Estimate:
        """``e`` with its value and bounds inside the reward range: a policy's value is a mean
        reward, so no estimate outside the range can be right (an ips value can overshoot it
        with weights above 1, a normal interval reach past it near an end)."""
        lo, hi, _ = self.ends
        if not math.isfinite(e.value):
            return e

        def clamp(x: float) -> float:
            return x if math.isnan(x) else min(max(x, lo), hi)

        return dataclasses.replace(
            e, value=clamp(e.value), ci_low=clamp(e.ci_low), ci_high=clamp(e.ci_high)
        )

    @property
    def ends(self) -> tuple[float, float, str]:
        """The reward range the intervals and the clamping use, and where it comes from: the
        given ``reward_range`` (``given``); else the least and the largest reward seen
        (``seen``); with one value seen, ``v``, [min(0, v), max(1, v)] (``default``)."""
        if self.reward_range is not None:
            return (*self.reward_range, "given")
        lo, hi = float(self._acc[sums.RMIN]), float(self._acc[sums.RMAX])
        if lo < hi:
            return lo, hi, "seen"
        if self.n == 0:
            return 0.0, 1.0, "default"
        return min(lo, 0.0), max(hi, 1.0), "default"

    @property
    def scored(self) -> bool:
        """Whether the intervals are score intervals: every reward at one of the two ends."""
        if self.n == 0 or self._acc[sums.MANY] == 1.0:
            return False
        lo, hi, _ = self.ends
        return all(
            math.isnan(v) or v == lo or v == hi
            for v in (float(self._acc[sums.R_A]), float(self._acc[sums.R_B]))
        )

    def _wilson(self, e: Estimate, n: float) -> Estimate:
        """``e``, a weighted mean of rewards at the two ends, with Wilson's interval over ``n``."""
        lo, hi, _ = self.ends
        a, b = wilson((e.value - lo) / (hi - lo), n, self._z)
        return dataclasses.replace(
            e, ci_low=lo + (hi - lo) * a, ci_high=lo + (hi - lo) * b, interval="wilson"
        )

    def _scored(self, out: list[Estimate]) -> list[Estimate]:
        """Score intervals (module docstring) in place of the normal ones, on the scale of r."""
        lo, hi, _ = self.ends
        span = hi - lo
        e = {x.name: x for x in out}
        for name, ratio in (("replay", self._replay), ("snips", self._snips)):
            if math.isfinite(e[name].value) and ratio.sv2 > 0:
                e[name] = self._wilson(e[name], ratio.ess)
        acc, n = self._acc, self.n
        sw, sw2 = float(acc[sums.SW]), float(acc[sums.SW2])
        # On the scale r' = (r - lo) / span, 0 or 1: sum w r' and sum w^2 r'^2 = sum w^2 r'.
        su = (float(acc[sums.SWR]) - lo * sw) / span
        su2 = (float(acc[sums.SW2R]) - lo * sw2) / span
        # The reward model's q' = (q - lo) / span over every row: sum w q', sum w^2 q'.
        swq = (float(acc[sums.SWQ]) - lo * sw) / span
        sw2q = (float(acc[sums.SW2Q]) - lo * sw2) / span
        # ips of r = lo * mean(w) + span * ips of r'; the interval is the r' part's, moved by the
        # first term (the weights' mean is taken as it is: it is 1 in expectation).
        shift = lo * sw / n
        # k, the mean weight of a success (intervals.py), as the reward model expects it from
        # every row: where successes are rare and propensities spread, the few seen mostly carry
        # small weights and their own mean weight is far too small (bench/ope_coverage.py).
        if swq > 0 and sw2q > 0:
            k = sw2q / swq
        elif su > 0:
            k = su2 / su
        else:
            k = sw2 / sw if sw > 0 else 0.0
        if k > 0:
            a, b = scaled_wilson(su / n, k, n, self._z)
            ips = e["ips"] = dataclasses.replace(
                e["ips"], ci_low=shift + span * a, ci_high=shift + span * b, interval="score"
            )
            e["dr"] = self._dr_scored(e["dr"], ips, k, su, su2, (a, b), lo, hi)
        return [e[x.name] for x in out]

    def _dr_scored(
        self,
        d: Estimate,
        ips: Estimate,
        k: float,
        su: float,
        su2: float,
        score: tuple[float, float],
        lo: float,
        hi: float,
    ) -> Estimate:
        """dr's interval for rewards at the two ends. A dr term is ``t = u + span w r'`` with
        ``u = dm + w (lo - q)`` and ``r'`` 0/1, so ``Var(t) = Var(u) + span^2 Var(w r') +
        2 span Cov(u, w r')``. The terms with a success in them carry ``w^2 r'``, which the few
        successes seen estimate badly when propensities spread (the heavy-weighted success is
        rarely seen): there, as for ips, one ``w`` is replaced by ``k``, the mean weight of a
        success as the reward model expects it from every row. The terms' own sample variance,
        right when successes are plentiful however wrong the reward model, weighs in as the
        successes' effective number grows (``DR_SUCCESSES``), and the ends are set in the
        proportions of ips's score interval, skewed as a mean of rare heavy terms is
        (bench/ope_coverage.py measures both regimes). With no success of weight > 0 yet, dr's
        interval spans ips's score interval and the same moved to dr's value."""
        n, acc = self.n, self._acc
        if not math.isfinite(d.value):
            return d
        span = hi - lo
        sw, sw2, swr = (float(acc[i]) for i in (sums.SW, sums.SW2, sums.SWR))
        v1 = (swr - lo * sw) / span / n  # mean(w r')
        if n >= 2 and v1 > 0:
            f = n / (n - 1)
            eu = (float(acc[sums.SU]) + lo * sw) / n
            euu = (float(acc[sums.SUU]) + 2 * lo * float(acc[sums.SUW]) + lo * lo * sw2) / n
            e_dm_wr = (float(acc[sums.SDWR]) - lo * float(acc[sums.SDW])) / span / n
            e_wr_loq = (
                lo * swr - float(acc[sums.SWRQ]) - lo * lo * sw + lo * float(acc[sums.SWQR])
            ) / (span * n)
            cov = e_dm_wr + k * e_wr_loq - eu * v1
            var_k = f * (euu - eu * eu + span * span * (k * v1 - v1 * v1) + 2 * span * cov)
            # The terms' own variance is trusted as far as the successes it rests on are many:
            # their effective number, (sum w r')^2 / sum (w r')^2, against DR_SUCCESSES.
            n_s = su * su / su2
            trust = n_s / (n_s + DR_SUCCESSES)
            var = trust * max(var_k, self._dr.m2 / (n - 1)) + (1.0 - trust) * var_k
            # ips's score interval is skewed as a mean of rare heavy terms is (intervals.py); dr's
            # rare heavy terms are the same successes, so its ends take the same proportions.
            sd_ips = math.sqrt(max(k * v1 - v1 * v1, 0.0) / n)
            if var > 0 and sd_ips > 0:
                sd = math.sqrt(var / n) / sd_ips  # dr's sd per unit of ips's (r' scale)
                return dataclasses.replace(
                    d,
                    ci_low=d.value - (v1 - score[0]) * sd,
                    ci_high=d.value + (score[1] - v1) * sd,
                    interval="model",
                )
        # No success of weight > 0: dr's value is the reward model's guess, which the log cannot
        # check; the interval spans ips's score interval and the same moved to dr's value.
        return dataclasses.replace(
            d,
            ci_low=min(ips.ci_low, d.value - (ips.value - ips.ci_low)),
            ci_high=max(ips.ci_high, d.value + (ips.ci_high - ips.value)),
            interval="score-shifted",
        )

    def _bootstrapped(self, e: Estimate, fallback: bool = False) -> Estimate:
        b, c = self._boot, self.confidence
        assert b is not None
        if e.name == "dm" or not math.isfinite(e.value):
            return e
        lo, hi = {
            "replay": lambda: b.ratio("mr", "m", c),
            "snips": lambda: b.ratio("wr", "w", c),
            "ips": lambda: b.mean("wr", c),
            "dr": lambda: b.mean("dr", c),
            "logging": lambda: b.mean("r", c),
        }[e.name]()
        if fallback and not hi > lo:
            return e
        return dataclasses.replace(e, ci_low=lo, ci_high=hi, interval="bootstrap")

    def warnings(
        self, *, min_ess: float = 100.0, min_matched: int = 30, max_weight_share: float = 0.05
    ) -> list[str]:
        """What a reader of the estimates must know: too few effective or matched events, one
        event with more than ``max_weight_share`` of the total weight (the interval then turns on
        whether that one event was a success; bench/ope_coverage.py), weights short of their
        expected mean (:attr:`unseen_weight`), and the replay estimator on a log that is not
        uniform."""
        out = []
        if self.n == 0:
            return ["no events: nothing is estimated"]
        if self._snips.ess < min_ess:
            out.append(
                f"effective sample size {self._snips.ess:.1f} (of {self.n} events) is below {min_ess:g}: "
                "the importance-weighted estimates (ips, snips, dr) rest on few events and their "
                "intervals are approximate"
            )
        share = float(self._acc[sums.WMAX]) / float(self._acc[sums.SW]) if self._acc[sums.SW] else 0
        if share > max_weight_share:
            out.append(
                f"one event carries {share:.0%} of the importance weight (weight "
                f"{self._acc[sums.WMAX]:.4g}): the importance-weighted estimates and their "
                "intervals turn on it; a log with more such events, or --clip, gives steadier ones"
            )
        short = self.unseen_weight
        if short > 0:
            out.append(
                f"the importance weights average {float(self._acc[sums.SW]) / self.n:.3g} where "
                f"they average 1 in expectation: the target mostly chooses what the log rarely "
                f"did, and ips's interval takes in the {short:.3g} of weight no event showed "
                "(at any reward); read snips"
            )
        if self._replay.nonzero < min_matched:
            out.append(
                f"only {self._replay.nonzero} events where the target could choose the logged action: "
                "replay's estimate and interval rest on them alone"
            )
        if self._acc[sums.UNIFORM] != 1.0:
            out.append(
                "the log is not uniform (its propensities are not 1/K): the replay estimator assumes it "
                "is and is biased here; read snips or dr"
            )
        return out

    def estimates(self) -> list[Estimate]:
        """The five estimates, in the order replay, ips, snips, dm, dr, and cascade after them
        when rows had slate ids."""
        return self._all()

    def running(self) -> dict[str, list[tuple[int, float]]]:
        """Per estimator, ``(events seen, estimate)`` at geometrically spaced counts and at the
        current count, for a plot of the running estimates."""
        if self.n:
            self._record()
        return {name: list(pts) for name, pts in self._running.items() if pts or name != "cascade"}

    @property
    def logging_value(self) -> Estimate:
        """The logging policy's own value: the mean logged reward, with its interval."""
        e = self._logged.estimate("logging", self._z)
        if self.scored:
            e = self._wilson(e, self.n)
        if self._boot is not None:
            e = self._bootstrapped(e, fallback=self.scored)
        return self._clamped(e)
