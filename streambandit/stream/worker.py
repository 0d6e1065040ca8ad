"""The Kafka worker: one consumer in a group, one transactional producer, a partition's engine
per assigned partition.

The worker is the imperative shell around three parts, each readable on its own:

- ``batch.py``: a poll batch through the partitions' engines, with no Kafka client;
- ``transaction.py``: the batch's outputs and input offsets in one Kafka transaction (its
  docstring is the exactly-once argument, step by step);
- ``recovery.py``: a partition rebuilt from its snapshot and the logs written after it.

Per batch (:meth:`Worker.step`): poll, process (outputs handed to the transaction as they are
made), commit. Snapshots are taken between transactions (by time and by number of updates) and
on revocation; on assignment a partition is recovered and snapshotted at once, or, while another
producer's transaction is open on its output logs, paused alone until it ends (``Waiting``).
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

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from streambandit.config.kafka import consumer_settings, producer_settings, reader_settings
from streambandit.config.worker import WorkerConfig, snapshot_due
from streambandit.engine.chains import ChainPosition, next_chain_id, plan_snapshot
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.stream.authorization import (
    denied_topic_in_log,
    refusal_code,
    refusal_line,
    topic_may_be_named_later,
    transaction_refusal,
)
from streambandit.stream.batch import BatchProcessor, PartitionState, now_ms
from streambandit.stream.errors import NotAuthorized, WorkerError
from streambandit.stream.freeze import FreezeWatch
from streambandit.stream.kafka_checks import (
    GroupProtocol,
    check_client_settings,
    choose_group_protocol,
    kafka_logger,
    wait_for_brokers,
)
from streambandit.stream.logs import (
    COMMITTED_NOT_ANSWERED,
    LogEndUnreadable,
    LogReader,
    TransactionOpen,
    group_committed,
)
from streambandit.stream.outage import BrokerOutage
from streambandit.stream.recovery import recover_partition
from streambandit.stream.snapshot_writer import CAN_FORK, SnapshotWriter
from streambandit.stream.snapshots import SnapshotStore
from streambandit.stream.stall import StallWatch
from streambandit.stream.telemetry import BUCKETS, Histogram, Status, TelemetryServer
from streambandit.stream.transaction import (
    STEP_S,
    BrokerWait,
    StopWhileWaiting,
    Transaction,
    TransactionFailed,
    TransactionFatal,
    commit_offsets,
    group_metadata,
    note_failed_delivery,
)
from streambandit.wire import Snapshot, SnapshotHeader

__all__ = ["Worker", "WorkerError", "freeze_long_lived"]

log = logging.getLogger("streambandit")

# A partition waiting for an open transaction: how often its recovery is tried again (a look at
# its three output logs' ends), and how often the wait is logged again.
WAIT_RETRY_S = 0.5
WAIT_LOG_EVERY_S = 30.0
# A transaction that has just ended can look open for a moment: Apache Kafka writes its commit or
# abort markers to the partitions after the producer's call has returned (the previous owner's
# last batch, or this worker's own last one). A partition's first look at its logs waits this
# long for that before the partition is left waiting; the retries do not wait. The final
# snapshots of a stop or a revocation share one such wait: without it, the last snapshot of a
# partition whose last batch has just committed is held back, and its next owner reads the logs
# from an older one.
MARKERS_WAIT_S = 1.0


@dataclasses.dataclass
class Waiting:
    """An assigned partition whose recovery waits for a transaction open on one of its output
    logs. Its inputs are paused, so nothing of it is fetched or processed until it is recovered;
    the worker's other partitions serve meanwhile."""

    held: TransactionOpen  # the open transaction the last look found
    since: float  # time.monotonic() of the first look that found one
    since_wall: float  # time.time() of the same, for an operator
    next_try: float = 0.0
    next_log: float = 0.0

    def describe(self, p: int) -> str:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.since_wall))
        return (
            f"p{p} waiting for an open transaction on {self.held.topic}-{self.held.partition} "
            f"since {at}"
        )


def _instance_unreleased(err: KafkaError) -> bool:
    """The consumer's error is the broker's UNRELEASED_INSTANCE_ID, fatal to the consumer
    (librdkafka delivers it as _FATAL with the broker's message, its fatal flag unset)."""
    return err.code() == KafkaError._FATAL and "instance ID is still used by another" in err.str()


class _DeniedTopics(logging.Filter):
    """Notes the topic of each librdkafka line that says a transaction was refused a topic (the
    transaction's error does not name it); passes every line."""

    def __init__(self, into: list[str]) -> None:
        super().__init__()
        self.into = into

    def filter(self, record: logging.LogRecord) -> bool:
        topic = denied_topic_in_log(record.getMessage())
        if topic is not None:
            self.into.append(topic)
        return True


def _keys(tps: list[TopicPartition]) -> set[tuple[str, int]]:
    return {(tp.topic, tp.partition) for tp in tps}


def freeze_long_lived() -> None:
    """Take what is alive now out of the cyclic garbage collector's walks (``gc.freeze``).

    A full collection walks every tracked object. At start that is every object the imports made
    (numba's above all), and Python starts one whenever enough objects have survived younger
    collections: in a worker draining a backlog, every few batches, each a pause in the middle
    of a batch (e2e part 4 measures the pauses with and without the freeze). Modules, the
    configuration and the models of a recovered partition live as long as the worker, so the
    worker freezes them after start-up and after each recovery; the collection before the freeze
    keeps garbage from being frozen with them. Frozen objects are still freed when their last
    reference goes."""
    gc.collect()
    gc.freeze()


def _weakly(method: Any) -> Any:
    """A Kafka client callback that calls ``method`` without keeping its object alive: a bound
    method would make a client <-> worker cycle, which the worker's gc.freeze keeps forever."""
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        m = ref()
        return None if m is None else m(*args)

    return call


class _LoopWait(BrokerWait):
    """The worker's side of a wait on an unreachable broker (Worker._broker_waiting), held
    weakly: the worker holds the transaction that holds this."""

    def __init__(self, worker: "Worker") -> None:
        self._worker = weakref.ref(worker)

    def waiting(self, what: str, error: Any) -> None:
        w = self._worker()
        if w is not None:
            w._broker_waiting(what, error)

    def answered(self) -> None:
        w = self._worker()
        if w is not None:
            w._broker_answered()

    def stop_asked(self) -> bool:
        w = self._worker()
        return w is None or w._stopping

    def broker_answers(self) -> bool:
        w = self._worker()
        if w is None:
            return False
        try:
            w.consumer.list_topics(timeout=1)
        except KafkaException:
            return False
        return True


class Worker:
    """Run with ``run()``; ``stop()`` (from a signal handler) makes it finish the batch and leave.

    ``instance_id`` names this worker in the group and, with the group id, makes its
    transactional id. Give every live worker its own, and keep it across restarts (the CLI's
    default is the host name; in Kubernetes, the StatefulSet pod name): a restarted instance then
    fences its killed predecessor at once, and a transaction the predecessor left open ends
    instead of holding back every reader of its partitions until the broker's transaction
    timeout. The default here, a random id, is only for workers whose predecessors' transactions
    need not end early (tests, benchmarks, the demo).
    """

    def __init__(
        self,
        config: WorkerConfig,
        store: SnapshotStore,
        *,
        instance_id: str | None = None,
    ) -> None:
        check_client_settings(
            config
        )  # a bad librdkafka key or value: an error naming it, before any client
        self.config = config
        # Only this group's snapshots: another group on the same topics and store has other models.
        self.store = store.scoped(config.group_id)
        self.metrics: collections.Counter[str] = collections.Counter()
        self.writer = SnapshotWriter(self.store, self.metrics)
        self.fork_snapshots = CAN_FORK
        self.instance_id = instance_id or uuid.uuid4().hex[:12]
        c = config
        self.batch = BatchProcessor(config, self.metrics)
        self.partitions: dict[int, PartitionState] = self.batch.partitions  # the same dict
        # Assigned partitions whose recovery waits for an open transaction (never in partitions).
        self.waiting: dict[int, Waiting] = {}
        # The transactional id: stable for a stable instance id, so that a restarted instance
        # fences its dead predecessor and ends the transaction it left open at once.
        self.transactional_id = f"{c.group_id}-{self.instance_id}"
        quiet = {"logger": kafka_logger()}  # librdkafka's log lines through ours, repeats held back
        # The group consumer is made in start(): its protocol may depend on the broker's answer.
        self.consumer: Any = None
        self.protocol = GroupProtocol("classic", "not joined yet", 6.0)
        # Topic partitions (topic, p) the group has given this member. Partition p is served once
        # both of its inputs are here; a lone half (a split the co-partitioning assignor should
        # not make) stays paused until its other half comes.
        self.assigned: set[tuple[str, int]] = set()
        self._instance_held_since = self._instance_held_logged = 0.0  # see _rejoin_later
        # See _maybe_snapshot: a step longer than half the group session holds snapshots back.
        self._session_s = self.protocol.session_s
        self._polled = time.monotonic()  # when the last consume() returned
        self._freeze = FreezeWatch()  # a process frozen inside a batch does not commit it
        self._wake_after_callback = False  # see _wake_fetchers
        self._snapshots_held_until = 0.0
        # A broker the loop waits for (stream/outage.py): a state it reports, not a hang.
        self.outage = BrokerOutage()
        self._next_probe = 0.0
        self._committing = 0.0  # when the batch's commit began
        # Topics librdkafka's lines say a transaction was refused (see _process_and_commit).
        self._denied: list[str] = []
        self._refused_group = False  # the group refused this principal: no leave to wait for
        self._denied_filter = _DeniedTopics(self._denied)
        kafka_logger().filters.insert(0, self._denied_filter)  # before the repeats are held back
        self.transaction = self._new_transaction(_LoopWait(self))
        # Waits for open transactions on our logs at most the transaction timeout, and a little more.
        open_timeout_s = (
            producer_settings(c.bootstrap_servers, "", c.kafka)["transaction.timeout.ms"] / 1000 + 5
        )
        self.reader = LogReader(
            reader_settings(c.bootstrap_servers, c.kafka) | quiet, open_timeout_s
        )
        self._stopping = False
        # Between joining (or a revocation) and the assignment that ends that rebalance: a leave
        # now lands inside the rebalance (see _leave_when_settled).
        self._rebalancing = True
        # The group's name for this member, read in the loop's own thread at each assignment: the
        # consumer is not called from another thread while the loop polls it.
        self.member_id = ""
        # What an operator sees (stream/telemetry.py). The loop writes these; the HTTP thread
        # reads the published Status and the two plain attributes below, nothing else.
        self.histograms = {name: Histogram(bounds) for name, bounds in BUCKETS.items()}
        self.status: Status | None = None
        self.last_progress = time.monotonic()
        self.recovering = False
        self.started = False
        self._next_publish = self._next_summary = 0.0
        self._summary_base: collections.Counter[str] = collections.Counter()
        self._summary_at = time.monotonic()
        self.telemetry: TelemetryServer | None = None
        if c.metrics_port is not None:
            self.telemetry = TelemetryServer(
                c.metrics_host, c.metrics_port, lambda: self.status, self.health, self.ready
            )
        # A rebalance is reported only once it outlasts two sessions as well: a member's join
        # waits for the others' heartbeats and for a departed member's session to expire, and
        # the wedge this looks for lasts for good (stream/stall.py).
        self._stalls = self._stall_watch()
        self._next_stall_check = 0.0

    def _stall_watch(self) -> StallWatch:
        s = self.config.stall_report_s
        return StallWatch(s, max(s, 2 * self._session_s))

    def _join_group(self) -> None:
        """Choose the group protocol (one log line says which and why) and make the group
        consumer with its settings; start() subscribes it, and the partitions come in _on_assign."""
        c = self.config
        self.protocol = choose_group_protocol(c)
        self._session_s = self.protocol.session_s
        self._stalls = self._stall_watch()
        # A member of an incremental group is never without its assignment for a rebalance, and
        # its first assignment may be empty, with no callback.
        self._rebalancing = not self.protocol.incremental
        log.info(
            "group protocol=%s (%s): %s",
            self.protocol.name,
            "incremental: partitions that keep their owner are served through a rebalance"
            if self.protocol.incremental
            else "eager: every partition stops while the group rebalances",
            self.protocol.reason,
        )
        try:
            settings = consumer_settings(
                c.bootstrap_servers,
                c.group_id,
                c.kafka,
                self.transactional_id if c.static_membership else None,
                protocol=self.protocol.name,
            )
        except ValueError as exc:  # a classic-only setting under the consumer protocol
            raise WorkerError(str(exc)) from None
        # The group's description names each member by it (streambandit status): which worker
        # holds a partition. A client.id of the configuration's wins.
        settings.setdefault("client.id", self.instance_id)
        # error_cb: a consumer that loses every connection says so at once (an idle worker has no
        # commit to find the broker away with).
        self._consumer_settings = (
            settings | {"logger": kafka_logger()} | {"error_cb": _weakly(self._on_consumer_error)}
        )
        self.consumer = Consumer(self._consumer_settings)

    def _subscribe(self) -> None:
        self.consumer.subscribe(
            [self.config.first_input, self.config.topics.rewards],
            on_assign=_weakly(self._on_assign),
            on_revoke=_weakly(self._on_revoke),
            on_lost=_weakly(self._on_lost),
        )

    def _rejoin_later(self) -> None:
        """The broker refused this static member's join: under the consumer protocol (KIP-848)
        an instance id stays with the member that had it until that member leaves or its session
        ends, and a process killed without leaving has not left. Not an error to exit on (a
        restart would be refused the same way until then): a new consumer joins again each
        second, and the line below says what the worker waits for."""
        now = time.monotonic()
        if not self._instance_held_since:
            self._instance_held_since = now
        if now >= self._instance_held_logged:
            self._instance_held_logged = now + 10.0
            log.warning(
                "joining: the group still counts instance id %s as a live member (a process of "
                "this instance stopped without leaving, e.g. killed); the broker releases it when "
                "that member's session ends (%.0f s, group.consumer.session.timeout.ms) and then "
                "moves its partitions; joining again every second, waited_s=%.0f",
                self.transactional_id,
                self._session_s,
                now - self._instance_held_since,
            )
        self.metrics["join_refused"] += 1
        self.consumer.close()
        time.sleep(1.0)
        self.consumer = Consumer(self._consumer_settings)
        self._subscribe()

    def _new_transaction(self, broker_wait: BrokerWait) -> Transaction:
        """A transactional producer with this worker's transactional id, not yet initialised."""
        c = self.config
        delivery_errors: list = []
        producer = Producer(
            producer_settings(c.bootstrap_servers, self.transactional_id, c.kafka)
            | {"logger": kafka_logger()}  # librdkafka's lines through ours, repeats held back
            | {"on_delivery": functools.partial(note_failed_delivery, delivery_errors)}
        )
        return Transaction(producer, delivery_errors, self.transactional_id, broker_wait)

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self, max_seconds: float | None = None) -> None:
        try:
            self.start()
            freeze_long_lived()
            deadline = None if max_seconds is None else time.monotonic() + max_seconds
            while not self._stopping and (deadline is None or time.monotonic() < deadline):
                try:
                    self.step()
                except StopWhileWaiting:
                    # A stop while a recovery or a rebuild waited for the broker (a step's own
                    # batch is abandoned in step): what is not recovered is read again at the
                    # next start, from what committed.
                    break
                self._check_stalls()
                self._report()
        finally:
            self.close()

    # -- what an operator sees -----------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """Liveness: the loop (or a recovery) made progress within ``health_timeout_s``. Waiting
        for an unreachable broker is progress: the loop runs, and a restart would not help."""
        if self.outage.active:
            return True, f"alive; {self.outage.reason()}"
        quiet = time.monotonic() - self.last_progress
        if quiet > self.config.health_timeout_s:
            return (
                False,
                f"stuck: no progress for {quiet:.0f} s (health_timeout_s {self.config.health_timeout_s:g})",
            )
        return True, "recovering" if self.recovering else "ok"

    def ready(self) -> tuple[bool, str]:
        """Readiness: partitions assigned and recovered, the loop serving them."""
        if not self.started:
            return False, "starting: joining the group"
        if self._stopping:
            return False, "stopping"
        if self.outage.active:
            return False, self.outage.reason()
        if self.recovering:
            return False, "recovering partitions"
        if self._instance_held_since:
            return False, "joining: the group still counts this instance id as a live member"
        waiting = list(self.waiting.items())
        if waiting:
            # Not ready: a partition is assigned and not served; its wait may need an operator.
            served = len(self.partitions)
            return False, f"serving {served} of {served + len(waiting)} partitions; " + "; ".join(
                w.describe(p) for p, w in sorted(waiting)
            )
        if not self.partitions:
            return False, "no partitions assigned"
        return True, f"serving {len(self.partitions)} partition(s)"

    def _report(self, force: bool = False) -> None:
        """Publish a Status for the metrics endpoint (about once a second) and log the periodic
        summary line. Broker queries here are the consumer's cached watermarks only."""
        now = time.monotonic()
        self.last_progress = now
        if force or now >= self._next_publish:
            self._next_publish = now + 1.0
            self.status = self._status(now)
        every = self.config.log_summary_s
        if every and now >= self._next_summary:
            if self._next_summary:
                self._log_summary(now)
            self._next_summary = now + every

    def _status(self, now: float) -> Status:
        from streambandit import __version__

        lag = []
        topic_of = self.batch.topic_of
        for p, part in list(self.partitions.items()):
            for src in (CONTEXTS, REWARDS):
                tp = TopicPartition(topic_of(src), p)
                try:
                    _, hi = self.consumer.get_watermark_offsets(tp, cached=True)
                except Exception:  # noqa: BLE001 (no cached figure yet: left out of this Status)
                    continue
                if hi >= 0:
                    lag.append((tp.topic, p, max(hi - part.next_offset[src], 0)))
        parts = list(self.partitions.items())
        return Status(
            counters=dict(self.metrics),
            histograms={k: h.frozen() for k, h in self.histograms.items()},
            assigned=tuple(sorted(p for p, _ in parts)),
            models=sum(len(part.engine.models) for _, part in parts),
            open_decisions=sum(len(part.engine.pending) for _, part in parts),
            lag=tuple(lag),
            snapshot_age_s=tuple((p, now - part.snapshot_wall) for p, part in parts),
            recovery_wait_s=tuple((p, now - w.since) for p, w in sorted(self.waiting.items())),
            broker_unavailable_s=self.outage.seconds() if self.outage.active else None,
            info={
                "version": __version__,
                "group": self.config.group_id,
                "instance": self.instance_id,
            },
        )

    def _log_summary(self, now: float) -> None:
        m, base = self.metrics, self._summary_base
        took = max(now - self._summary_at, 1e-9)
        dead = sum(v for k, v in m.items() if k.startswith("dead_letter.")) - base["dead_letters"]
        lag = sum(n for _, _, n in self.status.lag) if self.status else 0
        log.info(
            "summary partitions=%d records/s=%.0f decisions/s=%.0f joined/s=%.0f open_decisions=%d lag=%d "
            "dead_letters=%d aborts=%d",
            len(self.partitions),
            (m["records_in"] - base["records_in"]) / took,
            (m["actions"] - base["actions"]) / took,
            (m["joined"] - base["joined"]) / took,
            sum(len(part.engine.pending) for part in self.partitions.values()),
            lag,
            dead,
            m["transaction_aborts"] - base["transaction_aborts"],
        )
        self._summary_base = collections.Counter(
            {k: m[k] for k in ("records_in", "actions", "joined", "transaction_aborts")}
        )
        self._summary_base["dead_letters"] = dead + base["dead_letters"]
        self._summary_at = now

    def start(self) -> None:
        """Check the topics, open the transactional producer and join the group: what ``run`` does
        before its loop (a caller driving ``step`` itself calls this first)."""
        wait_for_brokers(self.config)
        self._join_group()
        self._check_topics()
        try:
            self.transaction.producer.init_transactions(30)
        except KafkaException as exc:
            self._raise_if_refused(exc, transactional_id=self.transactional_id)
            raise
        self._subscribe()
        from streambandit import __version__

        c, t = self.config, self.config.topics
        self.started = True
        log.info(
            "worker started version=%s group=%s instance=%s transactional_id=%s brokers=%s %s=%s rewards=%s "
            "actions=%s joined=%s dead_letter=%s models=%s metrics=%s",
            __version__,
            c.group_id,
            self.instance_id,
            self.transactional_id,
            c.bootstrap_servers,
            "decisions" if c.learn_only else "contexts",
            c.first_input,
            t.rewards,
            t.actions,
            t.joined,
            t.dead_letter,
            ",".join(f"{m.match}:{m.policy}/d={m.dim}" for m in c.models.specs),
            f"{c.metrics_host}:{self.telemetry.port}" if self.telemetry is not None else "off",
        )

    def stop(self) -> None:
        self._stopping = True

    def close(self) -> None:
        self._stopping = True
        self._freeze.close()
        kafka_logger().removeFilter(self._denied_filter)
        away = self.outage.active
        if away:
            # A snapshot reads where the output logs end, which an unreachable broker does not
            # say: the next owner recovers from the last snapshot and the logs instead.
            log.info(
                "stop: broker unavailable; partitions=%s not snapshotted, their next owner "
                "recovers them from the stored snapshots and the logs",
                sorted(self.partitions),
            )
            self.transaction.abandon()
        else:
            markers_until = time.monotonic() + MARKERS_WAIT_S
            for p in list(self.partitions):
                self._snapshot_if_settled(p, "stop", final_until=markers_until)
        for p in sorted(self.partitions):
            # Served no more from here: the leave below hands it to another member.
            log.info("partition stopped partition=%d", p)
        self.partitions.clear()
        try:
            self.writer.close()
            if self.consumer is not None:
                self._leave_when_settled()
                self.consumer.close()
        finally:
            self.reader.close()
            try:
                self.transaction.producer.flush(1 if away else 10)
            except KafkaException as exc:
                # A fenced or failed producer, most often why the worker stops: its flush raises
                # too, and must not replace that reason, already on its way up, with its own.
                log.warning("producer not flushed at stop error=%s", exc)
            if self.telemetry is not None:
                self.telemetry.close()

    def _leave_when_settled(self) -> None:
        """Before the consumer's close leaves the group: if a rebalance is under way (this
        worker was revoked or is joining and has no assignment yet), wait for its assignment, at
        most one group session. On the embedded broker a member that leaves inside a rebalance
        can stay counted in the group, gone, and every later join waits for it for good
        (docs/notes/tansu.md); a leave in a settled group is only the next rebalance. Records
        fetched meanwhile are dropped: they are not committed, and the next owner reads them."""
        if not self.started:
            return
        try:
            self.consumer.consume(100, 0)  # serves a revocation the group has already announced
        except KafkaException:
            return
        if (
            not self._rebalancing
            or self.outage.active
            or self.protocol.incremental
            or self._refused_group
        ):
            # Under the consumer protocol (KIP-848) a leave is a heartbeat the coordinator takes
            # at any moment; the wedge waited out here is the classic protocol's on the embedded
            # broker.
            # With the broker away the group cannot move on either: waiting would only delay the
            # stop (docs/operations.md, SIGTERM while waiting). Nor can a group that refused this
            # principal: it was never a member.
            return
        deadline = time.monotonic() + self._session_s
        while self._rebalancing and time.monotonic() < deadline:
            try:
                self.consumer.consume(100, 0.1)
            except KafkaException as exc:  # the consumer is failing: nothing to wait for
                log.warning("stopping: consumer error while waiting for the rebalance: %s", exc)
                return
        if self._rebalancing:
            log.warning(
                "stopping inside a rebalance that did not end within %.0f s; leaving the group "
                "anyway",
                self._session_s,
            )

    def _check_topics(self) -> None:
        md = self.consumer.list_topics(timeout=10)
        counts = {}
        for name in self.config.topics.all(self.config.learn_only):
            if name not in md.topics:
                # A topic the principal may not Describe is left out of a listing of all topics;
                # asked for by name, the broker says why.
                alone = self.consumer.list_topics(name, timeout=10).topics.get(name)
                if alone is not None and alone.error is not None:
                    self._raise_if_refused(
                        alone.error,
                        topics=[name],
                        writing=name in self._output_topics()[:3],
                        describing=True,
                    )
            if name not in md.topics or md.topics[name].error is not None:
                raise WorkerError(f"topic {name!r} does not exist")
            counts[name] = len(md.topics[name].partitions)
        if len(set(counts.values())) != 1:
            raise WorkerError(f"topics must be co-partitioned (same partition count): {counts}")

    # -- one batch -----------------------------------------------------------------------------

    def step(self) -> int:
        """Poll, process and commit one batch (transaction.py has the argument); returns the
        number of input records taken."""
        if self.writer.refused is not None:  # a snapshot the store refused this principal
            self._raise_if_refused(self.writer.refused, topics=self._store_topic(), writing=True)
        if self.waiting:
            self._retry_waiting()
        msgs = self._poll_batch()
        started = time.monotonic()
        records = []
        for msg in msgs:
            if msg.error():
                self._raise_if_refused(
                    msg.error(), topics=[msg.topic()] if msg.topic() else [], group=True
                )
                if _instance_unreleased(msg.error()) and not self.assigned:
                    self._rejoin_later()
                    return len(msgs)
                if msg.error().fatal():
                    raise WorkerError(f"consumer error: {msg.error()}")
                log.warning("consumer error=%s", msg.error())
                continue
            records.append(msg)
        # From here until the commit (or the abort and rebuild) the partitions' state is ahead of
        # what committed: none is snapshotted until it is settled again (``_snapshot_if_settled``).
        try:
            if not self._process_and_commit(records):
                return len(msgs)
        except StopWhileWaiting:
            # A stop while the broker is away: nothing of this batch committed (or, had the
            # broker taken the commit already, it is whole); the next start reads from what did.
            self.transaction.abandon()
            return len(msgs)
        except TransactionFatal as fatal:
            if not fatal.after_outage:
                raise
            self._replace_producer(fatal)
            return len(msgs)
        for part in self.partitions.values():
            part.committed_offset = dict(part.next_offset)
        self.metrics["transactions"] += 1
        done = time.monotonic()
        h, times = self.histograms, self.batch.times
        h["commit"].observe([done - self._committing])
        h["batch"].observe([done - started])
        if times.decided_ms:  # event time to the commit that made the action readable
            h["decision_latency"].observe(
                (now_ms() - np.asarray(times.decided_ms, dtype=np.float64)) / 1000
            )
        if times.reward_delays_ms:
            h["reward_delay"].observe(np.asarray(times.reward_delays_ms, dtype=np.float64) / 1000)
        times.clear()
        self._maybe_snapshot()
        return len(msgs)

    def _process_and_commit(self, records: list[Any]) -> bool:
        """The batch through the engines and its transaction; False when nothing was committed
        (no output, or aborted and rebuilt)."""
        try:
            self.batch.process(records, now_ms(), self._inputs_behind(), self.transaction.emit)
            if not self.transaction.open:
                # No output. The input offsets the batch moved (a reward summed into an open
                # window, an early reward held, a tick read back) commit with the next batch that
                # has output, or once the partition is idle (_commit_idle). Until then a restart
                # reads these records again.
                self._commit_idle()
                return False
            offsets = [TopicPartition(topic, p, off) for topic, p, off in self.batch.offsets()]
            self._committing = time.monotonic()
            self.transaction.flush()
            self.transaction.commit(
                offsets,
                group_metadata(self.consumer, self._freeze.longest_gap_s(), self._session_s),
            )
        except TransactionFailed as failure:
            # The topic a refused transaction wrote is named in librdkafka's log line only,
            # which the producer's poll delivers (it may not have yet).
            if topic_may_be_named_later(failure):
                deadline = time.monotonic() + 1.0
                while not self._denied and time.monotonic() < deadline:
                    self.transaction.producer.poll(0.1)
            denied = self._denied[-1] if self._denied else None
            refusal = transaction_refusal(failure, self._denied)
            self._denied.clear()
            self._raise_if_refused(
                refusal,
                topics=[denied] if denied else self._output_topics(),
                writing=True,
                group=True,
                transactional_id=self.transactional_id,
            )
            self.metrics["transaction_aborts"] += 1
            self.batch.times.clear()
            self.transaction.abort(failure)  # raises when the producer cannot go on
            self._rebuild_all()
            return False
        return True

    # -- a broker that does not answer (stream/outage.py) ------------------------------------

    def _broker_waiting(self, what: str, error: Any, in_step: bool = True) -> None:
        """Between two bounded waits for ``what``: report the outage (a line now and then, the
        gauges, ``/ready``), and leave the step's wait when a stop was asked for."""
        if not self.outage.active:
            self.metrics["broker_outages"] += 1
        line = self.outage.waiting(what, error)
        if line:
            log.warning("%s", line)
        self._report(force=True)
        if not in_step:
            return
        if self._stopping:
            raise StopWhileWaiting()
        time.sleep(0.2)  # a call refused at once (no connection) is not tried again at once

    def _on_consumer_error(self, err: KafkaError) -> None:
        """librdkafka's error callback, served inside ``consume()``: every connection down is an
        outage (probed in _check_stalls until a broker answers); the rest is librdkafka's to
        retry, and its lines say it under ``streambandit.kafka``."""
        if err.code() != KafkaError._ALL_BROKERS_DOWN:
            return
        if not self.outage.active:
            self.metrics["broker_outages"] += 1
        line = self.outage.waiting("a broker to connect to (every connection down)", err)
        if line:
            log.warning("%s", line)

    def _raise_if_refused(
        self,
        error: Any,
        topics: list[str] = (),
        writing: bool = False,
        group: bool = False,
        transactional_id: str | None = None,
        describing: bool = False,
    ) -> None:
        """NotAuthorized when ``error`` is a refused ACL or refused credentials (see
        stream/authorization.py): retrying would be refused again, so the worker stops."""
        line = refusal_line(
            error,
            self.config.kafka or {},
            self.config.bootstrap_servers,
            topics=topics,
            writing=writing,
            describing=describing,
            group=self.config.group_id if group else None,
            transactional_id=transactional_id,
        )
        if line is not None:
            self._refused_group = refusal_code(error) == KafkaError.GROUP_AUTHORIZATION_FAILED
            raise NotAuthorized(line)

    def _output_topics(self) -> list[str]:
        t = self.config.topics
        return [t.actions, t.joined, t.dead_letter, t.rewards]

    def _broker_answered(self) -> None:
        line = self.outage.over()
        if line:
            log.info("%s", line)
            self._report(force=True)

    def _await_broker(self, what: str) -> None:
        """Return once a broker answers a metadata request, waiting in bounded steps."""
        while True:
            try:
                self.consumer.list_topics(timeout=STEP_S)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                if getattr(err, "fatal", lambda: False)():
                    raise
                self._broker_waiting(what, err)
                continue
            self._broker_answered()
            return

    def _replace_producer(self, fatal: TransactionFatal) -> None:
        """The producer cannot go on after its transaction waited for an unreachable broker:
        fenced (the broker aborted the transaction at ``transaction.timeout.ms``), or a call that
        does not complete although the broker answers again (transaction.py, ``until_answered``).
        A new producer with the same transactional id ends whatever the old one left open, and
        every partition is rebuilt from what committed, as after any abort (the batch is read
        again, or not if its commit had completed)."""
        log.warning(
            "%s: starting a new producer with the same transactional id and rebuilding partitions",
            fatal,
        )
        self.batch.times.clear()
        self.metrics["producer_restarts"] += 1
        old = self.transaction
        old.retire()
        try:
            old.producer.purge(in_queue=True, in_flight=True, blocking=False)
        except KafkaException:
            pass
        self.transaction = self._new_transaction(old.broker_wait)
        producer = self.transaction.producer
        self.transaction.until_answered("init_transactions", producer.init_transactions)
        self._rebuild_all()

    def _commit_idle(self) -> None:
        """Commit the processed input of every idle partition (no input for ``idle_commit_ms``)
        that is ahead of its committed offsets, and snapshot an idle partition whose state is past
        its last snapshot, so that its last snapshot holds the end of its input. Its last batches
        had no output, and no later batch with output is coming to carry their offsets. A plain
        consumer commit, outside any transaction: nothing of these batches is in a log, so there
        is nothing to commit with them, and recovery reads the input up to the committed offsets
        again (stream/recovery.py). Not a transaction holding only offsets: the embedded broker
        applies only the first such transaction of a producer (docs/notes/tansu.md)."""
        now = now_ms()
        idle = [
            p for p, part in self.partitions.items() if part.idle(now, self.config.idle_commit_ms)
        ]
        if idle:
            self._past_markers(idle)
        # Committed again even when already committed but not yet snapshotted at its end: the
        # commit names this member and its generation, so its success says the group still gives
        # this worker the partition. A worker resumed after a freeze (SIGSTOP, a paused VM) may
        # not have heard yet that its partitions moved; its commit is refused, and it snapshots
        # nothing of them (test_kafka_faults.py, the frozen idle worker).
        due = [
            p
            for p in idle
            if not self.partitions[p].settled
            or self.partitions[p].snapshot_offset != self.partitions[p].next_offset
        ]
        if not due:
            return
        offsets = [
            TopicPartition(self.batch.topic_of(src), p, off)
            for p in due
            for src, off in self.partitions[p].next_offset.items()
            if off >= 0
        ]
        try:
            commit_offsets(self.consumer, offsets, self._freeze.longest_gap_s(), self._session_s)
        except (TransactionFailed, KafkaException) as exc:
            # A commit needs Read on each input topic.
            self._raise_if_refused(exc, topics=sorted({tp.topic for tp in offsets}), group=True)
            # A rebalance or a lost session: the partitions' next owner reads this input again.
            self.metrics["idle_commit_failures"] += 1
            log.warning("idle partitions=%s: offsets not committed: %s", due, exc)
            return
        for p in due:
            part = self.partitions[p]
            part.committed_offset = dict(part.next_offset)
        self.metrics["idle_commits"] += 1
        self._maybe_snapshot()

    def _past_markers(self, idle: list[int]) -> None:
        """Move the next offset of idle partitions up to the consumer's position: every record
        delivered has been processed (nothing is held for the merge), so what lies between is
        transaction markers (our ticks' among them), and the committed offset reaches the end of
        the partition."""
        topic_of = self.batch.topic_of
        tps = [TopicPartition(topic_of(src), p) for p in idle for src in (CONTEXTS, REWARDS)]
        for tp in self.consumer.position(tps):
            nxt = self.partitions[tp.partition].next_offset
            src = self.batch.source_of[tp.topic]
            if tp.offset > nxt.get(src, 0):
                nxt[src] = tp.offset

    def _check_stalls(self) -> None:
        """Every few seconds: is this worker idle while work waits, or are its commits not
        applied? (stream/stall.py). Broker queries only; never raises."""
        now = time.monotonic()
        if self.outage.active:
            # Seen away (by a commit, or by a stall check of an idle worker): a short metadata
            # request every few seconds says when it is back.
            if now >= self._next_probe:
                self._next_probe = now + STEP_S
                try:
                    self.consumer.list_topics(timeout=1)
                except KafkaException as exc:
                    err = exc.args[0] if exc.args else exc
                    self._broker_waiting("metadata (idle)", err, in_step=False)
                else:
                    self._broker_answered()
            return
        if now < self._next_stall_check:
            return
        self._next_stall_check = now + min(10.0, self.config.stall_report_s / 4)
        try:
            lag = None
            if not self.partitions and not self.waiting:
                lag = self._group_input_lag()
            behind = self._commits_not_applied()
        except KafkaException as exc:  # a broker that does not answer: an outage, probed above
            err = exc.args[0] if exc.args else exc
            self._broker_waiting("the group's offsets (stall check)", err, in_step=False)
            return
        except Exception as exc:  # noqa: BLE001 (the next check tries again)
            log.debug("stall check failed: %s", exc)
            return
        for line in self._stalls.check(
            now,
            assigned=len(self.partitions) + len(self.waiting),
            input_lag=lag,
            behind=behind,
            rebalancing=self._rebalancing,
        ):
            self.metrics["stalls_reported"] += 1
            log.error("stalled: %s", line)

    def _group_input_lag(self) -> int:
        """Records of the inputs the group has not committed yet, over every partition."""
        t = self.config.topics
        md = self.consumer.list_topics(timeout=5)
        tps = [
            TopicPartition(topic, p)
            for topic in (self.config.first_input, t.rewards)
            for p in md.topics[topic].partitions
        ]
        lag = 0
        for tp in self.consumer.committed(tps, 5):
            _, hi = self.consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=5, cached=False
            )
            lag += max(hi - max(tp.offset, 0), 0)
        return lag

    def _commits_not_applied(self) -> dict[tuple[str, int], tuple[int, int]]:
        """Where the group's committed offset is below the one this worker last committed."""
        ours = {
            (self.batch.topic_of(src), p): off
            for p, part in self.partitions.items()
            for src, off in part.committed_offset.items()
            if off > 0
        }
        if not ours:
            return {}
        got = self.consumer.committed([TopicPartition(t, p) for t, p in ours], 5)
        return {
            (tp.topic, tp.partition): (ours[(tp.topic, tp.partition)], max(tp.offset, 0))
            for tp in got
            if max(tp.offset, 0) < ours[(tp.topic, tp.partition)]
        }

    def _poll_batch(self) -> list[Any]:
        """What is already fetched, up to ``batch_max_records``; when nothing is, wait up to
        ``poll_timeout_ms`` for the first record only. (``consume(n, timeout)`` alone waits the
        whole timeout unless n records come, which under light load adds the timeout to every
        decision's latency.)"""
        n = self.config.batch_max_records
        self._freeze.reset()  # a batch's commit checks that the process ran since this poll
        msgs = self.consumer.consume(n, 0)
        if not msgs:
            timeout_ms = self.batch.poll_wait_ms(self.config.poll_timeout_ms, now_ms())
            msgs = self.consumer.consume(1, timeout_ms / 1000)
            if msgs:
                msgs += self.consumer.consume(n - 1, 0)
        if self._wake_after_callback:  # a rebalance callback ran inside these consume() calls
            self._wake_fetchers()
        self._polled = time.monotonic()
        return msgs

    def _wake_fetchers(self) -> None:
        """Send one request to each broker that leads an input this member kept through an
        incremental rebalance: its end offset, asked of the leader.

        librdkafka pauses every assigned partition while a rebalance callback runs. A broker's
        fetcher thread that looks at its partitions during that pause drops them from its fetch
        list and then sleeps until its next periodic wake-up, up to a second, before it sees them
        resumed; a request to that broker wakes it at once. The worker's revoke callback (its
        final snapshot and transaction) outlasts a fetch round trip, so without this the
        partitions a member keeps stop for about a second at each rebalance it gives partitions
        up in (``python -m bench.join``). A request that fails only leaves that wait in place."""
        self._wake_after_callback = False
        kept = sorted(self.assigned)
        woken: set[int] = set()
        try:
            for topic in sorted({t for t, _ in kept}):
                md = self.consumer.list_topics(topic, timeout=1).topics.get(topic)
                for t, p in kept:
                    leader = md.partitions[p].leader if md and p in md.partitions else -1
                    if t == topic and leader >= 0 and leader not in woken:
                        woken.add(leader)
                        self.consumer.get_watermark_offsets(
                            TopicPartition(t, p), timeout=1, cached=False
                        )
        except KafkaException as exc:
            log.debug("rebalance: waking the fetchers of kept partitions failed: %s", exc)
        self.metrics["fetcher_wakes"] += len(woken)

    def _inputs_behind(self) -> dict[int, tuple[bool, bool]]:
        """Per partition and input: does the broker hold records not yet delivered to us? The high
        watermark of the partition's last fetch response (cached by librdkafka: no request) is
        beyond the consumer's position, which moves past transaction markers. Unknown (no fetch
        answered yet) counts as behind, so the first batch after an assignment waits for both
        inputs' first fetch."""
        topic_of = self.batch.topic_of
        tps = [
            TopicPartition(topic_of(src), p) for p in self.partitions for src in (CONTEXTS, REWARDS)
        ]
        out: dict[int, list[bool]] = {p: [False, False] for p in self.partitions}
        for tp in self.consumer.position(tps) if tps else []:
            src = self.batch.source_of[tp.topic]
            delivered = (
                tp.offset if tp.offset >= 0 else self.partitions[tp.partition].next_offset[src]
            )
            _, hi = self.consumer.get_watermark_offsets(tp, cached=True)
            out[tp.partition][src] = hi < 0 or hi > delivered
        return {p: (b[0], b[1]) for p, b in out.items()}

    # -- recovery ------------------------------------------------------------------------------

    def _committed(self, p: int) -> dict[int, int]:
        """The group's committed offset of partition ``p`` per input source (0 when none)."""
        t = self.config.topics
        got = self._group_committed(
            [TopicPartition(self.config.first_input, p), TopicPartition(t.rewards, p)]
        )
        return {CONTEXTS: max(got[0].offset, 0), REWARDS: max(got[1].offset, 0)}

    def _group_committed(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        """The group's committed offsets of ``tps``, waited for as for a broker that is away when
        the coordinator does not answer within a step: after a node's restart, Apache Kafka's
        coordinator loads the offsets topic before it answers, and a worker rebuilding then must
        not exit (a refusal still stops it)."""
        while True:
            try:
                got = group_committed(self.consumer, tps, timeout_s=STEP_S)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else exc
                self._raise_if_refused(err, group=True)
                if (
                    getattr(err, "fatal", lambda: True)()
                    or err.code() not in COMMITTED_NOT_ANSWERED
                ):
                    raise
                self._broker_waiting("the group's committed offsets", err)
                continue
            self._broker_answered()
            return got

    def _recover(self, p: int) -> PartitionState:
        self.writer.wait(p)  # the stored chain includes what this worker handed over for p
        try:
            return recover_partition(
                p,
                self.config,
                self.writer.reads,
                self.reader,
                lambda: self._committed(p),
                self.metrics,
                open_wait_s=0.0 if p in self.waiting else MARKERS_WAIT_S,
            )
        except NotAuthorized:
            raise  # the log reader's, naming its topic
        except (RuntimeError, KafkaException) as exc:  # the snapshot topic's reader
            self._raise_if_refused(exc, topics=self._store_topic())
            raise

    def _store_topic(self) -> list[str]:
        topic = getattr(self.store, "topic", None)  # a TopicStore's
        return [topic] if topic else []

    def _inputs_of(self, p: int) -> list[TopicPartition]:
        return [TopicPartition(self.batch.topic_of(src), p) for src in (CONTEXTS, REWARDS)]

    def _recover_or_wait(self, p: int) -> PartitionState | None:
        """Partition ``p`` recovered; or None, with ``p`` in ``self.waiting``, while a transaction
        is open on one of its output logs. Recovering past it would read the logs short and lose
        what it may yet commit; waiting here would leave every other partition unserved, however
        long the transaction stays open. The caller pauses the inputs of a new waiting one."""
        try:
            return self._recover(p)
        except TransactionOpen as held:
            now = time.monotonic()
            w = self.waiting.get(p)
            if w is None:
                w = self.waiting[p] = Waiting(held, now, time.time())
            w.held = held
            w.next_try = now + WAIT_RETRY_S
            if now >= w.next_log:
                w.next_log = now + WAIT_LOG_EVERY_S
                log.warning(
                    "partition waits for an open transaction partition=%d waited_s=%.0f: %s. Its "
                    "inputs are paused until that transaction commits or aborts; the other "
                    "partitions serve meanwhile. If a worker died inside it, restart that worker "
                    "with its instance id (its transactional id ends it at once), or wait for the "
                    "broker's transaction timeout",
                    p,
                    now - w.since,
                    held,
                )
            return None

    def _take_up(self, p: int) -> bool:
        """Recover partition ``p`` and hold it (see _recover_or_wait); True when it is held."""
        started = time.monotonic()
        part = self._recover_or_wait(p)
        if part is None:
            return False
        self.partitions[p] = part
        # Persist what recovery rebuilt (the models the log replay changed, or a base when no
        # chain was usable): the next recovery replays less log.
        if part.chain is None or part.engine.changed:
            self._snapshot(p)
        took = time.monotonic() - started
        self.metrics["recovery_ms"] = int(took * 1000)
        self.histograms["recovery"].observe([took])
        self.last_progress = time.monotonic()
        freeze_long_lived()
        log.info(
            "partition assigned partition=%d recovered_in_ms=%d models=%d open_decisions=%d",
            p,
            self.metrics["recovery_ms"],
            len(part.engine.models),
            len(part.engine.pending),
        )
        return True

    def _retry_waiting(self) -> None:
        """Between batches: try the waiting partitions' recoveries again. One recovered is read
        from the committed offsets its recovery started from: the open transaction, once
        committed, may have moved them past where the client would resume."""
        now = time.monotonic()
        for p, w in sorted(self.waiting.items()):
            if now < w.next_try or not self._take_up(p):
                continue
            del self.waiting[p]
            part = self.partitions[p]
            for src, off in part.next_offset.items():
                self.consumer.seek(TopicPartition(self.batch.topic_of(src), p, off))
            self.consumer.resume(self._inputs_of(p))
            log.info(
                "partition no longer waits partition=%d waited_s=%.1f",
                p,
                time.monotonic() - w.since,
            )
            self._report(force=True)

    def _rebuild_all(self) -> None:
        """After an aborted transaction: every partition from what did commit, and the consumer
        back at the committed offsets, so the aborted batch is read again."""
        self._await_broker("the committed offsets and logs to rebuild from")
        assigned = list(self.partitions)
        self.partitions.clear()
        self.recovering = True
        try:
            for p in assigned:
                part = self._recover_or_wait(p)
                if part is None:
                    self.consumer.pause(self._inputs_of(p))
                else:
                    self.partitions[p] = part
                self.last_progress = time.monotonic()
        finally:
            self.recovering = False
        held = list(self.partitions)
        committed = self._group_committed([tp for p in held for tp in self._inputs_of(p)])
        for tp in committed:
            self.consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))

    # -- snapshots -----------------------------------------------------------------------------

    def _maybe_snapshot(self) -> None:
        now = time.monotonic()
        if now - self._polled > self._session_s / 2:
            # A step this long may be a process that was stopped (SIGSTOP, a paused VM), its
            # heartbeats with it: the group may have given its partitions to another member, and
            # librdkafka not know it yet (its commit may still succeed, had the transaction's
            # offsets been accepted before the stop). A snapshot now could pair this worker's
            # offsets with the new owner's log ends. Held back one session: by then a heartbeat
            # has been answered, and a loss reaches _on_lost at a poll.
            self._snapshots_held_until = now + self._session_s
            log.warning(
                "a step took %.1f s, more than half the group session (%.0f s): no snapshot for "
                "%.0f s, until the group has confirmed this worker's partitions",
                now - self._polled,
                self._session_s,
                self._session_s,
            )
        if now < self._snapshots_held_until:
            return
        for p in self.writer.take_failures():
            if p in self.partitions:
                self.partitions[
                    p
                ].chain = None  # its changes are in no stored snapshot: a base next
        for p, part in self.partitions.items():
            # Not while the previous one is still being written: its changes go into the next.
            # An idle partition whose state is past its last snapshot is snapshotted now: its
            # last snapshot then holds the end of its input.
            if (
                part.settled
                and not self.writer.busy(p)
                and (
                    snapshot_due(
                        part.engine.updates - part.updates_at_snapshot,
                        now - part.snapshot_wall,
                        part.snapshot_took_s,
                        self.config,
                    )
                    or part.snapshot_offset != part.next_offset
                    and part.idle(now_ms(), self.config.idle_commit_ms)
                )
            ):
                self._snapshot(p)

    def _snapshot_if_settled(self, p: int, why: str, final_until: float) -> None:
        """Snapshot partition ``p`` if everything it processed is committed, and wait until it is
        stored (a revocation, a stop); a transaction that looks open on its output logs is waited
        for until ``final_until`` (time.monotonic, :data:`MARKERS_WAIT_S`). Otherwise (stopped in the middle of a
        batch, or after batches with no output) its state is ahead of the committed offsets, a
        snapshot of it would not fit them, and the next owner recovers from the last snapshot and
        the logs, reading those records again."""
        part = self.partitions[p]
        if part.settled:
            self._snapshot(p, markers_wait_s=max(0.0, final_until - time.monotonic()))
            self.writer.wait(p)
            return
        self.metrics["snapshots_skipped"] += 1
        log.info(
            "%s: partition=%d not snapshotted; its input from %s on was processed but not committed and "
            "is read again by its next owner",
            why,
            p,
            part.committed_offset,
        )

    def _snapshot(self, p: int, markers_wait_s: float = 0.0) -> None:
        """Hand partition ``p``'s state as of the last commit to the writer (call only between
        transactions): a base, or an increment of the models changed since the last snapshot
        (engine/chains.py). The loop pays for the copy of what goes in, or for a fork when that is
        ``snapshot_fork_models`` or more; packing and storing run on the writer's thread or in
        the forked child (bench.snapshots measures the pause)."""
        part = self.partitions[p]
        t = self.config.topics
        started = time.monotonic()
        # Where our outputs end: past every committed record of ours, so recovery reads the logs
        # from here. Settled first: our transaction is closed, but another producer's may be open.
        markers_until = started + markers_wait_s
        try:
            out_next = {
                topic: self.reader.settle(
                    topic,
                    p,
                    wait_s=max(0.0, markers_until - time.monotonic()),
                    unreadable_s=STEP_S,
                )
                for topic in (t.actions, t.joined, t.dead_letter)
            }
        except TransactionOpen as held:
            # Another producer's transaction is open on one of our output logs (a predecessor
            # killed inside one, a zombie's, any client's), or our own last one's markers are not
            # written yet (MARKERS_WAIT_S): where the log ends is not known until
            # it ends, commits or is aborted at its transaction timeout, and waiting for that here
            # would stop the loop past the poll interval. This snapshot waits for the next
            # trigger, after a step; a recovery meanwhile reads more of the logs after the older
            # snapshot, and waits for the transaction itself.
            self.metrics["snapshots_skipped"] += 1
            self._snapshots_held_until = time.monotonic() + STEP_S
            log.warning("snapshot of partition=%d held back: %s", p, held)
            return
        except LogEndUnreadable as exc:
            # The broker (or the partition's leader) does not answer: this snapshot waits for the
            # next trigger, after a step, and nothing of the partition's state is lost meanwhile;
            # a recovery reads more of the logs after the older snapshot instead.
            self.metrics["snapshots_skipped"] += 1
            self._snapshots_held_until = time.monotonic() + STEP_S
            self._broker_waiting(f"the end of partition {p}'s output logs (snapshot)", exc, False)
            return
        engine = part.engine
        kind = "base"
        if self.store.supports_increments:
            kind = plan_snapshot(
                part.chain, len(engine.changed), len(engine.models), self.config.snapshot_base_every
            )
        changed = engine.take_changed()
        if kind == "base":
            part.chain = ChainPosition(
                next_chain_id(now_ms(), part.chain.chain if part.chain else 0), 0
            )
            models = None
        else:
            part.chain = ChainPosition(part.chain.chain, part.chain.seq + 1)
            models = sorted(changed)
        head = SnapshotHeader(
            partition=p,
            created_ms=now_ms(),
            chain=part.chain.chain,
            seq=part.chain.seq,
            contexts_offset=part.next_offset[CONTEXTS],
            rewards_offset=part.next_offset[REWARDS],
            actions_offset=out_next[t.actions],
            joined_offset=out_next[t.joined],
            dead_letter_offset=out_next[t.dead_letter],
        )
        fork_at = self.config.snapshot_fork_models
        if (
            self.fork_snapshots
            and fork_at
            and len(engine.models if models is None else models) >= fork_at
        ):
            self.writer.submit_forked(p, head, engine, models)
        else:
            self.writer.submit(p, Snapshot(head, engine.snapshot(models)))
        part.updates_at_snapshot = engine.updates
        part.snapshot_offset = dict(part.next_offset)
        part.snapshot_wall = time.monotonic()
        part.snapshot_took_s = part.snapshot_wall - started
        self.metrics["snapshot_pause_us"] = int(part.snapshot_took_s * 1e6)

    # -- rebalance -----------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Eager (classic): tps is the whole new assignment, after a revocation of everything.
        # Incremental (KIP-848): tps is what this member gains; what it keeps goes on serving.
        self.member_id = consumer.memberid() or ""
        self._rebalancing = False
        self.metrics["assigns"] += 1
        if self._instance_held_since:
            log.info(
                "joined: instance id %s released after waited_s=%.1f",
                self.transactional_id,
                time.monotonic() - self._instance_held_since,
            )
            self._instance_held_since = 0.0
        if self._stopping:
            # An assignment that arrives while the worker stops (consumer.close() serves a
            # rebalance still in flight) is left unrecovered: the stores and the writer may be
            # closed already, and nothing of it was processed, so the next owner reads it all.
            log.info(
                "rebalance: assigned partitions=%s while stopping; left to the next owner",
                sorted({tp.partition for tp in tps}),
            )
            self._assign(consumer, tps)
            return
        self.assigned |= {(tp.topic, tp.partition) for tp in tps}
        new = sorted(
            p
            for p in {tp.partition for tp in tps}
            if p not in self.partitions and p not in self.waiting and self._whole(p)
        )
        log.info(
            "rebalance: assigned partitions=%s new=%s member=%s",
            sorted({tp.partition for tp in tps}),
            new,
            self.member_id,
        )
        self.recovering = True
        try:
            for p in new:
                self._take_up(p)
        finally:
            self.recovering = False
        # The client assigns after this callback when the callback has not; assigned here, so
        # that the partitions left waiting are paused before anything of them is fetched.
        self._assign(consumer, tps)
        self._pause_unserved(consumer)
        # The inputs of the partitions taken up now are read: a pause from an earlier assignment
        # (a lone half, a wait) can outlive the client's unassignment. A half assigned earlier,
        # paused, whose other half came now reads from where the partition's recovery starts
        # (nothing of it was fetched while paused).
        gained = _keys(tps)
        for p in new:
            if p in self.partitions:
                part = self.partitions[p]
                for tp in self._inputs_of(p):
                    if (tp.topic, p) not in gained:
                        src = self.batch.source_of[tp.topic]
                        consumer.seek(TopicPartition(tp.topic, p, part.next_offset[src]))
                consumer.resume(self._inputs_of(p))
        self._report(force=True)

    def _assign(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        if self.protocol.incremental:
            consumer.incremental_assign(tps)
        else:
            consumer.assign(tps)

    def _whole(self, p: int) -> bool:
        """Both inputs of partition ``p`` are assigned to this member."""
        return all((tp.topic, p) in self.assigned for tp in self._inputs_of(p))

    def _pause_unserved(self, consumer: Consumer) -> None:
        """Pause the assigned inputs of partitions not served: those waiting for an open
        transaction, and a lone half of a partition (its records would be read without the
        partition's state, which its other half's owner may hold)."""
        unserved = [
            TopicPartition(t, p)
            for t, p in sorted(self.assigned)
            if p in self.waiting or not self._whole(p)
        ]
        halves = sorted({tp.partition for tp in unserved if not self._whole(tp.partition)})
        if halves:
            log.warning(
                "rebalance: only one input of partitions=%s assigned to this member; paused "
                "until the other comes (the group's assignor should keep partition p of both "
                "inputs together: partition.assignment.strategy range, or group.remote.assignor "
                "range)",
                halves,
            )
        if unserved:
            consumer.pause(unserved)

    def _on_revoke(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # Records fetched but not processed are dropped: their offsets were not committed, so the
        # next owner reads them again. What did commit is snapshotted for a fast handoff. No
        # transaction is open here: callbacks run inside consume(), between committed batches.
        self.metrics["revokes"] += 1
        self._wake_after_callback = self.protocol.incremental
        if not self.protocol.incremental:
            self._rebalancing = True
        log.info("rebalance: revoked partitions=%s", sorted({tp.partition for tp in tps}))
        self._release(tps, "revoked", snapshot=True)
        # The client unassigns after this callback (incrementally under KIP-848); the other
        # half of a partition split by the revocation is paused meanwhile.
        self._pause_unserved(consumer)

    def _on_lost(self, consumer: Consumer, tps: list[TopicPartition]) -> None:
        # The group took these partitions away without this worker's part in it (its session or
        # poll interval ran out: a frozen or starved process), and another member may own them
        # and have written their logs and snapshots since. No snapshot from here: it would pair
        # this worker's input offsets with the new owner's log ends, under a chain position the
        # new owner may already have used, and later recoveries would miss the new owner's
        # updates. What this worker committed is in the logs and the snapshots already stored.
        self.metrics["losses"] += 1
        self._wake_after_callback = self.protocol.incremental
        if not self.protocol.incremental:
            self._rebalancing = True
        log.warning(
            "rebalance: lost partitions=%s (the group gave them to another member); dropped "
            "without a snapshot",
            sorted({tp.partition for tp in tps}),
        )
        self._release(tps, "lost", snapshot=False)

    def _release(self, tps: list[TopicPartition], why: str, snapshot: bool) -> None:
        """Stop serving every partition one of whose inputs is in ``tps``."""
        markers_until = time.monotonic() + MARKERS_WAIT_S
        for p in sorted({tp.partition for tp in tps}):
            if p in self.partitions:
                if snapshot:
                    self._snapshot_if_settled(p, why, final_until=markers_until)
                self.batch.remove(p)
                log.info("partition %s partition=%d", why, p)
            self._stop_waiting(p, why)
        self.assigned -= _keys(tps)

    def _stop_waiting(self, p: int, why: str) -> None:
        # Nothing of a waiting partition was recovered or processed: it is only forgotten, and
        # the client's unassignment ends its pause.
        w = self.waiting.pop(p, None)
        if w is not None:
            log.info(
                "partition %s partition=%d while waiting for an open transaction waited_s=%.1f",
                why,
                p,
                time.monotonic() - w.since,
            )
