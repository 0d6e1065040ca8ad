"""Choosing a model configuration from a log: every combination of a grid of settings replayed
as a target (all of them in one pass over the log), ranked by an off-policy estimate.

A setting is a hyper-parameter of the policy (``lam``, ``beta_scale``, ``link``, ...) or one of
the fields ``policy`` and ``epsilon`` of a ``[[models]]`` entry; each candidate applies its
settings to every entry of the base configuration. Candidates are ranked by one estimator's
value (snips by default: it needs no reward model and its weights are normalised). The best is
**separated** from another candidate when its interval lies wholly above the other's; when
they overlap the log cannot tell them apart at the interval's level, and the ranking says so
rather than recommending a winner by noise.

What the estimates are: each candidate learns during the replay (rejection sampling), so an
estimate is the value of that candidate's learning path through this log (runner.LEARNING_NOTE).
Candidates compared on one log share its rows, which is what a choice between them needs.

The best estimate is biased upward. Each candidate's estimate is its value plus noise, and the
largest of many noisy estimates is, on average, above the chosen candidate's value (the winner's
curse; the more candidates and the wider their intervals, the larger the gap). Its interval is not
a valid interval for the chosen candidate either: it was chosen for being high. A held-out part
of the log (:func:`holdout_start`) measures the chosen candidate on rows the choice did not see:
the candidates are ranked on the first rows, and the best, continuing from the models it learned
there (:func:`holdout_target`), is replayed on the rest. That estimate and its interval are those
of one candidate fixed in advance, with nothing selected on them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from streambandit.config.models import ModelsConfig, ModelSpec
from streambandit.policies.base import POLICIES
from streambandit.replay.runner import ReplayResult, Target

__all__ = [
    "Candidate",
    "Ranking",
    "candidates",
    "rank",
    "parse_grid",
    "MAX_CANDIDATES",
    "SPEC_SETTINGS",
    "holdout_start",
    "holdout_target",
    "WINNERS_CURSE",
]

# Each candidate is a learner replayed beside the others: cost and memory grow with their number.
MAX_CANDIDATES = 64
SPEC_SETTINGS = (
    "policy",
    "epsilon",
)  # settings that are fields of [[models]], not hyper-parameters

# What tune's report says of the best estimate (module docstring).
WINNERS_CURSE = (
    "The best of several noisy estimates is biased upward (the winner's curse): the chosen "
    "candidate's estimate and interval above overstate its value, the more so with more "
    "candidates. --holdout FRACTION measures it on rows the choice did not see."
)


@dataclasses.dataclass(frozen=True)
class Candidate:
    name: str  # "lam=0.1,beta_scale=1"
    settings: dict[str, Any]
    models: ModelsConfig


@dataclasses.dataclass(frozen=True)
class Ranking:
    estimator: str
    order: list[tuple[Candidate, ReplayResult]]  # best first (NaN estimates last)
    tied_with_best: list[str]  # candidates whose interval overlaps the best's

    @property
    def best(self) -> Candidate:
        return self.order[0][0]

    @property
    def separated(self) -> bool:
        """Whether the log tells the best apart from every other candidate."""
        return not self.tied_with_best


def _value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text.strip()


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["lam=0.1,1,10", "link=identity,logistic"]`` -> ``{"lam": [0.1, 1, 10], ...}``; numbers
    and true/false are read as such, anything else is a string."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        parts = [v for v in values.split(",") if v.strip()]
        if not sep or not key or not parts:
            raise ValueError(f"--grid {item!r}: expected NAME=V1,V2,...")
        if key in grid:
            raise ValueError(f"--grid {key}: given twice")
        grid[key] = [_value(v) for v in parts]
    return grid


def _apply(spec: ModelSpec, settings: dict[str, Any]) -> ModelSpec:
    fields = {k: v for k, v in settings.items() if k in SPEC_SETTINGS}
    hyper = {**spec.hyper, **{k: v for k, v in settings.items() if k not in SPEC_SETTINGS}}
    if "policy" in fields and fields["policy"] not in POLICIES:
        raise ValueError(
            f"unknown policy {fields['policy']!r}; known: {', '.join(sorted(POLICIES))}"
        )
    if "epsilon" in fields:
        eps = fields["epsilon"]
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 <= eps <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {eps!r}")
        fields["epsilon"] = float(eps)
    return dataclasses.replace(spec, hyper=hyper, **fields)


def candidates(base: ModelsConfig, grid: dict[str, list[Any]]) -> list[Candidate]:
    """Every combination of ``grid`` applied to ``base``, each checked by building its policies
    (a bad value is a ValueError naming the candidate, before any log is read)."""
    if not grid:
        raise ValueError("tune needs a grid: --grid NAME=V1,V2,...")
    combos = list(itertools.product(*grid.values()))
    if len(combos) > MAX_CANDIDATES:
        raise ValueError(
            f"the grid has {len(combos)} combinations; at most {MAX_CANDIDATES} (each is a learner "
            "replayed beside the others)"
        )
    out = []
    for combo in combos:
        settings = dict(zip(grid, combo))
        name = ",".join(f"{k}={v}" for k, v in settings.items())
        try:
            specs = tuple(_apply(spec, settings) for spec in base.specs)
            for spec in specs:
                spec.build().validate_reward(spec.default_reward)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"candidate {name}: {exc}") from None
        out.append(Candidate(name, settings, ModelsConfig(specs)))
    return out


def targets(cands: list[Candidate]) -> list[Target]:
    return [Target(c.name, c.models) for c in cands]


def rank(
    cands: list[Candidate], results: dict[str, ReplayResult], estimator: str = "snips"
) -> Ranking:
    """``cands`` ordered by ``estimator``'s value (highest first), with the candidates whose
    interval overlaps the best's."""

    def est(c: Candidate):
        return results[c.name].estimate(estimator)

    order = sorted(cands, key=lambda c: -est(c).value if math.isfinite(est(c).value) else math.inf)
    best = est(order[0])
    tied = [
        c.name
        for c in order[1:]
        if not math.isfinite(best.value)
        or not math.isfinite(est(c).value)
        or est(c).ci_high >= best.ci_low
    ]
    return Ranking(estimator, [(c, results[c.name]) for c in order], tied)


def holdout_start(rows: int, fraction: float) -> int:
    """The index of the first held-out row when the last ``fraction`` of ``rows`` rows are held
    out: the candidates are ranked on the rows before it. ValueError when either part is empty."""
    if isinstance(fraction, bool) or not 0.0 < fraction < 1.0:
        raise ValueError(f"--holdout must be a fraction in (0, 1), got {fraction!r}")
    start = rows - math.floor(rows * fraction)
    if start <= 0 or start >= rows:
        raise ValueError(
            f"--holdout {fraction:g} of {rows} rows leaves "
            f"{'no row to rank on' if start <= 0 else 'no row held out'}"
        )
    return start


def holdout_target(best: Candidate, ranked_on: ReplayResult) -> Target:
    """The best candidate to replay on the held-out rows: its configuration, starting from the
    models it learned on the rows it was ranked on, and learning on as it would live."""
    return Target(best.name, best.models, states=ranked_on.models)
