"""Replay a log of decisions through a target configuration: what it would have chosen, what it
would have learnt, and what it is worth (off-policy estimates).

For every logged decision, in log order:

1. its model key resolves to a :class:`~streambandit.config.models.ModelSpec` (an unknown
   key is a :class:`~streambandit.replay.logged.LogError` naming the event);
2. the target model of that key (one per key, built from the spec) decides with the worker's own
   :func:`~streambandit.engine.decision.choose`, seeded per event exactly as live, so a replay of
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

Targets (:class:`Target`). :func:`replay_targets` evaluates several targets in one pass over the
log: each is a streambandit configuration that learns as above, the same frozen (``learn=False``:
it decides from its starting state and never updates, e.g. models loaded from a worker's snapshot
or from ``--save-state``), or an external policy given by its probabilities for each row (a
column of the log, or a side file keyed by event id). A row that any target cannot use is an
error, or with ``skip_bad`` skipped for every target, so that all targets are estimated on the
same rows. Beside the pooled estimates each target has estimates per model key (the first
:data:`MAX_KEY_ESTIMATES` keys) and, for slate rows, per position (the first
:data:`MAX_POSITION_ESTIMATES` positions), each with the pooled estimates' intervals (bootstrap
included).

A configured target whose every model has ``epsilon = 1`` chooses uniformly at random whatever
its learner's scores: its kind is ``uniform`` (:data:`KINDS`), and its estimates are the uniform
policy's value, the same whether it learns, is frozen or starts from a state.

Slates: a row with a position is decided at that slot (:func:`~streambandit.engine.decision.choose`
with ``position``: the k-th arm by score, epsilon-greedy) and the evaluator weighs it per slot
(``estimators.py``).

Pure: numpy only, no Kafka client.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import numpy as np

from streambandit.config.models import ModelsConfig, ModelSpec
from streambandit.engine.decision import (
    NO_DRAW,
    choice_with_probabilities,
    choose_with_probabilities,
)
from streambandit.numerics.event_draw import event_seed
from streambandit.policies.base import Policy
from streambandit.policies.linear_ucb import LinearUCBPolicy
from streambandit.replay import row_kernel
from streambandit.replay.estimators import (
    Estimate,
    OffPolicyEvaluator,
    RidgeRewardModel,
    raise_for_terms,
)
from streambandit.replay.logged import LogError, LoggedDecision

__all__ = [
    "ReplayResult",
    "KeyEstimates",
    "Target",
    "replay",
    "replay_targets",
    "DEFAULT_MAX_LAG",
    "PROGRESS_EVERY",
    "LEARNING_NOTE",
    "MAX_KEY_ESTIMATES",
    "MAX_POSITION_ESTIMATES",
    "KINDS",
]

DEFAULT_MAX_LAG = (
    100_000  # logged updates of one model key held back waiting for earlier-version decisions
)
PROGRESS_EVERY = 1000
# Per-key estimates cost an evaluator each; a log of millions of keys (one per user) gets them for
# its first keys and the pooled estimate for all.
MAX_KEY_ESTIMATES = 1000
# Positions are slots of a slate (at most K); a log of pages with thousands of slots gets the top ones.
MAX_POSITION_ESTIMATES = 100

# What a target's kind says about it (the report prints this beside the kinds it shows).
KINDS = {
    "learning": "a configuration that learns from the log as it would have live (rejection sampling)",
    "frozen": "a configuration that decides from its starting state and never updates",
    "uniform": "a configuration whose every model has epsilon = 1: it chooses uniformly at random "
    "whatever its learner says, so its estimates are the uniform policy's value, the same learning "
    "or frozen, from any state",
    "external": "a policy from another system, given by its probabilities for each row",
}
_SCORED_MAX = 1024  # score vectors kept per model between its updates
_REWARDS_OK_MAX = 256
_F64 = np.dtype(np.float64)

# The intervals treat the target's probabilities at each event as given. A target that learns
# during the replay has probabilities that depend on this log's earlier events: what is estimated
# is the value of this one learning path, and the spread of a learner's value over other logs
# (other orders, other draws of the logging policy) is not in the interval.
LEARNING_NOTE = (
    "the target learned during the replay (from the events where it chose the logged action): the "
    "estimates are the value of this one learning path through this log, and the intervals cover "
    "that value, not the learner's expected value on other logs of the same traffic"
)


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
    warnings: list[str] = dataclasses.field(
        default_factory=list
    )  # what a reader of the estimates must know
    target: str = "target"  # the target's name
    kind: str = "learning"  # a key of KINDS
    by_key: dict[str, "KeyEstimates"] = dataclasses.field(
        default_factory=dict
    )  # model key -> its estimates
    keys_without_estimates: int = (
        0  # events of keys past MAX_KEY_ESTIMATES (in the pooled estimates only)
    )
    # position (0: the top slot) -> the estimates of the slate rows at that slot
    by_position: dict[int, "KeyEstimates"] = dataclasses.field(default_factory=dict)
    positions_without_estimates: int = 0  # events at positions past MAX_POSITION_ESTIMATES
    # The range every value and bound is clamped to, and whence: "given" (--reward-range),
    # "seen" (the least and the largest reward of the log), "default" ([0, 1] and the one value).
    reward_range: tuple[float, float, str] = (0.0, 1.0, "default")

    @property
    def match_rate(self) -> float:
        return self.matched / self.events if self.events else math.nan

    def estimate(self, name: str) -> Estimate:
        for e in self.estimates:
            if e.name == name:
                return e
        raise KeyError(name)


@dataclasses.dataclass(frozen=True)
class KeyEstimates:
    """One model key's (or one slate position's) share of a target's estimates."""

    estimates: list[Estimate]
    logging_value: Estimate
    events: int


@dataclasses.dataclass(frozen=True)
class Target:
    """A policy to evaluate.

    ``models``: a streambandit configuration (one model per key, built from its spec); None for
    an external target, whose probabilities for each row are ``probs[event_id]`` (a side file)
    or, without ``probs``, the row's own ``external`` entry of this name (a column of the log).
    ``learn``: whether the models learn from the log (rejection sampling, module docstring).
    ``states``: model key -> a state dict the key's model starts from (a snapshot's models, or a
    file written by ``--save-state``); keys not in it start fresh.
    """

    name: str
    models: ModelsConfig | None = None
    learn: bool = True
    states: Mapping[str, dict[str, Any]] | None = None
    probs: Mapping[str, np.ndarray] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a target needs a name")
        if self.models is None and self.states is not None:
            raise ValueError(
                f"target {self.name!r}: an external target has no models to load states into"
            )

    @property
    def kind(self) -> str:
        """A key of :data:`KINDS`."""
        if self.models is None:
            return "external"
        if all(spec.epsilon >= 1.0 for spec in self.models.specs):
            return "uniform"
        return "learning" if self.learn else "frozen"


class _Evaluators:
    """A target's pooled evaluator, one per model key (the first MAX_KEY_ESTIMATES keys) and one
    per slate position (the first MAX_POSITION_ESTIMATES positions), all of the same settings:
    a row is in one key's and at most one position's, so a bootstrap costs each row two or three
    replicate draws whatever the number of keys."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.pooled = OffPolicyEvaluator(**settings)
        self.by_key: dict[str, OffPolicyEvaluator] = {}
        self.by_position: dict[int, OffPolicyEvaluator] = {}
        self.untracked = 0
        self.untracked_positions = 0

    def _part(self) -> OffPolicyEvaluator:
        # No running estimates (nothing plots them) for a key's or a position's share.
        return OffPolicyEvaluator(**self.settings, running_growth=math.inf)

    def add(self, d: LoggedDecision, probs: np.ndarray, predicted: np.ndarray) -> None:
        """Row ``d`` with the target's probabilities and the reward model's predictions for it:
        checked once and added to the pooled and the key's sums in one compiled call, then to
        its position's (slate rows only)."""
        e = self.key_part(d.model_key)
        self.pooled.add_also_to(
            e, d.action, d.propensity, d.reward, probs, predicted, d.slate_id, d.position
        )
        if d.position >= 0:
            self._add_position(d, probs, predicted)

    def key_part(self, key: str) -> OffPolicyEvaluator | None:
        """The evaluator of ``key``'s share of a row (:meth:`resolve`; None: the row is counted
        as untracked)."""
        e = self.resolve(key)
        if e is None:
            self.untracked += 1
        return e

    def resolve(self, key: str) -> OffPolicyEvaluator | None:
        """The evaluator of ``key``'s share of the rows, made for a new key (None past
        MAX_KEY_ESTIMATES keys: the same for every later row of the key)."""
        e = self.by_key.get(key)
        if e is None and len(self.by_key) < MAX_KEY_ESTIMATES:
            e = self.by_key[key] = self._part()
        return e

    def _add_position(self, d: LoggedDecision, probs: np.ndarray, predicted: np.ndarray) -> None:
        e = self.by_position.get(d.position)
        if e is None:
            if len(self.by_position) >= MAX_POSITION_ESTIMATES:
                self.untracked_positions += 1
                return
            e = self.by_position[d.position] = self._part()
        # No slate id: one position's rows are one slot of each slate, not slates (no cascade).
        e.add(
            action=d.action,
            propensity=d.propensity,
            reward=d.reward,
            target_probs=probs,
            predicted=predicted,
        )

    def by_key_estimates(self) -> dict[str, KeyEstimates]:
        return {
            k: KeyEstimates(e.estimates(), e.logging_value, e.n) for k, e in self.by_key.items()
        }

    def by_position_estimates(self) -> dict[int, KeyEstimates]:
        return {
            p: KeyEstimates(e.estimates(), e.logging_value, e.n)
            for p, e in sorted(self.by_position.items())
        }


class _RewardModels:
    """The per-key ridge reward models of the direct and doubly robust estimators, one set for all
    targets: each target hands every used row of a key to its key's model in log order (possibly
    later than other targets, when it holds records back), so every target's models would be the
    same. The first target to reach a row has the model predict and learn; the others take the
    predictions made then, kept until the last of them has."""

    def __init__(self, targets: int, reward_range: tuple[float, float] | None = None) -> None:
        self.targets = targets
        self.reward_range = reward_range  # the models predict inside it (RidgeRewardModel)
        self.models: dict[str, RidgeRewardModel] = {}
        self.pending: dict[str, list] = {}  # event id -> [predictions, targets still to take them]

    def predicted(self, d: LoggedDecision) -> np.ndarray:
        """The reward model's predictions for ``d``'s arms, made before it learns ``d``."""
        made = self.made(d)
        if made is not None:
            return made
        predicted = self.model(d).predict_then_learn(d.features, d.action, d.reward)
        self.keep(d, predicted)
        return predicted

    def made(self, d: LoggedDecision) -> np.ndarray | None:
        """The predictions another target had made for ``d`` (None: ``d``'s model is to predict
        and learn now)."""
        entry = self.pending.get(d.event_id) if self.pending else None
        if entry is None:
            return None
        entry[1] -= 1
        if not entry[1]:
            del self.pending[d.event_id]
        return entry[0]

    def model(self, d: LoggedDecision) -> RidgeRewardModel:
        model = self.models.get(d.model_key)
        if model is None:
            model = self.models[d.model_key] = RidgeRewardModel(
                d.features.shape[1], reward_range=self.reward_range
            )
        return model

    def keep(self, d: LoggedDecision, predicted: np.ndarray, taken: int = 1) -> None:
        """Hold ``d``'s fresh predictions for the targets other than the ``taken`` that have
        them."""
        if self.targets > taken:
            self.pending[d.event_id] = [predicted, self.targets - taken]


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

    __slots__ = (
        "key",
        "spec",
        "policy",
        "applied",
        "seen",
        "waiting",
        "updates",
        "scored",
        "rewards_ok",
        "row_kernel",
    )

    def __init__(self, key: str, spec: ModelSpec, state: dict[str, Any] | None = None) -> None:
        self.key = key
        self.spec = spec
        self.policy: Policy = spec.build()
        if state is not None:
            self.policy.load_state_dict(state)  # raises if the state is of another configuration
        self.applied = 0  # logged updates processed (applied to the target or rejected)
        self.seen = 0  # logged records seen (the next record's update index)
        self.waiting: dict[int, list[_Rec]] = {}  # version -> records to decide at that version
        self.updates: collections.deque[_Rec] = (
            collections.deque()
        )  # seen, not yet applied, log order
        # Scores of read-only arm arrays (rows sharing one, as OBD's rows of the same user do)
        # under the current state: a policy's scores are a function of its state and the arms.
        self.scored: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # Rewards the policy accepted (its rule depends on the value alone): 0/1 clicks are
        # checked once.
        self.rewards_ok: set[float] = set()
        # A linear UCB learner: its rows are decided, learnt from and summed in one compiled call
        # with the other targets' of the key (_KeyTargets).
        self.row_kernel = isinstance(self.policy, LinearUCBPolicy)

    def scores(self, arms: np.ndarray) -> np.ndarray:
        """``policy.scores(arms)`` for a read-only ``arms``, computed once per state."""
        hit = self.scored.get(id(arms))
        if hit is not None and hit[0] is arms:  # the entry holds arms: its id is not reused
            return hit[1]
        scores = self.policy.scores(arms)
        if len(self.scored) >= _SCORED_MAX:
            self.scored.clear()
        self.scored[id(arms)] = (arms, scores)
        return scores


class _ModelReplayer:
    """A streambandit configuration as the target: it decides (and learns) row by row."""

    def __init__(
        self,
        target: Target,
        max_lag: int,
        evaluators: _Evaluators,
        reward_range,
        reward_models: _RewardModels,
    ) -> None:
        assert target.models is not None
        self.target = target
        self.reward_models = reward_models
        self.config = target.models
        self.max_lag = max_lag
        self.evaluators = evaluators
        self.reward_range = reward_range
        self.models: dict[str, _Model] = {}
        self.decisions: dict[str, int] = {}
        self.matched = 0
        self.events = 0
        self.off_version = 0
        self._ready: dict[int, _Rec] = {}
        self._next_emit = 0

    # -- per record ----------------------------------------------------------------------------

    def check(self, d: LoggedDecision) -> _Model:
        """The target model of ``d``'s key, once ``d`` is known to fit it; nothing is kept for a
        decision that does not (a LogError), so a row refused by another target leaves no trace."""
        m = self.models.get(d.model_key)
        spec = m.spec if m is not None else self.config.resolve(d.model_key)
        if spec is None:
            raise LogError(
                f"{d.where}: no configuration matches model key {d.model_key!r}", "model_key"
            )
        if d.features.shape[1] != spec.dim:
            raise LogError(
                f"{d.where}: features have dimension {d.features.shape[1]}, model "
                f"{d.model_key!r} expects {spec.dim}",
                "features",
            )
        if m is None:
            states = self.target.states
            try:
                m = _Model(
                    d.model_key, spec, states.get(d.model_key) if states is not None else None
                )
            except (
                ValueError
            ) as exc:  # a loaded state of another configuration: the whole target is wrong
                raise ValueError(
                    f"target {self.target.name!r}: the state of model {d.model_key!r} does not fit "
                    f"its configuration: {exc}"
                ) from None
        if d.reward not in m.rewards_ok:
            try:
                m.policy.validate_reward(d.reward)
            except ValueError as exc:
                raise LogError(
                    f"{d.where}: reward {d.reward!r} not accepted by model {d.model_key!r} "
                    f"({spec.policy}): {exc}",
                    "reward",
                ) from None
            if len(m.rewards_ok) < _REWARDS_OK_MAX:
                m.rewards_ok.add(d.reward)
        return m

    def add(self, d: LoggedDecision, m: _Model) -> None:
        self.models[d.model_key] = m
        v = d.decision_version
        if v < 0 and self._next_emit == self.events and not (m.updates or m.waiting):
            # Decided and learnt from at once, and every earlier record is with the evaluator:
            # the path of _decide, _apply and the in-order hand-over without the bookkeeping.
            self._next_emit = self.events = self.events + 1
            m.seen += 1
            choice, probs = self._choose(m, d)
            self.decisions[d.event_id] = choice
            self.evaluators.add(d, probs, self._learn(m, d, choice))
            return
        self.decisions[d.event_id] = -1  # its choice is set when it is decided
        rec = _Rec(self.events, d)
        self.events += 1
        if v is None or v < 0:
            if m.waiting or m.updates:
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

    def _choose(self, m: _Model, d: LoggedDecision) -> tuple[int, np.ndarray]:
        """The target's choice for ``d`` and its probabilities over the arms."""
        spec = m.spec
        f = d.features
        try:
            if f.flags.writeable:
                scores = m.policy.scores(f)
            else:
                scores = m.scores(f)
        except ValueError as exc:
            raise LogError(f"{d.where}: {exc}", "features") from None
        if d.position <= 0:
            return choice_with_probabilities(
                scores,
                epsilon=spec.epsilon,
                model_key=d.model_key,
                event_id=d.event_id,
                seed=spec.seed,
            )
        # The worker's rule on the same score vector the target distribution is computed from.
        dec, probs = choose_with_probabilities(
            scores,
            epsilon=spec.epsilon,
            model_key=d.model_key,
            event_id=d.event_id,
            seed=spec.seed,
            position=d.position,
        )
        return dec.index, probs

    def _learn(self, m: _Model, d: LoggedDecision, choice: int) -> np.ndarray:
        """The logged update of ``d``: the target learns if it chose the logged action; the
        reward model always learns. Returns the reward model's predictions made before."""
        predicted = self.reward_models.predicted(d)
        if choice == d.action:
            if self.target.learn:
                m.policy.update(d.features[d.action], d.reward)
                m.scored.clear()
            self.matched += 1
        m.applied += 1
        return predicted

    def _decide(self, m: _Model, rec: _Rec) -> None:
        rec.choice, rec.probs = self._choose(m, rec.d)
        self.decisions[rec.d.event_id] = rec.choice

    def _apply(self, m: _Model, rec: _Rec) -> None:
        """The logged update of ``rec`` (:meth:`_learn`), then the record to the evaluator in
        log order."""
        d = rec.d
        if rec.choice is None:  # cannot happen: a record's version is at most its update index
            raise AssertionError(f"event {d.event_id!r} updated before it was decided")
        rec.predicted = self._learn(m, d, rec.choice)
        if (
            rec.seq == self._next_emit and not self._ready
        ):  # in log order already (no versions held back)
            self._next_emit += 1
            self.evaluators.add(d, rec.probs, rec.predicted)
            rec.probs = rec.predicted = None
            return
        self._ready[rec.seq] = rec
        while self._next_emit in self._ready:
            r = self._ready.pop(self._next_emit)
            self._next_emit += 1
            self.evaluators.add(r.d, r.probs, r.predicted)
            r.probs = r.predicted = None

    def result_fields(self) -> dict[str, Any]:
        return {
            "models": {k: m.policy.state_dict() for k, m in self.models.items()},
            "policies": {k: m.spec.policy for k, m in self.models.items()},
            "decisions": self.decisions,
            "off_version": self.off_version,
        }


class _ExternalReplayer:
    """A policy from another system as the target: its probabilities for each row are given.
    Nothing learns but the per-key reward models of the direct and doubly robust estimators."""

    def __init__(
        self, target: Target, evaluators: _Evaluators, reward_models: _RewardModels
    ) -> None:
        self.target = target
        self.evaluators = evaluators
        self.reward_models = reward_models
        self.dims: dict[str, int] = {}  # model key -> the dimension of its first row
        self.events = 0
        self.matched = 0

    def check(self, d: LoggedDecision) -> np.ndarray:
        """The target's probabilities for ``d``'s arms (at its slot)."""
        name, given = self.target.name, self.target.probs
        if given is not None:
            probs = given.get(d.event_id)
            if probs is None:
                raise LogError(
                    f"{d.where}: target {name!r} has no probabilities for this event", "target"
                )
            k = len(d.arm_ids)
            if probs.shape != (k,):
                raise LogError(
                    f"{d.where}: target {name!r} gives {probs.shape[0]} probabilities for {k} arms",
                    "target",
                )
        else:
            probs = next((p for n, p in d.external if n == name), None)
            if probs is None:
                raise LogError(
                    f"{d.where}: no probabilities of target {name!r} in this row", "target"
                )
        dim = self.dims.get(d.model_key)
        if dim is not None and dim != d.features.shape[1]:
            raise LogError(
                f"{d.where}: features have dimension {d.features.shape[1]}, earlier rows of model key "
                f"{d.model_key!r} had {dim}",
                "features",
            )
        return probs

    def add(self, d: LoggedDecision, probs: np.ndarray) -> None:
        self.dims.setdefault(d.model_key, d.features.shape[1])
        predicted = self.reward_models.predicted(d)
        self.events += 1
        self.matched += bool(probs[d.action] > 0.0)
        self.evaluators.add(d, probs, predicted)

    def finish(self) -> None:
        pass

    def result_fields(self) -> dict[str, Any]:
        return {
            "models": {},
            "policies": {k: "external" for k in self.dims},
            "decisions": {},
            "off_version": 0,
        }


class _KeyTargets:
    """The linear UCB models of one model key, one per target that has one: a row of the key is
    decided, learnt from and summed for all of them in one compiled call
    (``row_kernel.decide_and_sum_targets``: the compiled steps of the per-call path on the same
    arrays, so the same bits), then each target's own update. The other targets of the row
    (external ones, other learners) take their own path.

    A row takes this path when it is next in every member's log order with nothing held back
    (no decision version, and every earlier record applied), at no slate position, with arms of
    its own (a writeable float64 array; rows sharing a read-only one are scored once per model
    state by ``_Model.scores``). Other rows take the per-call path."""

    __slots__ = (
        "key",
        "members",
        "rest",
        "dim",
        "rewards_ok",
        "seeds",
        "reward_models",
        "reward_model",
        "args",
        "book",
        "given",
        "probs",
        "out",
    )

    def __init__(
        self,
        key: str,
        runs: list[_ModelReplayer | _ExternalReplayer],
        fits: list,
        reward_models: _RewardModels,
    ) -> None:
        """From the first row of ``key`` that every target accepted (``fits``: their checks'
        results): its models are the targets' models of the key from now on."""
        self.key = key
        self.members: list[tuple[_ModelReplayer, _Model]] = []
        self.rest: list[tuple[int, _ModelReplayer | _ExternalReplayer]] = []  # (index in runs, run)
        for j, (r, fit) in enumerate(zip(runs, fits)):
            if isinstance(r, _ModelReplayer):
                r.models[key] = fit
                if fit.row_kernel:
                    self.members.append((r, fit))
                    continue
            self.rest.append((j, r))
        self.dim = self.members[0][1].spec.dim if self.members else 0
        self.rewards_ok: set[float] = set()  # rewards every member accepted
        self.seeds = sorted({m.spec.seed for _, m in self.members if m.spec.epsilon > 0.0})
        self.reward_models = reward_models
        self.reward_model: RidgeRewardModel | None = None
        self.args: tuple | None = None  # the compiled call's targets, made at the first row taken
        # Per member: its decisions, run, model, update (None: frozen), pooled and key evaluators.
        self.book: list[tuple] = []
        self.given = (0.0, 0.0, 0.0)  # the evaluators' clip (0: none) and reward range
        # The compiled call's outputs that are read before the next row: reused.
        self.probs = self.out = np.empty((0, 0))

    def takes(self, d: LoggedDecision, clean: bool) -> bool:
        """Whether ``d`` takes this path (class docstring); ``clean``: no record of the log has
        been held back yet, so every target is ready for it."""
        f = d.features
        return (
            bool(self.members)
            and d.decision_version < 0
            and d.position < 0
            and f.flags.writeable
            and f.dtype is _F64
            and (
                clean
                or all(
                    r._next_emit == r.events and not (m.updates or m.waiting)
                    for r, m in self.members
                )
            )
        )

    def check(self, d: LoggedDecision) -> None:
        """The members' ``check``: done once per dimension and reward value."""
        if d.features.shape[1] != self.dim or d.reward not in self.rewards_ok:
            for r, _ in self.members:
                r.check(d)
            if len(self.rewards_ok) < _REWARDS_OK_MAX:
                self.rewards_ok.add(d.reward)

    def _prepare(self, d: LoggedDecision) -> None:
        targets, book = [], []
        for r, m in self.members:
            pooled, part = r.evaluators.pooled, r.evaluators.resolve(self.key)
            spec = m.spec
            epsilon = float(spec.epsilon)
            slot = 1 + self.seeds.index(spec.seed) if epsilon > 0.0 else 0
            theta, inv, scalars, count, i, kind, params = m.policy.kernel_row()
            targets.append(
                (theta, inv, scalars, count, int(i), int(kind), params, epsilon, slot)
                + (pooled.sums, pooled.key_sums(part))
            )
            update = m.policy.update if r.target.learn else None
            book.append((r.decisions, r, m, update, pooled, part))
        self.args, self.book = tuple(targets), book
        self.out = np.empty((len(book), 5))
        pooled = book[0][4]
        self.given = (pooled.clip or 0.0, *pooled.given)
        self.reward_model = self.reward_models.model(d)

    def add(self, d: LoggedDecision) -> None:
        """Row ``d`` (:meth:`takes` it, every target accepted it) for every member."""
        if self.args is None:
            self._prepare(d)
        f, key, eid = d.features, self.key, d.event_id
        k, n = f.shape[0], len(self.book)
        probs, out, predicted = self.probs, self.out, np.empty(k)
        if probs.shape[1] != k:
            probs = self.probs = np.empty((n, k))
        digests = (NO_DRAW, *[event_seed(key, eid, seed) for seed in self.seeds])
        action, p, r = d.action, float(d.propensity), float(d.reward)
        model = self.reward_model
        status, j = row_kernel.decide_and_sum_targets(
            f, self.args, digests, probs, *model.kernel_state(), predicted, action, p, r,
            *self.given, out,
        )  # fmt: skip
        if status != row_kernel.ROW_OK:
            run, m = self.members[j]
            if status == row_kernel.ARMS_REFUSED:
                run._choose(m, d)  # raises the refusal of these features, as the other path does
                raise AssertionError(
                    f"{d.where}: features refused by one scoring and not the other"
                )
            raise_for_terms(status, action, p, r, probs[j], predicted)
        model.learnt(r)
        self.reward_models.keep(d, predicted, taken=n)
        for (decisions, run, m, update, pooled, part), (choice, w, pa, dm, qa) in zip(
            self.book, out.tolist()
        ):
            choice = int(choice)
            decisions[eid] = choice
            if choice == action:
                if update is not None:
                    update(f[action], r)
                    m.scored.clear()
                run.matched += 1
            m.seen += 1
            m.applied += 1
            run._next_emit = run.events = run.events + 1
            pooled.sums_added(part, w, pa, p, r, dm, qa)
            if part is None:
                run.evaluators.untracked += 1


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
    learn: bool = True,
    states: Mapping[str, dict[str, Any]] | None = None,
) -> ReplayResult:
    """Replay ``decisions`` (in log order) through the target configuration ``models``.

    ``progress(n)`` is called every :data:`PROGRESS_EVERY` events and at the end. ``counts``: the
    dict a reader of :mod:`streambandit.replay.files` filled while ``decisions`` was consumed
    (``skipped``, ``skipped_<reason>``); its skipped rows are reported in the result.
    ``skip_bad``: a decision the target configuration cannot use (no model for its key, another
    dimension, a reward its link or ``reward_range`` refuses, an event id seen before) is skipped
    and counted in ``counts`` the same way, instead of raising :class:`LogError`.
    ``reward_range``, ``bootstrap`` and ``confidence`` choose the intervals
    (:class:`~streambandit.replay.estimators.OffPolicyEvaluator`); ``learn`` and ``states``: see
    :class:`Target`.
    """
    target = Target("target", models, learn=learn, states=states)
    return replay_targets(
        decisions,
        [target],
        clip=clip,
        progress=progress,
        max_lag=max_lag,
        counts=counts,
        skip_bad=skip_bad,
        reward_range=reward_range,
        bootstrap=bootstrap,
        confidence=confidence,
    )["target"]


def replay_targets(
    decisions: Iterable[LoggedDecision],
    targets: list[Target],
    *,
    clip: float | None = None,
    progress: Callable[[int], None] | None = None,
    max_lag: int = DEFAULT_MAX_LAG,
    counts: dict[str, int] | None = None,
    skip_bad: bool = False,
    reward_range: tuple[float, float] | None = None,
    bootstrap: int = 0,
    confidence: float = 0.95,
) -> dict[str, ReplayResult]:
    """:func:`replay` of several targets in one pass over ``decisions``: target name -> result,
    in the order given. Every target sees the same rows (module docstring)."""
    if max_lag < 0:
        raise ValueError(f"max_lag must be >= 0, got {max_lag!r}")
    names = [t.name for t in targets]
    if not targets or len(set(names)) != len(names):
        raise ValueError(f"replay needs at least one target, each with its own name; got {names}")
    start = time.perf_counter()
    settings = {
        "clip": clip,
        "reward_range": reward_range,
        "bootstrap": bootstrap,
        "confidence": confidence,
    }
    OffPolicyEvaluator(**settings)  # refuses bad settings before the log is read
    reward_models = _RewardModels(len(targets), reward_range)
    runs: list[_ModelReplayer | _ExternalReplayer] = [
        _ModelReplayer(t, max_lag, _Evaluators(settings), reward_range, reward_models)
        if t.models is not None
        else _ExternalReplayer(t, _Evaluators(settings), reward_models)
        for t in targets
    ]
    seen: set[str] = set()
    events = 0
    counts = {} if counts is None else counts
    by_key: dict[str, _KeyTargets] = {}
    clean = True  # no record held back yet (none had a decision version)
    for d in decisions:
        group = by_key.get(d.model_key)
        fused = group is not None and group.takes(d, clean)
        try:
            if d.event_id in seen:
                raise LogError(
                    f"{d.where}: duplicate event id: an earlier decision of the log has it (a row written "
                    "twice, or ids reused)",
                    "duplicate",
                )
            if reward_range is not None and not reward_range[0] <= d.reward <= reward_range[1]:
                raise LogError(
                    f"{d.where}: reward {d.reward!r} outside --reward-range "
                    f"[{reward_range[0]:g}, {reward_range[1]:g}]",
                    "reward",
                )
            # Every target first: a row is used by all or by none.
            if fused:
                group.check(d)
                fits = [r.check(d) for _, r in group.rest]
            else:
                fits = [r.check(d) for r in runs]
        except LogError as err:
            if not skip_bad:
                raise
            counts["skipped"] = counts.get("skipped", 0) + 1
            counts[f"skipped_{err.reason}"] = counts.get(f"skipped_{err.reason}", 0) + 1
            continue
        seen.add(d.event_id)
        if group is None:  # the key's first row
            group = by_key[d.model_key] = _KeyTargets(d.model_key, runs, fits, reward_models)
            fused = group.takes(d, clean)
            if fused:
                fits = [fits[j] for j, _ in group.rest]
        if fused:
            group.add(d)
            for (_, r), fit in zip(group.rest, fits):
                r.add(d, fit)
        else:
            for r, fit in zip(runs, fits):
                r.add(d, fit)
            clean = clean and d.decision_version < 0
        events += 1
        if progress is not None and events % PROGRESS_EVERY == 0:
            progress(events)
    for r in runs:
        r.finish()
    assert not reward_models.pending  # every prediction kept for other targets was taken
    if progress is not None:
        progress(events)
    skipped = counts.get("skipped", 0)
    by_reason = {k[len("skipped_") :]: v for k, v in counts.items() if k.startswith("skipped_")}
    seconds = time.perf_counter() - start
    results = {}
    for t, r in zip(targets, runs):
        ev = r.evaluators.pooled
        warnings = ev.warnings()
        if t.kind == "learning" and r.matched:
            warnings.append(LEARNING_NOTE)
        if r.evaluators.untracked:
            warnings.append(
                f"estimates per model key for the first {MAX_KEY_ESTIMATES} keys only; "
                f"{r.evaluators.untracked} events of later keys are in the pooled estimates alone"
            )
        if r.evaluators.untracked_positions:
            warnings.append(
                f"estimates per position for the first {MAX_POSITION_ESTIMATES} positions seen only; "
                f"{r.evaluators.untracked_positions} slate rows at later positions are in the pooled "
                "estimates alone"
            )
        results[t.name] = ReplayResult(
            warnings=warnings,
            estimates=list(ev.estimates()),
            logging_value=ev.logging_value,
            reward_range=ev.ends,
            events=r.events,
            matched=r.matched,
            running=ev.running(),
            skipped=int(skipped),
            skipped_by_reason=dict(by_reason),
            seconds=seconds,
            target=t.name,
            kind=t.kind,
            by_key=r.evaluators.by_key_estimates(),
            keys_without_estimates=r.evaluators.untracked,
            by_position=r.evaluators.by_position_estimates(),
            positions_without_estimates=r.evaluators.untracked_positions,
            **r.result_fields(),
        )
    return results
