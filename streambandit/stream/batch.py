"""One poll batch through the partitions' engines, with no Kafka client.

Given the records a consumer fetched (anything with confluent_kafka.Message's accessors), the
:class:`BatchProcessor` decodes them in one compiled pass, buffers each in its partition's
event-time merger, releases what the merge allows in (event time, topic, offset) order, runs each
record through the partition's engine, and hands the encoded outputs, as (topic, partition, key,
value), to an ``emit`` callback. It keeps the next input offset of each partition and input:
what the caller commits with those outputs. The worker drives it between a poll and a commit;
benchmarks and tests drive it with no broker.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import logging
import time
from typing import Any, Callable

import numpy as np

from streambandit import reasons
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.chains import ChainPosition
from streambandit.engine.column_merge import ColumnMerger, Released
from streambandit.engine.compiled_pass import CONTEXT, OTHER, REWARD_RECORD
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.engine.partition import Rejected
from streambandit.engine.pass_outputs import EncodedOutputs
from streambandit.engine.record_columns import (
    META_FIELDS,
    META_OFF,
    META_RECORD_MS,
    META_SRC,
    RecordColumns,
)
from streambandit.log_format import RepeatFilter
from streambandit.wire import (
    Action,
    Context,
    DeadLetter,
    DecodeError,
    InputRef,
    Joined,
    ReplicaDecision,
    Reward,
    Tick,
    encode,
)
from streambandit.wire.batch_decode import DecodedColumns
from streambandit.wire.batch_encode import encode_actions_timed, encode_joined_timed

__all__ = ["BatchProcessor", "PartitionState", "Output", "EMIT_EVERY", "now_ms"]

Output = tuple[str, int, bytes | None, bytes]  # (topic, partition, key, value)
Emit = Callable[[list[Output]], None]

# Records processed between hand-overs of their outputs: librdkafka sends them while the rest of
# the batch is processed, instead of the commit waiting for all of them (e2e part 4).
EMIT_EVERY = 256

_TIMED = frozenset(
    (Context, ReplicaDecision, Reward, Tick)
)  # the decoded records that carry an event time

log = logging.getLogger("streambandit")

_INT64_MAX = 2**63 - 1

# A dead letter is a WARNING line, one per reason per interval with a count of the rest: a client
# sending only bad records must not turn the worker's log into a copy of the dead-letter topic.
DEAD_LETTER_LOG_EVERY_S = 10.0

# An empty poll's shortest wait once a held record's merge deadline has passed. A record still
# held then is held for input the broker has and has not delivered (InputMerger): a record's
# arrival wakes the poll, but transaction markers alone deliver no message, so the poll looks
# again soon. A wait of zero spun the worker's loop at a full core until the input came, on
# machines where the broker that is to deliver it shares the cores.
HELD_RECHECK_MS = 2


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclasses.dataclass
class PartitionState:
    engine: ArrayPartitionEngine
    merger: ColumnMerger
    next_offset: dict[
        int, int
    ]  # per input source: the next offset to process (what a commit records)
    # Per input source, the next offset as of the last commit (or recovery). While it differs from
    # next_offset the state is ahead of what committed, and the partition is not snapshotted.
    committed_offset: dict[int, int] = dataclasses.field(default_factory=dict)
    updates_at_snapshot: int = 0
    snapshot_wall: float = dataclasses.field(default_factory=time.monotonic)
    snapshot_took_s: float = 0.0  # how long the last snapshot of the partition took
    # Per input source, the next offset the partition's last snapshot holds ({}: none taken by
    # this worker yet). An idle partition whose state is past it is snapshotted once more.
    snapshot_offset: dict[int, int] = dataclasses.field(default_factory=dict)
    last_input_wall_ms: int = dataclasses.field(default_factory=now_ms)
    last_tick_wall_ms: int = 0
    # Where the partition's stored snapshots stand (engine/chains.py); None: the next is a base.
    chain: ChainPosition | None = None

    @property
    def settled(self) -> bool:
        """Whether everything processed is committed (a snapshot now fits the committed offsets)."""
        return self.next_offset == self.committed_offset

    def idle(self, now_ms: int, quiet_ms: int) -> bool:
        """Whether no input has come for ``quiet_ms`` and none is held for the merge."""
        return now_ms - self.last_input_wall_ms >= quiet_ms and not self.merger.pending()


@dataclasses.dataclass
class BatchTimes:
    """Event times of a batch's outputs, for the histograms the worker fills after its commit."""

    decided_ms: list[int] = dataclasses.field(default_factory=list)  # each action's decision time
    reward_delays_ms: list[int] = dataclasses.field(
        default_factory=list
    )  # reward time - decision time

    def clear(self) -> None:
        self.decided_ms.clear()
        self.reward_delays_ms.clear()


class _Outputs:
    """A batch's outputs not yet handed over, in each output topic's order: encoded (the
    engine's compiled pass's, dead letters, ticks), and the Python rules' actions and joined
    records as objects, encoded together by :meth:`flush` (before anything encoded is added
    after them). ``runs`` says which partition each object is of: (first action, first joined
    record, partition) of each run, marked by :meth:`mark` when the partition changes (a tuple
    per output cost more). Counts go to ``metrics``, event times to ``seen`` (the worker's
    latency histograms)."""

    def __init__(self, topics: Topics, metrics: collections.Counter, seen: BatchTimes) -> None:
        self.topics, self.metrics, self.seen = topics, metrics, seen
        self.actions: list[Action] = []
        self.joined: list[Joined] = []
        self.others: list[Output] = []
        self.runs: list[tuple[int, int, int]] = []
        self.p = -1

    def mark(self, p: int) -> None:
        """What is added from now on is of partition ``p``."""
        self.p = p
        self.runs.append((len(self.actions), len(self.joined), p))

    def _partitions(self, which: int, n: int) -> list[int]:
        """The partition of each of the ``n`` records of list ``which`` (0 actions, 1 joined)."""
        out: list[int] = []
        runs = self.runs
        for i, run in enumerate(runs):
            stop = runs[i + 1][which] if i + 1 < len(runs) else n
            out += [run[2]] * (stop - run[which])
        return out

    def encoded(self, enc: EncodedOutputs) -> None:
        """A compiled pass's outputs, of partition ``self.p``."""
        if self.actions or self.joined:
            self.flush()
        t, p, out, metrics = self.topics, self.p, self.others, self.metrics
        if enc.actions:
            topic = t.actions
            out += [(topic, p, k, v) for k, v in zip(enc.action_keys, enc.actions)]
            self.seen.decided_ms += enc.decided_ms
            metrics["actions"] += len(enc.actions)
        if enc.joined:
            topic = t.joined
            out += [(topic, p, k, v) for k, v in zip(enc.joined_keys, enc.joined)]
            self.seen.reward_delays_ms += enc.delays
            metrics["default_rewards"] += enc.defaults
            metrics["joined"] += len(enc.joined)

    def flush(self) -> None:
        """The objects held, encoded after what is encoded already."""
        t, actions, joined, metrics = self.topics, self.actions, self.joined, self.metrics
        out = self.others
        if actions:
            values, decided = encode_actions_timed(actions)
            topic = t.actions
            out += [
                (topic, p, a.model_key.encode(), v)
                for p, a, v in zip(self._partitions(0, len(actions)), actions, values)
            ]
            self.seen.decided_ms += decided
        if joined:
            values, delays = encode_joined_timed(joined)
            topic = t.joined
            out += [
                (topic, p, j.model_key.encode(), v)
                for p, j, v in zip(self._partitions(1, len(joined)), joined, values)
            ]
            self.seen.reward_delays_ms += delays
            metrics["default_rewards"] += len(joined) - len(delays)
        metrics["actions"] += len(actions)
        metrics["joined"] += len(joined)
        self.actions, self.joined, self.runs = [], [], [(0, 0, self.p)]

    def take(self) -> list[Output]:
        """Everything held, encoded, as (topic, partition, key, value); empties the buffer."""
        self.flush()
        out, self.others = self.others, []
        return out


class _RunOutputs:
    """``ArrayPartitionEngine.process_columns``'s sink for a run of partition ``p``: the
    compiled pass's outputs encoded, the Python rules' objects sorted into actions, joined
    records and dead letters (each refusal's with its record's InputRef)."""

    __slots__ = ("buf", "p", "run", "processor")

    def __init__(self, buf: _Outputs, p: int, run: "_Run", processor: "BatchProcessor") -> None:
        self.buf, self.p, self.run, self.processor = buf, p, run, processor

    def encoded(self, outputs: EncodedOutputs) -> None:
        self.buf.encoded(outputs)

    def objects(self, record: int, outputs: list) -> None:
        buf = self.buf
        for o in outputs:
            ocls = type(o)
            if ocls is Action:
                buf.actions.append(o)
            elif ocls is Joined:
                buf.joined.append(o)
            else:
                buf.others.append(self.processor._dead_letter(self.p, o, self.run[record][1]))


class BatchProcessor:
    """The partitions this worker holds and what a batch does to them."""

    def __init__(self, config: WorkerConfig, metrics: collections.Counter) -> None:
        self.config = config
        self.metrics = metrics
        self.times = BatchTimes()  # the worker empties it after each batch
        t = config.topics
        self.source_of = {config.first_input: CONTEXTS, t.rewards: REWARDS}
        self.partitions: dict[int, PartitionState] = {}
        # Merge counters of partitions no longer held (the metrics stay cumulative).
        self._merge_base = [0, 0]
        self._dead_letter_lines = RepeatFilter(DEAD_LETTER_LOG_EVERY_S)

    def topic_of(self, source: int) -> str:
        return self.config.first_input if source == CONTEXTS else self.config.topics.rewards

    def remove(self, p: int) -> PartitionState:
        """Stop holding partition ``p``; its merge counters stay in the metrics."""
        part = self.partitions.pop(p)
        self._merge_base[0] += part.merger.forced
        self._merge_base[1] += part.merger.out_of_order
        return part

    def offsets(self) -> list[tuple[str, int, int]]:
        """(topic, partition, next offset) of every input read so far: what a commit records."""
        return [
            (self.topic_of(src), p, off)
            for p, part in self.partitions.items()
            for src, off in part.next_offset.items()
            if off >= 0
        ]

    def wait_deadline_ms(self) -> int | None:
        """When the first held record's merge wait runs out (it is released then), if any is held."""
        deadlines = [
            d
            for part in self.partitions.values()
            if (d := part.merger.wait_deadline_ms()) is not None
        ]
        return min(deadlines, default=None)

    def poll_wait_ms(self, poll_timeout_ms: int, now: int) -> int:
        """How long an empty poll may wait for a record: ``poll_timeout_ms``, cut to the first
        held record's merge deadline (released then, not at the timeout), and never below
        HELD_RECHECK_MS."""
        deadline = self.wait_deadline_ms()
        if deadline is None:
            return poll_timeout_ms
        return min(poll_timeout_ms, max(deadline - now, HELD_RECHECK_MS))

    def process(
        self, records: list[Any], now: int, behind: dict[int, tuple[bool, bool]], emit: Emit
    ) -> int:
        """Buffer ``records`` and process what the merge releases (see :meth:`release`); returns
        how many records were processed."""
        self.buffer(records, now)
        released = self.release(now, behind, emit)
        parts = self.partitions.values()
        self.metrics["merge_forced"] = self._merge_base[0] + sum(x.merger.forced for x in parts)
        self.metrics["merge_out_of_order"] = self._merge_base[1] + sum(
            x.merger.out_of_order for x in parts
        )
        self.metrics["pending"] = sum(len(x.engine.pending) for x in parts)  # a gauge
        return released

    def buffer(self, records: list[Any], now: int) -> None:
        """Decode the batch's records and buffer each in its partition's merger."""
        # The whole batch is decoded into columns in one compiled pass (e2e part 2 compares
        # decoding in bulk with decoding one record at a time); a record object is made only
        # for a record that needs one (one the fast layouts do not take, here, or one the
        # engine's compiled pass leaves, in release).
        if not records:
            return  # a poll that timed out: nothing fetched
        fetched = _Fetched(records, self.source_of, self.config.learn_only)
        partitions = self.partitions
        ahead = self.config.max_event_time_ahead_ms
        meta, ts = fetched.meta, fetched.cols.ts.copy()
        # Event times: the decoder's, or the record's for what only codec.decode takes.
        timed = fetched.cols.fast != 0
        for i in np.flatnonzero(~timed).tolist():
            ev = fetched.event(i)
            if type(ev) in _TIMED:
                ts[i], timed[i] = ev.timestamp_ms, True
        # The rule of admission.too_far_ahead, on the batch's columns.
        # (A record timestamp is the client's to set: the sum is kept from wrapping past int64.)
        record_ms = meta[:, META_RECORD_MS]
        limit = np.minimum(record_ms, _INT64_MAX - ahead) + ahead
        merged = timed & ~((record_ms > 0) & (ts > limit))
        # Per partition and input, the records in fetch (offset) order, handed to the merger at
        # once (2 p + source orders them; a stable sort keeps each one's offsets in order).
        group = 2 * np.array(fetched.partition, dtype=np.int64) + meta[:, META_SRC]
        order = np.argsort(group, kind="stable")
        cuts = np.flatnonzero(np.diff(group[order])) + 1
        for rows in np.split(order, cuts):
            key = int(group[rows[0]])
            part = partitions.get(key >> 1)
            if part is None:
                continue  # records fetched just before their partition was revoked
            src, merger = key & 1, part.merger
            offsets, times = meta[rows, META_OFF], ts[rows]
            at = 0
            for b in np.flatnonzero(~merged[rows]).tolist():
                # A DecodeError, or an event time the engine will refuse as too far ahead
                # (merged by that time, it would hold back every later record of its input):
                # placed with no time, after what came before it.
                merger.extend(src, times[at:b], offsets[at:b], rows[at:b], fetched, now)
                merger.push_untimed(src, int(offsets[b]), int(rows[b]), fetched, now)
                at = b + 1
            merger.extend(src, times[at:], offsets[at:], rows[at:], fetched, now)
            part.last_input_wall_ms = now

    def release(self, now: int, behind: dict[int, tuple[bool, bool]], emit: Emit) -> int:
        """Process every record the mergers release now, in merge order, handing the encoded
        outputs to ``emit`` every :data:`EMIT_EVERY` records and at the end; returns how many.

        ``behind[p]`` says, per input of partition p, whether the broker holds records not yet
        fetched (the merge then waits for them). Each partition's released records go to its
        engine as one run of columns per hand-over (``ArrayPartitionEngine.process_columns``):
        the common case, a context on contexts or a reward on rewards keyed by its model key,
        in the engine's compiled pass; what the pass leaves through ``_handle``. Actions and
        joined records are encoded together, one compiled pass each per hand-over; each output
        topic's records keep their order, which is all the logs' order depends on
        (bench.worker_path measures this loop by stage)."""
        out_buf = _Outputs(self.config.topics, self.metrics, self.times)
        released = 0
        for p, part in self.partitions.items():
            items = part.merger.pop_ready(now, behind[p])
            for at in range(0, len(items), EMIT_EVERY):
                run = _Run(items, at, at + EMIT_EVERY, p)
                out_buf.mark(p)
                part.engine.process_columns(
                    run.columns(),
                    run,
                    None,
                    lambda j, run=run, part=part: self._handle(part, run, j),
                    _RunOutputs(out_buf, p, run, self),
                )
                run.advance(part.next_offset)
                if at + EMIT_EVERY < len(items):
                    emit(out_buf.take())
            self.metrics["records_in"] += len(items)
            released += len(items)
            out_buf.mark(p)
            out_buf.others += self._maybe_tick(p, part, now)
        emit(out_buf.take())
        return released

    def _handle(self, part: PartitionState, run: "_Run", j: int) -> list:
        """Record j of ``run``, one the engine's compiled pass left: the common case to the
        engine's rules, anything else to ``_other``."""
        ev, ref = run[j]
        cls, key, eng = type(ev), ref.key, part.engine
        first = ReplicaDecision if self.config.learn_only else Context
        if cls is first and ref.source == CONTEXTS and key == ev.model_key.encode():
            return eng.on_decision(ev, ref) if self.config.learn_only else eng.on_context(ev, ref)
        if cls is Reward and ref.source == REWARDS and key == ev.model_key.encode():
            return eng.on_reward(ev, ref)
        return self._other(part, ev, ref)

    def _other(
        self, part: PartitionState, ev: Any, ref: InputRef
    ) -> list[Action | Joined | Rejected]:
        """A record that is not the common case: one that did not decode, one on the wrong topic,
        a tick, or a keyed record whose key is not its model key."""
        if isinstance(ev, DecodeError):
            return [Rejected(ev.reason, ev.detail, ref)]
        first = ReplicaDecision if self.config.learn_only else Context
        if (
            ref.source == CONTEXTS
            and not isinstance(ev, first)
            or ref.source == REWARDS
            and not isinstance(ev, (Reward, Tick))
        ):
            return [
                Rejected(
                    reasons.WRONG_TOPIC,
                    f"a {type(ev).__name__} record on {self.topic_of(ref.source)!r}",
                    ref,
                )
            ]
        if isinstance(ev, Tick):
            if ev.group_id != self.config.group_id:
                # Only this group's workers may move its watermark: a tick from a client, or from
                # another group reading the same rewards topic, would close this group's windows.
                return [
                    Rejected(
                        reasons.FOREIGN_TICK,
                        f"a tick of group {ev.group_id!r}, not {self.config.group_id!r}",
                        ref,
                    )
                ]
            return part.engine.on_tick(ev, ref)
        # A context or reward whose message key is not its model key, or that has none: it is on
        # whatever partition its key (or a random draw) chose, where its model's other records are
        # not, and would build a second copy of the model there.
        if ref.key is None:
            return [
                Rejected(
                    reasons.KEY_MISMATCH,
                    f"no message key: produce {type(ev).__name__.lower()}s keyed by their "
                    f"model key ({ev.model_key!r})",
                    ref,
                )
            ]
        return [
            Rejected(
                reasons.KEY_MISMATCH,
                f"message key {ref.key!r} is not the model key {ev.model_key!r}",
                ref,
            )
        ]

    def _dead_letter(self, p: int, o: Rejected, trigger: InputRef) -> Output:
        """The dead-letter record of a refused input (or of a decision whose update failed)."""
        t = self.config.topics
        self.metrics[f"dead_letter.{o.reason}"] += 1
        src = o.source
        held = self._dead_letter_lines.admit(o.reason)
        if held is not None:
            log.warning(
                "dead letter reason=%s partition=%d offset=%d detail=%s%s",
                o.reason,
                p,
                -1 if isinstance(src, Action) else src.offset,
                o.detail[:300],
                f" ({held} more with this reason held back)" if held else "",
            )
        if isinstance(src, Action):  # update_failed: the decision itself is what could not be used
            dl = DeadLetter(
                o.reason,
                o.detail,
                t.actions,
                p,
                -1,
                src.model_key.encode(),
                encode(src),
                now_ms(),
                trigger.source,
                trigger.offset,
            )
        else:
            key, value, detail = src.key, src.value, o.detail
            limit = self.config.max_dead_letter_bytes
            if len(value or b"") + len(key or b"") > limit:
                # Copied whole, the dead letter would exceed what a producer accepts, and its
                # transaction would fail again on every retry. A prefix, with the original's
                # length and digest, still identifies it (and its offset locates it).
                detail += "; " + "; ".join(
                    f"{what} of {len(b)} bytes (sha256 {hashlib.sha256(b).hexdigest()}) cut to "
                    f"its first {min(len(b), limit // 2)}"
                    for what, b in (("key", key), ("value", value))
                    if b and len(b) > limit // 2
                )
                key = key[: limit // 2] if key else key
                value = value[: limit // 2] if value else value
            dl = DeadLetter(
                o.reason,
                detail,
                self.topic_of(src.source),
                p,
                src.offset,
                key,
                value,
                src.timestamp_ms,
                trigger.source,
                trigger.offset,
            )
            return (t.dead_letter, p, key, encode(dl))
        return (t.dead_letter, p, None, encode(dl))

    def _maybe_tick(self, p: int, part: PartitionState, now: int) -> list[Output]:
        """An idle partition with open decisions gets a watermark tick written into rewards[p]:
        the window still closes, and the tick is in the log, so replay and recovery see it.

        The tick moves event time on by the wall time the partition has been quiet, from its own
        watermark, not to the wall clock: an application whose event time runs behind the wall
        clock (a backlog, a skewed clock) would otherwise see every open window closed by the
        first quiet moment."""
        idle = now - part.last_input_wall_ms
        if (
            (not part.engine.pending and not part.engine.early)
            or idle < self.config.idle_tick_ms
            or now - part.last_tick_wall_ms < self.config.idle_tick_ms
            or part.merger.pending()
        ):
            return []
        part.last_tick_wall_ms = now
        self.metrics["ticks"] += 1
        return [
            (
                self.config.topics.rewards,
                p,
                None,
                encode(Tick(part.engine.watermark_ms + idle, self.config.group_id)),
            )
        ]


class _Fetched:
    """A poll batch: its values and keys, the values decoded into columns, and per record what
    the engine's pass reads beside them (``meta``: the kind it should see the record as, its
    input, offset and record timestamp) and its partition."""

    __slots__ = ("values", "keys", "cols", "meta", "partition", "_events")

    def __init__(self, messages: list[Any], source_of: dict[str, int], learn_only: bool) -> None:
        self.values = values = [m.value() for m in messages]
        self.keys = keys = [m.key() for m in messages]
        self.cols = cols = DecodedColumns(values, keys)
        n = len(messages)
        sources = [source_of[m.topic()] for m in messages]
        meta = np.zeros((n, META_FIELDS), dtype=np.int64)
        meta[:, 1] = sources
        meta[:, 2] = [m.offset() for m in messages]
        meta[:, 3] = [m.timestamp()[1] for m in messages]
        src = meta[:, 1]
        # The pass's case: a context on contexts (a learn-only worker takes replicas' decisions,
        # none of them here) or a reward on rewards, keyed by its model key.
        ctx = (cols.fast == 1) & (src == CONTEXTS) & cols.key_ok & (not learn_only)
        rew = (cols.fast == 2) & (src == REWARDS) & cols.key_ok
        meta[:, 0] = np.where(ctx, CONTEXT, np.where(rew, REWARD_RECORD, OTHER))
        self.meta = meta
        self.partition = [m.partition() for m in messages]
        self._events: dict[int, Any] = {}

    def event(self, i: int) -> Any:
        """Record i, decoded (made once)."""
        ev = self._events.get(i)
        if ev is None:
            ev = self._events[i] = self.cols.record(i)
        return ev

    def ref(self, i: int) -> InputRef:
        _, src, offset, record_ms = self.meta[i].tolist()
        return InputRef(src, self.partition[i], offset, self.keys[i], self.values[i], record_ms)


class _Run:
    """Records ``lo`` to ``hi`` of a release of the merge, as the engine takes a run: its
    columns, and each record with its InputRef when asked for."""

    __slots__ = ("batch", "row", "src", "off", "batches", "p")

    def __init__(self, released: Released, lo: int, hi: int, p: int) -> None:
        self.batch, self.row = released.batch[lo:hi], released.row[lo:hi]
        self.src, self.off = released.src[lo:hi], released.off[lo:hi]
        self.batches, self.p = released.batches, p

    def __len__(self) -> int:
        return len(self.row)

    def __getitem__(self, j: int) -> tuple[Any, InputRef]:
        fetched, i = self.batches[int(self.batch[j])], int(self.row[j])
        return fetched.event(i), fetched.ref(i)

    def columns(self) -> RecordColumns:
        # Per fetched batch, its records' rows in it and places in the run: the merge
        # interleaves a partition's two inputs, and so their batches, record by record.
        rows, n = self.row, len(self.row)
        lo, hi = self.batch.min(), self.batch.max()
        if lo == hi:
            fetched = self.batches[int(lo)]
            parts = [(fetched.cols, rows, np.arange(n), fetched.meta[rows])]
        else:
            distinct, group = np.unique(self.batch, return_inverse=True)
            parts = []
            for g, number in enumerate(distinct.tolist()):
                at = np.flatnonzero(group == g)
                fetched, mine = self.batches[number], rows[at]
                parts.append((fetched.cols, mine, at, fetched.meta[mine]))
        return RecordColumns.gather(n, parts)

    def advance(self, next_offset: dict[int, int]) -> None:
        """The next offset of each input past the run's records (offsets rise within one)."""
        for src in (CONTEXTS, REWARDS):
            at = np.flatnonzero(self.src == src)
            if len(at):
                next_offset[src] = int(self.off[at[-1]]) + 1
