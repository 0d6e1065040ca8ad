"""Authorization and authentication refusals from the broker, as one line that says what the
principal may not do and which ACL to grant.

A refusal does not go away by itself: retrying it only repeats the same error (and some of the
worker's retries have no back-off). So every place that meets one stops the process with
:class:`~streambandit.stream.errors.NotAuthorized` (exit code ``NOT_AUTHORIZED``); a supervisor
restarts it after its back-off (stream/supervisor.py), and it runs once the ACL is granted.
docs/security.md lists the ACLs each command needs.

Pure functions of librdkafka's errors and settings; the worker and the readers raise.
"""

from __future__ import annotations

import re
from typing import Any

from confluent_kafka import KafkaError, KafkaException

__all__ = [
    "AUTHORIZATION_CODES",
    "AUTHENTICATION_CODES",
    "refusal_code",
    "principal_of",
    "not_authorized_line",
    "authentication_line",
    "denied_topic_in_log",
    "topic_may_be_named_later",
    "transaction_refusal",
    "refusal_line",
]

#: The codes of an ACL missing, and the resource type each names.
AUTHORIZATION_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED: "Topic",
    KafkaError.GROUP_AUTHORIZATION_FAILED: "Group",
    KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "TransactionalId",
    KafkaError.CLUSTER_AUTHORIZATION_FAILED: "Cluster",
}
#: The codes of credentials refused (a wrong password, a certificate the broker does not trust).
AUTHENTICATION_CODES = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)


def _error_of(error: Any) -> KafkaError | None:
    if isinstance(error, KafkaError):
        return error
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    return None


# A TLS handshake the broker ended because it does not trust the client's certificate (or the
# client does not trust the broker's): librdkafka reports it as a failed receive or an SSL error,
# with the TLS alert in the text.
_TLS_REFUSED = re.compile(
    r"alert (certificate unknown|bad certificate|unknown ca|certificate required"
    r"|certificate expired|certificate revoked)|certificate verify failed",
    re.I,
)


def refusal_code(error: Any) -> int | None:
    """The authorization or authentication code of ``error`` (a KafkaError, a KafkaException,
    or an exception caused by one, at any depth), or None for every other error. A TLS handshake
    refused for a certificate counts as ``_AUTHENTICATION``."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        err = _error_of(error)
        if err is not None and (
            err.code() in AUTHORIZATION_CODES or err.code() in AUTHENTICATION_CODES
        ):
            return err.code()
        if (
            err is not None
            and err.code() in (KafkaError._SSL, KafkaError._TRANSPORT)
            and _TLS_REFUSED.search(err.str())
        ):
            return KafkaError._AUTHENTICATION
        error = getattr(error, "__cause__", None) or getattr(error, "__context__", None)
    return None


def principal_of(settings: dict[str, Any]) -> str:
    """Who the client is to the broker, as the ``[kafka]`` settings say it."""
    if settings.get("sasl.username"):
        return f"User:{settings['sasl.username']}"
    for key in ("ssl.certificate.location", "ssl.keystore.location"):
        if settings.get(key):
            return f"the principal of the certificate {key}={settings[key]}"
    return "this client's principal"


def not_authorized_line(
    code: int, settings: dict[str, Any], action: str, resource: str, grant: str
) -> str:
    """The line for a missing ACL: ``action`` is what was refused ("Write topic actions"),
    ``resource`` the ACL's resource as kafka-acls names it, ``grant`` the operations to allow."""
    name = KafkaError(code).name()
    return (
        f"not authorized: {principal_of(settings)} cannot {action} ({name}); grant it "
        f"{grant} on {resource} (docs/security.md)"
    )


def authentication_line(settings: dict[str, Any], bootstrap: str, message: str) -> str:
    """The line for credentials the broker refused."""
    who = principal_of(settings)
    return (
        f"authentication failed: the broker at {bootstrap} refused {who}: {message}; check the "
        f"[kafka] security settings (sasl.username, sasl.password, ssl.certificate.location, "
        f"ssl.key.location)"
    )


# librdkafka's line when the transaction coordinator refuses a partition: the only place that
# names the topic (the transaction's error does not).
_ADDPARTS = re.compile(r'Failed to add partition "([^"]+)" \[\d+\] to transaction: .*authorization')


def denied_topic_in_log(line: str) -> str | None:
    """The topic a librdkafka log line says a transaction could not write, or None."""
    m = _ADDPARTS.search(line)
    return m.group(1) if m else None


def topic_may_be_named_later(failure: Any) -> bool:
    """``failure`` of a transaction step may be a refused topic whose librdkafka log line (the
    only place that names it, :func:`denied_topic_in_log`) the producer's poll has not delivered
    yet: a topic refused, or ``_STATE``, which a produce raises once the transaction has failed
    (after a refused topic, say) without naming the cause."""
    if refusal_code(failure) == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return True
    err = _error_of(_first_kafka_error(failure))
    return err is not None and err.code() == KafkaError._STATE


def transaction_refusal(failure: Any, denied_topics: list[str]) -> Any | None:
    """The refusal a failed transaction step stops on, or None: ``failure`` itself when it is
    one, else a topic refusal when librdkafka's log said the transaction was refused a topic
    (``denied_topics``, from :func:`denied_topic_in_log`): whatever step failed after that
    (the next produce's ``_STATE``, say) failed because of it. It must be found before the
    abort, which fails fatally after a refused topic on Apache Kafka (INVALID_TXN_STATE:
    librdkafka ends a transaction the coordinator never began; tests/integration/
    test_kafka_security.py shows both on a broker)."""
    if refusal_code(failure) is not None:
        return failure
    if denied_topics:
        return KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    return None


def _first_kafka_error(error: Any) -> Any:
    """The first KafkaError or KafkaException on ``error``'s chain of causes, or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _error_of(error) is not None:
            return error
        error = getattr(error, "__cause__", None) or getattr(error, "__context__", None)
    return None


def _message(error: Any) -> str:
    err = _error_of(_first_kafka_error(error))
    return err.str() if err is not None else ""


def refusal_line(
    error: Any,
    settings: dict[str, Any],
    bootstrap: str,
    *,
    topics: list[str] = (),
    writing: bool = False,
    describing: bool = False,
    topic_operation: str | None = None,
    group: str | None = None,
    group_operation: str = "Read",
    transactional_id: str | None = None,
) -> str | None:
    """The one line for ``error`` when it is a refusal, else None. What the client was doing
    names the resource: ``topics`` read (or written, ``writing``; only looked up,
    ``describing``: Read or Write grants Describe, and a topic without it is hidden;
    ``topic_operation`` the one to grant when it is neither), ``group`` joined or committed
    to (``group_operation`` the ACL it needs: Read to join and commit, Describe to find its
    coordinator only), ``transactional_id`` initialised; a transactional id's ACL is granted on its prefix, the
    text up to its last '-' (the worker's is ``<group_id>-<instance id>``)."""
    code = refusal_code(error)
    if code is None:
        return None
    if code in AUTHENTICATION_CODES:
        return authentication_line(settings, bootstrap, _message(error))
    kind = AUTHORIZATION_CODES[code]
    if kind == "Topic":
        op = "Write" if writing else "Read"
        names = ", ".join(topics) or "a topic"
        which = "topic" if len(topics) == 1 else "one of the topics"
        did = "Describe" if describing else op
        grant = topic_operation or op
        return not_authorized_line(
            code, settings, f"{did} {which} {names}", f"Topic {names}", grant
        )
    if kind == "Group":
        return not_authorized_line(
            code, settings, f"use group {group}", f"Group {group}", group_operation
        )
    if kind == "TransactionalId":
        prefix = (transactional_id or "").rpartition("-")[0] + "-"
        return not_authorized_line(
            code,
            settings,
            f"use transactional id {transactional_id}",
            f"TransactionalId {prefix} (--resource-pattern-type prefixed)",
            "Write",
        )
    return not_authorized_line(code, settings, "act on the cluster", "Cluster", "IdempotentWrite")
