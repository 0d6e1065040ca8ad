"""stream/authorization.py: which librdkafka errors are refusals, and the line each becomes."""

from confluent_kafka import KafkaError, KafkaException

from streambandit.stream.authorization import (
    denied_topic_in_log,
    principal_of,
    refusal_code,
    refusal_line,
    topic_may_be_named_later,
    transaction_refusal,
)
from streambandit.stream.transaction import TransactionFailed

SASL = {"security.protocol": "SASL_SSL", "sasl.username": "worker", "sasl.password": "x"}


def err(code: int, text: str = "") -> KafkaError:
    return KafkaError(code, text)


def test_authorization_and_authentication_codes_are_refusals_and_others_are_not():
    for code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError._AUTHENTICATION,
        KafkaError.SASL_AUTHENTICATION_FAILED,
    ):
        assert refusal_code(err(code)) == code
        assert refusal_code(KafkaException(err(code))) == code
    for code in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_COORDINATOR):
        assert refusal_code(err(code, "Connection refused")) is None
    assert refusal_code(ValueError("no")) is None and refusal_code(None) is None


def test_a_refusal_is_found_through_the_exceptions_it_caused():
    try:
        try:
            raise KafkaException(err(KafkaError.GROUP_AUTHORIZATION_FAILED))
        except KafkaException as inner:
            raise RuntimeError("reading actions[0]") from inner
    except RuntimeError as outer:
        assert refusal_code(outer) == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_a_tls_handshake_refused_for_the_certificate_is_an_authentication_failure():
    alert = "Receive failed: error:0A000416:SSL routines::ssl/tls alert certificate unknown"
    assert refusal_code(err(KafkaError._TRANSPORT, alert)) == KafkaError._AUTHENTICATION
    assert refusal_code(err(KafkaError._SSL, "certificate verify failed")) == (
        KafkaError._AUTHENTICATION
    )
    assert refusal_code(err(KafkaError._TRANSPORT, "Connection reset by peer")) is None


def test_the_principal_is_the_sasl_user_or_the_certificate():
    assert principal_of(SASL) == "User:worker"
    pem = {"ssl.certificate.location": "/c/worker.pem"}
    assert (
        principal_of(pem)
        == "the principal of the certificate ssl.certificate.location=/c/worker.pem"
    )
    assert principal_of({}) == "this client's principal"


def test_each_refusal_names_the_operation_and_the_grant():
    def line(code, **kw):
        return refusal_line(err(code), SASL, "b:9093", **kw)

    assert line(KafkaError.TOPIC_AUTHORIZATION_FAILED, topics=["actions"], writing=True) == (
        "not authorized: User:worker cannot Write topic actions (TOPIC_AUTHORIZATION_FAILED); "
        "grant it Write on Topic actions (docs/security.md)"
    )
    assert "cannot Read topic contexts" in line(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, topics=["contexts"]
    )
    assert "cannot Describe topic contexts (TOPIC_AUTHORIZATION_FAILED); grant it Read" in line(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, topics=["contexts"], describing=True
    )
    assert "cannot Write one of the topics a, b " in line(
        KafkaError.TOPIC_AUTHORIZATION_FAILED, topics=["a", "b"], writing=True
    )
    assert "cannot use group g (GROUP_AUTHORIZATION_FAILED); grant it Read on Group g" in line(
        KafkaError.GROUP_AUTHORIZATION_FAILED, group="g"
    )
    assert "grant it Describe on Group streambandit-reader" in line(
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        group="streambandit-reader",
        group_operation="Describe",
    )
    assert (
        "cannot use transactional id g-w-1 (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); grant it "
        "Write on TransactionalId g-w- (--resource-pattern-type prefixed)"
    ) in line(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, transactional_id="g-w-1")
    assert "IdempotentWrite on Cluster" in line(KafkaError.CLUSTER_AUTHORIZATION_FAILED)
    auth = refusal_line(
        err(KafkaError._AUTHENTICATION, "SASL authentication error"), SASL, "b:9093"
    )
    assert auth.startswith(
        "authentication failed: the broker at b:9093 refused User:worker: SASL authentication error;"
    )
    assert refusal_line(err(KafkaError._TRANSPORT, "down"), SASL, "b:9093") is None


def test_the_topic_a_transaction_was_refused_is_read_from_librdkafkas_line():
    refused = (
        "ADDPARTS [rdkafka#producer-8] [thrd:main]: TxnCoordinator/1: Failed to add partition "
        '"rewards-7b5b82" [0] to transaction: Broker: Topic authorization failed'
    )
    assert denied_topic_in_log(refused) == "rewards-7b5b82"
    not_tried = refused.replace("Topic authorization failed", "Operation not attempted")
    assert denied_topic_in_log(not_tried) is None


def failed(code: int, text: str = "") -> TransactionFailed:
    """A transaction step's failure as the worker catches it (raised from the KafkaException)."""
    exc = KafkaException(err(code, text))
    try:
        raise TransactionFailed(exc) from exc
    except TransactionFailed as caught:
        return caught


def test_a_step_that_fails_after_a_refused_topic_is_that_refusal():
    # The next produce after a refused topic raises _STATE, which names no cause: the topic is
    # waited for while only the log line can name it, and once named the failure is its refusal.
    after = failed(KafkaError._STATE, "Unable to produce message: Local: Erroneous state")
    assert refusal_code(after) is None
    assert topic_may_be_named_later(after)
    assert transaction_refusal(after, []) is None
    refusal = transaction_refusal(after, ["actions-1"])
    assert refusal_code(refusal) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    line = refusal_line(refusal, SASL, "b:9093", topics=["actions-1"], writing=True)
    assert line.startswith("not authorized: User:worker cannot Write topic actions-1 ")
    # A refusal is itself; a topic refused is waited for; other failures are neither.
    refused = failed(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert transaction_refusal(refused, []) is refused and topic_may_be_named_later(refused)
    fenced = failed(KafkaError._FENCED, "fenced")
    assert transaction_refusal(fenced, []) is None and not topic_may_be_named_later(fenced)
    group = failed(KafkaError.GROUP_AUTHORIZATION_FAILED)
    assert transaction_refusal(group, []) is group and not topic_may_be_named_later(group)
