"""What a worker is configured with: its topics, its bounds and its triggers (pure, no Kafka)."""

from __future__ import annotations

import dataclasses
from typing import Any

from streambandit.config.models import ModelsConfig

__all__ = ["Topics", "WorkerConfig", "snapshot_due"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topics:
    contexts: str = "contexts"
    rewards: str = "rewards"
    actions: str = "actions"
    joined: str = "joined"
    dead_letter: str = "dead-letter"
    # Decisions made by replicas (serving/replica.py): a learn-only worker's first input, in place
    # of contexts.
    decisions: str = "decisions"

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
    group_id: str = "streambandit"
    topics: Topics = Topics()
    # Under a backlog each transaction's commit waits for a few serial broker round trips; a
    # larger bound means fewer of them (a broker with longer round trips gains more; bench.e2e
    # part 4 drains with this and with 2,000). Under light load a batch is what one fetch
    # brought, so the bound adds no latency there.
    batch_max_records: int = 5000
    poll_timeout_ms: int = 50
    merge_wait_ms: int = (
        20  # how long a record waits for the other input's head (docs/design.md, merge order)
    )
    idle_tick_ms: int = (
        1000  # an idle partition with open decisions gets a watermark tick this often
    )
    snapshot_interval_s: float = 30.0
    # A snapshot pauses the partition's loop (e2e part 6 measures it at a steady load), and
    # recovery re-applies the joined records after it (bench.recovery measures it). Every
    # 10,000 updates a busy worker paused every few seconds; this bounds the replay instead, and
    # snapshot_interval_s keeps it lower at moderate rates.
    snapshot_every_updates: int = 100_000
    # At most this share of a partition's time goes to snapshotting it: a snapshot costs time in
    # proportion to the partition's models (bench.memory measures it at 100,000 models), and the
    # two triggers above do not know that.
    snapshot_max_share: float = 0.1
    # A snapshot holds the models changed since the previous one (an increment) unless the chain
    # has this many increments, which recovery reads and lays over their base (engine/chains.py).
    snapshot_base_every: int = 32
    # A snapshot of at least this many models is taken by a forked child (Linux, a directory
    # store): the loop then pauses for the fork, in proportion to the worker's memory, not for a
    # copy of the models (bench.snapshots measures both: at 100,000 models a fork costs about
    # what copying 1,000 does). 0: never fork. While the child runs, the memory the loop changes
    # is copied for the parent (copy-on-write): at most the worker's size again.
    snapshot_fork_models: int = 1000
    max_pending: int = 100_000
    max_early_rewards: int = 10_000
    max_recent: int = 100_000
    # Bounds on what a client sends (docs/schemas.md, reason codes id_too_long, event_time_ahead
    # and the dead-letter truncation): ids that fit any output record, an event time at most this
    # far ahead of its record's Kafka timestamp (set the input topics' message.timestamp.type to
    # LogAppendTime, so that the broker, not the client, sets that timestamp), and the largest
    # record copied whole into a dead letter (below librdkafka's default message.max.bytes).
    max_id_bytes: int = 1024
    max_event_time_ahead_ms: int = 3_600_000
    # The most models one partition holds: a model key matching a pattern costs a model's state
    # for good, and a client sending a new key per context would otherwise grow the worker until
    # it is killed, and its restart with it (its snapshot holds them all). A context of a new key
    # past it is dead-lettered too_many_models. Memory per model: docs/operations.md.
    max_models: int = 1_000_000
    max_dead_letter_bytes: int = 256 * 1024
    # How long the worker may hold no partition while its inputs have lag, or see the group's
    # committed offsets behind its own commits, before it says so (stream/stall.py).
    stall_report_s: float = 60.0
    # A static member of the group (KIP-345), its id the worker's transactional id: a worker that
    # restarts within session.timeout.ms (raise it to cover a pod's restart) gets its partitions
    # back without a rebalance, and one that stops does not give them up until then. The embedded
    # broker rebalances only after that timeout even on a restart (docs/notes/tansu.md).
    static_membership: bool = False
    # The operator's view (stream/telemetry.py): /metrics, /healthz and /ready on this port
    # (None: no endpoint; 0: any free port). /healthz fails when the loop made no progress for
    # health_timeout_s: a poll returns within poll_timeout_ms and a recovery reports each
    # partition, so only a stuck loop is that late.
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    health_timeout_s: float = 60.0
    # A one-line summary of the worker's rates, lag and dead letters at INFO this often (0: never).
    log_summary_s: float = 60.0
    # How long the worker waits for a broker of bootstrap.servers to answer at start-up before it
    # stops with one error line (a supervisor or Kubernetes restarts it, with their back-off).
    broker_wait_s: float = 30.0
    # A learn-only worker decides nothing: replicas decide from copies of its models and log each
    # decision on topics.decisions (serving/replica.py); it joins rewards to those decisions as to
    # its own, writes actions (the decisions as it opened them), joined and snapshots.
    learn_only: bool = False
    kafka: dict[str, Any] = dataclasses.field(
        default_factory=dict
    )  # librdkafka settings, dotted names

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

    def __post_init__(self) -> None:
        if not 0.0 < self.snapshot_max_share <= 1.0:
            raise ValueError(
                f"snapshot_max_share must be in (0, 1], got {self.snapshot_max_share!r}"
            )
        if self.snapshot_base_every < 0:
            raise ValueError(f"snapshot_base_every must be >= 0, got {self.snapshot_base_every!r}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ValueError(
                f"metrics_port must be a TCP port (0-65535), got {self.metrics_port!r}"
            )
        for name in ("health_timeout_s", "broker_wait_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not self.log_summary_s >= 0:
            raise ValueError(
                f"log_summary_s must be >= 0 (0: no summary), got {self.log_summary_s!r}"
            )
        if self.max_models < 1:
            raise ValueError(f"max_models must be >= 1, got {self.max_models!r}")
        if self.snapshot_fork_models < 0:
            raise ValueError(
                f"snapshot_fork_models must be >= 0 (0: never fork), got {self.snapshot_fork_models!r}"
            )
        for spec in self.models.specs:
            if spec.policy == "bkb" and spec.hyper.get("max_points") is None:
                # Exact BKB keeps every distinct pulled point and refits over all of them: behind a
                # worker whose contexts bring new arm vectors it would stall its partition.
                raise ValueError(
                    f"model {spec.match!r}: bkb keeps every distinct pulled point, so its state and "
                    "its time per update grow without bound when the arms change with the contexts; "
                    "set hyper.max_points (the size of a fixed catalog) or use bkb_stream"
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
