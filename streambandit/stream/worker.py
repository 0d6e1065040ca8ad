"""The Kafka worker: one consumer in a group, one transactional producer, an engine per partition.

Per batch (``step``): poll input records, merge each partition's contexts and rewards into event
time order, run them through the partition's engine, and commit the outputs together with the
input offsets in one Kafka transaction (``_commit``). Snapshots are taken after a commit (by time
and by number of updates) and on revocation; on assignment a partition is restored from its
latest snapshot plus the logs written after it (``_recover``).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import logging
import time
import uuid
import weakref
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from streambandit import reasons
from streambandit.wire.batch_decode import decode_batch
from streambandit.wire.batch_encode import encode_actions, encode_joined_records
from streambandit.errors import StreambanditError
from streambandit.wire import (Action, Context, DeadLetter, DecodeError, InputRef, Joined, Reward, Tick,
                                 decode, encode, pack_snapshot)
from streambandit.stream.engine import PartitionEngine, RecoveryError, Rejected
from streambandit.stream.kafka_config import consumer_settings, producer_settings, reader_settings
from streambandit.stream.logs import committed_view, high_watermark, read_range
from streambandit.stream.merge import CONTEXTS, REWARDS, InputMerger
from streambandit.models_config import ModelsConfig
from streambandit.stream.snapshots import SnapshotStore, usable_snapshots

__all__ = ["Topics", "WorkerConfig", "Worker", "WorkerError", "freeze_long_lived", "snapshot_due"]

log = logging.getLogger("streambandit")


class WorkerError(StreambanditError, RuntimeError):
    """The worker cannot continue (configuration that does not fit the cluster, a fatal producer
    error). Raised from ``run``; a supervisor restarts the process, which then recovers."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topics:
    contexts: str = "contexts"
    rewards: str = "rewards"
    actions: str = "actions"
    joined: str = "joined"
    dead_letter: str = "dead-letter"

    def all(self) -> list[str]:
        return [self.contexts, self.rewards, self.actions, self.joined, self.dead_letter]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    bootstrap_servers: str
    models: ModelsConfig
    group_id: str = "streambandit"
    topics: Topics = Topics()
    # Under a backlog each transaction's commit waits for ~3 serial broker round trips; a larger
    # bound means fewer of them (on the embedded broker 5,000 and 2,000 drain at the same rate
    # within noise: bench/results/e2e.md part 4; a broker with longer round trips gains more).
    # Under light load a batch is what one fetch brought, so the bound adds no latency there.
    batch_max_records: int = 5000
    poll_timeout_ms: int = 50
    merge_wait_ms: int = 20  # how long a record waits for the other input's head (DESIGN 3.4)
    idle_tick_ms: int = 1000  # an idle partition with open decisions gets a watermark tick this often
    snapshot_interval_s: float = 30.0
    # A snapshot pauses the partition's loop (~80 ms with a 2 s window's open decisions at 3,600
    # contexts/s a partition: bench/results/e2e.md, part 6), and recovery re-applies the joined records after
    # it (~50 us each: bench/results/worker.md, 10,000 a partition in ~0.5 s). At 10,000 a busy
    # worker paused every few seconds, which set its p99 latency; 100,000 bounds the replay to
    # ~5 s a partition (the snapshot_interval_s trigger keeps it lower at moderate rates).
    snapshot_every_updates: int = 100_000
    # At most this share of a partition's time goes to snapshotting it: a snapshot costs time in
    # proportion to the partition's models (bench/results/memory.md: 11 s at 100,000 oful models),
    # and the two triggers above do not know that.
    snapshot_max_share: float = 0.1
    max_pending: int = 100_000
    max_early_rewards: int = 10_000
    max_recent: int = 100_000
    kafka: dict[str, Any] = dataclasses.field(default_factory=dict)  # librdkafka settings, dotted names

    def __post_init__(self) -> None:
        if not 0.0 < self.snapshot_max_share <= 1.0:
            raise ValueError(f"snapshot_max_share must be in (0, 1], got {self.snapshot_max_share!r}")


_TIMED = frozenset((Context, Reward, Tick))  # the decoded records that carry an event time


def _now_ms() -> int:
    return int(time.time() * 1000)


def snapshot_due(updates_since: int, seconds_since: float, last_snapshot_s: float, config: WorkerConfig) -> bool:
    """Whether a partition's next snapshot is due: after ``snapshot_every_updates`` updates or
    ``snapshot_interval_s`` seconds, but never sooner than keeps snapshotting within
    ``snapshot_max_share`` of the time (a snapshot that took s seconds is followed by at least
    s (1 / share - 1) seconds without one). Revocation and shutdown snapshot regardless."""
    if seconds_since < last_snapshot_s * (1.0 / config.snapshot_max_share - 1.0):
        return False
    return updates_since >= config.snapshot_every_updates or seconds_since >= config.snapshot_interval_s


def freeze_long_lived() -> None:
    """Take what is alive now out of the cyclic garbage collector's walks (``gc.freeze``).

    A full collection walks every tracked object. At start that is every object the imports made
    (numba's above all), and Python starts one whenever enough objects have survived
    younger collections: in a worker draining a backlog, every few batches, each a pause of up to
    ~90 ms in the middle of a batch (~8 ms frozen: bench/results/e2e.md, part 4). Modules, the configuration and the
    models of a recovered partition live as long as the worker, so the worker freezes them after
    start-up and after each recovery; the collection before the freeze keeps garbage from being
    frozen with them. Frozen objects are still freed when their last reference goes."""
    gc.collect()
    gc.freeze()


@dataclasses.dataclass
class _Partition:
    engine: PartitionEngine
    merger: InputMerger
    next_offset: dict[int, int]  # per input source: the next offset to process (what we commit)
    updates_at_snapshot: int = 0
    snapshot_wall: float = dataclasses.field(default_factory=time.monotonic)
    snapshot_took_s: float = 0.0  # how long the last snapshot of the partition took
    last_input_wall_ms: int = dataclasses.field(default_factory=_now_ms)
    last_tick_wall_ms: int = 0


def _weakly(method: Any) -> Any:
    """A Kafka client callback that calls ``method`` without keeping its object alive: a bound
    method would make a client <-> worker cycle, which the worker's gc.freeze keeps forever."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        m = ref()
        return None if m is None else m(*args)

    return call


def _note_failed_delivery(errors: list, err: KafkaError | None, msg: Any) -> None:
    """The producer's delivery callback: called for failed records only (``delivery.report.only.error``,
    kafka_config.py); one fails the batch's commit (``Worker._commit``)."""
    if err is not None:
        errors.append(err)


_EMIT_EVERY = 256  # records processed between hand-overs of their outputs to the producer


class _TransactionFailed(Exception):
    """Producing a batch's output failed: the batch's transaction is aborted and rebuilt."""

    def __init__(self, error: KafkaException) -> None:
        super().__init__(str(error))
        self.error = error


class _Outputs:
    """A batch's outputs not yet handed to the producer: actions and joined records as records
    (encoded together by ``take``), the rest (dead letters, ticks) already encoded."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        self.actions: list[tuple[int, Action]] = []
        self.joined: list[tuple[int, Joined]] = []
        self.others: list[tuple[str, int, bytes | None, bytes]] = []

    def take(self, metrics: collections.Counter) -> list[tuple[str, int, bytes | None, bytes]]:
        """Everything held, encoded, as (topic, partition, key, value); empties the buffer."""
        t, actions, joined = self.topics, self.actions, self.joined
        out = self.others
        if actions:
            out += [(t.actions, p, a.model_key.encode(), v)
                    for (p, a), v in zip(actions, encode_actions([a for _, a in actions]))]
        if joined:
            out += [(t.joined, p, j.model_key.encode(), v)
                    for (p, j), v in zip(joined, encode_joined_records([j for _, j in joined]))]
        metrics["actions"] += len(actions)
        metrics["joined"] += len(joined)
        self.actions, self.joined, self.others = [], [], []
        return out


class Worker:
    """Run with ``run()``; ``stop()`` (from a signal handler) makes it finish the batch and leave."""

    def __init__(self, config: WorkerConfig, store: SnapshotStore, *, instance_id: str | None = None) -> None:
        self.config = config
        self.store = store
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        c, t = config, config.topics
        self._topic_source = {t.contexts: CONTEXTS, t.rewards: REWARDS}
        self.consumer = Consumer(consumer_settings(c.bootstrap_servers, c.group_id, c.kafka))
        # Errors of failed records, as librdkafka reports them. The producer's callback holds this
        # list, not the worker: a bound method would make a worker <-> producer cycle, which the
        # worker's gc.freeze keeps forever, and a dropped worker's producer would live on (in tests
        # and benchmarks, reconnecting to brokers long stopped).
        self._delivery_errors: list[KafkaError] = []
        self.producer = Producer(producer_settings(c.bootstrap_servers, f"{c.group_id}-{self.instance_id}", c.kafka)
                                 | {"on_delivery": functools.partial(_note_failed_delivery, self._delivery_errors)})
        self.reader = Consumer(reader_settings(c.bootstrap_servers, c.kafka))
        self.partitions: dict[int, _Partition] = {}
        self.metrics: collections.Counter[str] = collections.Counter()
        self._stopping = False
        self._in_transaction = False  # begun by the batch's first output (``_emit``) or its commit
        self._uncommitted = False  # the partitions' state is ahead of the committed log (mid-batch)
        # Merge counters of partitions this worker no longer holds (the metrics stay cumulative).
        self._merge_base = [0, 0]

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self, max_seconds: float | None = None) -> None:
        self.start()
        freeze_long_lived()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        try:
            while not self._stopping and (deadline is None or time.monotonic() < deadline):
                self.step()
        finally:
            self.close()

    def start(self) -> None:
        """Check the topics, open the transactional producer and join the group: what ``run`` does
        before its loop (a caller driving ``step`` itself calls this first)."""
        self._check_topics()
        self.producer.init_transactions(30)
        self.consumer.subscribe([self.config.topics.contexts, self.config.topics.rewards], on_assign=_weakly(self._on_assign),
                                on_revoke=_weakly(self._on_revoke), on_lost=_weakly(self._on_revoke))

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        if self._uncommitted:
            # Stopped by an error in the middle of a batch (a fatal producer error, a bug): the
            # partitions hold records whose outputs and offsets never committed, and a snapshot of
            # them would be ahead of the log, which recovery refuses. The last snapshot and the log
            # are what the next owner recovers from.
            log.error("stopping in the middle of a batch: partitions=%s not snapshotted (their state is ahead of "
                      "the committed log)", sorted(self.partitions))
        else:
            for p in list(self.partitions):
                self._snapshot(p)
        self.partitions.clear()
        try:
            self.consumer.close()
        finally:
            self.reader.close()
            self.producer.flush(10)

    def _check_topics(self) -> None:
        md = self.consumer.list_topics(timeout=10)
        counts = {}
        for name in self.config.topics.all():
            if name not in md.topics or md.topics[name].error is not None:
                raise WorkerError(f"topic {name!r} does not exist")
            counts[name] = len(md.topics[name].partitions)
        if len(set(counts.values())) != 1:
            raise WorkerError(f"topics must be co-partitioned (same partition count): {counts}")

    # -- one batch -----------------------------------------------------------------------------

    def step(self) -> int:
        """Poll, process and commit one batch; returns the number of input records taken."""
        msgs = self._poll_batch()
        # From here until the commit (or the abort and rebuild) the partitions' state may be ahead
        # of the committed log: a snapshot of it would not fit the log (see ``close``).
        self._uncommitted = True
        try:
            offsets, released = self._handle(msgs, _now_ms(), self._emit)
        except _TransactionFailed as exc:
            self._abort_and_rebuild(exc.error)
            return len(msgs)
        # A released record moves the partition's next offset even when it has no output (a
        # reward summed into an open window, an early reward held), so it commits too.
        if self._in_transaction or msgs or released:
            self._commit(offsets)
            self._maybe_snapshot()
        else:
            self._uncommitted = False
        return len(msgs)

    def _handle(self, msgs: list[Any], now: int, emit: Any) -> tuple[list[TopicPartition], int]:
        """Decode, merge and process a polled batch, handing its outputs to ``emit`` as they are
        made: the input offsets to commit, and how many records were processed."""
        records = []
        for msg in msgs:
            if msg.error():
                if msg.error().fatal():
                    raise WorkerError(f"consumer error: {msg.error()}")
                log.warning("consumer error=%s", msg.error())
                continue
            records.append(msg)
        self._buffer(records, now)
        released = self._release(now, emit)
        self.metrics["merge_forced"] = self._merge_base[0] + sum(x.merger.forced for x in self.partitions.values())
        self.metrics["merge_out_of_order"] = self._merge_base[1] + sum(x.merger.out_of_order for x in self.partitions.values())
        self.metrics["pending"] = sum(len(x.engine.pending) for x in self.partitions.values())  # a gauge
        offsets = [TopicPartition(self._topic_of(src), p, off)
                   for p, part in self.partitions.items() for src, off in part.next_offset.items() if off >= 0]
        return offsets, released

    def _buffer(self, records: list[Any], now: int) -> None:
        """Decode the batch's records and buffer each in its partition's merger."""
        # The whole batch is decoded in one pass (2.7 us a context against 8.7 one by one: e2e.md part 2).
        values = [m.value() for m in records]
        partitions, sources = self.partitions, self._topic_source
        # Per partition and source (key 2 p + source), the records in fetch (offset) order, handed
        # to the merger at once.
        runs: collections.defaultdict[int, list[tuple[int, int, int, Any]]] = collections.defaultdict(list)
        for msg, value, ev in zip(records, values, decode_batch(values)):
            p = msg.partition()
            src, offset = sources[msg.topic()], msg.offset()
            ref = InputRef(src, p, offset, msg.key(), value, msg.timestamp()[1])
            if type(ev) in _TIMED:
                runs[2 * p + src].append((ev.timestamp_ms, src, offset, (ev, ref)))
            else:  # a DecodeError, without an event time: the merger places it after what came before it
                part = partitions.get(p)
                if part is not None:
                    part.merger.extend(src, runs.pop(2 * p + src, []), now)
                    part.merger.push(src, offset, None, (ev, ref), now)
                    part.last_input_wall_ms = now
        for key, run in runs.items():
            part = partitions.get(key >> 1)
            if part is None:
                continue  # records fetched just before their partition was revoked
            part.merger.extend(key & 1, run, now)
            part.last_input_wall_ms = now

    def _release(self, now: int, emit: Any) -> int:
        """Process every record the mergers release now, in merge order, handing the encoded
        outputs to ``emit`` every ``_EMIT_EVERY`` records and at the end; returns how many.

        The per-record loop of the worker (bench/results/worker_path.md has its cost): the common
        case, a context on contexts or a reward on rewards keyed by its model key, goes straight to
        the engine; everything else takes ``_process``. Actions and joined records are encoded
        together, one compiled pass each per hand-over (``batch_encode``); each output topic's
        records keep their order, which is all the logs' order depends on. Handing them over
        during the batch lets librdkafka send them while the rest is processed, instead of the
        commit waiting for all of them (bench/results/e2e.md, part 4)."""
        out_buf: _Outputs = _Outputs(self.config.topics)
        behind = self._inputs_behind()
        released = 0
        for p, part in self.partitions.items():
            eng, next_offset = part.engine, part.next_offset
            on_context, on_reward = eng.on_context, eng.on_reward
            actions, joined, others = out_buf.actions, out_buf.joined, out_buf.others
            n = 0
            for _, src, offset, (ev, ref) in part.merger.pop_ready(now, behind[p]):
                cls, key = type(ev), ref.key
                if cls is Context and src == CONTEXTS and (key is None or key == ev.model_key.encode()):
                    out = on_context(ev, ref)
                elif cls is Reward and src == REWARDS and (key is None or key == ev.model_key.encode()):
                    out = on_reward(ev, ref)
                else:
                    out = self._process(p, part, ev, ref)
                for o in out:
                    ocls = type(o)
                    if ocls is Action:
                        actions.append((p, o))
                    elif ocls is Joined:
                        joined.append((p, o))
                    else:
                        others.append(self._dead_letter(p, o, ref))
                next_offset[src] = offset + 1
                n += 1
                if n % _EMIT_EVERY == 0:
                    emit(out_buf.take(self.metrics))
                    actions, joined, others = out_buf.actions, out_buf.joined, out_buf.others
            self.metrics["records_in"] += n
            released += n
            out_buf.others += self._maybe_tick(p, part, now)
        emit(out_buf.take(self.metrics))
        return released

    def _poll_batch(self) -> list[Any]:
        """What is already fetched, up to ``batch_max_records``; when nothing is, wait up to
        ``poll_timeout_ms`` for the first record only. (``consume(n, timeout)`` alone waits the
        whole timeout unless n records come, which under light load adds the timeout to every
        decision's latency.)"""
        n = self.config.batch_max_records
        msgs = self.consumer.consume(n, 0)
        if not msgs:
            # Wait no longer than a held record's merge wait: it is released when that runs out,
            # not when the poll timeout does.
            timeout_ms = self.config.poll_timeout_ms
            now = _now_ms()
            for part in self.partitions.values():
                deadline = part.merger.wait_deadline_ms()
                if deadline is not None:
                    timeout_ms = min(timeout_ms, max(deadline - now, 0))
            msgs = self.consumer.consume(1, timeout_ms / 1000)
            if msgs:
                msgs += self.consumer.consume(n - 1, 0)
        return msgs

    def _inputs_behind(self) -> dict[int, tuple[bool, bool]]:
        """Per partition and input: does the broker hold records not yet delivered to us? The high
        watermark of the partition's last fetch response (cached by librdkafka: no request) is
        beyond the consumer's position, which moves past transaction markers. Unknown (no fetch
        answered yet) counts as behind, so the first batch after an assignment waits for both
        inputs' first fetch."""
        tps = [TopicPartition(self._topic_of(src), p) for p in self.partitions for src in (CONTEXTS, REWARDS)]
        out: dict[int, list[bool]] = {p: [False, False] for p in self.partitions}
        for tp in self.consumer.position(tps) if tps else []:
            src = self._topic_source[tp.topic]
            delivered = tp.offset if tp.offset >= 0 else self.partitions[tp.partition].next_offset[src]
            _, hi = self.consumer.get_watermark_offsets(tp, cached=True)
            out[tp.partition][src] = hi < 0 or hi > delivered
        return {p: (b[0], b[1]) for p, b in out.items()}

    def _topic_of(self, source: int) -> str:
        return self.config.topics.contexts if source == CONTEXTS else self.config.topics.rewards

    def _process(self, p: int, part: _Partition, ev: Any, ref: InputRef) -> list[Action | Joined | Rejected]:
        """A record that is not the common case (``_release`` handles that): a record that did not
        decode, one on the wrong topic, a tick, or a keyed record whose key is not its model key."""
        eng = part.engine
        if isinstance(ev, DecodeError):
            return [Rejected(ev.reason, ev.detail, ref)]
        if ref.source == CONTEXTS and not isinstance(ev, Context) or ref.source == REWARDS and not isinstance(ev, (Reward, Tick)):
            return [Rejected(reasons.WRONG_TOPIC, f"a {type(ev).__name__} record on {self._topic_of(ref.source)!r}", ref)]
        if isinstance(ev, Tick):
            return eng.advance_to(ev.timestamp_ms, ref)
        # a context or reward whose message key is not its model key
        return [Rejected(reasons.KEY_MISMATCH, f"message key {ref.key!r} is not the model key {ev.model_key!r}", ref)]

    def _dead_letter(self, p: int, o: Rejected, trigger: InputRef) -> tuple[str, int, bytes | None, bytes]:
        """The dead-letter record of a refused input (or of a decision whose update failed)."""
        t = self.config.topics
        self.metrics[f"dead_letter.{o.reason}"] += 1
        src = o.source
        if isinstance(src, Action):  # update_failed: the decision itself is what could not be used
            dl = DeadLetter(o.reason, o.detail, t.actions, p, -1, src.model_key.encode(), encode(src), _now_ms(),
                            trigger.source, trigger.offset)
        else:
            dl = DeadLetter(o.reason, o.detail, self._topic_of(src.source), p, src.offset, src.key, src.value,
                            src.timestamp_ms, trigger.source, trigger.offset)
        return (t.dead_letter, p, src.key if isinstance(src, InputRef) else None, encode(dl))

    def _maybe_tick(self, p: int, part: _Partition, now: int) -> list[tuple[str, int, bytes | None, bytes]]:
        """An idle partition with open decisions gets a watermark tick written into rewards[p]:
        the window still closes, and the tick is in the log, so replay and recovery see it.

        The tick moves event time on by the wall time the partition has been quiet, from its own
        watermark, not to the wall clock: an application whose event time runs behind the wall
        clock (a backlog, a skewed clock) would otherwise see every open window closed by the
        first quiet moment."""
        idle = now - part.last_input_wall_ms
        if (not part.engine.pending and not part.engine.early) or idle < self.config.idle_tick_ms \
                or now - part.last_tick_wall_ms < self.config.idle_tick_ms or part.merger.pending():
            return []
        part.last_tick_wall_ms = now
        self.metrics["ticks"] += 1
        return [(self.config.topics.rewards, p, None, encode(Tick(part.engine.watermark_ms + idle)))]

    # -- the commit path -----------------------------------------------------------------------

    def _emit(self, outputs: list[tuple[str, int, bytes | None, bytes]]) -> None:
        """Produce outputs in the batch's transaction, opening it on the first."""
        if not outputs:
            return
        try:
            if not self._in_transaction:
                self.producer.begin_transaction()
                self._in_transaction = True
            self._produce(outputs)
        except KafkaException as exc:
            raise _TransactionFailed(exc) from exc

    def _commit(self, offsets: list[TopicPartition]) -> None:
        """The batch's outputs (produced by ``_emit``) and its input offsets in one transaction.
        Every failure branch aborts before the offsets are committed, and the partitions are then
        rebuilt from what did commit."""
        try:
            # 1. The transaction is open if any output was produced; open it for the offsets alone.
            if not self._in_transaction:
                self.producer.begin_transaction()
                self._in_transaction = True
            # 2. Add the input offsets (next offset to process, per partition) to the transaction.
            if offsets:
                self.producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), 30)
            # 3. Commit: all of it becomes visible, or none of it does.
            self.producer.commit_transaction(30)
            self._in_transaction = False
            if self._delivery_errors:
                raise KafkaException(self._delivery_errors[0])
        except KafkaException as exc:
            self._abort_and_rebuild(exc)
            return
        self._uncommitted = False
        self.metrics["transactions"] += 1

    def _produce(self, outputs: list[tuple[str, int, bytes | None, bytes]]) -> None:
        """Hand every output to the producer, each to its input's partition (co-partitioning).
        Only failed records are reported (``_note_failed_delivery``); in a transaction one makes it
        abortable, so commit_transaction raises and ``_commit``'s failure branch runs."""
        produce = self.producer.produce
        for topic, p, key, value in outputs:
            try:
                produce(topic, value, key, p)  # positional: a third cheaper than keywords
            except BufferError:  # the local queue is full: let librdkafka send, then retry
                self.producer.poll(0.1)
                produce(topic, value, key, p)
        self.producer.poll(0)

    def _abort_and_rebuild(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args else None
        log.error("transaction failed error=%s; aborting and rebuilding partitions", err)
        if isinstance(err, KafkaError) and err.fatal():
            raise WorkerError(f"fatal producer error: {err}") from exc
        try:
            if self._in_transaction:
                self.producer.abort_transaction(30)
        except KafkaException as abort_exc:
            raise WorkerError(f"could not abort the failed transaction: {abort_exc}") from exc
        self._in_transaction = False
        self._delivery_errors.clear()
        self._rebuild_all()
        self._uncommitted = False

    def _rebuild_all(self) -> None:
        assigned = list(self.partitions)
        self.partitions.clear()
        for p in assigned:
            self.partitions[p] = self._recover(p)
        committed = self.consumer.committed([TopicPartition(self._topic_of(s), p) for p in assigned for s in (0, 1)], 30)
        for tp in committed:
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    # -- snapshots -----------------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        now = time.monotonic()
        for p, part in self.partitions.items():
            if snapshot_due(part.engine.updates - part.updates_at_snapshot, now - part.snapshot_wall,
                            part.snapshot_took_s, self.config):
                self._snapshot(p)

    def _snapshot(self, p: int) -> None:
        """Save partition ``p`` as of the last commit (call only between transactions)."""
        part = self.partitions[p]
        t = self.config.topics
        started = time.monotonic()
        # Where our outputs end: past every committed record of ours (no transaction is open, and
        # only this worker writes the partition's outputs), so recovery reads the logs from here.
        out_next = {topic: high_watermark(self.reader, topic, p) for topic in (t.actions, t.joined, t.dead_letter)}
        data = pack_snapshot({
            "partition": p, "created_ms": _now_ms(),
            "contexts_offset": part.next_offset[CONTEXTS], "rewards_offset": part.next_offset[REWARDS],
            "actions_offset": out_next[t.actions], "joined_offset": out_next[t.joined],
            "dead_letter_offset": out_next[t.dead_letter], "engine": part.engine.snapshot(),
        })
        self.store.save(p, data)
        part.updates_at_snapshot = part.engine.updates
        part.snapshot_wall = time.monotonic()
        part.snapshot_took_s = part.snapshot_wall - started
        self.metrics["snapshots"] += 1
        self.metrics["snapshot_bytes"] = len(data)
        log.info("snapshot partition=%d bytes=%d models=%d pending=%d", p, len(data), len(part.engine.models),
                 len(part.engine.pending))

    # -- rebalance -----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        for p in sorted({tp.partition for tp in tps}):
            if p not in self.partitions:
                started = time.monotonic()
                self.partitions[p] = self._recover(p)
                # Persist what recovery rebuilt: the next recovery replays less log.
                self._snapshot(p)
                self.metrics["recovery_ms"] = int((time.monotonic() - started) * 1000)
                freeze_long_lived()
                log.info("partition assigned partition=%d recovered_in_ms=%d", p, self.metrics["recovery_ms"])

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Records fetched but not processed are dropped: their offsets were not committed, so the
        # next owner reads them again. What did commit is snapshotted for a fast handoff.
        for p in sorted({tp.partition for tp in tps}):
            if p in self.partitions:
                self._snapshot(p)
                merger = self.partitions.pop(p).merger
                self._merge_base[0] += merger.forced
                self._merge_base[1] += merger.out_of_order
                log.info("partition revoked partition=%d", p)

    # -- recovery (DESIGN.md 3.3) ----------------------------------------------------------------

    def _recover(self, p: int) -> _Partition:
        """Partition ``p`` from its newest snapshot that fits the configuration and the logs; a
        snapshot that does not (a changed policy or hyper-parameter, logs that do not continue
        it) is reported and the next older one tried, and last the whole joined log from offset 0.
        Never silently fresh models: if even the log does not fit, the worker stops."""
        for snap in [*usable_snapshots(self.store, p), None]:
            try:
                return self._recover_from(p, snap)
            except (ValueError, RecoveryError) as exc:
                if snap is None:
                    raise WorkerError(f"partition {p}: the joined log does not fit the model configuration "
                                      f"({exc}); restore the configuration the log was written with") from exc
                self.metrics["snapshot_fallbacks"] += 1
                log.error("snapshot does not fit partition=%d created_ms=%d error=%s; falling back to an older one "
                          "or the joined log", p, snap["created_ms"], exc)
        raise AssertionError("unreachable")

    def _recover_from(self, p: int, snap: dict | None) -> _Partition:
        c, t = self.config, self.config.topics
        limits = {"max_pending": c.max_pending, "max_early_rewards": c.max_early_rewards, "max_recent": c.max_recent}
        if snap is None:
            engine = PartitionEngine(c.models, **limits)
            start = {"contexts": 0, "rewards": 0, t.actions: 0, t.joined: 0, t.dead_letter: 0}
        else:
            engine = PartitionEngine.restore(c.models, snap["engine"], **limits)
            start = {"contexts": snap["contexts_offset"], "rewards": snap["rewards_offset"], t.actions: snap["actions_offset"],
                     t.joined: snap["joined_offset"], t.dead_letter: snap["dead_letter_offset"]}
        got = self.consumer.committed([TopicPartition(t.contexts, p), TopicPartition(t.rewards, p)], 30)
        committed = {CONTEXTS: max(got[0].offset, 0), REWARDS: max(got[1].offset, 0)}
        if committed[CONTEXTS] < start["contexts"] or committed[REWARDS] < start["rewards"]:
            raise WorkerError(f"partition {p}: snapshot is ahead of the committed offsets ({start} vs {committed})")

        def events_of(topic: str, begin: int, end: int | None = None) -> list[tuple[Any, Any]]:
            out = []
            for m in read_range(self.reader, topic, p, begin, end):
                try:
                    out.append((decode(m.value()), m))
                except DecodeError:
                    out.append((None, m))
            return out

        def trig(e: Any) -> tuple[int, int]:
            return (e.trigger_source, e.trigger_offset)

        joined = committed_view([e for e, _ in events_of(t.joined, start[t.joined]) if e is not None],
                                key=lambda e: e.event_id, trigger=trig, committed=committed)
        actions = committed_view([e for e, _ in events_of(t.actions, start[t.actions]) if e is not None],
                                 key=lambda e: e.event_id, trigger=trig, committed=committed)
        dead = committed_view([e for e, _ in events_of(t.dead_letter, start[t.dead_letter]) if e is not None],
                              key=lambda e: (e.source_topic, e.source_offset, e.value if e.source_offset < 0 else b""),
                              trigger=trig, committed=committed)
        inputs = events_of(t.rewards, start["rewards"], committed[REWARDS])
        contexts = events_of(t.contexts, start["contexts"], committed[CONTEXTS])
        rewards = [(e, InputRef(REWARDS, p, m.offset(), m.key(), m.value(), m.timestamp()[1]))
                   for e, m in inputs if isinstance(e, Reward)]
        dead_lettered = {InputRef(CONTEXTS if d.source_topic == t.contexts else REWARDS, p, d.source_offset)
                         for d in dead if d.source_offset >= 0}
        closed = {decode(d.value).event_id for d in dead if d.reason == reasons.UPDATE_FAILED and d.value}
        stamps = [e.timestamp_ms for e, _ in inputs + contexts if isinstance(e, (Context, Reward, Tick))]
        engine.recover_from_logs(joined, actions, rewards, dead_lettered, closed, max(stamps, default=-(2**63)))
        self.metrics["recovered_joined"] += len(joined)
        return _Partition(engine=engine, merger=InputMerger(c.merge_wait_ms), next_offset=dict(committed))
