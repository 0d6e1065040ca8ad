"""A batch's outputs and its input offsets in one Kafka transaction: the exactly-once argument.

The worker reads inputs with ``isolation.level=read_committed`` and auto-commit off, and owns one
transactional producer. Per batch:

1. **Begin.** The transaction opens with the batch's first output (:meth:`Transaction.emit`). A
   batch with no output (a reward summed into an open window) opens none: its offsets commit
   with the next batch that has output, because a transaction holding only offsets may be
   applied late or never by a broker (the embedded one does this), which would leave the group's
   offsets behind the worker's. Until then the worker does not snapshot those partitions.
2. **Emit.** Outputs are produced into the open transaction, each to its input's partition
   (co-partitioning), handed over during the batch so librdkafka sends them while the rest is
   processed. Nothing produced here is visible to a read_committed reader yet.
3. **Offsets.** The next offset to process of every input partition (last processed + 1) is
   added to the transaction with the consumer group's metadata (``send_offsets_to_transaction``),
   so that a stale owner of the group is fenced (KIP-447).
4. **Commit.** ``commit_transaction``: the outputs and the offsets become visible together, or,
   if it fails, neither does.
5. **Check.** A record whose delivery failed (the producer's callback, :func:`note_failed_delivery`)
   fails the batch even when the broker accepted the commit: nothing is acknowledged on a
   partial batch.

Every failure leaves through :class:`TransactionFailed` before the caller records the batch as
committed; the caller then calls :meth:`Transaction.abort` and rebuilds its state from what did
commit (the snapshot and the logs) and seeks the consumer back to the committed offsets, so the
batch is read and processed again. What librdkafka reports decides how:

- **fatal** (``KafkaError.fatal()``: the producer was fenced by a newer instance with the same
  transactional id, or its state is broken): :meth:`abort` raises :class:`TransactionFatal` (a
  ``WorkerError``); the process stops without touching the broker again, and whoever owns the
  partitions next recovers them.
- **abortable** (``txn_requires_abort()``, a failed produce, a failed delivery): abort, rebuild,
  read again.
- **retriable** (``retriable()``, e.g. a commit that timed out): handled as abortable. Retrying
  the same call would often do, but an abort and a rebuild are never wrong, and are rare.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from streambandit.stream.errors import WorkerError

__all__ = ["Transaction", "TransactionFailed", "TransactionFatal", "note_failed_delivery"]

log = logging.getLogger("streambandit")

# The errors of a producer whose transactional id a newer instance took over.
_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


class TransactionFailed(Exception):
    """A step of the batch's transaction failed: the caller aborts it and rebuilds."""

    def __init__(self, error: KafkaException) -> None:
        super().__init__(str(error))
        self.error = error


class TransactionFatal(WorkerError):
    """The producer cannot go on (fenced, or a fatal librdkafka error); the worker must stop."""


def note_failed_delivery(errors: list, err: KafkaError | None, msg: Any) -> None:
    """The producer's delivery callback (``functools.partial(note_failed_delivery, errors)``):
    with ``delivery.report.only.error`` it is called for failed records only; one fails the
    batch's commit (step 5). The callback holds the list, not the worker: a bound method would
    make a worker <-> producer reference cycle."""
    if err is not None:
        errors.append(err)


class Transaction:
    """The worker's transactional producer, one batch at a time (steps 1-5 above)."""

    def __init__(self, producer: Producer, delivery_errors: list, transactional_id: str = "") -> None:
        self.producer = producer
        self.transactional_id = transactional_id
        self.delivery_errors = delivery_errors  # appended by note_failed_delivery
        self.open = False

    def emit(self, outputs: list[tuple[str, int, bytes | None, bytes]]) -> None:
        """Steps 1-2: produce ``outputs`` (topic, partition, key, value) in the batch's transaction,
        opening it on the first."""
        if not outputs:
            return
        try:
            if not self.open:
                self.producer.begin_transaction()
                self.open = True
            produce = self.producer.produce
            for topic, p, key, value in outputs:
                try:
                    produce(topic, value, key, p)  # positional: cheaper than keywords, once per output
                except BufferError:  # the local queue is full: let librdkafka send, then retry
                    self.producer.poll(0.1)
                    try:
                        produce(topic, value, key, p)
                    except BufferError:
                        # Escaping as itself it would end the worker with this transaction open;
                        # as a failed produce it is aborted and the batch is read again (abortable).
                        raise KafkaException(KafkaError(
                            KafkaError._QUEUE_FULL, "the producer's queue stayed full after a 0.1 s poll",
                            txn_requires_abort=True)) from None
            self.producer.poll(0)
        except KafkaException as exc:
            raise TransactionFailed(exc) from exc

    def commit(self, offsets: list[TopicPartition], group_metadata: Any) -> None:
        """Steps 3, 4, 5, after at least one :meth:`emit`: the input ``offsets`` (next offset to
        process per partition) and everything emitted, committed together. Raises
        :class:`TransactionFailed` on any failure; on return the batch is committed."""
        if not self.open:
            raise RuntimeError("commit without an open transaction: a batch with no output commits nothing")
        try:
            if offsets:
                self.producer.send_offsets_to_transaction(offsets, group_metadata, 30)
            self.producer.commit_transaction(30)
            self.open = False
            if self.delivery_errors:
                raise KafkaException(self.delivery_errors[0])
        except KafkaException as exc:
            raise TransactionFailed(exc) from exc

    def abort(self, failure: TransactionFailed) -> None:
        """After ``failure``: abort the open transaction, or raise :class:`TransactionFatal` when
        the error is fatal or the abort itself fails. The caller then rebuilds its state."""
        exc = failure.error
        err = exc.args[0] if exc.args else None
        log.error("transaction failed error=%s; aborting and rebuilding partitions", err)
        if isinstance(err, KafkaError) and err.fatal():
            hint = ""
            if err.code() in _FENCED:
                hint = (f"; a newer producer with the transactional id {self.transactional_id!r} started: two live "
                        f"workers must not share an instance id (--instance-id)")
            raise TransactionFatal(f"fatal producer error: {err}{hint}") from exc
        try:
            if self.open:
                self.producer.abort_transaction(30)
        except KafkaException as abort_exc:
            raise TransactionFatal(f"could not abort the failed transaction: {abort_exc}") from exc
        self.open = False
        self.delivery_errors.clear()
