"""The librdkafka settings the worker needs for exactly-once, as functions returning dicts.

User settings (``[kafka]`` in the worker configuration, dotted librdkafka names) are merged over
these, except the few that exactly-once depends on (``FORCED``): the worker sets those itself,
and a configuration giving one of them another value is refused (:func:`check_user_settings`).
Settings for one kind of client go in a sub-table, ``[kafka.consumer]`` or ``[kafka.producer]``
(librdkafka warns about a consumer setting given to a producer); the consumers include the
recovery reader.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CLASSIC_ONLY",
    "FORCED",
    "REMOTE_ASSIGNOR",
    "RANGE_READS",
    "check_user_settings",
    "consumer_settings",
    "producer_settings",
    "reader_settings",
    "for_client",
]

# Group timing: with librdkafka's defaults the first join on the embedded broker takes many times
# longer than with these (docs/notes/tansu.md), and these are valid on Apache Kafka. Revocation
# (snapshot + close) must finish well inside them.
_GROUP_TIMING = {
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 1000,
    "max.poll.interval.ms": 30000,
}


# For a reader of ranges of records that are already there (recovery's reads of our logs, the
# snapshot topic), under the user's own settings: a fetch need not wait for more (librdkafka's 500
# ms is paid at every transaction marker a read ends on, and the embedded broker holds a fetch for
# all of it even when records are there: docs/notes/tansu.md), and a snapshot of many models
# comes in few large fetches rather than one per MiB (python -m bench.kafka --only handoff).
RANGE_READS = {"fetch.wait.max.ms": 10, "max.partition.fetch.bytes": 32 * 1024 * 1024}


# What exactly-once needs, for the group consumer's and the producer's settings: each key, the
# value the worker sets (None: a value of its own, per worker) and why.
_READ_COMMITTED = "never read another transaction's uncommitted records"
_OFFSETS_IN_TRANSACTION = "offsets commit inside the output transaction only"
FORCED_CONSUMER: dict[str, tuple[Any, str]] = {
    "group.id": (None, "the group is [worker] group_id"),
    "enable.auto.commit": (False, _OFFSETS_IN_TRANSACTION),
    "enable.auto.offset.store": (False, _OFFSETS_IN_TRANSACTION),
    "isolation.level": ("read_committed", _READ_COMMITTED),
}
FORCED_PRODUCER: dict[str, tuple[Any, str]] = {
    "transactional.id": (
        None,
        "each worker's own, <group_id>-<instance id>, fences its predecessor",
    ),
    "enable.idempotence": (True, "a transactional producer must be idempotent"),
    "acks": ("all", "a committed record must be on every in-sync replica"),
}
# librdkafka's other names of forced settings.
_ALIASES = {"request.required.acks": "acks"}
FORCED = (
    FORCED_CONSUMER
    | FORCED_PRODUCER
    | {alias: FORCED_PRODUCER[name] for alias, name in _ALIASES.items()}
)


def check_user_settings(user: dict[str, Any]) -> None:
    """ValueError, one line, for a ``[kafka]`` table the worker cannot use as it is: a sub-table
    other than consumer or producer, a value that is itself a table, ``group.instance.id``, or a
    setting exactly-once depends on (``FORCED``) with another value than the worker's."""
    for_client("admin", user)  # the sub-tables
    tables = [("[kafka]", user)] + [
        (f"[kafka.{k}]", v) for k, v in user.items() if k in ("consumer", "producer")
    ]
    for where, settings in tables:
        for key, value in settings.items():
            if where != "[kafka]" and isinstance(value, dict):
                raise ValueError(f"{where} {key} is a table; settings only here")
            if key == "group.instance.id":
                raise ValueError(f"{where} {_NO_INSTANCE_ID}")
            if key in FORCED and not _same(value, FORCED[key][0]):
                forced, why = FORCED[key]
                needs = "its own value" if forced is None else _text(forced)
                raise ValueError(
                    f"{where} {key} = {value!r} is refused: exactly-once needs {needs}, which "
                    f"the worker sets ({why})"
                )


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _same(value: Any, forced: Any) -> bool:
    """Whether a user's ``value`` is the one the worker sets anyway. The environment gives every
    librdkafka value as text ("false" is False), and librdkafka takes -1 for acks=all."""
    text = _text(value).strip().lower()
    return forced is not None and (text == _text(forced).lower() or (forced, text) == ("all", "-1"))


# One configuration file serves every process of a group (serve --processes N, a StatefulSet):
# one id for all would have each new member fence the one before.
_NO_INSTANCE_ID = (
    "group.instance.id cannot be set in the configuration: set [worker] static_membership = true, "
    "and each worker process uses its own instance id (--instance-id)"
)


def for_client(client: str, user: dict[str, Any] | None) -> dict[str, Any]:
    """The common settings of ``user`` with those of its ``client`` sub-table (``consumer`` or
    ``producer``) over them; ``"admin"`` gets the common settings only."""
    user = user or {}
    unknown = sorted(
        k for k, v in user.items() if isinstance(v, dict) and k not in ("consumer", "producer")
    )
    if unknown:
        raise ValueError(
            f"[kafka] sub-table(s) {', '.join(unknown)} unknown: use [kafka.consumer] or [kafka.producer]"
        )
    common = {k: v for k, v in user.items() if not isinstance(v, dict)}
    return common | (user.get(client, {}) if client in ("consumer", "producer") else {})


# Settings of the classic protocol that the consumer protocol (KIP-848) keeps on the broker: the
# group's session and heartbeat are broker settings there, and its assignor is the broker's.
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")

#: The consumer protocol's assignor: the broker's range assignor gives partition p of every
#: subscribed topic of equal partition count to one member (contexts p and rewards p together),
#: and keeps a partition where it is when it can. The default, uniform, does neither.
REMOTE_ASSIGNOR = "range"


def consumer_settings(
    bootstrap: str,
    group_id: str,
    user: dict[str, Any] | None = None,
    static_instance: str | None = None,
    protocol: str = "classic",
) -> dict[str, Any]:
    """The group consumer's settings under group ``protocol`` (``classic``: the eager range
    assignor; ``consumer``: KIP-848, incremental, the broker's range assignor); with
    ``static_instance``, a static member of the group under that id (KIP-345: a member that
    restarts within the session timeout gets its partitions back without a rebalance)."""
    if protocol not in ("classic", "consumer"):
        raise ValueError(f"group protocol {protocol!r}: classic or consumer")
    s: dict[str, Any] = {"bootstrap.servers": bootstrap, "auto.offset.reset": "earliest"}
    if protocol == "classic":
        s |= _GROUP_TIMING | {"partition.assignment.strategy": "range"}
    else:
        s |= {
            "group.protocol": "consumer",
            "group.remote.assignor": REMOTE_ASSIGNOR,
            "max.poll.interval.ms": _GROUP_TIMING["max.poll.interval.ms"],
        }
    user_settings = for_client("consumer", user)
    if "group.instance.id" in user_settings:
        raise ValueError(_NO_INSTANCE_ID)
    if protocol == "consumer":
        broker_side = sorted(k for k in CLASSIC_ONLY if k in user_settings)
        if broker_side:
            raise ValueError(
                f"[kafka] {', '.join(broker_side)}: not a client setting under the consumer group "
                "protocol (KIP-848), where the broker sets the session and heartbeat "
                "(group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms, or the "
                "group's own consumer.session.timeout.ms) and assigns the partitions; remove it, "
                'or set [worker] group_protocol = "classic"'
            )
        if user_settings.get("group.remote.assignor", REMOTE_ASSIGNOR) != REMOTE_ASSIGNOR:
            raise ValueError(
                f"[kafka] group.remote.assignor = {user_settings['group.remote.assignor']!r}: the "
                f"worker needs {REMOTE_ASSIGNOR!r}, the assignor that gives partition p of the "
                "contexts and of the rewards to the same member"
            )
    s.update(user_settings)
    if static_instance:
        s["group.instance.id"] = static_instance
    s.update(
        {
            "group.id": group_id,
            "enable.auto.commit": False,  # offsets commit inside the output transaction only
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",  # never read another transaction's uncommitted records
        }
    )
    return s


def producer_settings(
    bootstrap: str, transactional_id: str, user: dict[str, Any] | None = None
) -> dict[str, Any]:
    # Delivery reports for failed records only: the worker needs no report of a success (a failed
    # record fails the transaction; where the outputs end is read at snapshot time), and each
    # report is a call into Python inside commit_transaction.
    s: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "linger.ms": 5,
        "transaction.timeout.ms": 10000,
        "delivery.report.only.error": True,
    }
    s.update(for_client("producer", user))
    for alias in _ALIASES:
        s.pop(alias, None)
    s.update({k: v for k, (v, _) in FORCED_PRODUCER.items() if v is not None})
    s["transactional.id"] = transactional_id
    return s


def reader_settings(bootstrap: str, user: dict[str, Any] | None = None) -> dict[str, Any]:
    """A consumer for reading bounded ranges of our own logs during recovery (assign, no group)."""
    s: dict[str, Any] = {"bootstrap.servers": bootstrap}
    s.update(for_client("consumer", user))
    s.update(
        {
            "group.id": "streambandit-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    return s
