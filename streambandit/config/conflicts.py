"""Settings that are each valid alone but must agree with one another (pure).

Each check says which keys disagree and what the code relies on; librdkafka itself refuses the
pairs it knows (max.poll.interval.ms below session.timeout.ms, message.timeout.ms above
transaction.timeout.ms), at ``serve --check-config`` and at start (stream/kafka_checks.py).
"""

from __future__ import annotations

from typing import Any

from streambandit.config.kafka import consumer_settings, producer_settings

__all__ = ["conflicts", "snapshot_topic_conflict", "DEAD_LETTER_ROOM"]

# A dead letter is the refused record (up to max_dead_letter_bytes) with its reason, detail and
# origin: a few hundred bytes; this leaves room to spare under the producer's message.max.bytes.
DEAD_LETTER_ROOM = 16 * 1024
_LIBRDKAFKA_MESSAGE_MAX_BYTES = 1_000_000  # librdkafka's default message.max.bytes


def _number(value: Any) -> float | None:
    """A librdkafka value as a number (the environment gives text), None if it is none: then
    librdkafka refuses it itself."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def conflicts(config: Any) -> list[str]:
    """One line for each pair of a ``WorkerConfig``'s settings that disagree."""
    c = config
    out = []
    if c.health_timeout_s * 1000 <= c.poll_timeout_ms:
        out.append(
            f"[worker] health_timeout_s ({c.health_timeout_s:g} s) must be longer than "
            f"poll_timeout_ms ({c.poll_timeout_ms} ms): an idle loop shows progress once a poll, "
            "and /healthz would fail between two"
        )
    names = c.topics.all(c.learn_only)
    same = sorted({n for n in names if names.count(n) > 1})
    if same:
        out.append(
            f"[topics] name(s) {', '.join(same)} given to more than one of "
            f"{', '.join(_topic_keys(c.learn_only))}: each needs a topic of its own"
        )
    consumer = consumer_settings(c.bootstrap_servers, c.group_id, c.kafka)
    heartbeat = _number(consumer.get("heartbeat.interval.ms"))
    session = _number(consumer.get("session.timeout.ms"))
    if heartbeat is not None and session is not None and heartbeat >= session:
        out.append(
            f"[kafka] heartbeat.interval.ms ({heartbeat:g}) must be below session.timeout.ms "
            f"({session:g}): the group drops a member that sends no heartbeat within the session"
        )
    producer = producer_settings(c.bootstrap_servers, "", c.kafka)
    most = _number(producer.get("message.max.bytes", _LIBRDKAFKA_MESSAGE_MAX_BYTES))
    if most is not None and c.max_dead_letter_bytes + DEAD_LETTER_ROOM > most:
        out.append(
            f"[worker] max_dead_letter_bytes ({c.max_dead_letter_bytes}) must be at least "
            f"{DEAD_LETTER_ROOM} below the producer's [kafka] message.max.bytes ({most:g}): a "
            "dead letter the producer refuses fails its transaction again on every retry"
        )
    return out


def snapshot_topic_conflict(topic: str | None, config: Any) -> str | None:
    """The snapshot topic is compacted and holds snapshots only: not one of the worker's topics."""
    if topic is not None and topic in config.topics.all(config.learn_only):
        return (
            f"[worker] snapshot_topic {topic!r} is also one of [topics]: snapshots need a "
            "compacted topic of their own"
        )
    return None


def _topic_keys(learn_only: bool) -> list[str]:
    first = "decisions" if learn_only else "contexts"
    return [first, "rewards", "actions", "joined", "dead_letter"]
