"""Confidence intervals for off-policy estimates of a bounded reward, and a streaming bootstrap.

The estimators' normal intervals (``mean +- z s / sqrt(n)``) take the spread of the log's own
terms as the truth's. When every reward is 0/1 and few are 1 (click logs), that spread is 0 or
nearly, and the interval collapses to a point, e.g. ``0 [0, 0]`` for a log with no matched click,
whose exact 95% interval over 200 trials is [0, 0.018]. A *score* interval (Wilson 1927, "Probable
inference, the law of succession, and statistical inference") instead asks which values ``v``
the estimate is within ``z`` standard errors *of v*, with the variance the model gives at ``v``:

    { v : (vhat - v)^2 <= z^2 v (1 - v) / n }                      (Wilson; vhat, v in [0, 1])

which never collapses and is close to exact (Agresti & Coull 1998, "Approximate is better than
'exact'"). Here, with rewards scaled to ``r' = (r - lo) / (hi - lo)`` in [0, 1]:

- a weighted mean ``sum v r' / sum v`` (replay, snips, the logging value): Wilson with ``n`` the
  effective sample size of its weights, ``(sum v)^2 / sum v^2`` (Kish 1965), which is the count
  for equal weights: the variance of a weighted mean of Bernoulli(p) terms is ``p(1-p) / ESS``;
- IPS, ``mean(w r')``: a term is ``w r'`` with ``r'`` 0/1, so its variance at value ``v`` is
  ``E[w^2 r'] - v^2 = k v - v^2`` with ``k = E[w^2 r'] / E[w r']`` the mean weight of a success
  (estimated ``sum w^2 r'^2 / sum w r'``; with no success yet, the mean weight of an event,
  ``sum w^2 / sum w``). Then ``v / k`` is a proportion and the interval is ``k`` times Wilson's at
  ``vhat / k`` over ``n`` events. With ``r'`` 0/1 this variance at ``vhat`` is exactly the sample
  variance the normal interval uses: the two agree away from the boundary.

:class:`PoissonBootstrap` resamples a stream without storing it (Hanley & MacGibbon 2006; Oza &
Russell 2001): each event enters replicate ``b`` ``c_b ~ Poisson(1)`` times, the limit of the
multinomial counts of an ordinary bootstrap, so B replicates cost O(B) memory and time per event.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["wilson", "scaled_wilson", "PoissonBootstrap", "MIN_REPLICATES", "MAX_REPLICATES"]

# Percentile ends need a few replicates in each tail; past 10,000 the ends move by less than the
# log's own noise, and each replicate costs 8 bytes per sum and a Poisson draw per event.
MIN_REPLICATES, MAX_REPLICATES = 10, 10_000


def wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson's score interval for a proportion ``p`` in [0, 1] over ``n`` (> 0) trials."""
    if not n > 0:
        return 0.0, 1.0
    p = min(max(p, 0.0), 1.0)
    z2n = z * z / n
    centre = (p + z2n / 2.0) / (1.0 + z2n)
    half = z * math.sqrt(p * (1.0 - p) / n + z2n / (4.0 * n)) / (1.0 + z2n)
    # The ends bracket p exactly; rounding alone could put a computed end past it at p = 0 or 1.
    return min(max(centre - half, 0.0), p), max(min(centre + half, 1.0), p)


def scaled_wilson(value: float, k: float, n: float, z: float) -> tuple[float, float]:
    """The score interval of a mean of ``n`` terms ``w r'`` (``r'`` 0/1) whose variance at ``v``
    is ``k v - v^2``: ``k`` times Wilson's interval at ``value / k``."""
    lo, hi = wilson(value / k, n, z)
    return k * lo, k * hi


class PoissonBootstrap:
    """B bootstrap replicates of the estimators' sums, streamed (module docstring).

    Each event adds its terms (a dict name -> value; the same names each time) with a count drawn
    per replicate; :meth:`ratio` and :meth:`mean` give percentile intervals of ``sum u / sum v``
    and of a mean over the replicates."""

    def __init__(self, replicates: int, seed: int = 0) -> None:
        if not MIN_REPLICATES <= replicates <= MAX_REPLICATES:
            raise ValueError(
                f"a bootstrap needs {MIN_REPLICATES} to {MAX_REPLICATES} replicates, got {replicates}"
            )
        self.replicates = int(replicates)
        self._rng = np.random.default_rng(np.random.SeedSequence([seed, 0x0B007]))
        self._sums: dict[str, np.ndarray] = {}
        self._n = np.zeros(self.replicates)

    def add(self, terms: dict[str, float]) -> None:
        c = self._rng.poisson(1.0, self.replicates).astype(np.float64)
        self._n += c
        for name, x in terms.items():
            s = self._sums.get(name)
            if s is None:
                s = self._sums[name] = np.zeros(self.replicates)
            s += c * x

    def _interval(self, values: np.ndarray, confidence: float) -> tuple[float, float]:
        v = values[np.isfinite(values)]
        if v.size < self.replicates // 2:  # most replicates undefined: no interval
            return -math.inf, math.inf
        a = (1.0 - confidence) / 2.0
        lo, hi = np.quantile(v, [a, 1.0 - a])
        return float(lo), float(hi)

    def mean(self, name: str, confidence: float) -> tuple[float, float]:
        """Percentile interval of the mean of the terms ``name``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._interval(self._sums[name] / self._n, confidence)

    def ratio(self, num: str, den: str, confidence: float) -> tuple[float, float]:
        """Percentile interval of ``sum num / sum den``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._interval(
                self._sums[num] / np.where(self._sums[den] > 0, self._sums[den], np.nan), confidence
            )
