"""The broker-outage state (stream/outage.py) on a fake clock: which errors count as the broker
not answering, one line now and then while it lasts, and the readiness reason."""

from confluent_kafka import KafkaError

from streambandit.stream.outage import BrokerOutage, broker_unavailable


def test_only_a_retriable_error_that_neither_aborts_nor_ends_the_transaction_is_waited_out():
    assert broker_unavailable(KafkaError(KafkaError._TIMED_OUT, "t", retriable=True))
    assert not broker_unavailable(KafkaError(KafkaError._TIMED_OUT, "t"))
    assert not broker_unavailable(KafkaError(KafkaError._FENCED, "f", fatal=True, retriable=True))
    assert not broker_unavailable(
        KafkaError(KafkaError.INVALID_TXN_STATE, "a", txn_requires_abort=True, retriable=True)
    )
    assert not broker_unavailable(RuntimeError("not a librdkafka error"))


def test_an_outage_logs_its_first_wait_then_one_line_per_interval_and_ends_with_a_line():
    now = [100.0]
    o = BrokerOutage(log_every_s=10, clock=lambda: now[0])
    assert not o.active and o.seconds() == 0 and o.over() is None
    first = o.waiting("commit_transaction", "Local: Timed out")
    assert first and "waiting for commit_transaction since" in first and "(0 s)" in first
    lines = []
    for _ in range(25):  # 25 s of 1 s waits
        now[0] += 1
        lines.append(o.waiting("commit_transaction", "Local: Timed out"))
    said = [line for line in lines if line]
    assert len(said) == 2 and "(10 s)" in said[0] and "(20 s)" in said[1]
    assert o.active and o.seconds() == 25
    assert o.reason() == "broker unavailable for 25 s: waiting for commit_transaction"
    assert o.over() == "broker available again after 25.0 s (waited for commit_transaction)"
    assert not o.active and o.over() is None
    # the next outage starts afresh: its first wait is logged at once
    now[0] += 3
    assert o.waiting("abort_transaction", "x") is not None and o.seconds() == 0
