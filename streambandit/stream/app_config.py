"""The worker's configuration file: one TOML document with the Kafka connection, the worker's
settings and the models.

    [kafka]                       # librdkafka settings, passed through (dotted names)
    "bootstrap.servers" = "kafka-1:9092,kafka-2:9092"

    [worker]
    group_id = "streambandit"
    snapshot_dir = "/var/lib/streambandit/snapshots"
    snapshot_interval_s = 30
    snapshot_every_updates = 10000
    merge_wait_ms = 20
    idle_tick_ms = 1000

    [topics]                      # optional; these are the defaults
    contexts = "contexts"
    rewards = "rewards"
    actions = "actions"
    joined = "joined"
    dead_letter = "dead-letter"

    [[models]]                    # see streambandit/stream/models_config.py
    ...
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from streambandit.stream.models_config import parse_models_config
from streambandit.stream.worker import Topics, WorkerConfig

__all__ = ["load_worker_config"]

_WORKER_KEYS = {f.name for f in dataclasses.fields(WorkerConfig)} - {"bootstrap_servers", "models", "topics", "kafka"}


def load_worker_config(path: str | Path, *, bootstrap_servers: str | None = None) -> tuple[WorkerConfig, str | None]:
    """The worker configuration and the snapshot directory (None: not configured)."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"configuration file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{p} is not valid TOML: {exc}") from exc
    return parse_worker_config(raw, source=str(p), bootstrap_servers=bootstrap_servers)


def parse_worker_config(raw: dict[str, Any], *, source: str = "<config>",
                        bootstrap_servers: str | None = None) -> tuple[WorkerConfig, str | None]:
    kafka = dict(raw.get("kafka", {}))
    bootstrap = bootstrap_servers or kafka.pop("bootstrap.servers", None)
    kafka.pop("bootstrap.servers", None)
    if not bootstrap:
        raise ValueError(f"{source}: [kafka] needs \"bootstrap.servers\"")
    worker = dict(raw.get("worker", {}))
    snapshot_dir = worker.pop("snapshot_dir", None)
    unknown = sorted(set(worker) - _WORKER_KEYS)
    if unknown:
        raise ValueError(f"{source}: [worker] has unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(_WORKER_KEYS))}")
    topics = raw.get("topics", {})
    try:
        topics_obj = Topics(**topics)
    except TypeError as exc:
        raise ValueError(f"{source}: [topics]: {exc}") from None
    cfg = WorkerConfig(bootstrap_servers=bootstrap, models=parse_models_config(raw, source=source), topics=topics_obj,
                       kafka=kafka, **worker)
    return cfg, snapshot_dir
