"""Replay a log of decisions through a target configuration: what it would have chosen, what it
would have learnt, and what it is worth (off-policy estimates).

For every logged decision, in log order:

1. its model key resolves to a :class:`~streambandit.models_config.ModelSpec` (an unknown
   key is a :class:`~streambandit.replay.logged.LogError` naming the event);
2. the target model of that key (one per key, built from the spec) decides with the worker's own
   :func:`~streambandit.decision.choose`, seeded per event exactly as live, so a replay of
   the worker's own log with the worker's configuration chooses exactly as the worker did;
3. the evaluator gets the logged action, propensity and reward, the target's epsilon-greedy
   distribution over the arms and a per-key ridge reward model's predictions made *before* this
   event;
4. the target learns as it would have live, by rejection sampling (Li et al., WSDM 2011): only
   when its choice equals the logged action is it updated with ``(features[action], reward)``;
   the reward model is always updated with the logged pair.

Timing. The worker's joined log is in update order, and each record carries the version (update
count) the live model had when it decided (``decision_version``). A decision with version ``v``
is made after the ``v``-th logged update of its model key and before the ``v+1``-th, so the
updates are held back (per key, up to ``max_lag`` of them) until the decisions that precede them
are made. A decision whose version was already passed (held back longer than ``max_lag``, or a
log that does not start at the model's beginning) is made at the earliest version still possible
and counted in ``ReplayResult.off_version``. Records with ``decision_version == -1`` (external
logs) are decided and then learnt from at once.

Pure: numpy only, no Kafka client.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Any, Callable, Iterable

import numpy as np

from streambandit.decision import action_probabilities, choose
from streambandit.models_config import ModelsConfig, ModelSpec
from streambandit.policies.base import Policy
from streambandit.replay.estimators import Estimate, OffPolicyEvaluator, RidgeRewardModel
from streambandit.replay.logged import LogError, LoggedDecision

__all__ = ["ReplayResult", "replay", "DEFAULT_MAX_LAG", "PROGRESS_EVERY", "LEARNING_NOTE"]

DEFAULT_MAX_LAG = 100_000  # logged updates of one model key held back waiting for earlier-version decisions
PROGRESS_EVERY = 1000

# The intervals treat the target's probabilities at each event as given. A target that learns
# during the replay has probabilities that depend on this log's earlier events: what is estimated
# is the value of this one learning path, and the spread of a learner's value over other logs
# (other orders, other draws of the logging policy) is not in the interval.
LEARNING_NOTE = ("the target learned during the replay (from the events where it chose the logged action): the "
                 "estimates are the value of this one learning path through this log, and the intervals cover "
                 "that value, not the learner's expected value on other logs of the same traffic")


@dataclasses.dataclass
class ReplayResult:
    """What a replay found."""

    estimates: list[Estimate]  # one per estimator, in the evaluator's order
    logging_value: Estimate  # the logging policy's own average reward
    events: int  # logged decisions replayed
    matched: int  # of them, where the target chose the logged action (the target learnt from these)
    models: dict[str, dict[str, Any]]  # model key -> the target's final state_dict
    policies: dict[str, str]  # model key -> policy name
    decisions: dict[str, int]  # event id -> arm index the target chose
    running: dict[str, list[tuple[int, float]]]  # estimator name -> [(events, value)]
    off_version: int = 0  # decisions not made at their logged version (see the module docstring)
    skipped: int = 0  # rows the reader skipped as bad (--skip-bad)
    skipped_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = dataclasses.field(default_factory=list)  # what a reader of the estimates must know

    @property
    def match_rate(self) -> float:
        return self.matched / self.events if self.events else math.nan

    def estimate(self, name: str) -> Estimate:
        for e in self.estimates:
            if e.name == name:
                return e
        raise KeyError(name)


class _Rec:
    __slots__ = ("seq", "d", "choice", "probs", "predicted")

    def __init__(self, seq: int, d: LoggedDecision) -> None:
        self.seq = seq
        self.d = d
        self.choice: int | None = None
        self.probs: np.ndarray | None = None
        self.predicted: np.ndarray | None = None


class _Model:
    """The target model of one key, its reward model, and the decisions and updates held back."""

    def __init__(self, key: str, spec: ModelSpec) -> None:
        self.key = key
        self.spec = spec
        self.policy: Policy = spec.build()
        self.reward_model = RidgeRewardModel(spec.dim)
        self.applied = 0  # logged updates processed (applied to the target or rejected)
        self.seen = 0  # logged records seen (the next record's update index)
        self.waiting: dict[int, list[_Rec]] = {}  # version -> records to decide at that version
        self.updates: collections.deque[_Rec] = collections.deque()  # seen, not yet applied, log order


class _Replayer:
    def __init__(self, models: ModelsConfig, max_lag: int, evaluator: OffPolicyEvaluator) -> None:
        self.config = models
        self.max_lag = max_lag
        self.evaluator = evaluator
        self.models: dict[str, _Model] = {}
        self.decisions: dict[str, int] = {}
        self.matched = 0
        self.events = 0
        self.off_version = 0
        self._ready: dict[int, _Rec] = {}
        self._next_emit = 0

    # -- per record ----------------------------------------------------------------------------

    def add(self, d: LoggedDecision) -> None:
        m = self._model(d)
        if d.event_id in self.decisions:
            raise LogError(f"{d.where}: duplicate event id: an earlier decision of the log has it (a row written "
                           "twice, or ids reused)", "duplicate")
        self.decisions[d.event_id] = -1  # known from now on; its choice is set when it is decided
        rec = _Rec(self.events, d)
        self.events += 1
        v = d.decision_version
        if v is None or v < 0:
            self._advance(m, final=True)  # everything held back first: "now" is after all of it
            m.seen += 1
            self._decide(m, rec)
            self._apply(m, rec)
            return
        u = m.seen
        m.seen += 1
        if v > u or v < m.applied:
            # Not a complete log of this model from its beginning, or held back past max_lag:
            # decide at the earliest version still possible.
            self.off_version += 1
            v = max(m.applied, min(v, u))
        m.waiting.setdefault(v, []).append(rec)
        m.updates.append(rec)
        self._advance(m, final=False)

    def finish(self) -> None:
        for m in self.models.values():
            self._advance(m, final=True)
        assert not self._ready and self._next_emit == self.events

    # -- internals -----------------------------------------------------------------------------

    def _model(self, d: LoggedDecision) -> _Model:
        """The target model of ``d``'s key, once ``d`` is known to fit it (nothing is created for
        a decision that does not)."""
        m = self.models.get(d.model_key)
        spec = m.spec if m is not None else self.config.resolve(d.model_key)
        if spec is None:
            raise LogError(f"{d.where}: no configuration matches model key {d.model_key!r}", "model_key")
        if d.features.shape[1] != spec.dim:
            raise LogError(f"{d.where}: features have dimension {d.features.shape[1]}, model "
                           f"{d.model_key!r} expects {spec.dim}", "features")
        bounds = self.evaluator.reward_range
        if bounds is not None and not bounds[0] <= d.reward <= bounds[1]:
            raise LogError(f"{d.where}: reward {d.reward!r} outside --reward-range "
                           f"[{bounds[0]:g}, {bounds[1]:g}]", "reward")
        if m is None:
            m = _Model(d.model_key, spec)
        try:
            m.policy.validate_reward(d.reward)
        except ValueError as exc:
            raise LogError(f"{d.where}: reward {d.reward!r} not accepted by model {d.model_key!r} "
                           f"({spec.policy}): {exc}", "reward") from None
        self.models[d.model_key] = m
        return m

    def _advance(self, m: _Model, *, final: bool) -> None:
        """Make the decisions due at the current version; apply held-back updates while more than
        ``max_lag`` are held (all of them when ``final``)."""
        while True:
            due = m.waiting.pop(m.applied, None)
            if due:
                for rec in due:
                    self._decide(m, rec)
            if not m.updates or (not final and len(m.updates) <= self.max_lag):
                break
            self._apply(m, m.updates.popleft())
        if final:
            # Versions beyond the last logged update (only off-version logs have them).
            for v in sorted(m.waiting):
                for rec in m.waiting.pop(v):
                    self._decide(m, rec)

    def _decide(self, m: _Model, rec: _Rec) -> None:
        d, spec = rec.d, m.spec
        try:
            scores = m.policy.scores(d.features)
        except ValueError as exc:
            raise LogError(f"{d.where}: {exc}", "features") from None
        # The worker's rule on the same score vector the target distribution is computed from.
        dec = choose(scores, epsilon=spec.epsilon, model_key=d.model_key, event_id=d.event_id, seed=spec.seed)
        rec.choice, rec.probs = dec.index, action_probabilities(scores, spec.epsilon)
        self.decisions[d.event_id] = dec.index

    def _apply(self, m: _Model, rec: _Rec) -> None:
        """The logged update of ``rec``: the target learns if it chose the logged action; the
        reward model always learns. Then hand the record to the evaluator in log order."""
        d = rec.d
        if rec.choice is None:  # cannot happen: a record's version is at most its update index
            raise AssertionError(f"event {d.event_id!r} updated before it was decided")
        x = d.features[d.action]
        rec.predicted = m.reward_model.predict(d.features)
        if rec.choice == d.action:
            m.policy.update(x, d.reward)
            self.matched += 1
        m.reward_model.update(x, d.reward)
        m.applied += 1
        self._ready[rec.seq] = rec
        while self._next_emit in self._ready:
            r = self._ready.pop(self._next_emit)
            self._next_emit += 1
            self.evaluator.add(action=r.d.action, propensity=r.d.propensity, reward=r.d.reward,
                               target_probs=r.probs, predicted=r.predicted)
            r.probs = r.predicted = None


def replay(
    decisions: Iterable[LoggedDecision],
    models: ModelsConfig,
    *,
    clip: float | None = None,
    progress: Callable[[int], None] | None = None,
    max_lag: int = DEFAULT_MAX_LAG,
    counts: dict[str, int] | None = None,
    skip_bad: bool = False,
    reward_range: tuple[float, float] | None = None,
    bootstrap: int = 0,
    confidence: float = 0.95,
) -> ReplayResult:
    """Replay ``decisions`` (in log order) through the target configuration ``models``.

    ``progress(n)`` is called every :data:`PROGRESS_EVERY` events and at the end. ``counts``: the
    dict a reader of :mod:`streambandit.replay.files` filled while ``decisions`` was consumed
    (``skipped``, ``skipped_<reason>``); its skipped rows are reported in the result.
    ``skip_bad``: a decision the target configuration cannot use (no model for its key, another
    dimension, a reward its link or ``reward_range`` refuses, an event id seen before) is skipped
    and counted in ``counts`` the same way, instead of raising :class:`LogError`.
    ``reward_range``, ``bootstrap`` and ``confidence`` choose the intervals
    (:class:`~streambandit.replay.estimators.OffPolicyEvaluator`).
    """
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag!r}")
    start = time.perf_counter()
    r = _Replayer(models, max_lag, OffPolicyEvaluator(clip=clip, reward_range=reward_range, bootstrap=bootstrap,
                                                      confidence=confidence))
    counts = {} if counts is None else counts
    for d in decisions:
        try:
            r.add(d)
        except LogError as err:  # raised before the decision changed any state
            if not skip_bad:
                raise
            counts["skipped"] = counts.get("skipped", 0) + 1
            counts[f"skipped_{err.reason}"] = counts.get(f"skipped_{err.reason}", 0) + 1
            continue
        if progress is not None and r.events % PROGRESS_EVERY == 0:
            progress(r.events)
    r.finish()
    if progress is not None:
        progress(r.events)
    ev = r.evaluator
    skipped = counts.get("skipped", 0)
    by_reason = {k[len("skipped_"):]: v for k, v in counts.items() if k.startswith("skipped_")}
    warnings = ev.warnings()
    if r.matched:
        warnings.append(LEARNING_NOTE)
    return ReplayResult(
        warnings=warnings,
        estimates=list(ev.estimates()),
        logging_value=ev.logging_value,
        events=r.events,
        matched=r.matched,
        models={k: m.policy.state_dict() for k, m in r.models.items()},
        policies={k: m.spec.policy for k, m in r.models.items()},
        decisions=r.decisions,
        running=ev.running(),
        off_version=r.off_version,
        skipped=int(skipped),
        skipped_by_reason=dict(by_reason),
        seconds=time.perf_counter() - start,
    )
