"""The partition engine with its state in arrays: the rules of engine/partition.py, record for
record, on state that compiled code can work on.

engine/partition.py holds a partition's open decisions, recently joined ids and deadlines as
Python objects (a dict of Action objects, an OrderedDict, tuples in a deque and a heap). Here
they are :class:`~streambandit.engine.open_decisions.OpenDecisions`,
:class:`~streambandit.engine.recent_ids.RecentIds` and a
:class:`~streambandit.engine.deadline_queue.DeadlineQueue`, whose arrays a compiled pass over a
batch can read and change with no Python object per event. The early rewards (a reward before
its decision: rare, and held with the input record it came in, to dead-letter it whole) stay a
dict, as the models do (each is its learner's object; the row learners keep their state in
arrays of their own, policies/rows.py).

This class is the reference for that compiled pass: every method does what the same method of
:class:`~streambandit.engine.partition.PartitionEngine` does, with the same outputs and the same
snapshot, which tests/unit/engine/test_array_partition.py holds it to on streams that take every
path (early, duplicate, late and unknown rewards, evictions, refusals, recovery from the logs).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from streambandit.config.models import ModelsConfig, ModelSpec
from streambandit.engine import admission
from streambandit.engine import compiled_pass as cp
from streambandit.engine.deadline_queue import NONE, DeadlineQueue
from streambandit.engine.id_table import IdTable
from streambandit.engine.model_columns import ModelColumns
from streambandit.engine.open_decisions import (
    DEADLINE_MS,
    DECIDED_MS,
    DIM,
    MODEL,
    N_REWARDS,
    PROPENSITY,
    REWARD,
    SEQ,
    OpenDecisions,
)
from streambandit.engine.partition import (
    PartitionEngine,
    RecoveryError,
    Rejected,
    _Counts,
    _trigger_of,
)
from streambandit.engine.pass_outputs import (
    EncodedOutputs,
    ModelKeyBytes,
    encode_outputs,
    model_key_bytes,
)
from streambandit.engine.recent_ids import RecentIds
from streambandit.engine.record_columns import RecordColumns
from streambandit.numerics.event_draw import event_seeds_into
from streambandit.policies.base import Policy
from streambandit.policies.state_blocks import layers_of, model_states
from streambandit.reasons import (
    MODEL_KEY_MISMATCH,
    UPDATE_FAILED,
)
from streambandit.wire import Action, Context, InputRef, Joined, ReplicaDecision, Reward, Tick

__all__ = ["ArrayPartitionEngine", "OutputSink"]


class OutputSink(Protocol):
    """Where :meth:`ArrayPartitionEngine.process_columns` hands a run's outputs, as they are
    made (each output topic's order is theirs): the compiled pass's encoded, the Python rules'
    as the objects their methods return."""

    def encoded(self, outputs: EncodedOutputs) -> None: ...

    def objects(self, record: int, outputs: list) -> None: ...


_COUNTERS = (
    ("actions", cp.C_ACTIONS),
    ("rewards", cp.C_REWARDS),
    ("joined_observed", cp.C_JOINED_OBSERVED),
    ("joined_default", cp.C_JOINED_DEFAULT),
    ("evicted_pending", cp.C_EVICTED),
)


def _arrays(t: IdTable) -> tuple:
    """An id table's arrays in the order engine/compiled_pass.py takes them."""
    return (
        t.slots,
        t.entry_start,
        t.entry_len,
        t.entry_hash,
        t.next_free,
        t.older,
        t.newer,
        t.arena,
        t.meta,
    )


_NO_DIGESTS = np.zeros((1, 16), dtype=np.uint8)  # a run where no model explores

# The kinds of the deadline queue's items: an open decision's window (the item's entry is the
# decision's), an early reward's (the entry is a token the early ids are held under).
DECISION, EARLY = 0, 1


class ArrayPartitionEngine(PartitionEngine):
    """Models, open decisions and early rewards of one partition: PartitionEngine's rules, and
    its methods where they read the state through what both engines have (``in`` on the open
    decisions and the recent ids, the models, the early rewards); the rest here, on arrays."""

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
        self.max_id_bytes, self.max_event_time_ahead_ms = max_id_bytes, max_event_time_ahead_ms
        self.max_models = max_models
        self.models: dict[str, Policy] = {}
        self._specs: dict[str, ModelSpec] = {}
        # The models' keys in the order they were made: OpenDecisions names a model by its index.
        self.model_keys: list[str] = []
        self._model_index: dict[str, int] = {}
        max_dim = max((spec.dim for spec in config.specs), default=1)
        self.pending = OpenDecisions(self.model_keys, max_dim)
        self.early: dict[str, list[tuple[Reward, Any]]] = {}
        self.early_ids = IdTable()  # early's keys, for compiled code to look up
        self._n_early = 0
        self._early_tokens: dict[int, str] = {}  # an early item's token -> its event id
        self.recent = RecentIds(max_recent)
        self.watermark_ms = -(2**63)
        self._deadlines = DeadlineQueue()
        self._seq = 0
        self.counters: collections.Counter[str] = _Counts()
        self.updates = 0
        self.changed: set[str] = set()
        self._recent_added = 0
        self._recent_tail = 0
        self._columns = ModelColumns()
        self._key_bytes = model_key_bytes([])
        self._digests_of: tuple[RecordColumns, np.ndarray] | None = None

    # -- entry points --------------------------------------------------------------------------

    @property
    def _next_deadline(self) -> float:
        """The smallest deadline held (inf: none), what PartitionEngine's methods compare."""
        nxt = self._deadlines.next_deadline()
        return math.inf if nxt == NONE else nxt

    def _add_model(self, key: str, model: Policy) -> Policy:
        self._model_slot(key)
        self.models[key] = model
        self._columns.set(self._model_index[key], self.spec_of(key), model)
        return model

    def _model_slot(self, key: str) -> int:
        """The index OpenDecisions names model ``key`` by (given at its first use)."""
        i = self._model_index.get(key)
        if i is None:
            i = self._model_index[key] = len(self.model_keys)
            self.model_keys.append(key)
        return i

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
        ts, event_id, pending = ev.timestamp_ms, ev.event_id, self.pending
        arm_id = ev.arm_ids[index]
        if refusal := admission.id_refusal("chosen arm's id", arm_id, self.max_id_bytes):
            return out + [self._refused(refusal, source)]
        action = Action(
            event_id,
            ev.model_key,
            arm_id,
            index,
            score,
            propensity,
            version,
            ts,
            ev.features[index].copy(),
            trigger.source,
            trigger.offset,
        )
        out.append(action)
        self.counters["actions"] += 1
        if len(pending) >= self.max_pending:
            self.counters["evicted_pending"] += 1
            self._close(pending.oldest(), ts, trigger, out)
        deadline = ts + spec.reward_window_ms
        self._seq = seq = self._seq + 1
        e = pending.open(
            event_id,
            self._model_slot(ev.model_key),
            arm_id,
            index,
            score,
            propensity,
            version,
            ts,
            action.features,
            (trigger.source, trigger.offset),
            deadline,
            seq,
        )
        self._deadlines.push(deadline, seq, DECISION, e)
        if self.early and event_id in self.early:
            self._take_early(event_id, ts, trigger, out)
        if self._due():
            out += self._advance(self.watermark_ms, trigger)
        return out

    def _due(self) -> bool:
        """A deadline the watermark has reached is held."""
        nxt = self._deadlines.next_deadline()
        return nxt != NONE and nxt <= self.watermark_ms

    def _advance(self, timestamp_ms: int, trigger: InputRef) -> list[Joined | Rejected]:
        if timestamp_ms > self.watermark_ms:
            self.watermark_ms = timestamp_ms
        out: list[Joined | Rejected] = []
        ints = None
        while True:
            item = self._deadlines.pop_due(self.watermark_ms)
            if item is None:
                break
            deadline, seq, kind, entry = item
            if kind == DECISION:
                ints = self.pending.ints
                live = entry < len(ints) and self.pending.ids.entry_len[entry] >= 0
                if live and ints[entry, SEQ] == seq:  # not closed since, nor decided again
                    self._close(entry, deadline, trigger, out)
            else:
                self._early_due(self._early_tokens.pop(entry), out)
        return out

    # -- a run of records, compiled (engine/compiled_pass.py) ------------------------------------

    def process(self, events: list[tuple[Any, Any]]) -> tuple[list, list[int]]:
        """Apply the rules to ``events``, (record, source) pairs in processing order, as one
        call of :meth:`on_context` (a Context), :meth:`on_reward` (a Reward), :meth:`on_decision`
        (a ReplicaDecision) or :meth:`on_tick` (a Tick) each would: ``(outputs, ends)``, the
        outputs of every record in order and, for each record, how many outputs the records up
        to it made. The common case runs in one compiled pass; each record the pass leaves goes
        through the methods above, and the pass goes on after it."""
        per_record: list[list] = [[] for _ in events]
        self.process_columns(RecordColumns(events), events, per_record)
        outputs: list = []
        ends, count = [], 0
        for outs in per_record:
            outputs += outs
            count += len(outs)
            ends.append(count)
        return outputs, ends

    def process_columns(
        self,
        cols: RecordColumns,
        events: Sequence[tuple[Any, Any]],
        per_record: list[list] | None,
        handle: Callable[[int], list] | None = None,
        sink: OutputSink | None = None,
    ) -> None:
        """:meth:`process` of ``events`` given their columns: each record's outputs appended to
        its list in ``per_record``. With ``per_record`` None, the outputs go to ``sink`` as they
        are made: the compiled pass's encoded (engine/pass_outputs.py: no object made), the
        Python rules' as objects; with no sink either, they are dropped (what bench.engine_pass
        counts: the pass alone).

        ``handle(i)`` gives the outputs of record i, one the pass leaves, in the caller's way
        (the worker's: a record that came on the wrong input is refused before the rules see
        it); by default the record goes to the method of its kind. ``events`` is read only at
        the records the pass leaves: a caller may make each pair when it is asked for."""
        n, i, models_seen = len(events), 0, -1
        if per_record is not None:
            deliver: Callable[[int, list], None] = lambda j, outs: per_record[j].extend(outs)  # noqa: E731
        elif sink is not None:
            deliver = sink.objects
        else:
            deliver = lambda j, outs: None  # noqa: E731
        one = handle if handle is not None else (lambda j: self._one(*events[j]))
        while i < n:
            if len(self.model_keys) != models_seen:
                cols.set_models(i, self._model_index, self.models)
                models_seen = len(self.model_keys)
            nxt, rest_of_previous = self._run_compiled(cols, i, per_record)
            if per_record is None and sink is not None and len(self.last_pass[0]):
                sink.encoded(
                    encode_outputs(cols, self.pending.ids.arena, self._keys(), *self.last_pass)
                )
            if rest_of_previous:  # the decided record's windows to close, by the rules here
                _, source = events[nxt - 1]
                deliver(nxt - 1, self._advance(self.watermark_ms, _trigger_of(source)))
                i = nxt
                continue
            if nxt >= n:
                break
            deliver(nxt, one(nxt))
            i = nxt + 1

    def _digests(self, cols: RecordColumns) -> np.ndarray:
        """Per record of ``cols``, a context's exploration seed (``event_draw.event_seed``) when
        its model explores, zeros otherwise; one row of zeros when none explores. Made once per
        run of columns (the pass is called again after each record it leaves)."""
        if self._digests_of is not None and self._digests_of[0] is cols:
            return self._digests_of[1]
        seeds = []
        for key in cols.key_names:
            spec = self.spec_of(key)
            seeds.append(spec.seed if spec is not None and spec.epsilon > 0.0 else None)
        digests = _NO_DIGESTS
        if any(seed is not None for seed in seeds):
            rec, key_col = cols.rec_i, cols.key_col
            explores = np.array([seed is not None for seed in seeds])
            rows = np.flatnonzero(
                (rec[:, cp.R_KIND] == cp.CONTEXT) & (key_col >= 0) & explores[key_col]
            )
            keys = model_key_bytes(cols.key_names)
            digits = model_key_bytes([str(int(seed or 0)) for seed in seeds])
            digests = np.zeros((len(rec), 16), dtype=np.uint8)
            event_seeds_into(
                digests,
                rows,
                key_col,
                cols.id_buf,
                rec[:, cp.R_ID_START],
                rec[:, cp.R_ID_LEN],
                keys.buf,
                keys.ends,
                digits.buf,
                digits.ends,
            )
        self._digests_of = (cols, digests)
        return digests

    def _keys(self) -> ModelKeyBytes:
        """The model keys' bytes (engine/pass_outputs.py), made again when a model is added."""
        if len(self._key_bytes.each) != len(self.model_keys):
            self._key_bytes = model_key_bytes(self.model_keys)
        return self._key_bytes

    def _one(self, ev: Any, source: Any) -> list:
        cls = type(ev)
        if cls is Context:
            return self.on_context(ev, source)
        if cls is Reward:
            return self.on_reward(ev, source)
        if cls is ReplicaDecision:
            return self.on_decision(ev, source)
        if cls is Tick:
            return self.on_tick(ev, source)
        raise TypeError(f"the engine takes no {cls.__name__} record")

    def _run_compiled(
        self, cols: RecordColumns, start: int, per_record: list[list] | None
    ) -> tuple[int, bool]:
        """One compiled pass from record ``start``: its outputs appended to ``per_record`` (None:
        left as columns); ``(the first record it left, whether the record before that left
        windows to close)``."""
        pending, recent = self.pending, self.recent
        n_contexts = int(cols.contexts_after[start])
        id_bytes = int(cols.id_bytes_after[start])
        pending.reserve(n_contexts, id_bytes, int(cols.arm_bytes_after[start]))
        closes = len(pending) + n_contexts
        recent.reserve(closes, int(pending.ids.meta[1]) + id_bytes)
        self._deadlines.reserve(n_contexts)
        q = self._deadlines
        width = pending.features.shape[1]
        # Room for every output the run could make (each open decision closed, each context
        # decided), not zeroed: the pass writes every field of each output it makes, and only
        # those are read; the pages of what it does not make are never touched.
        out = np.empty((n_contexts + closes + 1, 3), dtype=np.int64)
        act_i = np.empty((n_contexts + 1, 3), dtype=np.int64)
        act_f = np.empty((n_contexts + 1, 2))  # score, propensity
        jn_i = np.empty((closes + 1, cp.J_FIELDS), dtype=np.int64)
        jn_f = np.empty((closes + 1, 2))
        jn_x = np.empty((closes + 1, width))
        st = np.array(
            [
                self.watermark_ms,
                self._seq,
                self.max_pending,
                self.max_id_bytes,
                self.max_event_time_ahead_ms,
                self.max_recent,
            ],
            dtype=np.int64,
        )
        cnt = np.zeros(cp.C_SIZE, dtype=np.int64)
        counts = np.zeros(4, dtype=np.int64)
        t, a, r, ea = pending.ids, pending.arm_ids, recent.ids, self.early_ids
        nxt = cp.run_records(
            start, cols.rec_i, cols.rec_f, cols.id_buf, cols.feat_buf, cols.arm_buf,
            cols.arm_start, cols.arm_len, self._digests(cols),
            _arrays(t), _arrays(a), pending.arm_refs, pending.ints, pending.floats,
            pending.features, _arrays(r), recent.observed, _arrays(ea), q.run, q.heap, q.meta,
            self._columns.ints, self._columns.floats, st, cnt, out, act_i, act_f, jn_i, jn_f,
            jn_x, counts,
        )  # fmt: skip
        self.watermark_ms, self._seq = int(st[cp.S_WATERMARK]), int(st[cp.S_SEQ])
        c = self.counters
        # New counters in the order the pass first counted them (a snapshot lists that order).
        counted = [(int(cnt[cp.C_FIRST + f]), name, f) for name, f in _COUNTERS if cnt[f]]
        for _, name, field in sorted(counted):
            c[name] += int(cnt[field])
        self.updates += int(cnt[cp.C_UPDATES])
        self._recent_added += int(cnt[cp.C_RECENT])
        keys = self.model_keys
        self.changed.update(keys[m] for m in set(jn_i[: counts[2], cp.J_MODEL].tolist()))
        # The last pass's output columns (engine/pass_outputs.py encodes them). The joined ids'
        # bytes are in pending.ids.arena until the ids' next reserve (the next pass, or a
        # decision of the Python rules), whose compaction may move the arena to a new array.
        self.last_pass = (out[: counts[0]], act_i, act_f, jn_i, jn_f, jn_x)
        if per_record is not None:
            self._outputs(cols, out[: counts[0]], act_i, act_f, jn_i, jn_f, jn_x, per_record)
        return int(nxt), bool(counts[3])

    def _outputs(self, cols, out, act_i, act_f, jn_i, jn_f, jn_x, per_record) -> None:
        """The pass's output columns as Actions and Joined records, by record."""
        arena, keys = self.pending.ids.arena, self.model_keys
        rec_i = cols.rec_i
        for kind, k, rec in out:
            if kind == cp.O_ACTION:
                r = rec_i[rec]
                index = int(act_i[k, cp.A_ARM_INDEX])
                fs, d = int(r[cp.R_FEAT_START]), int(r[cp.R_D])
                at = fs + index * d
                arm_at = int(r[cp.R_ARMS_START]) + index
                s0 = int(cols.arm_start[arm_at])
                per_record[rec].append(
                    Action(
                        cols.id_buf[r[cp.R_ID_START] : r[cp.R_ID_START] + r[cp.R_ID_LEN]]
                        .tobytes()
                        .decode(),
                        cols.key_of(rec),
                        cols.arm_buf[s0 : s0 + cols.arm_len[arm_at]].tobytes().decode(),
                        index,
                        float(act_f[k, 0]),
                        float(act_f[k, 1]),
                        int(act_i[k, cp.A_VERSION]),
                        int(r[cp.R_TS]),
                        cols.feat_buf[at : at + d].copy(),
                        int(r[cp.R_SRC]),
                        int(r[cp.R_OFF]),
                    )
                )
            else:
                j = jn_i[k]
                s0, dim = int(j[cp.J_ID_START]), int(j[cp.J_DIM])
                key = keys[j[cp.J_MODEL]]
                per_record[rec].append(
                    Joined(
                        arena[s0 : s0 + j[cp.J_ID_LEN]].tobytes().decode(),
                        key,
                        jn_x[k, :dim].copy(),
                        float(jn_f[k, cp.J_REWARD]),
                        bool(j[cp.J_OBSERVED]),
                        float(jn_f[k, cp.J_PROPENSITY]),
                        int(j[cp.J_DECIDED]),
                        int(j[cp.J_NOW]),
                        int(j[cp.J_VERSION]),
                        int(j[cp.J_TSRC]),
                        int(j[cp.J_TOFF]),
                    )
                )

    # -- internals -----------------------------------------------------------------------------

    def _action(self, e: int) -> Action:
        """The open decision of entry ``e`` as its Action."""
        r = self.pending.row(e)
        del r["reward"], r["n_rewards"]
        return Action(**r)

    def _accept_reward(
        self, ev: Reward, source: Any, now_ms: int, trigger: InputRef, out: list
    ) -> list[Joined | Rejected]:
        e = self.pending.find(ev.event_id)
        ints, floats = self.pending.ints, self.pending.floats
        decided_by = self.model_keys[ints[e, MODEL]]
        if ev.model_key != decided_by:
            out.append(
                self._reject(
                    MODEL_KEY_MISMATCH,
                    f"reward for model {ev.model_key!r}, decision was made by {decided_by!r}",
                    source,
                )
            )
            return out
        if refusal := admission.reward_refusal(self.models[decided_by], ev.value):
            out.append(self._refused(refusal, source))
            return out
        value = float(ev.value)
        aggregation = self.spec_of(ev.model_key).aggregation
        self.counters["rewards"] += 1
        if aggregation == "first":
            floats[e, REWARD], ints[e, N_REWARDS] = value, 1
            return self._close(e, now_ms, trigger, out)
        if aggregation == "last" or ints[e, N_REWARDS] == 0:
            floats[e, REWARD] = value
        else:
            floats[e, REWARD] = float(floats[e, REWARD]) + value
        ints[e, N_REWARDS] += 1
        return out

    def _close(self, e: int, now_ms: int, trigger: InputRef, out: list) -> list[Joined | Rejected]:
        """Join the open decision of entry ``e``: apply its update and append the joined record
        to ``out`` (returned)."""
        pending = self.pending
        ints, floats = pending.ints, pending.floats
        event_id = pending.ids.key(e).decode()
        key = self.model_keys[ints[e, MODEL]]
        observed = ints[e, N_REWARDS] > 0
        reward = float(floats[e, REWARD]) if observed else self.spec_of(key).default_reward
        features = pending.features[e, : ints[e, DIM]].copy()
        propensity, decided_ms = float(floats[e, PROPENSITY]), int(ints[e, DECIDED_MS])
        action = None
        try:
            version = self.models[key].update_versioned(features, reward)
        except ValueError as exc:
            action = self._action(e)
            pending.close(e)
            self._remember(event_id, bool(observed))
            out.append(
                self._reject(UPDATE_FAILED, f"update for event {event_id!r} failed: {exc}", action)
            )
            return out
        pending.close(e)
        self.updates += 1
        self.changed.add(key)
        self._remember(event_id, bool(observed))
        self.counters["joined_observed" if observed else "joined_default"] += 1
        out.append(
            Joined(
                event_id,
                key,
                features,
                float(reward),
                bool(observed),
                propensity,
                decided_ms,
                now_ms,
                version,
                trigger.source,
                trigger.offset,
            )
        )
        return out

    def _remember(self, event_id: str, observed: bool) -> None:
        self.recent.remember(event_id, observed)
        self._recent_added += 1

    def _hold_early(self, reward: Reward, source: Any) -> None:
        held = self.early.get(reward.event_id)
        if held is None:
            held = self.early[reward.event_id] = []
            self.early_ids.add(reward.event_id.encode())
        held.append((reward, source))

    def _drop_early(self, event_id: str) -> list[tuple[Reward, Any]]:
        self.early_ids.remove(self.early_ids.find(event_id.encode()))
        return self.early.pop(event_id)

    def _clear_early(self) -> None:
        self.early, self.early_ids = {}, IdTable()

    def _push_deadline(self, deadline: int, kind: str, event_id: str) -> int:
        """An early reward's deadline (PartitionEngine.on_reward's call; the decisions' are
        pushed with their entries where they open)."""
        if kind != "early":
            raise ValueError(f"deadlines of kind {kind!r} are pushed with their entry")
        self._push_early(deadline, event_id)
        return self._seq

    def _push_early(self, deadline: int, event_id: str) -> None:
        """Hold an early reward's deadline: its item's entry is its own sequence number, the
        token its event id is held under."""
        self._seq = seq = self._seq + 1
        self._early_tokens[seq] = event_id
        self._deadlines.push(deadline, seq, EARLY, seq)

    def _rebuild_deadlines(self) -> None:
        self._deadlines, self._seq, self._early_tokens = DeadlineQueue(), 0, {}
        self._n_early = sum(map(len, self.early.values()))
        ints = self.pending.ints
        for e in self.pending.ids.in_order():
            self._seq = seq = self._seq + 1
            ints[e, SEQ] = seq
            self._deadlines.push(int(ints[e, DEADLINE_MS]), seq, DECISION, e)
        for event_id, held in self.early.items():
            for reward, _ in held:
                self._push_early(reward.timestamp_ms + self._window(reward.model_key), event_id)

    # -- snapshot, restore and recovery --------------------------------------------------------

    def snapshot(self, models: Iterable[str] | None = None) -> dict[str, Any]:
        keys = self.models.keys() if models is None else models
        return {
            "models": model_states(self.models, keys),
            "pending": self.pending.rows(),
            "early": [
                dataclasses.asdict(r) | {"source": src}
                for held in self.early.values()
                for r, src in held
            ],
            "recent": self.recent.items()
            if models is None
            else self.recent.tail(self._recent_tail),
            "watermark_ms": self.watermark_ms,
            "counters": dict(self.counters),
        }

    @classmethod
    def restore(
        cls, config: ModelsConfig, snap: dict[str, Any], **limits: int
    ) -> "ArrayPartitionEngine":
        e = cls(config, **limits)
        for layer in layers_of(snap["models"]):
            for block in getattr(layer, "blocks", ()):
                e._restore_block(block)
            for key, state in getattr(layer, "records", layer).items():
                model = e._configured(key, "snapshot", ValueError).build()
                model.load_state_dict(state)
                e._add_model(key, model)
        for p in snap["pending"]:
            e._model_slot(p["model_key"])
        e.pending.add_rows(
            snap["pending"],
            e._model_index,
            lambda r: r["decision_timestamp_ms"] + e._window(r["model_key"]),
        )
        for r in snap["early"]:
            reward = Reward(r["event_id"], r["model_key"], r["timestamp_ms"], r["value"])
            e._hold_early(reward, r["source"])
        e.recent.add_items([(k, bool(v)) for k, v in snap["recent"]])
        e.watermark_ms = snap["watermark_ms"]
        e._rebuild_deadlines()
        return e

    def recover_from_logs(
        self,
        joined: list[Joined],
        actions: list[Action],
        rewards: list[tuple[Reward, Any]],
        dead_lettered: set[Any],
        closed_event_ids: set[str],
        max_input_timestamp_ms: int,
    ) -> None:
        pending = self.pending
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
            if (e := pending.find(j.event_id)) >= 0:
                pending.close(e)
            self._remember(j.event_id, j.reward_observed)
            self.watermark_ms = max(self.watermark_ms, j.join_timestamp_ms)
        for event_id in closed_event_ids:
            if (e := pending.find(event_id)) >= 0:
                pending.close(e)
            self._remember(event_id, False)
        for a in actions:
            if a.model_key not in self.models:
                self._add_model(
                    a.model_key, self._configured(a.model_key, "the log", RecoveryError).build()
                )
                self.changed.add(a.model_key)
            if a.event_id not in self.recent:
                pending.open(
                    a.event_id,
                    self._model_slot(a.model_key),
                    a.arm_id,
                    a.arm_index,
                    a.score,
                    a.propensity,
                    a.model_version,
                    a.decision_timestamp_ms,
                    np.asarray(a.features, dtype=np.float64),
                    (a.trigger_source, a.trigger_offset),
                    a.decision_timestamp_ms + self._window(a.model_key),
                    0,
                )
        held = [(r, src) for rs in self.early.values() for r, src in rs]
        self._clear_early()
        ints, floats = pending.ints, pending.floats
        for reward, src in held + list(rewards):
            if src in dead_lettered or reward.event_id in self.recent:
                continue
            e = pending.find(reward.event_id)
            if e < 0:
                self._hold_early(reward, src)
                continue
            aggregation = self.spec_of(self.model_keys[ints[e, MODEL]]).aggregation
            value = float(reward.value)
            if aggregation == "last" or ints[e, N_REWARDS] == 0:
                floats[e, REWARD] = value
            else:
                floats[e, REWARD] = float(floats[e, REWARD]) + value
            ints[e, N_REWARDS] += 1
        self.watermark_ms = max(self.watermark_ms, max_input_timestamp_ms)
        self._rebuild_deadlines()
