"""What is checked before the worker's Kafka clients start, and how librdkafka's own log lines
reach the operator.

- ``check_client_settings``: every client the worker makes is built once with its settings and
  no broker address, so librdkafka itself judges every key and value (an unknown key, a bad
  value) without connecting; the error names the key.
- ``wait_for_brokers``: a metadata request, retried for ``broker_wait_s``; a cluster that does
  not answer is one error line saying what, which setting and what to do, not a traceback after
  hundreds of librdkafka lines.
- ``check_groups_described``: whether the principal may Describe the groups whose committed
  offsets a reader asks for (``export``, a replica); without it librdkafka's offsets request waits
  out its whole timeout, where describing the group is refused at once, as one line.
- ``choose_group_protocol``: the consumer group protocol, from ``[worker] group_protocol`` and,
  when that is ``auto``, from what the broker says it offers.
- ``wait_until_served``: a topic just created is known to the controller before the brokers'
  metadata has it; a request about it meanwhile (a describe, a producer's first send) is
  refused as an unknown topic. Creating commands wait until every partition has a leader.
- ``kafka_logger``: librdkafka's lines through Python logging (``logger`` client setting), each
  kind of line at most once a minute with a count of those held back: a broker that is down is
  otherwise one line per client and reconnect back-off.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from streambandit.config.kafka import (
    consumer_settings,
    for_client,
    producer_settings,
    reader_settings,
)
from streambandit.config.worker import WorkerConfig
from streambandit.log_format import RepeatFilter
from streambandit.redaction import redact
from streambandit.stream.authorization import refusal_line
from streambandit.stream.errors import NotAuthorized, WorkerError

__all__ = [
    "GroupProtocol",
    "check_client_settings",
    "check_groups_described",
    "choose_group_protocol",
    "wait_for_brokers",
    "wait_until_served",
    "kafka_logger",
]

_SETTINGS_DOC = "https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md"


def kafka_logger() -> logging.Logger:
    """The logger librdkafka's lines go to (``streambandit.kafka``), repeats held back."""
    logger = logging.getLogger("streambandit.kafka")
    if not any(isinstance(f, RepeatFilter) for f in logger.filters):
        logger.addFilter(RepeatFilter())
    return logger


def wait_until_served(admin: AdminClient, topics: list[str], timeout_s: float) -> dict | None:
    """The metadata of ``topics`` (name -> ``TopicMetadata``) once one listing showed every one
    with a leader for each of its partitions, within ``timeout_s`` (the metadata of the brokers
    ``admin`` asks, polled); else None. Use this listing: on a cluster the next one may come from
    a broker whose metadata has not caught up yet."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            listed = admin.list_topics(timeout=max(0.1, min(5.0, deadline - time.monotonic())))
            if all(
                t in listed.topics
                and listed.topics[t].error is None
                and listed.topics[t].partitions
                and all(p.leader >= 0 for p in listed.topics[t].partitions.values())
                for t in topics
            ):
                return {t: listed.topics[t] for t in topics}
        except KafkaException:
            pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _silent() -> logging.Logger:
    logger = logging.getLogger("streambandit.kafka.check")
    logger.propagate = False
    logger.disabled = True
    return logger


def _kafka_message(exc: BaseException) -> str:
    """librdkafka's text of an error, credentials masked here, where it ends: what librdkafka
    echoes of one runs to the end of its text (redaction.py)."""
    err = exc.args[0] if exc.args else exc
    return redact(err.str() if hasattr(err, "str") else str(err))


def check_client_settings(config: WorkerConfig, source: str = "[kafka]") -> None:
    """Build each of the worker's clients with its settings and no broker: librdkafka refuses an
    unknown key or a bad value here (ValueError naming the key as the configuration spells it,
    though librdkafka may name its alias), before anything connects."""
    c = config
    clients = (
        (
            "consumer",
            Consumer,
            # auto is decided at start, against the broker; until then the classic settings,
            # which every broker takes, are what librdkafka can judge.
            consumer_settings(
                c.bootstrap_servers,
                c.group_id,
                c.kafka,
                protocol="consumer" if c.group_protocol == "consumer" else "classic",
            ),
        ),
        (
            "producer",
            Producer,
            producer_settings(c.bootstrap_servers, "streambandit-check", c.kafka),
        ),
        ("consumer", Consumer, reader_settings(c.bootstrap_servers, c.kafka)),
    )
    for kind, make, settings in clients:
        error = _refused(make, settings)
        if error is None:
            continue
        # Which of the user's settings: each alone over the client's own.
        own = {k: v for k, v in settings.items() if k not in for_client(kind, c.kafka)}
        culprits = [
            k
            for k, v in for_client(kind, c.kafka).items()
            if _refused(make, own | {k: v}) is not None
        ]
        named = f"{', '.join(repr(k) for k in culprits)}: " if culprits else ""
        raise ValueError(
            f"{source}: librdkafka refuses the {kind}'s setting {named}{error} "
            f"(the settings: {_SETTINGS_DOC})"
        )


def _refused(make: Any, settings: dict[str, Any]) -> str | None:
    """librdkafka's complaint about ``settings`` (without the broker address), or None."""
    trial = {k: v for k, v in settings.items() if k != "bootstrap.servers"} | {"logger": _silent()}
    try:
        client = make(trial)
    except (KafkaException, TypeError, ValueError) as exc:
        return _kafka_message(exc)
    if isinstance(client, Consumer):
        client.close()
    return None


def wait_for_brokers(config: WorkerConfig) -> None:
    """Return once a broker of ``bootstrap.servers`` answers a metadata request; after
    ``broker_wait_s`` without one, WorkerError with the last connection error."""
    errors: list[Any] = []
    admin = AdminClient(
        {
            "bootstrap.servers": config.bootstrap_servers,
            **for_client("admin", config.kafka),
            "logger": _silent(),
            "error_cb": errors.append,
        }
    )
    deadline = time.monotonic() + config.broker_wait_s
    while True:
        left = deadline - time.monotonic()
        try:
            admin.list_topics(timeout=max(min(left, 5.0), 0.5))
            return
        except KafkaException as exc:
            admin.poll(0)  # serves error_cb: why the connections failed
            for err in errors:  # refused credentials are refused again: no wait
                line = refusal_line(err, config.kafka or {}, config.bootstrap_servers)
                if line is not None:
                    raise NotAuthorized(line) from None
            if time.monotonic() >= deadline:
                why = redact(errors[-1].str()) if errors else _kafka_message(exc)
                raise WorkerError(
                    f"no Kafka broker answered at {config.bootstrap_servers} (bootstrap.servers, --bootstrap-servers) "
                    f"within {config.broker_wait_s:g} s: {why}. Check the address, that the brokers run and are "
                    f"reachable from here, and the [kafka] security settings; [worker] broker_wait_s sets the wait"
                ) from None


#: The classic protocol's session (config/kafka.py sets it on the client).
CLASSIC_SESSION_S = 6.0
#: The consumer protocol's session when the broker does not say: Apache Kafka's default.
CONSUMER_SESSION_S = 45.0


@dataclasses.dataclass(frozen=True)
class GroupProtocol:
    """The group protocol a worker joins with (``classic`` or ``consumer``), why, and the
    group's session timeout under it (seconds)."""

    name: str
    reason: str
    session_s: float

    @property
    def incremental(self) -> bool:
        """A rebalance moves only the partitions that change owner (KIP-848)."""
        return self.name == "consumer"


def choose_group_protocol(config: WorkerConfig, timeout_s: float = 10.0) -> GroupProtocol:
    """The protocol of ``[worker] group_protocol``; for ``auto``, the consumer protocol (KIP-848)
    where the broker lists it in ``group.coordinator.rebalance.protocols`` (Apache Kafka 4 does),
    else the classic one. A broker that does not describe its configuration (the embedded broker;
    a principal without DescribeConfigs on the cluster) gets the classic protocol, which every
    broker has."""
    chosen = config.group_protocol
    if chosen == "classic":
        return GroupProtocol(
            "classic", "[worker] group_protocol = classic", _classic_session_s(config)
        )
    configs, why_not = _broker_configs(config, timeout_s)
    session_s = (
        float(configs.get("group.consumer.session.timeout.ms", CONSUMER_SESSION_S * 1000)) / 1000
    )
    if chosen == "consumer":
        return GroupProtocol("consumer", "[worker] group_protocol = consumer", session_s)
    offered = configs.get("group.coordinator.rebalance.protocols")
    if offered is not None and "consumer" in [p.strip() for p in offered.split(",")]:
        return GroupProtocol(
            "consumer",
            f"the broker offers it (group.coordinator.rebalance.protocols={offered})",
            session_s,
        )
    why = (
        f"the broker offers only {offered}"
        if offered is not None
        else f"the broker does not say it offers the consumer protocol ({why_not})"
    )
    return GroupProtocol("classic", why, _classic_session_s(config))


def _classic_session_s(config: WorkerConfig) -> float:
    settings = consumer_settings(config.bootstrap_servers, config.group_id, config.kafka)
    return float(settings.get("session.timeout.ms", CLASSIC_SESSION_S * 1000)) / 1000


def _broker_configs(config: WorkerConfig, timeout_s: float) -> tuple[dict[str, str], str]:
    """One broker's configuration as name -> value, and why it is empty when it is."""
    admin = AdminClient(
        {
            "bootstrap.servers": config.bootstrap_servers,
            **for_client("admin", config.kafka),
            "logger": _silent(),
        }
    )
    try:
        brokers = admin.list_topics(timeout=timeout_s).brokers
        if not brokers:
            return {}, "no broker in the metadata"
        resource = ConfigResource(ConfigResource.Type.BROKER, str(min(brokers)))
        described = next(iter(admin.describe_configs([resource]).values())).result(timeout_s)
    except (KafkaException, TimeoutError) as exc:
        return {}, f"describe configs: {_kafka_message(exc)}"
    configs = {k: v.value for k, v in described.items() if v.value is not None}
    return configs, "" if configs else "it describes no configuration"


def check_groups_described(
    bootstrap_servers: str, kafka: dict[str, Any] | None, groups: list[str], timeout_s: float = 30.0
) -> None:
    """NotAuthorized when the principal may not Describe one of ``groups``. Reading a group's
    committed offsets (or a reader's range, whose group's coordinator librdkafka looks up) needs
    Describe on it; without, the request waits out its whole timeout, where describing the group
    is refused at once. Any other error (a coordinator that moves or still loads:
    NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS; a timeout) says nothing about the grant and
    is left to the read that follows, which waits and retries as librdkafka does."""
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap_servers,
            **for_client("admin", kafka),
            "logger": kafka_logger(),
        }
    )
    for group, future in admin.describe_consumer_groups(list(groups)).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            line = refusal_line(
                exc, kafka or {}, bootstrap_servers, group=group, group_operation="Describe"
            )
            if line is not None:
                raise NotAuthorized(line) from None
