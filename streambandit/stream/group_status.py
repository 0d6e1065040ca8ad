"""Where a worker group stands (``streambandit status``): for each input partition the group
member that holds it, the committed and end offsets and the lag between them, and the newest
snapshot of its partition in the snapshot store (age, position, models).

Read from the broker as an operator's tools would, without joining the group: the members from
the group's description (the admin API), the committed offsets as the group's coordinator
holds them, the end offsets as a read_committed reader sees them (the worker's own
``consumer_lag``), and the snapshots as a recovering worker would load them (``load_latest``).
:func:`status_rows` and :func:`format_table` are pure; :func:`read_group_status` does the I/O.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from streambandit.config.kafka import for_client, reader_settings
from streambandit.config.worker import WorkerConfig
from streambandit.errors import StreambanditError
from streambandit.stream.kafka_checks import kafka_logger
from streambandit.stream.logs import group_committed, high_watermark
from streambandit.stream.snapshots import SnapshotStore, load_latest

__all__ = [
    "Owner",
    "SnapshotInfo",
    "PartitionRow",
    "GroupStatus",
    "StatusError",
    "status_rows",
    "format_table",
    "read_group_status",
]


class StatusError(StreambanditError, RuntimeError):
    """The group's state could not be read from the broker."""


@dataclasses.dataclass(frozen=True)
class Owner:
    member_id: str
    client_id: str  # the worker's instance id, unless its configuration sets client.id
    host: str


@dataclasses.dataclass(frozen=True)
class SnapshotInfo:
    created_ms: int
    contexts_offset: int  # the next offset of the first input the snapshot's state has not seen
    rewards_offset: int
    models: int


@dataclasses.dataclass(frozen=True)
class PartitionRow:
    topic: str
    partition: int
    owner: Owner | None
    committed: int | None  # None: the group has committed nothing here
    end: int
    lag: int
    # The newest usable snapshot of the partition: its position in this topic, age and models.
    snapshot_offset: int | None
    snapshot_age_s: float | None
    models: int | None


@dataclasses.dataclass(frozen=True)
class GroupStatus:
    group: str
    state: str  # the group's state as the broker says it: Stable, Empty, PreparingRebalance, ...
    members: int
    store: str  # where the snapshots were read: "topic NAME" or "directory PATH"
    rows: list[PartitionRow]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def status_rows(
    first_input: str,
    rewards: str,
    partitions: list[int],
    owners: dict[tuple[str, int], Owner],
    committed: dict[tuple[str, int], int | None],
    ends: dict[tuple[str, int], int],
    snapshots: dict[int, SnapshotInfo | None],
    now_ms: int,
) -> list[PartitionRow]:
    """One row per input partition, the first input's before the rewards' of each partition."""
    rows = []
    for p in partitions:
        snap = snapshots.get(p)
        for topic in (first_input, rewards):
            at = committed.get((topic, p))
            end = ends[(topic, p)]
            rows.append(
                PartitionRow(
                    topic=topic,
                    partition=p,
                    owner=owners.get((topic, p)),
                    committed=at,
                    end=end,
                    # Nothing committed: a worker starts from the earliest offset.
                    lag=max(end - (at or 0), 0),
                    snapshot_offset=None
                    if snap is None
                    else (snap.contexts_offset if topic == first_input else snap.rewards_offset),
                    snapshot_age_s=None
                    if snap is None
                    else max(now_ms - snap.created_ms, 0) / 1000,
                    models=None if snap is None else snap.models,
                )
            )
    return rows


def format_table(status: GroupStatus) -> str:
    """The status for a terminal: a line about the group, then the table."""
    head = (
        f"group {status.group}: {status.state}, {status.members} member(s); "
        f"snapshots from {status.store}"
    )
    header = (
        "topic",
        "partition",
        "owner",
        "committed",
        "end",
        "lag",
        "snapshot at",
        "age",
        "models",
    )
    lines = [header]
    for r in status.rows:
        owner = "-" if r.owner is None else f"{r.owner.client_id} ({r.owner.host})"
        lines.append(
            (
                r.topic,
                str(r.partition),
                owner,
                "-" if r.committed is None else str(r.committed),
                str(r.end),
                str(r.lag),
                "-" if r.snapshot_offset is None else str(r.snapshot_offset),
                "-" if r.snapshot_age_s is None else _age(r.snapshot_age_s),
                "-" if r.models is None else str(r.models),
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    text = [
        "  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in lines
    ]
    return "\n".join([head, *(t.rstrip() for t in text)])


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def read_group_status(
    config: WorkerConfig, store: SnapshotStore, store_name: str, timeout_s: float = 10.0
) -> GroupStatus:
    """The group of ``config`` as the broker and ``store`` (not yet scoped) have it now."""
    first, rewards = config.first_input, config.topics.rewards
    quiet = {"logger": kafka_logger()}
    admin = AdminClient(
        {"bootstrap.servers": config.bootstrap_servers, **for_client("admin", config.kafka)} | quiet
    )
    reader = Consumer(reader_settings(config.bootstrap_servers, config.kafka) | quiet)
    group = Consumer(
        reader_settings(config.bootstrap_servers, config.kafka)
        | {"group.id": config.group_id}
        | quiet
    )
    try:
        md = admin.list_topics(timeout=timeout_s)
        missing = [t for t in (first, rewards) if t not in md.topics or md.topics[t].error]
        if missing:
            raise StatusError(
                f"topic {missing[0]} does not exist: create the topics first "
                "(streambandit topics create)"
            )
        partitions = sorted(md.topics[first].partitions)
        tps = [TopicPartition(t, p) for p in partitions for t in (first, rewards)]
        desc = admin.describe_consumer_groups([config.group_id])[config.group_id].result(timeout_s)
        owners = {
            (tp.topic, tp.partition): Owner(m.member_id, m.client_id, m.host)
            for m in desc.members
            for tp in (m.assignment.topic_partitions if m.assignment else [])
        }
        committed = {
            (tp.topic, tp.partition): tp.offset if tp.offset >= 0 else None
            for tp in group_committed(group, tps, timeout_s)
        }
        ends = {
            (tp.topic, tp.partition): high_watermark(reader, tp.topic, tp.partition, timeout_s)
            for tp in tps
        }
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        raise StatusError(
            f"could not read group {config.group_id!r}: {err.str() if hasattr(err, 'str') else err}"
        ) from None
    finally:
        reader.close()
        group.close()
    scoped = store.scoped(config.group_id)
    snapshots = {}
    for p in partitions:
        snap = load_latest(scoped, p)
        snapshots[p] = (
            None
            if snap is None
            else SnapshotInfo(
                snap.header.created_ms,
                snap.header.contexts_offset,
                snap.header.rewards_offset,
                len(snap.engine["models"]),
            )
        )
    state = desc.state.name.title().replace("_", "") if desc.state is not None else "Unknown"
    rows = status_rows(
        first,
        rewards,
        partitions,
        owners,
        committed,
        ends,
        snapshots,
        int(time.time() * 1000),
    )
    return GroupStatus(config.group_id, state, len(desc.members), store_name, rows)
