"""The value a learning target is expected to have: an interval over its learning paths.

A target that learns during a replay (``runner.py``) has, at each event, probabilities that depend
on the log's earlier events; its estimates are the value of the one learning path this log gave
it, and their intervals cover that path's value. A team deploying the learner gets another path:
what they can expect is the learner's value averaged over paths, which varies more.

Estimand. The replay gives a learner its matched events as updates (rejection sampling) and
values its policy at every event, where it has had ``N_i`` updates. When the logging policy's
choice does not depend on the context beyond its propensities, an event matches with
probability 1/K whatever the learner chose, and the matched events are an online run: the
estimates' expectation is ``(1/n) sum_i E[v_{N_i}]``, ``v_t`` the learner's expected reward
online after ``t`` updates, its expected online value over the horizon the replay gives it
(``bench/ope_coverage_learners.py`` measures the coverage against a Monte Carlo of it). A
logging policy that favoured arms by context feeds the learner a tilted sample of the traffic;
nothing here corrects for that.

Interval. ``replicates`` extra replays of the learning targets, each over a Poisson bootstrap of
the log kept in log order: every row (every slate, for slate rows) appears ``Poisson(1)`` times
in place, each copy with its own event id (so the learner's exploration draws are new) and its
decision version moved to count the copies before it, so updates still arrive as late as they
did. An estimator's variance over the replicates, ``s^2``, is that of the whole procedure: the
log's noise, which the path interval already measures (``s_path``, its width over ``2 z``), and
the spread of the learner's paths, ``s_b^2 = max(0, s^2 - s_path^2)``. The interval is the path
interval with each side widened in quadrature, ``value -/+ sqrt(side^2 + (t s_b)^2)``, ``t``
Student's quantile at ``replicates - 1`` degrees of freedom: it keeps what the path interval
knows that a bootstrap does not (the score intervals' bounds for rare rewards and heavy weights)
and adds the paths' spread. A frozen or external target has no path and gets none. It costs
``replicates`` more passes over the log.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from statistics import NormalDist
from typing import Any

import numpy as np

from streambandit.replay.estimators import Estimate
from streambandit.replay.logged import LoggedDecision
from streambandit.replay.runner import ReplayResult, Target, replay_targets

__all__ = [
    "DEFAULT_REPLICATES",
    "ExpectedValue",
    "expected_values",
    "resample",
    "interval_from_replicates",
    "replicate_estimates",
]

DEFAULT_REPLICATES = 10  # each a pass over the log; the coverage study's setting
# The estimators given an expected-value interval: dm has no interval of its own (its error is
# its reward model's bias, which no resampling of the log measures).
_ESTIMATORS = ("replay", "ips", "snips", "dr", "cascade")


@dataclasses.dataclass(frozen=True)
class ExpectedValue:
    """One estimator's interval for a learning target's expected value."""

    name: str  # the estimator
    value: float  # the replay's own estimate (the path's)
    ci_low: float
    ci_high: float
    between: float  # s_b: the standard deviation of the path's value over learning paths
    replicates: int  # replicates with a finite estimate


def resample(
    decisions: Iterable[LoggedDecision], rng: np.random.Generator, tag: str
) -> Iterator[LoggedDecision]:
    """A Poisson(1) bootstrap of ``decisions`` in log order (module docstring): the copies of a
    row follow each other where the row was; the copy ``j`` of event ``e`` is ``e~<tag>.<j>``.

    A decision version ``v`` (the update count of its model when it decided) becomes the number
    of copies of that model's first ``v`` rows; a version past the rows seen keeps its excess.
    """
    copies = iter(())
    cum: dict[str, list[int]] = {}  # model key -> copies among its first i rows, i = 0, 1, ...
    unit: list[LoggedDecision] = []  # the rows of one slate (or one row), copied together

    def draw() -> int:
        nonlocal copies
        n = next(copies, None)
        if n is None:
            copies = iter(rng.poisson(1.0, 4096).tolist())
            n = next(copies)
        return n

    def emit(rows: list[LoggedDecision]) -> Iterator[LoggedDecision]:
        c = draw()
        versions = []
        for d in rows:
            seen = cum.setdefault(d.model_key, [0])
            u, v = len(seen) - 1, d.decision_version
            versions.append(
                v if v is None or v < 0 else seen[min(v, u)] + max(v - u, 0)
            )  # version of every copy: all are decided before any of them is learnt from
            seen.append(seen[-1] + c)
        for j in range(c):
            for d, v in zip(rows, versions):
                yield dataclasses.replace(
                    d,
                    event_id=f"{d.event_id}~{tag}.{j}",
                    decision_version=v,
                    slate_id=f"{d.slate_id}~{tag}.{j}" if d.slate_id else "",
                )

    for d in decisions:
        if unit and not (d.slate_id and d.slate_id == unit[-1].slate_id):
            yield from emit(unit)
            unit = []
        unit.append(d)
    if unit:
        yield from emit(unit)


def interval_from_replicates(
    path: Estimate, replicates: list[float], confidence: float
) -> tuple[float, float, float]:
    """``(low, high, s_b)``: the path estimate's interval widened by the paths' spread ``s_b``
    estimated from the finite replicate values (module docstring); unbounded with fewer than two
    replicates or an unbounded path interval."""
    xs = [x for x in replicates if math.isfinite(x)]
    v, low, high = path.value, path.ci_low, path.ci_high
    if len(xs) < 2 or not all(math.isfinite(x) for x in (v, low, high)):
        return -math.inf, math.inf, math.nan
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    s_path = (high - low) / (2 * z)
    s_b = math.sqrt(max(0.0, float(np.var(xs, ddof=1)) - s_path**2))
    # Imported here: scipy.stats takes 0.3-0.7 s to import, a fixed cost of every `replay`
    # command otherwise, though only --expected-value reaches this line (bench.replay).
    from scipy.stats import t as student_t

    widen = (float(student_t.ppf(0.5 + confidence / 2, len(xs) - 1)) * s_b) ** 2
    return v - math.sqrt((v - low) ** 2 + widen), v + math.sqrt((high - v) ** 2 + widen), s_b


def replicate_estimates(
    read: Callable[[], Iterable[LoggedDecision]],
    targets: list[Target],
    *,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    **replay_options: Any,
) -> dict[str, dict[str, list[float]]]:
    """Learning target name -> estimator -> its value in each replicate (module docstring).

    ``read()`` yields the log afresh (called once per replicate); ``progress(done, replicates)``
    after each replicate; ``replay_options`` go to ``replay_targets`` (clip, max_lag, skip_bad,
    reward_range), without an inner bootstrap. Frozen and external targets are left out.
    """
    if replicates < 2:
        raise ValueError(
            f"an expected-value interval needs at least 2 replicates, got {replicates}"
        )
    learners = [t for t in targets if t.kind == "learning"]
    values: dict[str, dict[str, list[float]]] = {t.name: {} for t in learners}
    if not learners:
        return values
    rng = np.random.default_rng(seed)
    for r in range(replicates):
        rows = resample(read(), rng, f"r{r}")
        found = replay_targets(rows, learners, **{**replay_options, "bootstrap": 0})
        for name, res in found.items():
            for e in res.estimates:
                values[name].setdefault(e.name, []).append(e.value)
        if progress is not None:
            progress(r + 1, replicates)
    return values


def expected_values(
    read: Callable[[], Iterable[LoggedDecision]],
    targets: list[Target],
    results: dict[str, ReplayResult],
    *,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    confidence: float = 0.95,
    progress: Callable[[int, int], None] | None = None,
    **replay_options: Any,
) -> dict[str, list[ExpectedValue]]:
    """Learning target name -> its expected-value intervals, one per estimator with an interval:
    :func:`replicate_estimates` around ``results``, the replay's own (``replay_targets`` over the
    same log and ``targets``), whose estimates are the centres."""
    values = replicate_estimates(
        read, targets, replicates=replicates, seed=seed, progress=progress, **replay_options
    )
    out: dict[str, list[ExpectedValue]] = {}
    for name, by_estimator in values.items():
        out[name] = []
        for e in results[name].estimates:
            if e.name not in _ESTIMATORS:
                continue
            xs = by_estimator.get(e.name, [])
            low, high, s = interval_from_replicates(e, xs, confidence)
            n = sum(math.isfinite(x) for x in xs)
            out[name].append(ExpectedValue(e.name, e.value, low, high, s, n))
    return out
