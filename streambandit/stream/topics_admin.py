"""The topics a worker configuration names, created and described through Kafka's admin API
(``streambandit topics``): the same calls on the embedded broker and on Apache Kafka.

``create_topics`` gives each topic the settings deploy/README.md asks for (``topic_configs``) and
checks the ones that exist already against them: a topic made by hand, or by an older version,
with another partition count or settings is reported, never changed. With ``dry_run`` nothing
is created: the missing topics are reported with what would be created (Kafka's own
``validate_only`` is not used for it: the embedded broker creates the topic anyway).

A broker that stops answering midway is a :class:`TopicsError`, one line; librdkafka's own
lines go through ``kafka_logger`` (stream/kafka_checks.py), repeats held back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from streambandit.config.app import DEFAULT_MAX_CHUNK_BYTES
from streambandit.config.kafka import for_client
from streambandit.config.worker import Topics
from streambandit.errors import StreambanditError
from streambandit.stream.authorization import (
    AUTHORIZATION_CODES,
    not_authorized_line,
    refusal_code,
)
from streambandit.stream.errors import NotAuthorized
from streambandit.stream.kafka_checks import kafka_logger, wait_until_served
from streambandit.stream.snapshots import snapshot_topic_config

__all__ = [
    "create_topics",
    "describe_topics",
    "topic_configs",
    "default_replication",
    "TopicStatus",
    "TopicsError",
]


class TopicsError(StreambanditError, RuntimeError):
    """A topic could not be created or described: the broker refused, or did not answer."""


# Settings an existing topic meets when its value is at least the one asked for.
_AT_LEAST = frozenset({"max.message.bytes", "min.insync.replicas"})


def _admin(bootstrap: str, kafka: dict[str, Any]) -> AdminClient:
    return AdminClient(
        {"bootstrap.servers": bootstrap, **for_client("admin", kafka), "logger": kafka_logger()}
    )


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else exc
    return err.str() if hasattr(err, "str") else str(err)


def default_replication(brokers: int) -> int:
    """Three replicas, or as many as there are brokers when fewer."""
    return max(1, min(3, brokers))


def topic_configs(
    topics: Topics,
    snapshot_topic: str | None,
    replication: int,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    learn_only: bool = False,
) -> dict[str, dict[str, str]]:
    """The settings of each topic a worker reads or writes (deploy/README.md, Topics)."""
    # acks=all is acknowledged once min.insync.replicas replicas have a record: with the broker
    # default of 1, a committed transaction's records may live on one broker only, and its loss
    # takes an exactly-once guarantee with it. Two of three keeps a broker's loss harmless and
    # the topic writable while one is down.
    durable = {"min.insync.replicas": "2"} if replication >= 3 else {}
    # The worker dead-letters a record whose event time is too far ahead of its Kafka timestamp
    # (event_time_ahead): with LogAppendTime that timestamp is the broker's, not the producer's.
    inputs = {"message.timestamp.type": "LogAppendTime"} | durable
    out = {
        topics.first_input(learn_only): inputs,
        topics.rewards: inputs,
        topics.actions: dict(durable),
        # The exact learning log: recovery re-applies it from the snapshot on, falls back to the
        # whole of it when no snapshot is usable, and replay reads it whole. Kept for ever.
        topics.joined: {"retention.ms": "-1"} | durable,
        topics.dead_letter: dict(durable),
    }
    if snapshot_topic:
        out[snapshot_topic] = snapshot_topic_config(max_chunk_bytes) | durable
    return out


@dataclasses.dataclass(frozen=True)
class TopicStatus:
    topic: str
    created: bool
    # How an existing topic differs from what create asks: e.g. "4 partitions (asked 8)".
    differences: tuple[str, ...] = ()
    partitions_differ: bool = False
    compacted: bool = False
    # A dry run's missing topic: what would be created ("8 partitions, replication 3, k=v, ...").
    would_create: str | None = None

    def __str__(self) -> str:
        if self.would_create is not None:
            return f"missing, would create: {self.would_create}"
        if self.created:
            return "created (compacted)" if self.compacted else "created"
        if not self.differences:
            return "exists"
        return "exists, differs: " + "; ".join(self.differences)


def create_topics(
    bootstrap: str,
    kafka: dict[str, Any],
    topics: Topics,
    snapshot_topic: str | None,
    partitions: int,
    replication: int | None = None,
    max_chunk_bytes: int | None = None,
    timeout_s: float = 30.0,
    learn_only: bool = False,
    dry_run: bool = False,
) -> list[TopicStatus]:
    """Create the inputs and outputs with ``partitions`` each (co-partitioned) and the snapshot
    topic compacted, each with :func:`topic_configs`; check those that exist against the same.
    ``replication`` None: :func:`default_replication` of the cluster's brokers; -1: the
    cluster's ``default.replication.factor`` (and no min.insync.replicas of ours). ``dry_run``:
    create nothing, say what would be created."""
    if partitions < 1:
        raise ValueError(f"--partitions must be >= 1, got {partitions}")
    admin = _admin(bootstrap, kafka)
    try:
        md = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise TopicsError(f"could not read the cluster's topics: {_reason(exc)}") from None
    if replication is None:
        replication = default_replication(len(md.brokers))
    wanted = topic_configs(
        topics,
        snapshot_topic,
        replication,
        DEFAULT_MAX_CHUNK_BYTES if max_chunk_bytes is None else max_chunk_bytes,
        learn_only,
    )
    existing = {t for t in wanted if t in md.topics and md.topics[t].error is None}
    if dry_run:
        found = _check_existing(admin, existing, wanted, partitions, replication, timeout_s)
        return [
            found.get(t)
            or TopicStatus(t, created=False, would_create=_plan(partitions, replication, c))
            for t, c in wanted.items()
        ]
    futures = (
        admin.create_topics(
            [
                NewTopic(t, num_partitions=partitions, replication_factor=replication, config=c)
                for t, c in wanted.items()
                if t not in existing
            ],
            request_timeout=timeout_s,
        )
        if len(existing) < len(wanted)
        else {}
    )
    created = set()
    for topic, fut in futures.items():
        try:
            fut.result(timeout_s)
            created.add(topic)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                existing.add(topic)  # made by someone else since the metadata was read
            elif refusal_code(exc) in AUTHORIZATION_CODES:
                # A missing ACL: one line naming the grant, exit code 3 (docs/security.md).
                line = not_authorized_line(
                    refusal_code(exc),
                    kafka,
                    f"create topic {topic}",
                    f"Cluster (or on Topic {topic})",
                    "Create",
                )
                raise NotAuthorized(line) from None
            else:
                # Refused as asked (e.g. more replicas than brokers): bad arguments, exit 2.
                raise ValueError(f"could not create topic {topic!r}: {_reason(exc)}") from None
    if created and not wait_until_served(admin, sorted(created), timeout_s):
        raise TopicsError(
            f"topics {sorted(created)} were created but had no leader for each partition within "
            f"{timeout_s:.0f} s"
        )
    found = _check_existing(admin, existing, wanted, partitions, replication, timeout_s)
    return [
        found[t]
        if t in found
        else TopicStatus(t, created=True, compacted="compact" in c.get("cleanup.policy", ""))
        for t, c in wanted.items()
    ]


def _plan(partitions: int, replication: int, config: dict[str, str]) -> str:
    copies = (
        "the cluster's default replication" if replication < 1 else f"replication {replication}"
    )
    return ", ".join([f"{partitions} partitions", copies, *(f"{k}={v}" for k, v in config.items())])


def _check_existing(
    admin: AdminClient,
    names: set[str],
    wanted: dict[str, dict[str, str]],
    partitions: int,
    replication: int,
    timeout_s: float,
) -> dict[str, TopicStatus]:
    if not names:
        return {}
    try:
        md = admin.list_topics(timeout=timeout_s)
        resources = {t: ConfigResource(ConfigResource.Type.TOPIC, t) for t in names}
        described = admin.describe_configs(list(resources.values()), request_timeout=timeout_s)
        actual = {
            t: {k: e.value for k, e in described[r].result(timeout_s).items()}
            for t, r in resources.items()
        }
    except KafkaException as exc:
        raise TopicsError(f"could not describe the existing topics: {_reason(exc)}") from None
    out = {}
    for t in names:
        diffs = []
        parts = md.topics[t].partitions
        if len(parts) != partitions:
            diffs.append(f"{len(parts)} partitions (asked {partitions})")
        replicas = min((len(p.replicas) for p in parts.values()), default=0)
        if replication > 0 and replicas != replication:
            diffs.append(f"replication factor {replicas} (asked {replication})")
        for key, want in wanted[t].items():
            have = actual[t].get(key)
            if have == want:
                continue
            if key in _AT_LEAST and have is not None and _int(have) >= _int(want):
                continue
            diffs.append(f"{key}={'unset' if have is None else have} (asked {want})")
        out[t] = TopicStatus(
            t, created=False, differences=tuple(diffs), partitions_differ=len(parts) != partitions
        )
    return out


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        return -1


def describe_topics(
    bootstrap: str,
    kafka: dict[str, Any],
    topics: Topics,
    snapshot_topic: str | None,
    timeout_s: float = 10.0,
    learn_only: bool = False,
) -> tuple[list[tuple[str, int | None]], bool]:
    """(topic, partition count or None when missing) for each of ``topics`` and the snapshot
    topic, and whether they are co-partitioned (all present, one partition count)."""
    try:
        md = _admin(bootstrap, kafka).list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise TopicsError(f"could not read the cluster's topics: {_reason(exc)}") from None
    names = topics.all(learn_only) + ([snapshot_topic] if snapshot_topic else [])
    rows = [
        (t, len(md.topics[t].partitions) if t in md.topics and md.topics[t].error is None else None)
        for t in names
    ]
    counts = {n for _, n in rows}
    return rows, None not in counts and len(counts) == 1
