"""The topics a worker configuration names, created and described through Kafka's admin API
(``streambandit topics``): the same calls on the embedded broker and on Apache Kafka."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streambandit.config.kafka import for_client
from streambandit.config.worker import Topics
from streambandit.stream.snapshots import create_snapshot_topic

__all__ = ["create_topics", "describe_topics"]


def _admin(bootstrap: str, kafka: dict[str, Any]) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, **for_client("admin", kafka)})


def create_topics(
    bootstrap: str,
    kafka: dict[str, Any],
    topics: Topics,
    snapshot_topic: str | None,
    partitions: int,
    replication: int = -1,
    max_chunk_bytes: int | None = None,
    timeout_s: float = 30.0,
    learn_only: bool = False,
) -> list[tuple[str, str]]:
    """Create the inputs and outputs with ``partitions`` each (co-partitioned) and the snapshot
    topic compacted; (topic, "created" or "exists") for each. ``replication`` -1: the cluster's."""
    if partitions < 1:
        raise ValueError(f"--partitions must be >= 1, got {partitions}")
    admin = _admin(bootstrap, kafka)
    done = []
    futures = admin.create_topics(
        [
            NewTopic(t, num_partitions=partitions, replication_factor=replication)
            for t in topics.all(learn_only)
        ],
        request_timeout=timeout_s,
    )
    for topic, fut in futures.items():
        try:
            fut.result(timeout_s)
            done.append((topic, "created"))
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                done.append((topic, "exists"))
            else:
                raise ValueError(f"could not create topic {topic!r}: {exc}") from None
    if snapshot_topic:
        extra = {} if max_chunk_bytes is None else {"max_chunk_bytes": max_chunk_bytes}
        created = create_snapshot_topic(
            bootstrap,
            snapshot_topic,
            partitions,
            replication_factor=replication,
            kafka=for_client("admin", kafka),
            timeout_s=timeout_s,
            **extra,
        )
        done.append((snapshot_topic, "created (compacted)" if created else "exists"))
    return done


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
    md = _admin(bootstrap, kafka).list_topics(timeout=timeout_s)
    names = topics.all(learn_only) + ([snapshot_topic] if snapshot_topic else [])
    rows = [
        (t, len(md.topics[t].partitions) if t in md.topics and md.topics[t].error is None else None)
        for t in names
    ]
    counts = {n for _, n in rows}
    return rows, None not in counts and len(counts) == 1
