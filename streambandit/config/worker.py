"""What a worker is configured with: its topics, its bounds and its triggers (pure, no Kafka)."""

from __future__ import annotations

import dataclasses
from typing import Any

from streambandit.config import schema
from streambandit.config.conflicts import conflicts
from streambandit.config.models import ModelsConfig
from streambandit.redaction import masked

__all__ = ["Topics", "WorkerConfig", "WORKER_FIELDS", "snapshot_due"]


def _default(table: str, key: str) -> Any:
    return schema.table(table)[key].default


# Each setting's type, range, default and purpose: config/schema.py.
@dataclasses.dataclass(frozen=True, kw_only=True)
class Topics:
    contexts: str = _default("topics", "contexts")
    rewards: str = _default("topics", "rewards")
    actions: str = _default("topics", "actions")
    joined: str = _default("topics", "joined")
    dead_letter: str = _default("topics", "dead_letter")
    decisions: str = _default("topics", "decisions")

    def __post_init__(self) -> None:
        schema.check_table("topics", dataclasses.asdict(self))

    def first_input(self, learn_only: bool = False) -> str:
        """The input a worker decides on (contexts) or, learn-only, takes decisions from."""
        return self.decisions if learn_only else self.contexts

    def all(self, learn_only: bool = False) -> list[str]:
        """The topics a worker reads and writes, co-partitioned."""
        return [
            self.first_input(learn_only),
            self.rewards,
            self.actions,
            self.joined,
            self.dead_letter,
        ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    bootstrap_servers: str
    models: ModelsConfig
    group_id: str = _default("worker", "group_id")
    topics: Topics = Topics()
    batch_max_records: int = _default("worker", "batch_max_records")
    poll_timeout_ms: int = _default("worker", "poll_timeout_ms")
    merge_wait_ms: int = _default("worker", "merge_wait_ms")
    idle_tick_ms: int = _default("worker", "idle_tick_ms")
    idle_commit_ms: int = _default("worker", "idle_commit_ms")
    snapshot_interval_s: float = _default("worker", "snapshot_interval_s")
    snapshot_every_updates: int = _default("worker", "snapshot_every_updates")
    snapshot_max_share: float = _default("worker", "snapshot_max_share")
    snapshot_base_every: int = _default("worker", "snapshot_base_every")
    snapshot_fork_models: int = _default("worker", "snapshot_fork_models")
    max_pending: int = _default("worker", "max_pending")
    max_early_rewards: int = _default("worker", "max_early_rewards")
    max_recent: int = _default("worker", "max_recent")
    max_id_bytes: int = _default("worker", "max_id_bytes")
    max_event_time_ahead_ms: int = _default("worker", "max_event_time_ahead_ms")
    max_models: int = _default("worker", "max_models")
    max_dead_letter_bytes: int = _default("worker", "max_dead_letter_bytes")
    stall_report_s: float = _default("worker", "stall_report_s")
    group_protocol: str = _default("worker", "group_protocol")
    static_membership: bool = _default("worker", "static_membership")
    metrics_port: int | None = _default("worker", "metrics_port")
    metrics_host: str = _default("worker", "metrics_host")
    health_timeout_s: float = _default("worker", "health_timeout_s")
    log_summary_s: float = _default("worker", "log_summary_s")
    broker_wait_s: float = _default("worker", "broker_wait_s")
    learn_only: bool = _default("worker", "learn_only")
    kafka: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # librdkafka settings, dotted names; [kafka.consumer] and [kafka.producer] as dicts

    def __repr__(self) -> str:
        """As the dataclass's, the credentials of ``kafka`` masked: a configuration in a log
        line or a traceback shows no password."""
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        shown["kafka"] = masked(self.kafka)
        return f"WorkerConfig({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    @property
    def first_input(self) -> str:
        return self.topics.first_input(self.learn_only)

    def engine_limits(self) -> dict[str, int]:
        """The bounds of a partition's engine (``PartitionEngine``'s keyword arguments)."""
        return {
            "max_pending": self.max_pending,
            "max_early_rewards": self.max_early_rewards,
            "max_recent": self.max_recent,
            "max_id_bytes": self.max_id_bytes,
            "max_event_time_ahead_ms": self.max_event_time_ahead_ms,
            "max_models": self.max_models,
        }

    def worker_settings(self) -> dict[str, Any]:
        """The ``[worker]`` settings of this configuration (those of config/schema.py it holds)."""
        return {k: getattr(self, k) for k in schema.table("worker") if k in WORKER_FIELDS}

    def __post_init__(self) -> None:
        schema.check_table("worker", self.worker_settings())
        for problem in conflicts(self):
            raise ValueError(problem)
        for spec in self.models.specs:
            if spec.policy == "bkb" and spec.hyper.get("max_points") is None:
                # Exact BKB keeps every distinct pulled point and refits over all of them: behind a
                # worker whose contexts bring new arm vectors it would stall its partition.
                raise ValueError(
                    f"model {spec.match!r}: bkb keeps every distinct pulled point, so its state and "
                    "its time per update grow without bound when the arms change with the contexts; "
                    "set hyper.max_points (the size of a fixed catalog) or use bkb_stream"
                )


#: The [worker] settings WorkerConfig holds (the snapshot_* location ones are SnapshotSettings').
WORKER_FIELDS = frozenset(f.name for f in dataclasses.fields(WorkerConfig)) & set(
    schema.table("worker")
)


def snapshot_due(
    updates_since: int, seconds_since: float, last_snapshot_s: float, config: WorkerConfig
) -> bool:
    """Whether a partition's next snapshot is due: after ``snapshot_every_updates`` updates or
    ``snapshot_interval_s`` seconds, but never sooner than keeps snapshotting within
    ``snapshot_max_share`` of the time (a snapshot that took s seconds is followed by at least
    s (1 / share - 1) seconds without one). Revocation and shutdown snapshot regardless."""
    if seconds_since < last_snapshot_s * (1.0 / config.snapshot_max_share - 1.0):
        return False
    return (
        updates_since >= config.snapshot_every_updates
        or seconds_since >= config.snapshot_interval_s
    )
