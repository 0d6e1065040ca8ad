"""A batch's outputs and its input offsets in one Kafka transaction: the exactly-once argument.

The worker reads its inputs with ``isolation.level=read_committed`` and auto-commit off, and owns
one transactional producer (idempotent, ``acks=all``, its transactional id stable per instance).
The claim: the outputs of an input record become readable to a read_committed reader when, and
only when, the group's committed offset of its partition moves past it, and then once.
Step by step (``Worker.step`` drives 1-7 for each batch):

1. **Begin.** The transaction opens with the batch's first output (:meth:`Transaction.emit`). A
   batch with no output (a reward summed into an open window) opens none: its offsets commit
   with the next batch that has output, or, once its partitions are idle, by the consumer
   outside any transaction (:func:`commit_offsets`): such a batch wrote nothing that would have
   to commit with them, and recovery reads the input up to the committed offsets again. Not a
   transaction holding only offsets: the embedded broker applies only the first such transaction
   of a producer, which would leave the group's offsets behind the worker's. Until its offsets
   commit the worker does not snapshot a partition. A ``begin_transaction`` that fails leaves
   none open (6).
2. **Emit.** Outputs are produced into the open transaction, each to its input's partition
   (co-partitioning), handed over during the batch so librdkafka sends them while the rest is
   processed. Nothing produced here is visible to a read_committed reader yet. A full local queue
   (``BufferError``) gets one ``poll(0.1)`` to let librdkafka send, then the produce is tried
   again; full a second time, the batch fails with an abortable ``_QUEUE_FULL``, and a produce
   librdkafka refuses (``KafkaException``) fails it with librdkafka's error (6, 7). A record
   whose delivery fails later is reported to :func:`note_failed_delivery`, called from inside
   ``poll``, ``commit_transaction`` or ``abort_transaction``.
3. **Offsets.** First every record emitted is delivered (:meth:`Transaction.flush`), so that
   the transaction shows as open on each output log it writes before its offsets can commit it:
   a next owner of the partitions settles those logs before it reads the committed offsets, and
   so waits for this transaction to end whichever way (step 8). Then the next offset to process
   of every input partition held (last processed + 1) is added to the transaction with the
   consumer group's metadata (``send_offsets_to_transaction``), so that a stale owner of the
   group is fenced (KIP-447). The coordinator checks the member id
   and generation the metadata names, but accepts metadata that names none, as it accepts an old
   client's commit; and librdkafka clears its member id the moment it finds its session timed
   out (a frozen or starved process, whose partitions the group has given away). A commit whose
   metadata was taken then would be accepted on partitions another member owns, so
   :func:`group_metadata` refuses it (6): it reads the member id before and after taking the
   metadata, and a member id that was empty or changed (a rejoin gets a new one) fails the batch.
   A process that was frozen (stream/freeze.py) for more than half the group session since the
   batch's poll fails it too: librdkafka learns of a lost session only after the process runs
   again, and a frozen batch's records may have reached no partition before the flush, where no
   next owner could see them. Apache Kafka also holds a next owner's offset fetch while a
   transaction's offsets are pending (KIP-447's ``require_stable``); on the embedded broker a
   resumed zombie's commit was seen to land after the next owner had recovered without it
   (tests/integration/test_churn.py), and the flush and this check are what keep it out.
4. **Commit.** ``commit_transaction`` first flushes every record produced, serving their delivery
   reports, and fails with an abortable error if any of them failed. A commit it accepts holds
   every output and every offset of the batch; one that fails abortable holds none; one that
   fails fatal or retriable may have committed, or may yet (7, 8). After an accepted commit no
   transaction is open.
5. **Check.** A delivery error still listed after an accepted commit cannot undo it. By 4, and
   because :meth:`Transaction.abort` empties the list only after ``abort_transaction`` has served
   the reports of the records it purged (7), the list then holds no report of this transaction's
   records nor one left over from an aborted transaction: the check guards against a producer
   that breaks 4. Should it fire, :meth:`Transaction.commit` raises :class:`TransactionFailed`
   for a committed batch; :meth:`Transaction.abort` finds no transaction open and aborts nothing,
   and the rebuild (6) reads committed offsets that include the batch, so it is not read again.
   The live state becomes what the logs say, which is what any later recovery builds: nothing is
   lost or doubled, and the cost is a rebuild.
6. **Fail.** Every failure in 1-5 leaves through :class:`TransactionFailed`, before the caller
   records the batch as committed. The caller calls :meth:`Transaction.abort` (7), rebuilds every
   partition from what did commit (the snapshot and the logs, filtered by the committed offsets,
   which a read_committed consumer reads as stable) and seeks the consumer to the committed
   offsets (``Worker._rebuild_all``): the batch is read and processed again, except after 5,
   where it committed and reading resumes after it.
7. **Abort**, by what librdkafka reported:

   - **fatal** (``KafkaError.fatal()``: the producer was fenced by a newer instance with the same
     transactional id, or its state is broken): :class:`TransactionFatal` (a ``WorkerError``),
     without calling ``abort_transaction``; the worker stops (8), unless the transaction had
     waited for an unreachable broker (8a).
   - **anything else**, with a transaction open: ``abort_transaction``, which purges the records
     not yet sent and serves their delivery reports before it returns; then the list of delivery
     errors is emptied, so those reports do not fail the next batch at 5. With none open (a
     ``begin_transaction`` that failed, or after 5) there is nothing to abort, and the list is
     emptied too. This covers abortable errors (``txn_requires_abort()``, a produce refused or
     failed, a failed delivery).
   - **the abort fails** (not retriable): :class:`TransactionFatal`; the worker stops (8).

   **A broker that does not answer** is none of these: a retriable error (a timeout, no
   coordinator) of ``send_offsets_to_transaction``, ``commit_transaction`` or
   ``abort_transaction`` is waited out (:meth:`Transaction.until_answered`): the call is made
   again, every :data:`STEP_S`, until it succeeds or fails otherwise. librdkafka resumes a
   commit or an abort that timed out when it is called again, so the outcome is the one the
   call would have had: a commit applied once, or an abortable or fatal error handled as above.
   The calls run on a thread of their own and the loop waits for them in steps, since a call on
   a coordinator that does not answer can block far past its timeout; between steps the worker
   reports the outage (stream/outage.py) and leaves on a stop (8b).

8. **Stop.** On :class:`TransactionFatal` the worker leaves its loop, its transaction perhaps
   still open or still committing; it neither commits nor aborts again (``Worker.close`` only
   flushes the producer) and snapshots none of the batch's partitions (they are not settled).
   The broker applies the transaction whole or not at all: committed (a commit it accepted, or
   one that completes in the background) or aborted (at the transaction timeout, or at once when
   the restarted instance, with the same transactional id, fences it). The next owner settles
   the output logs (no transaction open on them) before it reads the committed offsets, so it
   builds on whichever happened.

   a. After a wait for the broker, a fencing is most likely the broker's own: it aborted the
      transaction at ``transaction.timeout.ms``. And a call that goes on failing
      :data:`BACK_GRACE_S` after the broker answers again (librdkafka asking a coordinator that
      has gone; an abort whose epoch bump the broker does not grant) is given up. Either is a
      :class:`TransactionFatal` with ``after_outage``, and the worker goes on as a restarted
      instance would, in its own process: a new producer with the same transactional id, whose
      ``init_transactions`` ends the old one's transaction, then the rebuild of 6.
   b. A stop while waiting leaves the transaction to the broker as in 8 (one short
      ``abort_transaction`` is tried: :meth:`Transaction.abandon`).

9. **No transaction is open while the consumer polls.** The worker calls ``consume()`` only in
   ``Worker._poll_batch``, at the start of ``Worker.step``, and every step ends with its
   transaction committed (4), aborted (7), ended by a new producer (8a) or never begun (1), or
   with the loop leaving at a stop (8b); any exception out of a step
   (:class:`TransactionFatal`, a rebuild that fails, a bug) ends ``Worker.run``'s loop, and
   ``Worker.close`` empties the partitions before ``consumer.close()`` runs the revoke callback.
   :attr:`Transaction.open` says whether one is open. The rebalance callbacks run inside
   ``consume()`` and rely on this: ``Worker._on_revoke`` drops a revoked partition's processed
   but uncommitted input, which is safe only if none of its outputs can still commit (an open
   transaction would commit them without the partition's offsets, since a commit names only the
   partitions held, and the next owner would write them again); and both ``_on_revoke`` and
   ``Worker._on_assign`` call ``Worker._snapshot``, which is for between transactions: it reads
   where the output logs end once no transaction is open on them (``LogReader.settle``), and one
   of ours, unable to end while the loop waits inside ``consume()``, would hold that until the
   transaction timeout.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from streambandit.stream.errors import WorkerError
from streambandit.stream.outage import broker_unavailable

__all__ = [
    "BrokerWait",
    "STEP_S",
    "StopWhileWaiting",
    "Transaction",
    "TransactionFailed",
    "TransactionFatal",
    "commit_offsets",
    "group_metadata",
    "note_failed_delivery",
]

log = logging.getLogger("streambandit")

# The errors of a producer whose transactional id a newer instance took over.
_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


class TransactionFailed(Exception):
    """A step of the batch's transaction failed: the caller aborts it and rebuilds."""

    def __init__(self, error: KafkaException) -> None:
        super().__init__(str(error))
        self.error = error


class TransactionFatal(WorkerError):
    """The producer cannot go on (fenced, or a fatal librdkafka error). ``after_outage``: the
    transaction had waited for an unreachable broker, so the broker may have aborted it at its
    timeout and fenced this producer; a new producer can go on (the worker makes one)."""

    def __init__(self, message: str, after_outage: bool = False) -> None:
        super().__init__(message)
        self.after_outage = after_outage


class StopWhileWaiting(Exception):
    """A stop was asked for while the loop waited for an unreachable broker."""


# One bounded wait on the broker: a call that would block longer returns a retriable timeout and
# is called again, so the loop sees a stop and reports the outage every few seconds.
STEP_S = 2.0


class BrokerWait:
    """What the loop does between two bounded waits on an unreachable broker (the worker's
    implementation reports the outage and raises :class:`StopWhileWaiting` on a stop)."""

    def waiting(self, what: str, error: KafkaError) -> None:
        """A wait for ``what`` failed with a retriable ``error``; it is tried again on return."""

    def answered(self) -> None:
        """A call on the broker succeeded."""

    def broker_answers(self) -> bool:
        """Whether a broker answers a metadata request now (asked between two waits)."""
        return False

    def stop_asked(self) -> bool:
        """Whether the loop should leave the wait (asked a few times a second)."""
        return False


# How long a coordinator call may go on failing once the broker answers again (until_answered).
BACK_GRACE_S = 10.0


class _Calls:
    """One daemon thread that makes librdkafka's coordinator calls for the loop, one at a time.
    A daemon: a call left running by a stop does not hold the process's exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._running: Future | None = None

    def submit(self, call: Any, *args: Any) -> Future:
        future: Future = Future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kafka-calls", daemon=True)
            self._thread.start()
        self._queue.put((future, call, args))
        return future

    def busy(self) -> bool:
        return self._running is not None and not self._running.done()

    def close(self) -> None:
        """The thread ends after the call it is making, if any."""
        if self._thread is not None:
            self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, call, args = item
            self._running = future
            future.set_running_or_notify_cancel()
            try:
                future.set_result(call(*args))
            except BaseException as exc:  # noqa: BLE001 (the loop's to raise)
                future.set_exception(exc)
            del future, call, args  # nothing of a finished call kept alive until the next


def group_metadata(consumer: Any, frozen_s: float = 0.0, session_s: float = math.inf) -> Any:
    """Step 3's group metadata, taken while the consumer is a member of the group throughout; else
    :class:`TransactionFailed` (``UNKNOWN_MEMBER_ID``), for the caller to abort and rebuild: a
    session that timed out leaves librdkafka with no member id, and metadata without one would be
    accepted unchecked. The partitions' loss reaches the worker at its next poll.

    ``frozen_s``: the longest the process stood still since the batch's poll
    (stream/freeze.py). Longer than half the group session (``session_s``), the group may have
    moved on before librdkafka can know it, and the batch fails the same way: aborting it is
    always safe, committing it is not on a broker that does not hold the next owner's offsets
    for it (the embedded broker)."""
    _refuse_if_frozen(frozen_s, session_s)
    before = consumer.memberid()
    metadata = consumer.consumer_group_metadata()
    after = consumer.memberid()
    if not before or after != before:
        raise TransactionFailed(
            KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_MEMBER_ID,
                    "this consumer is no longer a member of its group (its session timed out "
                    "or it left): the group has given its partitions to another member",
                )
            )
        )
    return metadata


def _refuse_if_frozen(frozen_s: float, session_s: float) -> None:
    if frozen_s > session_s / 2:
        raise TransactionFailed(
            KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_MEMBER_ID,
                    f"this process stood still for {frozen_s:.1f} s during the batch, more than "
                    f"half the group session ({session_s:.0f} s): the group may have given its "
                    "partitions to another member, so the batch is aborted and read again",
                )
            )
        )


def commit_offsets(
    consumer: Any, offsets: list[TopicPartition], frozen_s: float = 0.0, session_s: float = math.inf
) -> None:
    """The input offsets of batches that had no output, committed by the consumer outside any
    transaction (step 1), while it is a member of the group throughout and was not frozen, as
    step 3 asks of a transaction's metadata; else :class:`TransactionFailed` (nothing was
    committed). The commit names the member and its generation, so a member the group has
    replaced is refused by a broker that checks them."""
    _refuse_if_frozen(frozen_s, session_s)
    before = consumer.memberid()
    if not before:
        raise TransactionFailed(
            KafkaException(
                KafkaError(
                    KafkaError.UNKNOWN_MEMBER_ID, "this consumer is no longer a member of its group"
                )
            )
        )
    consumer.commit(offsets=offsets, asynchronous=False)
    if consumer.memberid() != before:  # a rejoin meanwhile: the commit may have named either
        raise TransactionFailed(
            KafkaException(
                KafkaError(KafkaError.UNKNOWN_MEMBER_ID, "this consumer rejoined its group")
            )
        )


def note_failed_delivery(errors: list, err: KafkaError | None, msg: Any) -> None:
    """The producer's delivery callback (``functools.partial(note_failed_delivery, errors)``):
    with ``delivery.report.only.error`` it is called for failed records only. librdkafka fails
    the commit of such a record's transaction itself (step 4); the list is step 5's guard, and
    :meth:`Transaction.abort` empties it (step 7). The callback holds the list, not the worker: a
    bound method would make a worker <-> producer reference cycle."""
    if err is not None:
        errors.append(err)


class Transaction:
    """The worker's transactional producer, one batch at a time (steps 1-7 above; the worker
    does 6, 8 and 9). ``open``: whether a transaction is open."""

    def __init__(
        self,
        producer: Producer,
        delivery_errors: list,
        transactional_id: str = "",
        broker_wait: BrokerWait | None = None,
    ) -> None:
        self.producer = producer
        self.transactional_id = transactional_id
        self.delivery_errors = delivery_errors  # appended by note_failed_delivery
        self.open = False
        self.broker_wait = broker_wait or BrokerWait()
        self.waited = False  # the open transaction waited for an unreachable broker
        self._calls = _Calls()

    def until_answered(self, what: str, call: Any) -> None:
        """``call(timeout_s)``, a librdkafka call on a coordinator, made on a thread of its own
        while the loop waits for it in steps of :data:`STEP_S`, reporting the outage and leaving
        on a stop between steps: librdkafka's coordinator calls can block well past their own
        timeout while a broker does not answer. A retriable failure (the broker did not answer;
        librdkafka resumes a commit, an abort or an init that timed out when it is called
        again) is called again, until the call succeeds or fails otherwise.

        A call that neither returns nor succeeds for :data:`BACK_GRACE_S` after the broker
        answers metadata again raises :class:`TransactionFatal` (``after_outage``): librdkafka
        stuck on a coordinator that has gone (librdkafka issues 5456, 5511), or an abort that
        needs an epoch bump the broker does not grant (Tansu's). A new producer with the same
        transactional id ends the transaction either way (the worker makes one)."""
        back_since: float | None = None  # when the broker first answered metadata again
        first = time.monotonic()
        while True:
            started = reported = time.monotonic()
            future = self._calls.submit(call, STEP_S)
            while True:
                try:
                    future.result(timeout=0.25)
                except FutureTimeout:
                    # A stop leaves only a call that has waited a step: one the broker answers
                    # in time completes, so that a clean stop ends with its batch committed.
                    if self.broker_wait.stop_asked() and time.monotonic() - first >= STEP_S:
                        raise StopWhileWaiting() from None
                    if time.monotonic() - reported < STEP_S + 0.5:
                        continue
                    reported = time.monotonic()
                    error: Any = f"no answer for {reported - started:.0f} s"
                except KafkaException as exc:
                    error = exc.args[0] if exc.args else None
                    if not broker_unavailable(error):
                        raise
                else:
                    self.broker_wait.answered()
                    return
                self.waited = self.waited or self.open
                self.broker_wait.waiting(what, error)
                now = time.monotonic()
                if not self.broker_wait.broker_answers():
                    back_since = None
                elif back_since is None:
                    back_since = now
                elif now - back_since > BACK_GRACE_S:
                    raise TransactionFatal(
                        f"librdkafka's {what} has not completed {now - back_since:.0f} s after "
                        f"the broker answered again (last error: {error})",
                        after_outage=True,
                    )
                if future.done():
                    break  # failed: called again

    def busy(self) -> bool:
        """A call of :meth:`until_answered` is still running (left by a stop)."""
        return self._calls.busy()

    def retire(self) -> None:
        """This producer is replaced: its calls' thread ends (after a call still running)."""
        self._calls.close()

    def emit(self, outputs: list[tuple[str, int, bytes | None, bytes]]) -> None:
        """Steps 1-2: produce ``outputs`` (topic, partition, key, value) in the batch's transaction,
        opening it on the first. Raises :class:`TransactionFailed` when the transaction cannot
        begin, librdkafka refuses a record, or the queue is still full after one poll."""
        if not outputs:
            return
        try:
            if not self.open:
                self.producer.begin_transaction()
                self.open = True
                self.waited = False
            produce = self.producer.produce
            for topic, p, key, value in outputs:
                try:
                    produce(
                        topic, value, key, p
                    )  # positional: cheaper than keywords, once per output
                except BufferError:  # the local queue is full: let librdkafka send, then retry
                    self.producer.poll(0.1)
                    try:
                        produce(topic, value, key, p)
                    except BufferError:
                        # Escaping as itself it would end the worker with this transaction open;
                        # as a failed produce it is aborted and the batch is read again (step 2).
                        raise KafkaException(
                            KafkaError(
                                KafkaError._QUEUE_FULL,
                                "the producer's queue stayed full after a 0.1 s poll",
                                txn_requires_abort=True,
                            )
                        ) from None
            self.producer.poll(0)
        except KafkaException as exc:
            raise TransactionFailed(exc) from exc

    def flush(self) -> None:
        """Step 3's first half: every record emitted delivered to its partition, before the offsets
        join the transaction, so that from then on the transaction shows as open on every output
        log it writes and a next owner's recovery waits for it (``LogReader.settle``). A delivery
        that failed is not raised here: the transaction then fails its next call with the cause
        (a topic refused, say), which a failed record's own error (``_PURGE_QUEUE`` when
        librdkafka drops the rest) does not name (step 4)."""

        def flushed(timeout_s: float) -> None:
            left = self.producer.flush(timeout_s)
            if left:  # retriable: waited out as a broker that does not answer
                raise KafkaException(
                    KafkaError(
                        KafkaError._TIMED_OUT,
                        f"{left} records not delivered yet",
                        retriable=True,
                    )
                )

        try:
            self.until_answered("flush", flushed)
        except KafkaException as exc:
            raise TransactionFailed(exc) from exc

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Steps 3, 4, 5, after at least one :meth:`emit`: the input ``offsets`` (next offset to
        process per partition) and everything emitted, committed together. Raises
        :class:`TransactionFailed` on any failure, and at step 5 for a batch that did commit; on
        return the batch is committed and no transaction is open."""
        if not self.open:
            raise RuntimeError(
                "commit without an open transaction: a batch with no output commits nothing"
            )
        try:
            if offsets:
                self.until_answered(
                    "send_offsets_to_transaction",
                    lambda t: self.producer.send_offsets_to_transaction(offsets, group_metadata, t),
                )
            self.until_answered("commit_transaction", self.producer.commit_transaction)
            self.open = False
            if self.delivery_errors:
                raise KafkaException(self.delivery_errors[0])
        except KafkaException as exc:
            raise TransactionFailed(exc) from exc

    def abort(self, failure: TransactionFailed) -> None:
        """Step 7, after ``failure``: abort the open transaction, if one is, and forget the
        delivery errors; or raise :class:`TransactionFatal` when the error is fatal or the abort
        itself fails. The caller then rebuilds its state from what committed (step 6)."""
        exc = failure.error
        err = exc.args[0] if exc.args else None
        log.error("transaction failed error=%s; aborting and rebuilding partitions", err)
        if isinstance(err, KafkaError) and err.fatal():
            hint = ""
            if err.code() in _FENCED and self.waited:
                hint = (
                    "; the transaction had waited for the broker, which aborted it at its "
                    "transaction.timeout.ms"
                )
            elif err.code() in _FENCED:
                hint = (
                    f"; a newer producer with the transactional id {self.transactional_id!r} started (two "
                    f"live workers must not share an instance id, --instance-id), or the broker aborted "
                    f"this transaction at its transaction.timeout.ms (the worker or the cluster stalled "
                    f"that long)"
                )
            raise TransactionFatal(
                f"fatal producer error: {err}{hint}", after_outage=self.waited
            ) from exc
        try:
            if self.open:
                self.until_answered("abort_transaction", self.producer.abort_transaction)
        except KafkaException as abort_exc:
            raise TransactionFatal(
                f"could not abort the failed transaction: {abort_exc}", after_outage=self.waited
            ) from exc
        self.open = False
        self.delivery_errors.clear()

    def abandon(self) -> None:
        """On a stop while the broker is unreachable: one short attempt to abort the open
        transaction, and the records not sent dropped. What stays open on the broker ends when
        this instance starts again (the same transactional id fences it) or at the transaction
        timeout; either way none of it was committed, and the next owner reads its input again."""
        if self.open and not self.busy():  # a call still running would refuse the abort
            try:
                self.producer.abort_transaction(1)
                self.open = False
            except KafkaException as exc:
                log.warning("open transaction not aborted at stop error=%s", exc.args[0])
        self.producer.purge(in_queue=True, in_flight=True, blocking=False)
