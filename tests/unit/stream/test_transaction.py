"""The exactly-once argument of stream/transaction.py, branch by branch, with no broker: what
commits and what does not on every failure, where the consumer resumes, and a seeded run of
batches with failures injected in which every committed offset is last processed + 1, never
goes back, and every output is committed exactly once.

The fake producer behaves as librdkafka's transactional producer where the argument depends on
it: ``commit_transaction`` serves the delivery reports and fails, abortable, when a record
failed; ``abort_transaction`` purges the records and serves their reports before it returns; a
commit that timed out goes on in the background, is completed when ``commit_transaction`` is
called again, and ``abort_transaction`` is refused meanwhile (``_CONFLICT``); a fatal error
sticks. The one departure, a delivery error reported after an
accepted commit, is injected on purpose to test the guard of step 5. The loop that drives the
module is ``Worker.step`` reduced to offsets: outputs handed over during the batch, no commit
for a batch with no output, and after a failure an abort, then every partition rebuilt from the
committed offsets and the consumer sought to them.
"""

from __future__ import annotations

import collections
import functools
import random

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from streambandit.stream import transaction
from streambandit.stream.errors import WorkerError
from streambandit.stream.transaction import (
    BrokerWait,
    StopWhileWaiting,
    Transaction,
    TransactionFailed,
    TransactionFatal,
    group_metadata,
    note_failed_delivery,
)

IN, OUT = "contexts", "actions"
TXN_ID = "g-instance-1"
GROUP_METADATA = (
    object()
)  # the fake checks it reaches send_offsets_to_transaction: KIP-447 fencing needs it
HAND_OVER = 3  # outputs handed to emit at a time: a batch opens its transaction on the first


def has_output(offset: int) -> bool:
    """Every 4th input gives no output (a reward summed into an open window), so some batches
    have none and their offsets wait for the next batch that has."""
    return offset % 4 != 3


def output(p: int, offset: int) -> tuple[str, int, bytes, bytes]:
    return (OUT, p, str(offset).encode(), f"{p}:{offset}".encode())


def expected_outputs(p: int, end: int, start: int = 0) -> list[bytes]:
    return [output(p, o)[3] for o in range(start, end) if has_output(o)]


def err(code: int, **flags: bool) -> KafkaError:
    return KafkaError(code, f"injected {code}", **flags)


class Broker:
    """What read_committed readers and the group see: the committed outputs and input offsets."""

    def __init__(self) -> None:
        self.records: list[tuple[str, int, bytes | None, bytes]] = []
        self.offsets: dict[int, int] = {}  # input partition -> committed offset
        self.commits: list[dict[int, int]] = []  # the offsets of each commit applied, in order
        self.in_doubt: tuple[list, dict[int, int]] | None = (
            None  # a commit whose producer gave up waiting
        )

    def apply(self, records: list, offsets: dict[int, int]) -> None:
        # Each commit holds, per partition, the outputs of exactly the inputs it moves the
        # offset over: nothing lost, nothing twice.
        for p, end in offsets.items():
            assert [r[3] for r in records if r[1] == p] == expected_outputs(
                p, end, self.offsets.get(p, 0)
            )
        self.records += records
        self.offsets.update(offsets)
        self.commits.append(dict(offsets))

    def restart(self, commit_in_doubt: bool) -> None:
        """A new producer with the same transactional id fences the old one: a commit left in
        doubt ends, applied (its end transaction had reached the coordinator) or aborted; an
        open transaction is aborted (its records are simply never applied here)."""
        if self.in_doubt is not None and commit_in_doubt:
            self.apply(*self.in_doubt)
        self.in_doubt = None

    def outputs(self, p: int) -> list[bytes]:
        return [r[3] for r in self.records if r[1] == p]


class FakeProducer:
    """librdkafka's transactional producer, as far as the argument relies on it.

    ``fail(method, *what)`` scripts the next calls of ``method``: ``None`` a normal call, a
    KafkaError raised (its flags move the state as librdkafka's would), or for ``produce``
    ``"full"`` (BufferError) and ``"undeliverable"`` (accepted, then its delivery fails), for
    ``commit_transaction`` ``"timeout"`` (the commit goes on in the background), ``"fatal
    after commit"`` (the broker committed, the producer failed locally) and ``"late report"``
    (a delivery error reported after the accepted commit, which librdkafka does not do)."""

    def __init__(self, broker: Broker, on_delivery) -> None:
        self.broker = broker
        self.on_delivery = on_delivery
        self.state = "ready"  # ready, open, abortable, committing (in the background), fatal
        self.error: KafkaError | None = None  # the abortable or fatal error the state holds
        self.calls: list[str] = []
        self.records: list = []  # the open transaction's records
        self.offsets: dict[int, int] = {}
        self.reports: list = []  # delivery reports not served yet
        self.undelivered: list = []  # records whose delivery will fail, reported by the next flush
        self.served: list[KafkaError] = []
        self.purged = 0
        self.faults: dict[str, list] = collections.defaultdict(list)

    def fail(self, method: str, *what) -> None:
        self.faults[method] += what

    def _fault(self, method: str):
        return self.faults[method].pop(0) if self.faults[method] else None

    def _raise(self, e: KafkaError) -> None:
        if e.fatal():
            self.state, self.error = "fatal", e
        elif e.txn_requires_abort() and self.state == "open":
            self.state, self.error = "abortable", e
        raise KafkaException(e)

    def _serve(self, flush: bool = False) -> int:
        if flush and self.undelivered:
            # the broker's answer came: librdkafka makes a failed record's transaction abortable
            self.reports += [(err(KafkaError._MSG_TIMED_OUT), r) for r in self.undelivered]
            self.undelivered = []
            if self.state == "open":
                self.state, self.error = (
                    "abortable",
                    err(KafkaError._MSG_TIMED_OUT, txn_requires_abort=True),
                )
        reports, self.reports = self.reports, []
        for e, record in reports:
            self.served.append(e)
            self.on_delivery(e, record)
        return len(reports)

    def _fatal_sticks(self) -> None:
        if self.state == "fatal":
            raise KafkaException(self.error)

    def begin_transaction(self) -> None:
        self.calls.append("begin_transaction")
        self._fatal_sticks()
        if (fault := self._fault("begin_transaction")) is not None:
            self._raise(fault)
        assert self.state == "ready", f"begin_transaction with a transaction {self.state}"
        self.state = "open"

    def produce(self, topic, value, key, partition) -> None:
        self.calls.append("produce")
        self._fatal_sticks()
        fault = self._fault("produce")
        if isinstance(fault, KafkaError):  # first: a KafkaError does not compare with a str
            self._raise(fault)
        if fault == "full":
            raise BufferError("Local: Queue full")
        assert self.state in ("open", "abortable"), f"produce with the transaction {self.state}"
        if self.state == "abortable":
            raise KafkaException(err(KafkaError._STATE))
        record = (topic, partition, key, value)
        (self.undelivered if fault == "undeliverable" else self.records).append(record)

    def poll(self, timeout: float) -> int:
        self.calls.append(f"poll({timeout})")
        return self._serve()

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], metadata, timeout: float
    ) -> None:
        self.calls.append("send_offsets_to_transaction")
        self._fatal_sticks()
        assert metadata is GROUP_METADATA
        if (fault := self._fault("send_offsets_to_transaction")) is not None:
            self._raise(fault)
        assert self.state == "open", (
            f"send_offsets_to_transaction with the transaction {self.state}"
        )
        assert all(tp.topic == IN for tp in offsets)
        self.offsets.update({tp.partition: tp.offset for tp in offsets})

    def _done(self) -> tuple[list, dict[int, int]]:
        done = (self.records, self.offsets)
        self.records, self.offsets, self.state, self.error = [], {}, "ready", None
        return done

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit_transaction")
        self._fatal_sticks()
        if self.state == "committing":  # called again, librdkafka resumes the commit
            self.broker.apply(*self.broker.in_doubt)
            self.broker.in_doubt = None
            self._done()
            return
        assert self.state in ("open", "abortable"), (
            f"commit_transaction with the transaction {self.state}"
        )
        self._serve(flush=True)  # the flush before the commit serves the delivery reports
        if self.state == "abortable":
            raise KafkaException(self.error)
        fault = self._fault("commit_transaction")
        if isinstance(fault, KafkaError):
            self._raise(fault)
        if fault == "timeout":
            self.state, self.broker.in_doubt = "committing", (self.records, self.offsets)
            raise KafkaException(err(KafkaError._TIMED_OUT, retriable=True))
        if fault == "fatal after commit":
            self.broker.apply(*self._done())
            self.state = "fatal"
            self.error = KafkaError(
                KafkaError._TIMED_OUT,
                "Transaction commit succeeded on the broker but the "
                "transaction had already failed locally",
                fatal=True,
            )
            raise KafkaException(self.error)
        self.broker.apply(*self._done())
        if fault == "late report":
            self.reports.append((err(KafkaError._MSG_TIMED_OUT), output(0, -1)))
            self._serve()

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.calls.append("purge")
        self.records = []

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort_transaction")
        if self.state == "committing":
            raise KafkaException(
                KafkaError(
                    KafkaError._CONFLICT,
                    "Conflicting commit_transaction API call is already in progress",
                    retriable=True,
                )
            )
        self._fatal_sticks()
        if (fault := self._fault("abort_transaction")) is not None:
            self._raise(fault)
        assert self.state in ("open", "abortable"), (
            f"abort_transaction with the transaction {self.state}"
        )
        self.purged = len(self.records)
        self.reports += [(err(KafkaError._PURGE_QUEUE), r) for r in self.records]
        self._serve(
            flush=True
        )  # abort_transaction flushes: the purged records' reports come inside it
        self._done()


class FakeConsumer:
    """Input partitions of ``sizes[p]`` records, handed out from the positions on; ``consume``
    checks step 9: no transaction of the producer is open while it runs."""

    def __init__(
        self,
        sizes: dict[int, int],
        positions: dict[int, int],
        producer_state,
        rng: random.Random | None = None,
    ) -> None:
        self.sizes = sizes
        self.position = dict(positions)
        self.producer_state = producer_state
        self.rng = (
            rng  # interleaves the partitions at random; without, one partition after the other
        )
        self.seeks: list[tuple[int, int]] = []
        self.member_id = "member-1"  # librdkafka's: empty once its session timed out
        self.while_taking_metadata = lambda: None  # what happens on the group meanwhile

    def memberid(self) -> str:
        return self.member_id

    def consumer_group_metadata(self) -> object:
        self.while_taking_metadata()
        return GROUP_METADATA

    def consume(self, n: int, timeout: float) -> list[tuple[int, int]]:
        """Up to ``n`` records as (partition, offset)."""
        assert self.producer_state() == "ready", (
            f"consume() with the producer's transaction {self.producer_state()}"
        )
        out = []
        parts = [p for p in self.sizes if self.position[p] < self.sizes[p]]
        while parts and len(out) < n:
            p = self.rng.choice(parts) if self.rng else parts[0]
            out.append((p, self.position[p]))
            self.position[p] += 1
            if self.position[p] == self.sizes[p]:
                parts.remove(p)
        return out

    def seek(self, p: int, offset: int) -> None:
        self.seeks.append((p, offset))
        self.position[p] = offset


class Loop:
    """One worker on ``broker``: ``Worker.step`` reduced to offsets, around a real Transaction."""

    def __init__(
        self, broker: Broker, sizes: dict[int, int], rng: random.Random | None = None
    ) -> None:
        self.broker = broker
        self.errors: list = []
        self.producer = FakeProducer(broker, functools.partial(note_failed_delivery, self.errors))
        self.txn = Transaction(self.producer, self.errors, TXN_ID)
        committed = {p: broker.offsets.get(p, 0) for p in sizes}
        self.consumer = FakeConsumer(sizes, committed, lambda: self.producer.state, rng)
        self.next_offset = committed  # per partition: last processed + 1
        self.read: list[tuple[int, int]] = []  # the last batch

    def step(self, n: int = 100) -> str:
        self.read = self.consumer.consume(n, 0)
        try:
            out = []
            for p, offset in self.read:
                assert offset == self.next_offset[p]  # in order, none skipped, none twice
                self.next_offset[p] = offset + 1
                if has_output(offset):
                    out.append(output(p, offset))
                if len(out) == HAND_OVER:
                    self.txn.emit(out)
                    out = []
            self.txn.emit(out)
            if not self.txn.open:
                return "no output"
            self.txn.commit(
                [TopicPartition(IN, p, off) for p, off in self.next_offset.items()],
                group_metadata(self.consumer),
            )
        except TransactionFailed as failure:
            self.txn.abort(failure)
            self.rebuild()
            return "aborted"
        return "committed"

    def rebuild(self) -> None:
        """``Worker._rebuild_all``: state and positions from what the group committed."""
        self.next_offset = {p: self.broker.offsets.get(p, 0) for p in self.next_offset}
        for p, off in self.next_offset.items():
            self.consumer.seek(p, off)


def committed_loop(sizes: dict[int, int], first: int) -> tuple[Broker, Loop]:
    """A broker and a worker that has committed its first ``first`` records."""
    broker = Broker()
    loop = Loop(broker, sizes)
    if first:
        assert loop.step(first) == "committed"
    loop.producer.calls.clear()
    return broker, loop


def assert_rewound_and_redone(
    broker: Broker, loop: Loop, before: dict[int, int], batch: list
) -> None:
    """After an abort: nothing of the batch committed, the consumer back at the committed
    offsets, and the next batch reads the same records again and commits each output once."""
    assert broker.offsets == before
    assert loop.consumer.position == {p: before.get(p, 0) for p in loop.consumer.sizes}
    assert loop.errors == [] and not loop.txn.open
    assert loop.step(len(batch)) == "committed"
    assert loop.read == batch
    for p in loop.consumer.sizes:
        assert broker.outputs(p) == expected_outputs(p, broker.offsets[p])


# -- the path without failures -----------------------------------------------------------------


def test_a_batch_commits_its_outputs_and_its_next_offsets_together():
    broker, loop = committed_loop({0: 6, 1: 6}, first=0)
    assert loop.step(12) == "committed"
    assert broker.offsets == {0: 6, 1: 6} and broker.commits == [{0: 6, 1: 6}]
    assert broker.outputs(0) == expected_outputs(0, 6) and broker.outputs(1) == expected_outputs(
        1, 6
    )
    calls = loop.producer.calls
    assert calls.count("begin_transaction") == 1 and calls.count("produce") == 10
    assert calls[-2:] == ["send_offsets_to_transaction", "commit_transaction"]
    assert not loop.txn.open and loop.errors == []


def test_a_batch_with_no_output_opens_no_transaction_and_its_offsets_commit_with_the_next_batch():
    broker, loop = committed_loop({0: 8}, first=3)  # outputs of 0, 1, 2; offset 3
    assert loop.step(1) == "no output"  # offset 3 has none
    assert loop.producer.calls == [] and not loop.txn.open
    assert broker.offsets == {0: 3}  # not committed alone...
    assert loop.step(1) == "committed"
    assert broker.offsets == {0: 5}  # ...but with the next batch that has output
    assert broker.outputs(0) == expected_outputs(0, 5)
    loop.txn.emit([])
    assert loop.producer.calls[-1] == "commit_transaction"  # an empty hand-over calls nothing
    with pytest.raises(RuntimeError, match="without an open transaction"):
        loop.txn.commit([TopicPartition(IN, 0, 5)], GROUP_METADATA)


def test_a_full_queue_once_is_polled_out_and_the_batch_commits():
    broker, loop = committed_loop({0: 6}, first=0)
    loop.producer.fail("produce", None, "full")
    assert loop.step(6) == "committed"
    calls = loop.producer.calls
    i = calls.index("poll(0.1)")
    assert calls[i - 2 : i + 2] == [
        "produce",
        "produce",
        "poll(0.1)",
        "produce",
    ]  # the refused one again
    assert broker.outputs(0) == expected_outputs(0, 6) and broker.offsets == {0: 6}


def test_note_failed_delivery_keeps_failures_only():
    errors: list = []
    note_failed_delivery(errors, None, object())
    e = err(KafkaError._MSG_TIMED_OUT)
    note_failed_delivery(errors, e, object())
    assert errors == [e]


# -- failures the worker aborts and reads again (steps 6, 7) ---------------------------------------

ABORTED = {
    "begin_transaction refused": ("begin_transaction", err(KafkaError._STATE)),
    "queue full twice": ("produce", None, "full", "full"),
    "produce refused": ("produce", None, err(KafkaError.MSG_SIZE_TOO_LARGE)),
    "delivery failed": ("produce", None, "undeliverable"),
    "send_offsets abortable": (
        "send_offsets_to_transaction",
        err(KafkaError.CONCURRENT_TRANSACTIONS, txn_requires_abort=True),
    ),
    "commit abortable": (
        "commit_transaction",
        err(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True),
    ),
}


@pytest.mark.parametrize("fault", ABORTED.values(), ids=ABORTED.keys())
def test_an_abortable_failure_aborts_commits_nothing_and_the_batch_is_read_again(fault):
    broker, loop = committed_loop({0: 12, 1: 12}, first=8)
    before = dict(broker.offsets)
    method, *what = fault
    loop.producer.fail(method, *what)
    assert loop.step(8) == "aborted"
    batch = loop.read
    began = "produce" in loop.producer.calls
    # abort_transaction exactly when a transaction was open, never after a begin that failed
    assert loop.producer.calls.count("abort_transaction") == (1 if began else 0)
    assert loop.producer.records == [] and loop.producer.state == "ready"
    if began:  # the purged records' reports came inside abort_transaction...
        purge_reports = [e for e in loop.producer.served if e.code() == KafkaError._PURGE_QUEUE]
        assert loop.producer.purged and len(purge_reports) == loop.producer.purged
    assert_rewound_and_redone(
        broker, loop, before, batch
    )  # ...and do not fail the next batch at step 5


def test_a_second_full_queue_fails_the_batch_as_abortable_not_as_a_buffer_error():
    _, loop = committed_loop({0: 6}, first=0)
    loop.producer.fail("produce", None, "full", "full")
    loop.read = loop.consumer.consume(6, 0)
    with pytest.raises(TransactionFailed) as failed:
        loop.txn.emit([output(0, o) for o in range(3)])
    e = failed.value.error.args[0]
    assert e.code() == KafkaError._QUEUE_FULL and e.txn_requires_abort() and not e.fatal()
    assert loop.txn.open  # until abort
    loop.txn.abort(failed.value)
    assert not loop.txn.open and loop.producer.calls[-1] == "abort_transaction"


# -- a delivery error reported after the commit was accepted (step 5) ------------------------------


def test_a_delivery_error_after_an_accepted_commit_fails_the_step_but_the_batch_stays_committed():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail("commit_transaction", "late report")
    assert loop.step(4) == "aborted"
    assert broker.offsets == {0: 8} and broker.outputs(0) == expected_outputs(0, 8)  # committed
    assert "abort_transaction" not in loop.producer.calls  # none open: nothing to abort
    assert loop.errors == [] and not loop.txn.open
    assert loop.consumer.seeks == [(0, 8)]  # the rebuild resumes after the batch: not read again
    assert loop.step(4) == "committed" and loop.read == [(0, o) for o in range(8, 12)]
    assert broker.outputs(0) == expected_outputs(0, 12)


# -- failures that stop the worker (steps 7, 8) ----------------------------------------------------

FENCED = {
    "begin_transaction fenced": ("begin_transaction", err(KafkaError._FENCED, fatal=True)),
    "send_offsets fenced": (
        "send_offsets_to_transaction",
        err(KafkaError.PRODUCER_FENCED, fatal=True),
    ),
    "commit fenced": ("commit_transaction", err(KafkaError.PRODUCER_FENCED, fatal=True)),
    "commit with an old epoch": (
        "commit_transaction",
        err(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True),
    ),
}


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_consumer_whose_session_timed_out_commits_nothing_and_the_batch_is_read_again(when):
    """librdkafka clears its member id when it finds its session timed out, and the coordinator
    accepts a commit whose metadata names no member unchecked: the batch must not commit, on
    partitions the group may have given to another member, whether the session ran out before
    the commit or while its metadata was taken (the rejoin then has a new member id)."""
    sizes = {0: 40, 1: 40}
    broker, loop = committed_loop(sizes, 20)
    before = dict(broker.offsets)
    if when == "before":
        loop.consumer.member_id = ""
    else:

        def timed_out_and_rejoined() -> None:
            loop.consumer.member_id = "member-2"

        loop.consumer.while_taking_metadata = timed_out_and_rejoined
    assert loop.step(20) == "aborted"
    assert broker.offsets == before and broker.outputs(0) + broker.outputs(1) == [
        o for p in sizes for o in expected_outputs(p, before.get(p, 0))
    ]
    assert "send_offsets_to_transaction" not in loop.producer.calls
    assert "abort_transaction" in loop.producer.calls
    # A member again (the next poll hands over the loss or the new assignment): it goes on.
    loop.consumer.member_id, loop.consumer.while_taking_metadata = "member-3", lambda: None
    assert loop.step(100) == "committed"
    for p in sizes:
        assert broker.outputs(p) == expected_outputs(p, broker.offsets[p])


@pytest.mark.parametrize("fault", FENCED.values(), ids=FENCED.keys())
def test_a_fenced_producer_stops_the_worker_without_an_abort_and_commits_nothing(fault):
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail(*fault)
    with pytest.raises(TransactionFatal, match="--instance-id") as fatal:
        loop.step(4)
    assert isinstance(fatal.value, WorkerError) and TXN_ID in str(fatal.value)
    assert not fatal.value.after_outage  # another live instance: not a case for a new producer
    assert "abort_transaction" not in loop.producer.calls
    assert broker.offsets == {0: 4} and broker.outputs(0) == expected_outputs(0, 4)


def test_another_fatal_error_stops_the_worker_without_the_fencing_hint():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail(
        "commit_transaction", err(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True)
    )
    with pytest.raises(TransactionFatal, match="fatal producer error") as fatal:
        loop.step(4)
    assert (
        "--instance-id" not in str(fatal.value) and "abort_transaction" not in loop.producer.calls
    )
    assert broker.offsets == {0: 4}


def test_a_commit_accepted_by_the_broker_but_failed_locally_stops_the_worker_and_the_restart_goes_on_after_it():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail("commit_transaction", "fatal after commit")
    with pytest.raises(TransactionFatal):
        loop.step(4)
    assert broker.offsets == {0: 8}
    broker.restart(commit_in_doubt=False)
    again = Loop(broker, {0: 12})
    assert again.consumer.position == {0: 8}
    assert again.step(100) == "committed" and broker.outputs(0) == expected_outputs(0, 12)


# -- a broker that does not answer: waited out (stream/outage.py) ----------------------------------


class Waits(BrokerWait):
    """What the loop is told between two bounded waits; ``stop``: it leaves the wait."""

    def __init__(self, stop: bool = False, back: bool = False) -> None:
        self.waits: list[str] = []
        self.answers = 0
        self.stop = stop
        self.back = back  # the broker answers metadata meanwhile

    def waiting(self, what: str, error) -> None:
        self.waits.append(what)
        if self.stop:
            raise StopWhileWaiting()

    def answered(self) -> None:
        self.answers += 1

    def broker_answers(self) -> bool:
        return self.back


RETRIED = {
    "send_offsets retriable": (
        "send_offsets_to_transaction",
        err(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True),
    ),
    "commit timed out (resumed)": ("commit_transaction", "timeout"),
}


@pytest.mark.parametrize("fault", RETRIED.values(), ids=RETRIED.keys())
def test_a_retriable_failure_is_waited_out_and_the_batch_commits_once(fault):
    broker, loop = committed_loop({0: 12}, first=4)
    loop.txn.broker_wait = waits = Waits()
    method, what = fault
    loop.producer.fail(method, what)
    assert loop.step(4) == "committed"
    assert waits.waits == [method] and waits.answers >= 1
    assert loop.producer.calls.count(method) == 2 and "abort_transaction" not in loop.producer.calls
    assert broker.offsets == {0: 8} and broker.outputs(0) == expected_outputs(0, 8)
    assert loop.txn.waited  # a fencing now would be the broker's timeout, not another instance


def test_an_abort_that_times_out_is_called_again_and_the_batch_is_read_again():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.txn.broker_wait = waits = Waits()
    loop.producer.fail(
        "commit_transaction", err(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)
    )
    loop.producer.fail("abort_transaction", err(KafkaError._TIMED_OUT, retriable=True))
    assert loop.step(4) == "aborted"
    assert waits.waits == ["abort_transaction"]
    assert loop.producer.calls.count("abort_transaction") == 2
    assert_rewound_and_redone(broker, loop, {0: 4}, [(0, o) for o in range(4, 8)])


def test_a_fencing_after_a_wait_for_the_broker_is_marked_for_a_new_producer():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail(
        "send_offsets_to_transaction", err(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True)
    )
    loop.producer.fail("commit_transaction", err(KafkaError.PRODUCER_FENCED, fatal=True))
    with pytest.raises(TransactionFatal, match="waited for the broker") as fatal:
        loop.step(4)
    assert fatal.value.after_outage and "--instance-id" not in str(fatal.value)
    assert broker.offsets == {0: 4}


def test_a_call_failing_on_after_the_broker_answers_again_is_given_up_for_a_new_producer(
    monkeypatch,
):
    monkeypatch.setattr(transaction, "BACK_GRACE_S", 0.0)
    broker, loop = committed_loop({0: 12}, first=4)
    loop.txn.broker_wait = Waits(back=True)
    loop.producer.fail(
        "commit_transaction", err(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)
    )
    loop.producer.fail("abort_transaction", *[err(KafkaError._TIMED_OUT, retriable=True)] * 5)
    with pytest.raises(TransactionFatal, match="abort_transaction has not completed") as fatal:
        loop.step(4)
    assert fatal.value.after_outage
    assert loop.producer.calls.count("abort_transaction") == 2
    assert broker.offsets == {0: 4}


@pytest.mark.parametrize(
    "completes", [True, False], ids=["the commit completes", "the commit is aborted"]
)
def test_a_stop_while_waiting_leaves_the_transaction_and_either_outcome_is_exactly_once(completes):
    broker, loop = committed_loop({0: 12}, first=4)
    loop.txn.broker_wait = Waits(stop=True)
    loop.producer.fail("commit_transaction", "timeout")
    with pytest.raises(StopWhileWaiting):
        loop.step(4)
    loop.txn.abandon()  # refused while the commit goes on in the background: left to the broker
    assert broker.offsets == {0: 4}  # in doubt, until the restart fences the producer
    broker.restart(commit_in_doubt=completes)
    again = Loop(broker, {0: 12})
    assert again.consumer.position == {0: 8 if completes else 4}
    assert again.step(100) == "committed" and broker.outputs(0) == expected_outputs(0, 12)


def test_an_abort_that_fails_stops_the_worker_and_the_restart_reads_the_batch_again():
    broker, loop = committed_loop({0: 12}, first=4)
    loop.producer.fail(
        "commit_transaction", err(KafkaError.INVALID_TXN_STATE, txn_requires_abort=True)
    )
    loop.producer.fail("abort_transaction", err(KafkaError._STATE))  # not retriable
    with pytest.raises(TransactionFatal, match="could not abort"):
        loop.step(4)
    assert broker.offsets == {0: 4}
    broker.restart(commit_in_doubt=False)
    again = Loop(broker, {0: 12})
    assert again.consumer.position == {0: 4}
    assert again.step(100) == "committed" and broker.outputs(0) == expected_outputs(0, 12)


# -- every branch at random --------------------------------------------------------------------------

FAULTS = [
    *([()] * 12),  # most batches go through
    *ABORTED.values(),
    *RETRIED.values(),
    ("produce", "full"),
    ("commit_transaction", "late report"),
    *FENCED.values(),
    ("commit_transaction", err(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, fatal=True)),
    ("commit_transaction", "fatal after commit"),
    ("abort_transaction", err(KafkaError._TIMED_OUT, retriable=True)),  # armed for the next abort
    ("abort_transaction", err(KafkaError._STATE)),  # the same, not retriable: stops
]


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_over_random_batches_and_failures_offsets_never_go_back_and_every_output_commits_once(seed):
    random_run(seed)


def test_the_random_runs_take_every_branch():
    outcomes = sum((random_run(seed) for seed in SEEDS), collections.Counter())
    assert outcomes["committed"] and outcomes["aborted"] and outcomes["stopped"], outcomes


def random_run(seed: int) -> collections.Counter:
    """Batches of random sizes with random faults until every input committed; what each step
    came to."""
    rng = random.Random(seed)
    # Each partition's last input has output, so that the last batch commits whatever it reads.
    sizes = {p: rng.randrange(10, 60) for p in range(3)}
    sizes = {p: n + 1 if not has_output(n - 1) else n for p, n in sizes.items()}
    broker = Broker()
    loop = Loop(broker, sizes, rng)
    outcomes: collections.Counter[str] = collections.Counter()
    for _ in range(5000):
        if broker.offsets == sizes:
            break
        fault = rng.choice(FAULTS)
        if fault:
            loop.producer.fail(fault[0], *fault[1:])
        commits = len(broker.commits)
        try:
            outcome = loop.step(rng.randrange(1, 12))
        except TransactionFatal:
            outcome = "stopped"
            broker.restart(commit_in_doubt=rng.random() < 0.5)
            loop = Loop(broker, sizes, rng)  # the restarted worker, from what committed
        outcomes[outcome] += 1
        if outcome == "committed":
            # the committed offset of every partition is its last processed record + 1
            assert broker.commits[-1] == loop.next_offset
            for p in {p for p, _ in loop.read}:
                assert broker.offsets[p] == max(offset for q, offset in loop.read if q == p) + 1
        # offsets never go back, and each commit holds the outputs of exactly the inputs it
        # moved over (Broker.apply); so the committed outputs are the committed inputs', once
        for before, after in zip(broker.commits[max(commits - 1, 0) :], broker.commits[commits:]):
            assert all(after[p] >= before.get(p, 0) for p in after)
        for p in sizes:
            assert broker.outputs(p) == expected_outputs(p, broker.offsets.get(p, 0))
    assert broker.offsets == sizes, f"not drained: {broker.offsets} of {sizes} ({outcomes})"
    return outcomes
