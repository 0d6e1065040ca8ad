"""Reading our own logs back: bounded offset ranges of one partition, and the filter that makes
them exact on any broker.

``committed_view`` keeps what a committed transaction wrote: records whose trigger input lies
below the committed input offsets, and of each natural key the last occurrence. On Apache Kafka,
read_committed already hides aborted transactions and this filter changes nothing; on a broker
that shows aborted records (Tansu, docs/notes/tansu.md) it removes them, because the worker's
redo of an aborted batch writes the same records again later in the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Hashable, Iterable, Protocol, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from streambandit.config.kafka import RANGE_READS
from streambandit.stream.errors import NotAuthorized, WorkerError

__all__ = [
    "read_range",
    "committed_view",
    "group_committed",
    "high_watermark",
    "LogReader",
    "OpenTransactionTimeout",
    "TransactionOpen",
]

log = logging.getLogger("streambandit")


class Logged(Protocol):
    """An output record as committed_view reads it (wire/records.py: Action, Joined, DeadLetter)."""

    @property
    def natural_key(self) -> Hashable: ...

    @property
    def trigger(self) -> tuple[int, int]: ...


T = TypeVar("T", bound=Logged)


def high_watermark(consumer: Consumer, topic: str, partition: int, timeout_s: float = 10.0) -> int:
    """The offset after the last readable record (for a read_committed consumer: the LSO)."""
    _, hi = consumer.get_watermark_offsets(
        TopicPartition(topic, partition), timeout=timeout_s, cached=False
    )
    return int(hi)


# The group's coordinator is elsewhere, or still loading the group: librdkafka hands these back
# from committed() at once instead of asking again. Apache Kafka answers so for a moment after a
# cluster's first group request (the offsets topic is being created) and while a coordinator moves.
_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)

# committed() did not complete: no broker answered in time, or the coordinator is still not
# ready. A worker waits these out as an outage (Worker._group_committed); a one-shot command
# reports them.
COMMITTED_NOT_ANSWERED = _COORDINATOR_MOVING | {
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._WAIT_COORD,
    KafkaError.REQUEST_TIMED_OUT,
}


def group_committed(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = 30.0
) -> list[TopicPartition]:
    """``consumer.committed(partitions)``, asked again while the group's coordinator moves or
    loads, for up to ``timeout_s`` in all."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.committed(partitions, max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() not in _COORDINATOR_MOVING or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def read_range(
    consumer: Consumer,
    topic: str,
    partition: int,
    start: int,
    end: int | None = None,
    timeout_s: float = 30.0,
) -> list[Any]:
    """All messages of ``topic[partition]`` with ``start <= offset < end`` (``end=None``: up to
    the high watermark at call time), in offset order. ``consumer`` must not be subscribed."""
    if end is None:
        end = high_watermark(consumer, topic, partition)
    if start >= end:
        return []
    consumer.assign([TopicPartition(topic, partition, start)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                # Transaction markers occupy offsets: the position may reach `end` with no message.
                pos = consumer.position([TopicPartition(topic, partition)])[0].offset
                if pos >= end:
                    return out
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                raise RuntimeError(f"reading {topic}[{partition}]: {msg.error()}") from (
                    KafkaException(msg.error())
                )
            if msg.offset() >= end:
                return out
            out.append(msg)
            if msg.offset() == end - 1:
                return out
        raise TimeoutError(
            f"reading {topic}[{partition}] {start}..{end} took longer than {timeout_s} s"
        )
    finally:
        consumer.unassign()


def committed_view(records: Iterable[T], committed: dict[int, int]) -> list[T]:
    """The records a committed transaction wrote, in log order (see the module docstring).

    A record's ``trigger`` is (input source, input offset); ``committed[source]`` the committed
    offset of that input (the next offset to process). A record without a trigger (source -1) is
    kept.
    """
    kept: dict[Any, tuple[int, T]] = {}
    for i, r in enumerate(records):
        src, off = r.trigger
        if src >= 0 and off >= committed.get(src, 0):
            continue  # written by a batch whose input offsets never committed
        kept[r.natural_key] = (
            i,
            r,
        )  # the last occurrence wins: a redo follows the aborted original
    return [r for _, r in sorted(kept.values(), key=lambda t: t[0])]


class OpenTransactionTimeout(WorkerError):
    """A transaction stayed open on one of our output partitions past the transaction timeout."""


class LogEndUnreadable(WorkerError):
    """Where one of our output logs ends could not be read: the broker or the partition's leader
    did not answer within the reader's bound."""


class TransactionOpen(Exception):
    """A transaction is open on ``topic[partition]`` now: a read of it would stop short.

    What the broker reports is all that is known of it here (librdkafka has no call that names a
    transaction's producer): the log's end, which lies past the transaction's records, and the
    read_committed end. That end is where Apache Kafka's open transaction begins; the embedded
    broker reports it so, or as 0 (docs/notes/tansu.md), so it is never named as the start."""

    def __init__(self, topic: str, partition: int, committed_end: int, log_end: int) -> None:
        super().__init__(
            f"a transaction is open on {topic}[{partition}] (the log ends at offset {log_end}; "
            f"read_committed readers are held at offset {committed_end})"
        )
        self.topic, self.partition = topic, partition
        self.committed_end, self.log_end = committed_end, log_end


class LogReader:
    """Reads the worker's own output logs back (recovery, snapshots), never past an end it has
    not verified.

    The end of a log to a read_committed reader is its last stable offset: where the first
    transaction still open begins. While some producer's transaction is open on a partition (a
    worker killed inside one, a fenced zombie's), that end is below records that may yet commit,
    and the embedded broker even reports it as 0. Reading "to the end" then silently reads too
    little, and a recovery built on it loses the updates it did not see. So :meth:`settle` first
    waits until no transaction is open on the partition (the read_committed end equals the
    read_uncommitted one): the open transaction commits, is aborted by its producer's restart
    (same transactional id), or is aborted by the broker after the transaction timeout. Past
    that bound it raises :class:`OpenTransactionTimeout` naming the partition. ``settle(...,
    wait_s=...)`` waits only that long and then raises :class:`TransactionOpen`, for a caller
    that has other work to do meanwhile (a worker's recovery, stream/worker.py).

    A partition whose leader is moving (its broker died: not the leader any more, no leader
    known yet, a request that timed out) answers again once the cluster has elected another,
    within seconds: such errors are waited out within the same bound, not raised at once.
    """

    def __init__(self, settings: dict[str, Any], open_timeout_s: float) -> None:
        settings = RANGE_READS | settings
        self.settings = settings
        self.committed = Consumer(settings)
        self.uncommitted = Consumer(settings | {"isolation.level": "read_uncommitted"})
        self.open_timeout_s = open_timeout_s

    def settle(
        self,
        topic: str,
        partition: int,
        wait_s: float | None = None,
        unreadable_s: float | None = None,
    ) -> int:
        """The end of ``topic[partition]`` once no transaction is open on it (see the class).
        ``unreadable_s``: give up reading the end after this long (:class:`LogEndUnreadable`)
        instead of the reader's whole bound."""
        tp = TopicPartition(topic, partition)
        deadline = time.monotonic() + self.open_timeout_s
        read_deadline = deadline if unreadable_s is None else time.monotonic() + unreadable_s
        open_deadline = deadline if wait_s is None else time.monotonic() + wait_s
        failing = None
        while True:
            try:
                # The end first, then the stable end: a commit that lands between the two reads
                # then shows as settled (the stable end reaches the end read before it), not open.
                _, end = self.uncommitted.get_watermark_offsets(tp, timeout=10, cached=False)
                _, stable = self.committed.get_watermark_offsets(tp, timeout=10, cached=False)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.fatal():
                    raise
                self._raise_if_refused(exc, topic)
                if time.monotonic() >= read_deadline:
                    raise LogEndUnreadable(
                        f"{topic}[{partition}]: where the log ends could not be read within "
                        f"{min(self.open_timeout_s, unreadable_s or self.open_timeout_s):.0f} s: "
                        f"{err}"
                    ) from exc
                if failing is None:
                    log.warning(
                        "log end of %s[%d] not readable yet error=%s; retrying",
                        topic,
                        partition,
                        err,
                    )
                failing = err
                # A leader this client has not learnt of yet: librdkafka does not look for it by
                # itself for a partition that it neither consumes nor produces to.
                for client in (self.committed, self.uncommitted):
                    try:
                        client.list_topics(topic, timeout=2)
                    except KafkaException:
                        pass
                time.sleep(0.2)
                continue
            if failing is not None:
                log.info("log end of %s[%d] readable again", topic, partition)
                failing = None
            if stable >= end:
                return int(stable)
            if wait_s is not None and time.monotonic() >= open_deadline:
                raise TransactionOpen(topic, partition, int(stable), int(end))
            if time.monotonic() >= deadline:
                raise OpenTransactionTimeout(
                    f"{TransactionOpen(topic, partition, int(stable), int(end))} and did not end "
                    f"within {self.open_timeout_s:.0f} s; restart the worker that wrote it with the "
                    f"same instance id (its transactional id), or wait for the broker's transaction "
                    f"timeout"
                )
            time.sleep(0.1)

    def read(self, topic: str, partition: int, start: int, end: int) -> list[Any]:
        """The records of ``topic[partition]`` from ``start`` to ``end`` (from :meth:`settle`)."""
        try:
            return read_range(self.committed, topic, partition, start, end)
        except RuntimeError as exc:
            self._raise_if_refused(exc, topic)
            raise

    def _raise_if_refused(self, error: Exception, topic: str) -> None:
        """NotAuthorized for a refused ACL (Read on ``topic``, or this reader's group, whose
        coordinator librdkafka looks for although the reader commits nothing)."""
        from streambandit.stream.authorization import refusal_line

        line = refusal_line(
            error,
            self.settings,
            self.settings.get("bootstrap.servers", ""),
            topics=[topic],
            group=self.settings.get("group.id"),
            group_operation="Describe",
        )
        if line is not None:
            raise NotAuthorized(line) from None

    def close(self) -> None:
        try:
            self.committed.close()
        finally:
            self.uncommitted.close()
