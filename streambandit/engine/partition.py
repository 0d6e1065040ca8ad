"""The decision and join engine of one partition: pure, deterministic, no I/O.

It consumes decoded events in merge order (see ``merge.py``) and returns the records to publish:
one action per accepted context, one joined record per applied update, and a dead-letter reason
for anything it refuses. The Kafka worker, replay and the tests drive the same object.

Rules (docs/design.md: data flow, invariants 4, 6 and 8):
- Event time drives the join. The watermark is the largest event timestamp seen in the partition;
  before a record is handled, every decision whose window ``[t_decision, t_decision + window)``
  the watermark has closed is joined: with its aggregated reward if any arrived, else with the
  model's default reward (``reward_observed = False``). ``advance_to`` moves the watermark for an
  idle partition.
- ``aggregation = "first"`` applies the update when the first reward arrives (and refuses later
  ones as ``duplicate_reward``); ``"sum"`` and ``"last"`` accumulate until the window closes.
- A reward whose context has not been seen is held as an early reward until its own timestamp
  plus the window has passed; then it is dead-lettered as ``unknown_event``.
- Bounded memory: at most ``max_pending`` open decisions (the oldest is joined early with what it
  has, or the default reward) and ``max_early_rewards`` early rewards (the oldest is dead-lettered);
  recently joined event ids are remembered (``max_recent``) to tell a late reward from an unknown
  one. Nothing is dropped without a record.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from streambandit.config.models import ModelsConfig, ModelSpec
from streambandit.engine import admission
from streambandit.engine.admission import Refusal
from streambandit.engine.decision import decide
from streambandit.errors import StreambanditError
from streambandit.policies.base import Policy
from streambandit.policies.state_blocks import layers_of, model_states
from streambandit.reasons import (
    DUPLICATE_REWARD,
    LATE_REWARD,
    MODEL_KEY_MISMATCH,
    UNKNOWN_EVENT,
    UPDATE_FAILED,
)
from streambandit.wire import (
    NO_TRIGGER,
    Action,
    Context,
    InputRef,
    Joined,
    ReplicaDecision,
    Reward,
    Tick,
)

__all__ = ["Context", "Reward", "Action", "Joined", "Rejected", "PartitionEngine", "RecoveryError"]


class RecoveryError(StreambanditError, RuntimeError):
    """The logs after a snapshot do not fit the snapshot: the worker must not continue from it."""


@dataclasses.dataclass(slots=True)
class Rejected:
    """A record the engine refused; the worker dead-letters ``source`` (its original bytes and
    position) with this reason."""

    reason: str
    detail: str
    source: Any


_ACTION_FIELDS = tuple(f.name for f in dataclasses.fields(Action))

# _open and _close build their Action and Joined, and the _Pending of each decision, as an
# object.__new__ whose fields they set one by one: a dataclass's __init__ is one Python frame more
# per record, once per event on the worker's hot path (the engine stage of bench.worker_path).
# The same objects, provided the fields set are the class's: checked here, once.
_new = object.__new__
_BUILT_FIELDS = {
    Action: (
        "event_id",
        "model_key",
        "arm_id",
        "arm_index",
        "score",
        "propensity",
        "model_version",
        "decision_timestamp_ms",
        "features",
        "trigger_source",
        "trigger_offset",
    ),
    Joined: (
        "event_id",
        "model_key",
        "features",
        "reward",
        "reward_observed",
        "propensity",
        "decision_timestamp_ms",
        "join_timestamp_ms",
        "model_version_before",
        "trigger_source",
        "trigger_offset",
    ),
}


@dataclasses.dataclass(slots=True)
class _Pending:
    action: Action
    deadline_ms: int
    reward: float | None = None
    n_rewards: int = 0
    # The sequence number of the deadline this decision set: the one deadline that closes it (an
    # earlier decision of the same event id, closed early, may have left one of the same time).
    seq: int = 0


_BUILT_FIELDS[_Pending] = ("action", "deadline_ms", "reward", "n_rewards", "seq")
for _cls, _names in _BUILT_FIELDS.items():
    if tuple(f.name for f in dataclasses.fields(_cls)) != _names or _cls.__slots__ != _names:
        raise RuntimeError(f"engine/partition.py builds {_cls.__name__} with fields {_names}")


class _Counts(collections.Counter):
    """The engine's counters: a Counter whose item assignment is dict's own. Counter's
    ``__delitem__`` (which ignores a missing key) makes Python dispatch every item assignment of a
    Counter, ``counters[name] += 1`` included, through a method call: several per event on the
    worker's hot path (the engine stage of bench.worker_path). Deleting a missing key raises
    KeyError here, as from a dict; nothing deletes from the engine's counters."""

    __delitem__ = dict.__delitem__


class PartitionEngine:
    """Models, open decisions and early rewards of one partition."""

    def __init__(
        self,
        config: ModelsConfig,
        *,
        max_pending: int = 100_000,
        max_early_rewards: int = 10_000,
        max_recent: int = 100_000,
        max_id_bytes: int = 1024,
        max_event_time_ahead_ms: int = 3_600_000,
        max_models: int | None = None,
    ) -> None:
        self.config = config
        self.max_pending, self.max_early_rewards, self.max_recent = (
            max_pending,
            max_early_rewards,
            max_recent,
        )
        # Bounds on what a client controls, applied by the admission rule (engine/admission.py).
        self.max_id_bytes, self.max_event_time_ahead_ms = max_id_bytes, max_event_time_ahead_ms
        self.max_models = max_models  # None: no bound
        self.models: dict[str, Policy] = {}
        self._specs: dict[
            str, ModelSpec
        ] = {}  # spec_of's cache: keys with a model (bounded like models)
        self.pending: dict[str, _Pending] = {}  # insertion order = decision order
        self.early: dict[str, list[tuple[Reward, Any]]] = {}
        # The number of rewards ``early`` holds, kept as it changes: summing the lists per early
        # reward made each one cost O(max_early_rewards) once the store filled (140 us at 10,000
        # held), a rate any client sending rewards for unknown ids could impose.
        self._n_early = 0
        self.recent: collections.OrderedDict[str, bool] = (
            collections.OrderedDict()
        )  # joined id -> observed
        self.watermark_ms = -(2**63)
        # The deadlines of open decisions and early rewards, (deadline, seq, kind, event_id), taken
        # in (deadline, seq) order. Event time is mostly in order, so most deadlines come no
        # earlier than the one pushed before them: those go to a run (a deque, sorted as pushed),
        # the others to a heap, and the next deadline is the smaller of the two heads: the same
        # order as one heap of all of them, without a heap push and pop per decision (the engine
        # stage of bench.worker_path).
        self._deadlines: list[tuple[int, int, str, str]] = []  # the heap
        self._run: collections.deque[tuple[int, int, str, str]] = collections.deque()
        self._next_deadline: float = math.inf  # the smallest deadline held (inf: none)
        self._seq = 0
        # What this object did since it was built or restored, as a process's metrics count: not
        # state. A restore starts them at zero (they are in a snapshot for diagnostics only), so
        # a recovered engine never reports, as its own, counts that recovery then adds again.
        self.counters: collections.Counter[str] = _Counts()
        # Updates applied by this object (live or re-applied in recovery), for the worker's snapshot
        # trigger: the sum of the models' n_updates would be a walk over every model per batch.
        self.updates = 0
        # Keys of the models created or updated since the last take_changed(): what an increment
        # snapshot holds (its size follows the rate of change, not the number of models).
        self.changed: set[str] = set()
        # Ids joined since the last take_changed() (counted at the take for the increment after
        # it): an increment carries the tail of ``recent`` they make, not all of it.
        self._recent_added = 0
        self._recent_tail = 0

    # -- entry points --------------------------------------------------------------------------

    def on_context(
        self, ev: Context, source: Any = None, *, scores: list[np.ndarray] | None = None
    ) -> list[Action | Joined | Rejected]:
        """Decide a context. With ``scores`` (a list), every arm's score of the decision is
        appended to it (``decision.decide``): what an in-process caller returns with the
        decision, scored once."""
        # The worker's hot path (once per context): the rules as stated in the module docstring,
        # in as few Python frames as they allow (each costs about as much as a check:
        # bench/results/worker_path.md has the engine's cost per event).
        if type(source) is InputRef:
            record_ms, trigger = source.timestamp_ms, source
        else:
            record_ms, trigger = getattr(source, "timestamp_ms", 0), _trigger_of(source)
        refusal = admission.record_refusal(
            ev, record_ms, self.max_event_time_ahead_ms, self.max_id_bytes
        )
        if refusal is not None:
            return [self._refused(refusal, source)]
        # _admit, with the model's spec from spec_of's cache when it has one.
        ts, key = ev.timestamp_ms, ev.model_key
        if ts > self.watermark_ms:
            self.watermark_ms = ts
        # _advance only when a window closes: most contexts close none
        out = self._advance(ts, trigger) if self._next_deadline <= self.watermark_ms else []
        spec = self._specs.get(key)
        model = self.models.get(key)
        if spec is None or model is None:
            out, spec, model = self._admit_model(ev, source, out)
            if model is None:
                return out
        elif refusal := admission.context_refusal(
            key, ev.arm_ids, ev.features, spec
        ) or admission.decided_before(ev.event_id, self.pending, self.recent):
            out.append(self._refused(refusal, source))
            return out
        try:
            if spec.epsilon <= 0.0 and scores is None:  # decide's choice without exploration
                index, score, version = model.best_versioned(ev.features)
                propensity = 1.0
            else:
                version = model.n_updates
                d = decide(
                    model,
                    ev.features,
                    epsilon=spec.epsilon,
                    model_key=key,
                    event_id=ev.event_id,
                    seed=spec.seed,
                    scores=scores,
                )
                index, score, propensity = d.index, d.score, d.propensity
        except ValueError as exc:
            out.append(self._refused(admission.learner_refusal(exc, ev.features), source))
            return out
        return self._open(ev, spec, index, score, propensity, version, out, source, trigger)

    def on_decision(
        self, ev: ReplicaDecision, source: Any = None
    ) -> list[Action | Joined | Rejected]:
        """A decision a replica made and logged (a learn-only worker's input): checked as a
        context is, then opened as the decision the record names, not one this engine makes. Its
        action carries the replica's model version; the joined record, this engine's."""
        if refused := self._refuse(ev, source):
            return refused
        trigger = _trigger_of(source)
        out, spec, model = self._admit(ev, source, trigger)
        if model is None:
            return out
        if refusal := admission.feature_values_refusal(ev.features):
            return out + [self._refused(refusal, source)]
        return self._open(
            ev, spec, ev.arm_index, ev.score, ev.propensity, ev.model_version, out, source, trigger
        )

    def _admit(
        self, ev: Context | ReplicaDecision, source: Any, trigger: InputRef
    ) -> tuple[list, ModelSpec | None, Policy | None]:
        """Move event time to the context's, then apply the admission rule's checks of the model:
        a configured model key, distinct arm ids, the model's dimension, a new event id, room for
        a new model. ``(outputs so far, spec, model)``, the model None when the context is
        refused (its refusal is then the last output)."""
        ts = ev.timestamp_ms
        if ts > self.watermark_ms:
            self.watermark_ms = ts
        # _advance only when a window closes: most contexts close none
        out = self._advance(ts, trigger) if self._next_deadline <= self.watermark_ms else []
        return self._admit_model(ev, source, out)

    def _admit_model(
        self, ev: Context | ReplicaDecision, source: Any, out: list
    ) -> tuple[list, ModelSpec | None, Policy | None]:
        """:meth:`_admit`'s checks of the model, after event time moved (``out``: what that
        closed)."""
        key = ev.model_key
        spec = self.spec_of(key)
        refusal = admission.context_refusal(
            key, ev.arm_ids, ev.features, spec
        ) or admission.decided_before(ev.event_id, self.pending, self.recent)
        model = self.models.get(key)
        if model is None and refusal is None:
            refusal = admission.model_room_refusal(key, self.models, self.max_models)
        if refusal is not None:
            return out + [self._refused(refusal, source)], None, None
        if model is None:
            model = self._add_model(key, spec.build())
            self.changed.add(key)
        return out, spec, model

    def _add_model(self, key: str, model: Policy) -> Policy:
        """Hold ``model`` as the model of ``key`` (every model the engine makes or restores comes
        through here: engine/array_partition.py keeps an index of them)."""
        self.models[key] = model
        return model

    def _open(
        self,
        ev: Context | ReplicaDecision,
        spec: ModelSpec,
        index: int,
        score: float,
        propensity: float,
        version: int,
        out: list,
        source: Any,
        trigger: InputRef,
    ) -> list[Action | Joined | Rejected]:
        """Publish the decision on arm ``index`` and hold it open for its reward window."""
        ts, event_id, pending = ev.timestamp_ms, ev.event_id, self.pending
        arm_id = ev.arm_ids[index]
        if refusal := admission.id_refusal("chosen arm's id", arm_id, self.max_id_bytes):
            return out + [self._refused(refusal, source)]
        action = _new(Action)  # Action(event_id, ..., *trigger): see _BUILT_FIELDS
        action.event_id = event_id
        action.model_key = ev.model_key
        action.arm_id = arm_id
        action.arm_index = index
        action.score = score
        action.propensity = propensity
        action.model_version = version
        action.decision_timestamp_ms = ts
        action.features = ev.features[index].copy()
        action.trigger_source = trigger.source
        action.trigger_offset = trigger.offset
        out.append(action)
        self.counters["actions"] += 1
        if len(pending) >= self.max_pending:
            oldest = next(iter(pending))
            self.counters["evicted_pending"] += 1
            self._close(oldest, ts, trigger, out)
        deadline = ts + spec.reward_window_ms
        # _push_deadline, inlined on this path
        self._seq = seq = self._seq + 1
        p = _new(_Pending)  # _Pending(action, deadline, seq=seq)
        p.action, p.deadline_ms, p.reward, p.n_rewards, p.seq = action, deadline, None, 0, seq
        pending[event_id] = p
        run = self._run
        if not run or deadline >= run[-1][0]:
            run.append((deadline, seq, "decision", event_id))
        else:
            heapq.heappush(self._deadlines, (deadline, seq, "decision", event_id))
        if deadline < self._next_deadline:
            self._next_deadline = deadline
        if self.early and event_id in self.early:
            self._take_early(event_id, ts, trigger, out)
        # A context that arrives after its own window closed (the watermark is past it) is decided
        # and then joined at once, rather than whenever the next record happens to come.
        if self._next_deadline <= self.watermark_ms:
            out += self._advance(self.watermark_ms, trigger)
        return out

    def on_reward(self, ev: Reward, source: Any = None) -> list[Action | Joined | Rejected]:
        # The worker's hot path (once per reward), in as few frames as on_context.
        if type(source) is InputRef:
            record_ms, trigger = source.timestamp_ms, source
        else:
            record_ms, trigger = getattr(source, "timestamp_ms", 0), _trigger_of(source)
        refusal = admission.record_refusal(
            ev, record_ms, self.max_event_time_ahead_ms, self.max_id_bytes
        )
        if refusal is not None:
            return [self._refused(refusal, source)]
        ts = ev.timestamp_ms
        if ts > self.watermark_ms:
            self.watermark_ms = ts
        # _advance only when a window closes
        out = self._advance(ts, trigger) if self._next_deadline <= self.watermark_ms else []
        if ev.event_id in self.pending:
            return self._accept_reward(ev, source, ts, trigger, out)
        if ev.event_id in self.recent:
            observed = self.recent[ev.event_id]
            reason = DUPLICATE_REWARD if observed else LATE_REWARD
            return out + [
                self._reject(
                    reason,
                    f"event {ev.event_id!r} was already joined "
                    f"({'with a reward' if observed else 'with the default reward'})",
                    source,
                )
            ]
        spec = self.spec_of(ev.model_key)
        if spec is None:
            return out + [self._refused(admission.unknown_model_refusal(ev.model_key), source)]
        # Early: the context may still come. Keep it until its own window has passed.
        if self._n_early >= self.max_early_rewards:
            out += self._expire_oldest_early()
        self._hold_early(ev, source)
        self._n_early += 1
        self._push_deadline(ev.timestamp_ms + spec.reward_window_ms, "early", ev.event_id)
        self.counters["early_rewards"] += 1
        return out

    def on_tick(self, ev: Tick, source: Any = None) -> list[Joined | Rejected]:
        """A watermark tick read from the rewards log: :meth:`advance_to` its time, unless that is
        beyond the input bounds (a tick is a record like any other: a client can write one)."""
        if refused := self._refuse(ev, source):
            return refused
        return self.advance_to(ev.timestamp_ms, source)

    def advance_to(self, timestamp_ms: int, source: Any = None) -> list[Joined | Rejected]:
        """Move the watermark to ``timestamp_ms`` (if later) and close what it closes.

        ``source`` is the input record being processed; when it is an :class:`InputRef` every
        output records it as its trigger (readers use it to drop outputs of uncommitted batches)."""
        return self._advance(timestamp_ms, _trigger_of(source))

    def _advance(self, timestamp_ms: int, trigger: InputRef) -> list[Joined | Rejected]:
        if timestamp_ms > self.watermark_ms:
            self.watermark_ms = timestamp_ms
        out: list[Joined | Rejected] = []
        heap, run, watermark, pending = self._deadlines, self._run, self.watermark_ms, self.pending
        while True:
            # The smaller head of the run and the heap ((deadline, seq): seq is unique).
            if run and (not heap or run[0] < heap[0]):
                if run[0][0] > watermark:
                    break
                deadline, seq, kind, event_id = run.popleft()
            elif heap and heap[0][0] <= watermark:
                deadline, seq, kind, event_id = heapq.heappop(heap)
            else:
                break
            if kind == "decision":
                p = pending.get(event_id)
                if p is not None and p.seq == seq:  # not closed since, nor decided again
                    self._close(event_id, deadline, trigger, out)
            else:
                self._early_due(event_id, out)
        nxt = run[0][0] if run else math.inf
        if heap and heap[0][0] < nxt:
            nxt = heap[0][0]
        self._next_deadline = nxt
        return out

    # -- internals -----------------------------------------------------------------------------

    def _early_due(self, event_id: str, out: list) -> None:
        """An early reward's deadline passed: dead-letter the rewards for ``event_id`` whose
        window has passed (appended to ``out``), keep the younger ones."""
        held = self.early.get(event_id)
        if not held:
            return
        keep = []
        for reward, src in held:
            spec = self.spec_of(reward.model_key)
            if spec is None or reward.timestamp_ms + spec.reward_window_ms <= self.watermark_ms:
                out.append(
                    self._reject(
                        UNKNOWN_EVENT,
                        f"no decision for event {event_id!r} within the reward window",
                        src,
                    )
                )
            else:
                keep.append((reward, src))
        self._n_early -= len(held) - len(keep)
        if keep:
            self.early[event_id] = keep
        else:
            self._drop_early(event_id)

    def _take_early(self, event_id: str, ts: int, trigger: InputRef, out: list) -> None:
        """A decision just opened for ``event_id``: the rewards held for it, applied in order
        (outputs appended to ``out``)."""
        held = self._drop_early(event_id)
        self._n_early -= len(held)
        for reward, src in held:
            if event_id in self.pending:
                self._accept_reward(reward, src, ts, trigger, out)
            else:  # an earlier one of these rewards already closed it (aggregation "first")
                out.append(
                    self._reject(
                        DUPLICATE_REWARD,
                        f"event {event_id!r} was already joined with a reward",
                        src,
                    )
                )

    def _hold_early(self, reward: Reward, source: Any) -> None:
        """Hold a reward that came before its decision (with its input, to dead-letter it)."""
        self.early.setdefault(reward.event_id, []).append((reward, source))

    def _drop_early(self, event_id: str) -> list[tuple[Reward, Any]]:
        """Stop holding the rewards for ``event_id``; they are returned."""
        return self.early.pop(event_id)

    def _clear_early(self) -> None:
        self.early = {}

    def _refuse(self, ev: Context | ReplicaDecision | Reward | Tick, source: Any) -> list[Rejected]:
        """The refusal of a record by the admission rule's record checks (before it moves the
        watermark or anything else), or ``[]``."""
        refusal = admission.record_refusal(
            ev, getattr(source, "timestamp_ms", 0), self.max_event_time_ahead_ms, self.max_id_bytes
        )
        return [] if refusal is None else [self._refused(refusal, source)]

    def spec_of(self, model_key: str) -> ModelSpec | None:
        """The configuration of ``model_key`` (None: no entry matches it), the one way the engine
        finds a model's spec. Cached for the keys that have a model: looked up for every record,
        and the cache is bounded as the models are."""
        spec = self._specs.get(model_key)
        if spec is None:
            spec = self.config.resolve(model_key)
            if spec is not None and model_key in self.models:
                self._specs[model_key] = spec
        return spec

    def _configured(self, model_key: str, held_by: str, error: type[Exception]) -> ModelSpec:
        """:meth:`spec_of` for a model that ``held_by`` (a snapshot, the log) holds: ``error``
        when the configuration no longer has it."""
        spec = self.spec_of(model_key)
        if spec is None:
            raise error(
                f"{held_by} holds model {model_key!r} but the configuration has no entry for it"
            )
        return spec

    def _accept_reward(
        self, ev: Reward, source: Any, now_ms: int, trigger: InputRef, out: list
    ) -> list[Joined | Rejected]:
        """Take a reward for an open decision: its outputs appended to ``out`` (returned), which
        saves a list per reward on the worker's hot path."""
        p = self.pending[ev.event_id]
        if ev.model_key != p.action.model_key:
            out.append(
                self._reject(
                    MODEL_KEY_MISMATCH,
                    f"reward for model {ev.model_key!r}, decision was made by "
                    f"{p.action.model_key!r}",
                    source,
                )
            )
            return out
        if refusal := admission.reward_refusal(self.models[p.action.model_key], ev.value):
            out.append(self._refused(refusal, source))
            return out
        value = float(ev.value)
        spec = self._specs.get(ev.model_key)  # spec_of's cache, then spec_of
        aggregation = (spec if spec is not None else self.spec_of(ev.model_key)).aggregation
        self.counters["rewards"] += 1
        if aggregation == "first":
            p.reward, p.n_rewards = value, 1
            return self._close(ev.event_id, now_ms, trigger, out)
        p.reward = value if (aggregation == "last" or p.reward is None) else p.reward + value
        p.n_rewards += 1
        return out

    def _close(
        self, event_id: str, now_ms: int, trigger: InputRef, out: list
    ) -> list[Joined | Rejected]:
        """Join one open decision: apply its update and append the joined record to ``out``
        (returned)."""
        p = self.pending.pop(event_id)
        a = p.action
        key = a.model_key
        observed = p.n_rewards > 0
        if observed:
            reward = p.reward
        else:
            spec = self._specs.get(key)  # spec_of's cache, then spec_of
            reward = (spec if spec is not None else self.spec_of(key)).default_reward
        try:
            version = self.models[key].update_versioned(a.features, reward)
        except ValueError as exc:
            self._remember(event_id, observed)
            out.append(
                self._reject(UPDATE_FAILED, f"update for event {event_id!r} failed: {exc}", a)
            )
            return out
        self.updates += 1
        self.changed.add(key)
        recent = self.recent  # _remember, inlined on this path
        recent[event_id] = observed
        self._recent_added += 1
        if len(recent) > self.max_recent:
            recent.popitem(last=False)
        self.counters["joined_observed" if observed else "joined_default"] += 1
        j = _new(Joined)  # Joined(event_id, ..., *trigger): see _BUILT_FIELDS
        j.event_id = event_id
        j.model_key = key
        j.features = a.features
        j.reward = float(reward)
        j.reward_observed = observed
        j.propensity = a.propensity
        j.decision_timestamp_ms = a.decision_timestamp_ms
        j.join_timestamp_ms = now_ms
        j.model_version_before = version
        j.trigger_source = trigger.source
        j.trigger_offset = trigger.offset
        out.append(j)
        return out

    def _remember(self, event_id: str, observed: bool) -> None:
        self.recent[event_id] = observed
        self._recent_added += 1
        if len(self.recent) > self.max_recent:
            self.recent.popitem(last=False)

    def _expire_oldest_early(self) -> list[Rejected]:
        event_id = next(iter(self.early))
        reward, src = self.early[event_id].pop(0)
        self._n_early -= 1
        if not self.early[event_id]:
            self._drop_early(event_id)
        self.counters["evicted_early"] += 1
        return [
            self._reject(
                UNKNOWN_EVENT,
                f"early reward for {event_id!r} evicted: more than "
                f"{self.max_early_rewards} rewards wait for their context",
                src,
            )
        ]

    def _push_deadline(self, deadline: int, kind: str, event_id: str) -> int:
        """Hold ``deadline``; its sequence number."""
        self._seq = seq = self._seq + 1
        run = self._run
        if not run or deadline >= run[-1][0]:  # in order: the run stays sorted by (deadline, seq)
            run.append((deadline, seq, kind, event_id))
        else:
            heapq.heappush(self._deadlines, (deadline, seq, kind, event_id))
        if deadline < self._next_deadline:
            self._next_deadline = deadline
        return seq

    def _rebuild_deadlines(self) -> None:
        """The deadline heap from the pending decisions (in decision order) and the early rewards:
        the same relative order the live pushes had, which decides the order of equal deadlines;
        and the count of held early rewards, which restore and recovery change wholesale."""
        self._deadlines, self._run, self._next_deadline, self._seq = (
            [],
            collections.deque(),
            math.inf,
            0,
        )
        self._n_early = sum(map(len, self.early.values()))
        for event_id, p in self.pending.items():
            p.seq = self._push_deadline(p.deadline_ms, "decision", event_id)
        for event_id, held in self.early.items():
            for reward, _ in held:
                self._push_deadline(
                    reward.timestamp_ms + self._window(reward.model_key), "early", event_id
                )

    def _window(self, model_key: str) -> int:
        spec = self.spec_of(model_key)
        return spec.reward_window_ms if spec is not None else 0

    # -- snapshot, restore and recovery (docs/design.md, invariant 3) -------------------------

    def take_changed(self) -> set[str]:
        """The keys of the models created or updated since the last call (or since this engine
        was built or restored), and a fresh start for the next."""
        changed, self.changed = self.changed, set()
        self._recent_tail, self._recent_added = self._recent_added, 0
        return changed

    def snapshot(self, models: Iterable[str] | None = None) -> dict[str, Any]:
        """Everything needed to continue exactly, as plain data (arrays, scalars, lists, dicts);
        with ``models``, an increment: only those models, and of the recent ids only those joined
        before the last take_changed() and after the one before it (engine/chains.py lays it over
        its base).

        Must be taken between records (the worker takes it at a transaction boundary)."""
        keys = self.models.keys() if models is None else models
        return {
            "models": model_states(self.models, keys),
            # The fields read directly: dataclasses.asdict deep-copies each (features included),
            # and a partition holds a window's worth of them (the snapshot is a pause of the
            # worker's loop: e2e part 6). Records are values, so sharing features is safe.
            "pending": [
                {f: getattr(p.action, f) for f in _ACTION_FIELDS}
                | {"reward": p.reward, "n_rewards": p.n_rewards}
                for p in self.pending.values()
            ],
            "early": [
                dataclasses.asdict(r) | {"source": src}
                for held in self.early.values()
                for r, src in held
            ],
            "recent": list(self.recent.items()) if models is None else self._recent_items_tail(),
            "watermark_ms": self.watermark_ms,
            "counters": dict(self.counters),
        }

    def _recent_items_tail(self) -> list[tuple[str, bool]]:
        n = min(self._recent_tail, len(self.recent))
        tail = list(itertools.islice(reversed(self.recent.items()), n))
        tail.reverse()
        return tail

    @classmethod
    def restore(
        cls, config: ModelsConfig, snap: dict[str, Any], **limits: int
    ) -> "PartitionEngine":
        """An engine in exactly the state ``snap`` was taken in; its counters start at zero."""
        e = cls(config, **limits)
        for layer in layers_of(snap["models"]):  # a chain's snapshots, oldest first: later ones win
            for block in getattr(layer, "blocks", ()):
                e._restore_block(block)
            for key, state in getattr(layer, "records", layer).items():
                model = e._configured(key, "snapshot", ValueError).build()
                model.load_state_dict(state)  # raises if the configuration changed incompatibly
                e._add_model(key, model)
        for p in snap["pending"]:
            fields = {k: v for k, v in p.items() if k not in ("reward", "n_rewards")}
            action = Action(**fields)
            e.pending[action.event_id] = _Pending(
                action,
                action.decision_timestamp_ms + e._window(action.model_key),
                p["reward"],
                p["n_rewards"],
            )
        for r in snap["early"]:
            reward = Reward(r["event_id"], r["model_key"], r["timestamp_ms"], r["value"])
            e._hold_early(reward, r["source"])
        e.recent = collections.OrderedDict((k, bool(v)) for k, v in snap["recent"])
        while (
            len(e.recent) > e.max_recent
        ):  # a composed chain's recent ids: the oldest leave, as live
            e.recent.popitem(last=False)
        e.watermark_ms = snap["watermark_ms"]
        e._rebuild_deadlines()
        return e

    def _restore_block(self, block: Any) -> None:
        """The models of a StateBlock, a column at a time for each configuration its keys
        resolve to now (one, unless the configuration moved keys between entries)."""
        specs = [self._configured(key, "snapshot", ValueError) for key in block.keys]
        groups: dict[int, tuple[Any, list[int]]] = {}
        if specs and all(spec is specs[0] for spec in specs):
            groups[id(specs[0])] = (specs[0], [])
        else:
            for j, spec in enumerate(specs):
                groups.setdefault(id(spec), (spec, []))[1].append(j)
        for spec, rows in groups.values():
            part = block if len(groups) == 1 else block.take(np.array(rows))
            prototype = spec.build()
            if not hasattr(prototype, "restore_block"):
                for j, key in enumerate(part.keys):  # now a learner without blocks: one state each
                    model = spec.build()
                    model.load_state_dict(part.state(j))
                    self._add_model(key, model)
                continue
            for key, model in zip(part.keys, prototype.restore_block(part)):
                self._add_model(key, model)

    def recover_from_logs(
        self,
        joined: list[Joined],
        actions: list[Action],
        rewards: list[tuple[Reward, Any]],
        dead_lettered: set[Any],
        closed_event_ids: set[str],
        max_input_timestamp_ms: int,
    ) -> None:
        """Bring an engine restored from a snapshot up to the committed state, from the logs
        written after the snapshot (docs/design.md, invariant 3).

        - ``joined``: the joined records after the snapshot, in log order: the exact update
          sequence. Re-applied; each must find its model at the version it was applied to.
        - ``actions``: the actions after the snapshot, in log order; those not joined are pending.
        - ``rewards``: the rewards consumed after the snapshot, in offset order, with the source
          key the engine was given for each. Neither log holds the rewards accumulated for a
          window still open (``sum``/``last``) or waiting for their context: they are rebuilt
          from these, skipping those whose source is in ``dead_lettered`` (refused after the
          snapshot, as the dead-letter log shows).
        - ``closed_event_ids``: decisions closed by a failed update (dead-lettered, not joined).
        - ``max_input_timestamp_ms``: the largest event timestamp consumed after the snapshot.
        """
        for j in joined:
            model = self.models.get(j.model_key)
            if model is None:
                model = self._add_model(
                    j.model_key, self._configured(j.model_key, "the log", RecoveryError).build()
                )
            if model.n_updates != j.model_version_before:
                raise RecoveryError(
                    f"joined record {j.event_id!r} was applied to version {j.model_version_before} "
                    f"of model {j.model_key!r}, but replay reached version {model.n_updates}"
                )
            model.update(j.features, j.reward)
            self.updates += 1
            self.changed.add(j.model_key)
            self.pending.pop(j.event_id, None)
            self._remember(j.event_id, j.reward_observed)
            self.watermark_ms = max(self.watermark_ms, j.join_timestamp_ms)
        for event_id in closed_event_ids:
            self.pending.pop(event_id, None)
            self._remember(event_id, False)
        for a in actions:
            if a.model_key not in self.models:
                self._add_model(
                    a.model_key, self._configured(a.model_key, "the log", RecoveryError).build()
                )
                self.changed.add(a.model_key)
            if a.event_id not in self.recent:
                self.pending[a.event_id] = _Pending(
                    a, a.decision_timestamp_ms + self._window(a.model_key)
                )
        # Early rewards held at the snapshot, then the rewards consumed since, in offset order.
        held = [(r, src) for rs in self.early.values() for r, src in rs]
        self._clear_early()
        for reward, src in held + list(rewards):
            if src in dead_lettered or reward.event_id in self.recent:
                continue  # refused, or its effect is in a joined record
            p = self.pending.get(reward.event_id)
            if p is None:
                self._hold_early(reward, src)
                continue
            aggregation = self.spec_of(p.action.model_key).aggregation
            value = float(reward.value)
            p.reward = value if (aggregation == "last" or p.reward is None) else p.reward + value
            p.n_rewards += 1
        self.watermark_ms = max(self.watermark_ms, max_input_timestamp_ms)
        self._rebuild_deadlines()

    def _reject(self, reason: str, detail: str, source: Any) -> Rejected:
        self.counters[f"rejected.{reason}"] += 1
        return Rejected(reason, detail, source)

    def _refused(self, refusal: Refusal, source: Any) -> Rejected:
        return self._reject(refusal.reason, refusal.detail, source)


# The outputs of an input carry its source and offset as their trigger (stream/logs.py drops the
# outputs of a batch whose input never committed); those of a call or a test's input, NO_TRIGGER.
# The engine hands the input itself down to where the outputs are built, or this stand-in of
# NO_TRIGGER's position: a (source, offset) tuple made per record was one allocation more per
# event on the worker's hot path (the engine stage of bench.worker_path).
_NO_INPUT = InputRef(NO_TRIGGER[0], -1, NO_TRIGGER[1])


def _trigger_of(source: Any) -> InputRef:
    """What the outputs an input causes take their trigger from (``.source``, ``.offset``): the
    input record itself, or for a call or a test's input, :data:`_NO_INPUT`."""
    return source if isinstance(source, InputRef) else _NO_INPUT
