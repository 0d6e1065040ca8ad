"""The worker's configuration file: one TOML document with the Kafka connection, the worker's
settings and the models.

    [kafka]                       # librdkafka settings, passed through (dotted names)
    "bootstrap.servers" = "kafka-1:9092,kafka-2:9092"

    [worker]
    group_id = "streambandit"
    snapshot_topic = "snapshots"  # a compacted topic (Kafka), or instead:
    # snapshot_dir = "/var/lib/streambandit/snapshots"   (one machine: the embedded demo)
    snapshot_max_chunk_bytes = 524288  # snapshots larger than this go in several records
    snapshot_interval_s = 30
    snapshot_every_updates = 100000
    snapshot_max_share = 0.1      # at most this share of the time spent snapshotting
    snapshot_fork_models = 1000   # snapshots of this many models or more taken by a forked child
    merge_wait_ms = 20
    idle_tick_ms = 1000
    metrics_port = 9400           # /metrics, /healthz, /ready; unset: off (docs/operations.md)
    metrics_host = "0.0.0.0"
    health_timeout_s = 60         # /healthz fails after this long without progress
    log_summary_s = 60            # a one-line summary this often (0: none)
    broker_wait_s = 30            # at start, how long to wait for a broker to answer
    static_membership = false     # KIP-345: group.instance.id from the transactional id

    [topics]                      # optional; these are the defaults
    contexts = "contexts"
    rewards = "rewards"
    actions = "actions"
    joined = "joined"
    dead_letter = "dead-letter"

    [[models]]                    # see streambandit/config/models.py
    ...
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig

__all__ = [
    "load_worker_config",
    "parse_worker_config",
    "SnapshotSettings",
    "DEFAULT_MAX_CHUNK_BYTES",
]

# Half of Kafka's default maximum message size (~1 MB), leaving room for the header and key.
DEFAULT_MAX_CHUNK_BYTES = 512 * 1024


@dataclasses.dataclass(frozen=True)
class SnapshotSettings:
    """Where snapshots go: a compacted topic or a directory (at most one is set)."""

    topic: str | None = None
    dir: str | None = None
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES


_TABLES = {"kafka", "worker", "topics", "models"}
_SNAPSHOT_KEYS = {
    "snapshot_topic": "topic",
    "snapshot_dir": "dir",
    "snapshot_max_chunk_bytes": "max_chunk_bytes",
}
_WORKER_KEYS = {f.name for f in dataclasses.fields(WorkerConfig)} - {
    "bootstrap_servers",
    "models",
    "topics",
    "kafka",
}


def load_worker_config(
    path: str | Path, *, bootstrap_servers: str | None = None
) -> tuple[WorkerConfig, SnapshotSettings]:
    """The worker configuration and where its snapshots go."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"configuration file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p} is not valid TOML: {exc}") from exc
    return parse_worker_config(raw, source=str(p), bootstrap_servers=bootstrap_servers)


def parse_worker_config(
    raw: dict[str, Any], *, source: str = "<config>", bootstrap_servers: str | None = None
) -> tuple[WorkerConfig, SnapshotSettings]:
    unknown_tables = sorted(set(raw) - _TABLES)
    if unknown_tables:
        raise ValueError(
            f"{source}: unknown table(s) or key(s) at the top level: {', '.join(unknown_tables)}; "
            f"known: {', '.join(sorted(_TABLES))}"
        )
    kafka = dict(raw.get("kafka", {}))
    bootstrap = bootstrap_servers or kafka.pop("bootstrap.servers", None)
    kafka.pop("bootstrap.servers", None)
    if not bootstrap:
        raise ValueError(f'{source}: [kafka] needs "bootstrap.servers"')
    worker = dict(raw.get("worker", {}))
    snapshots = _snapshot_settings(
        {k: worker.pop(k) for k in list(worker) if k in _SNAPSHOT_KEYS}, source
    )
    unknown = sorted(set(worker) - _WORKER_KEYS)
    if unknown:
        known = ", ".join(sorted(_WORKER_KEYS | set(_SNAPSHOT_KEYS)))
        raise ValueError(
            f"{source}: [worker] has unknown setting(s) {', '.join(unknown)}; known: {known}"
        )
    topics = raw.get("topics", {})
    known_topics = {f.name for f in dataclasses.fields(Topics)}
    if not isinstance(topics, dict) or set(topics) - known_topics:
        extra = (
            sorted(set(topics) - known_topics) if isinstance(topics, dict) else ["(not a table)"]
        )
        raise ValueError(
            f"{source}: [topics] has unknown key(s) {', '.join(extra)}; "
            f"known: {', '.join(sorted(known_topics))}"
        )
    try:
        topics_obj = Topics(**topics)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: [topics]: {exc}") from None
    cfg = WorkerConfig(
        bootstrap_servers=bootstrap,
        models=parse_models_config(raw, source=source),
        topics=topics_obj,
        kafka=kafka,
        **worker,
    )
    return cfg, snapshots


def _snapshot_settings(raw: dict[str, Any], source: str) -> SnapshotSettings:
    s = SnapshotSettings(**{_SNAPSHOT_KEYS[k]: v for k, v in raw.items()})
    if s.topic is not None and s.dir is not None:
        raise ValueError(
            f"{source}: [worker] sets both snapshot_topic and snapshot_dir; choose one"
        )
    for name, value in (("snapshot_topic", s.topic), ("snapshot_dir", s.dir)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError(f"{source}: [worker] {name} must be a non-empty string, got {value!r}")
    if (
        not isinstance(s.max_chunk_bytes, int)
        or isinstance(s.max_chunk_bytes, bool)
        or s.max_chunk_bytes < 1
    ):
        raise ValueError(
            f"{source}: [worker] snapshot_max_chunk_bytes must be a positive integer, got {s.max_chunk_bytes!r}"
        )
    return s
