"""Settings from the environment, over the configuration file's (pure: the environment is an
argument, and so is the reading of a credential's file), so that credentials can come from a
Kubernetes Secret rather than the file.

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

A credential may come from a file instead (:func:`read_secret_files`), as container images do it:
``STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE=/run/secrets/kafka/sasl-password`` gives
``[kafka] "sasl.password"`` the file's text, its trailing line ends dropped. Only a credential
(redaction.is_secret) is read from a file; librdkafka's own settings named ``*.file`` (paths,
which librdkafka reads itself) are ordinary settings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streambandit.config import schema
from streambandit.redaction import is_secret

__all__ = ["PREFIX", "FILE_SUFFIX", "apply_environment", "read_secret_files", "variable_name"]

PREFIX = "STREAMBANDIT_"
FILE_SUFFIX = "_FILE"
_KAFKA_CLIENTS = ("consumer", "producer")
# librdkafka's settings whose names end in .file: a path librdkafka reads, not a file of ours.
_LIBRDKAFKA_FILE_SETTINGS = {
    "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
    "sasl.oauthbearer.assertion.private.key.file",
}


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
        elif parts[0] == "kafka" and len(parts) == 2 and parts[1]:
            _table(out, ["kafka"], name)[parts[1].replace("_", ".")] = text
        elif parts[0] == "kafka" and len(parts) == 3 and parts[1] in _KAFKA_CLIENTS and parts[2]:
            _table(out, ["kafka", parts[1]], name)[parts[2].replace("_", ".")] = text
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


def _setting_of(name: str) -> tuple[str, str] | None:
    """The table and key of the librdkafka setting a ``STREAMBANDIT_KAFKA__...`` variable
    names, or None for another variable."""
    parts = [p.lower() for p in name[len(PREFIX) :].split("__")]
    if parts[0] == "kafka" and len(parts) == 2 and parts[1]:
        return "[kafka]", parts[1].replace("_", ".")
    if parts[0] == "kafka" and len(parts) == 3 and parts[1] in _KAFKA_CLIENTS and parts[2]:
        return f"[kafka.{parts[1]}]", parts[2].replace("_", ".")
    return None


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def read_secret_files(
    environ: Mapping[str, str], read: Callable[[str], str] = _read_text
) -> dict[str, str]:
    """A copy of ``environ`` in which each ``STREAMBANDIT_..._FILE`` variable of a credential is
    replaced by the variable it stands for, its value the text ``read`` gives for the path, with
    the trailing line ends dropped. ValueError, one line naming the variable, the setting and the
    path (never the file's text), for a file that cannot be read or is empty, for a variable set
    both ways, or for a ``_FILE`` variable of a setting that is not a credential."""
    out = dict(environ)
    for name in sorted(environ):
        if not (name.startswith(PREFIX) and "__" in name and name.endswith(FILE_SUFFIX)):
            continue
        full = _setting_of(name)
        if full is not None and full[1] in _LIBRDKAFKA_FILE_SETTINGS:
            continue  # librdkafka's own setting, a path
        parts = name[len(PREFIX) :].lower().split("__")
        if parts[0] in ("worker", "topics") and len(parts) == 2:
            if parts[1] in schema.table(parts[0]):
                continue  # a setting of ours named *_file, should there be one
        base = name.removesuffix(FILE_SUFFIX)
        setting = _setting_of(base)
        if setting is None or not is_secret(setting[1]):
            what = f"{setting[0]} {setting[1]}" if setting else base
            raise ValueError(
                f"{name}: only a credential may come from a file, and {what} is not one; "
                f"set {base} itself (docs/security.md)"
            )
        where, key = setting
        if base in environ:
            raise ValueError(f"{name} and {base} are both set: give {where} {key} one way")
        path = environ[name]
        try:
            text = read(path).rstrip("\r\n")
        except UnicodeDecodeError:
            raise ValueError(f"{name}: {path} for {where} {key} is not UTF-8 text") from None
        except OSError as exc:
            why = exc.strerror or type(exc).__name__
            raise ValueError(f"{name}: cannot read {path} for {where} {key}: {why}") from None
        if not text:
            raise ValueError(f"{name}: {path} for {where} {key} is empty")
        del out[name]
        out[base] = text
    return out
