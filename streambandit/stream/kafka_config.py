"""The librdkafka settings the worker needs for exactly-once, as functions returning dicts.

User settings (``[kafka]`` in the worker configuration, dotted librdkafka names) are merged over
these, except the few that exactly-once depends on, which are forced.
"""

from __future__ import annotations

from typing import Any

__all__ = ["consumer_settings", "producer_settings", "reader_settings"]

# Group timing: a join takes ~3 s with these on the embedded broker (~23 s with the defaults) and
# they are valid on Apache Kafka. Revocation (snapshot + close) must finish well inside them.
_GROUP_TIMING = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000, "max.poll.interval.ms": 30000}


def consumer_settings(bootstrap: str, group_id: str, user: dict[str, Any] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"bootstrap.servers": bootstrap, **_GROUP_TIMING, "auto.offset.reset": "earliest",
                         "partition.assignment.strategy": "range"}
    s.update(user or {})
    s.update({
        "group.id": group_id,
        "enable.auto.commit": False,  # offsets commit inside the output transaction only
        "enable.auto.offset.store": False,
        "isolation.level": "read_committed",  # never read another transaction's uncommitted records
    })
    return s


def producer_settings(bootstrap: str, transactional_id: str, user: dict[str, Any] | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5, "transaction.timeout.ms": 10000}
    s.update(user or {})
    s.update({"transactional.id": transactional_id, "enable.idempotence": True, "acks": "all"})
    return s


def reader_settings(bootstrap: str, user: dict[str, Any] | None = None) -> dict[str, Any]:
    """A consumer for reading bounded ranges of our own logs during recovery (assign, no group)."""
    s: dict[str, Any] = {"bootstrap.servers": bootstrap}
    s.update(user or {})
    s.update({"group.id": "streambandit-reader", "enable.auto.commit": False, "isolation.level": "read_committed",
              "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    return s
