"""Settings from the environment, over the configuration file's (pure: the environment is an
argument), so that credentials can come from a Kubernetes Secret rather than the file.

One variable per setting, its name ``STREAMBANDIT_`` then the table and the key, joined by two
underscores, in upper case:

    STREAMBANDIT_WORKER__SNAPSHOT_INTERVAL_S=10          [worker] snapshot_interval_s = 10
    STREAMBANDIT_TOPICS__DEAD_LETTER=dl                  [topics] dead_letter = "dl"
    STREAMBANDIT_KAFKA__SASL_PASSWORD=...                [kafka] "sasl.password" = "..."
    STREAMBANDIT_KAFKA__CONSUMER__FETCH_WAIT_MAX_MS=10   [kafka.consumer] "fetch.wait.max.ms" = "10"

A librdkafka key's dots are single underscores (no librdkafka setting that takes a value has an
underscore in its name). ``[worker]`` and ``[topics]`` values are parsed as their setting's type
(config/schema.py: true/false, numbers; an empty value unsets an optional setting); librdkafka
values are passed as text, which librdkafka parses. ``[[models]]`` come from the file only.
Other variables without a double underscore (``STREAMBANDIT_BOOTSTRAP_SERVERS``, which
``--bootstrap-servers`` reads, ``STREAMBANDIT_KAFKA_CACHE``) are not settings of the file and
are left alone; ``STREAMBANDIT_WORKER_...`` and ``STREAMBANDIT_TOPICS_...`` with one underscore
are refused as the misspellings they are.

A credential's variable may name a file instead (``..._FILE``): config/secret_files.py.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from streambandit.config import schema

__all__ = ["PREFIX", "apply_environment", "kafka_setting", "variable_name"]

PREFIX = "STREAMBANDIT_"
_KAFKA_CLIENTS = ("consumer", "producer")


def variable_name(table: str, key: str) -> str:
    """The environment variable of a setting: ``table`` is worker, topics, kafka,
    kafka.consumer or kafka.producer; ``key`` as the file spells it."""
    parts = table.split(".") + [key.replace(".", "_")]
    return PREFIX + "__".join(p.upper() for p in parts)


def apply_environment(raw: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """A copy of the parsed document ``raw`` with the settings of ``environ`` over it. ValueError,
    one line naming the variable, for a variable that names no setting or a value of the wrong
    type."""
    out = copy.deepcopy(raw)
    for name in sorted(environ):
        if name.startswith(("STREAMBANDIT_WORKER_", "STREAMBANDIT_TOPICS_")) and "__" not in name:
            table, _, key = name[len(PREFIX) :].partition("_")
            raise ValueError(
                f"{name} names no setting: table and key are joined by two underscores "
                f"({PREFIX}{table}__{key})"
            )
        if not name.startswith(PREFIX) or "__" not in name:
            continue
        text = environ[name]
        parts = [p.lower() for p in name[len(PREFIX) :].split("__")]
        if parts[0] in ("worker", "topics") and len(parts) == 2:
            setting = schema.table(parts[0]).get(parts[1])
            if setting is None:
                known = ", ".join(variable_name(parts[0], k) for k in schema.table(parts[0]))
                raise ValueError(
                    f"{name}: [{parts[0]}] has no setting {parts[1]}; the variables are {known}"
                )
            value = setting.from_text(text, f"{name}: [{parts[0]}]")
            _table(out, [parts[0]], name)[parts[1]] = value
        elif (setting := kafka_setting(name)) is not None:
            path, key = setting
            _table(out, path, name)[key] = text
        else:
            raise ValueError(
                f"{name} names no setting: the variables are STREAMBANDIT_WORKER__<KEY>, "
                "STREAMBANDIT_TOPICS__<KEY>, STREAMBANDIT_KAFKA__<KEY> and "
                "STREAMBANDIT_KAFKA__CONSUMER__<KEY> or __PRODUCER__<KEY> (docs/operations.md)"
            )
    return out


def _table(doc: dict[str, Any], path: list[str], name: str) -> dict[str, Any]:
    """The table at ``path`` of ``doc``, made if the file has none."""
    for key in path:
        doc = doc.setdefault(key, {})
        if not isinstance(doc, dict):
            raise ValueError(f"{name}: the file's {'.'.join(path)} is not a table")
    return doc


def kafka_setting(name: str) -> tuple[list[str], str] | None:
    """Where the librdkafka setting a ``STREAMBANDIT_KAFKA__...`` variable names goes (the path
    of its table, ``["kafka"]`` or ``["kafka", client]``) and its key; None for another."""
    parts = [p.lower() for p in name[len(PREFIX) :].split("__")]
    if parts[0] == "kafka" and len(parts) == 2 and parts[1]:
        return ["kafka"], parts[1].replace("_", ".")
    if parts[0] == "kafka" and len(parts) == 3 and parts[1] in _KAFKA_CLIENTS and parts[2]:
        return ["kafka", parts[1]], parts[2].replace("_", ".")
    return None
