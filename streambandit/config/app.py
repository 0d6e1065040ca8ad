"""The worker's configuration file: one TOML document with the Kafka connection, the worker's
settings and the models, under the environment's settings (config/environment.py), each
credential possibly read from a file (config/secret_files.py). Each setting's type, range and
default: config/schema.py.

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
    idle_commit_ms = 1000         # a partition quiet this long has its input committed, snapshotted
    metrics_port = 9400           # /metrics, /healthz, /ready; unset: off (docs/operations.md)
    metrics_host = "0.0.0.0"
    health_timeout_s = 60         # /healthz fails after this long without progress
    log_summary_s = 60            # a one-line summary this often (0: none)
    broker_wait_s = 30            # at start, how long to wait for a broker to answer
    group_protocol = "auto"       # consumer (KIP-848, incremental) where the broker offers it, else classic
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
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streambandit.config import schema
from streambandit.config.conflicts import snapshot_topic_conflict
from streambandit.config.environment import apply_environment
from streambandit.config.kafka import check_user_settings
from streambandit.config.models import dump_models_config, parse_models_config, toml_value
from streambandit.config.secret_files import read_file_settings, read_secret_files
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.redaction import hide, secret_values

__all__ = [
    "load_worker_config",
    "parse_worker_config",
    "dump_worker_config",
    "SnapshotSettings",
    "DEFAULT_MAX_CHUNK_BYTES",
]

DEFAULT_MAX_CHUNK_BYTES = schema.table("worker")["snapshot_max_chunk_bytes"].default


@dataclasses.dataclass(frozen=True)
class SnapshotSettings:
    """Where snapshots go: a compacted topic or a directory (at most one is set)."""

    topic: str | None = None
    dir: str | None = None
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES


_SNAPSHOT_KEYS = {
    "snapshot_topic": "topic",
    "snapshot_dir": "dir",
    "snapshot_max_chunk_bytes": "max_chunk_bytes",
}


def load_worker_config(
    path: str | Path,
    *,
    bootstrap_servers: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[WorkerConfig, SnapshotSettings]:
    """The worker configuration and where its snapshots go: the file, under the settings of the
    environment (``STREAMBANDIT_<TABLE>__<KEY>``, config/environment.py; ``os.environ`` unless
    ``environ`` is given), under ``bootstrap_servers``; a credential of either may be the name
    of a file that holds it (config/secret_files.py). Its credentials are masked in every line
    the process writes from then on (redaction.py)."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"configuration file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p} is not valid TOML: {exc}") from exc
    raw = apply_environment(raw, read_secret_files(os.environ if environ is None else environ))
    raw = read_file_settings(raw, source=str(p))
    # From here on, no line this process writes shows them (redaction.py).
    hide(secret_values(raw.get("kafka")))
    return parse_worker_config(raw, source=str(p), bootstrap_servers=bootstrap_servers)


def parse_worker_config(
    raw: dict[str, Any], *, source: str = "<config>", bootstrap_servers: str | None = None
) -> tuple[WorkerConfig, SnapshotSettings]:
    """Validate a parsed configuration document; every error is one line naming the key."""
    unknown_tables = sorted(set(raw) - set(schema.TABLES))
    if unknown_tables:
        raise ValueError(
            f"{source}: unknown table(s) or key(s) at the top level: {', '.join(unknown_tables)}; "
            f"known: {', '.join(sorted(schema.TABLES))}"
        )
    for name in ("kafka", "worker", "topics"):
        if not isinstance(raw.get(name, {}), dict):
            raise ValueError(f"{source}: {name} must be a table ([{name}])")
    kafka = dict(raw.get("kafka", {}))
    bootstrap = bootstrap_servers or kafka.pop("bootstrap.servers", None)
    kafka.pop("bootstrap.servers", None)
    if not bootstrap or not isinstance(bootstrap, str):
        raise ValueError(f'{source}: [kafka] needs "bootstrap.servers" (a string)')
    worker = dict(raw.get("worker", {}))
    topics = dict(raw.get("topics", {}))
    try:
        schema.check_table("worker", worker)
        schema.check_table("topics", topics)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    snapshots = SnapshotSettings(
        **{_SNAPSHOT_KEYS[k]: worker.pop(k) for k in list(worker) if k in _SNAPSHOT_KEYS}
    )
    if snapshots.topic is not None and snapshots.dir is not None:
        raise ValueError(
            f"{source}: [worker] sets both snapshot_topic and snapshot_dir; choose one"
        )
    models = parse_models_config(raw, source=source)
    try:
        # Here, not in WorkerConfig: a program building one with these gets them forced.
        check_user_settings(kafka)
        cfg = WorkerConfig(
            bootstrap_servers=bootstrap,
            models=models,
            topics=Topics(**topics),
            kafka=kafka,
            **worker,
        )
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    problem = snapshot_topic_conflict(snapshots.topic, cfg)
    if problem:
        raise ValueError(f"{source}: {problem}")
    return cfg, snapshots


def dump_worker_config(config: WorkerConfig, snapshots: SnapshotSettings) -> str:
    """The whole configuration, defaults included, as TOML text that
    :func:`parse_worker_config` reads back to it, with every credential masked
    (``schema.is_secret``): what ``serve --print-config`` prints."""

    def line(key: str, value: Any) -> str:
        shown = schema.MASK if schema.is_secret(key) else value
        name = key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_value(key, "[kafka]")
        return f"{name} = {toml_value(shown, key)}"

    kafka = {k: v for k, v in config.kafka.items() if not isinstance(v, dict)}
    lines = ["[kafka]", line("bootstrap.servers", config.bootstrap_servers)]
    lines += [line(k, v) for k, v in kafka.items()]
    for client in ("consumer", "producer"):
        if config.kafka.get(client):
            lines += ["", f"[kafka.{client}]"]
            lines += [line(k, v) for k, v in config.kafka[client].items()]
    held = config.worker_settings() | {k: getattr(snapshots, v) for k, v in _SNAPSHOT_KEYS.items()}
    lines += ["", "[worker]"]
    for key in schema.table("worker"):
        if held[key] is None:
            lines.append(f"# {key} unset")
        else:
            lines.append(line(key, held[key]))
    lines += ["", "[topics]"]
    lines += [line(k, v) for k, v in dataclasses.asdict(config.topics).items()]
    return "\n".join(lines) + "\n\n" + dump_models_config(config.models)
