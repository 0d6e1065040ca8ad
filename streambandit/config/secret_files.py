"""Credentials read from files, so that none need be written in the configuration file or the
environment: a file of a Kubernetes Secret or a Docker secret (pure: the reading of a file is an
argument).

Two ways, for any credential of ``[kafka]``, ``[kafka.consumer]`` or ``[kafka.producer]``
(redaction.is_secret):

    STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE=/run/secrets/kafka/sasl-password   (the environment)
    "sasl.password" = { file = "/run/secrets/kafka/sasl-password" }           (the file, [kafka])

The setting is the file's text, its trailing line ends dropped. A ``_FILE`` variable is the
variable it stands for (config/environment.py): it overrides the configuration file, and may
not be set together with that variable. Only a credential is read from a file: its value is
then masked wherever the process writes (redaction.py), which another setting's is not.
librdkafka's own settings named ``*.file`` (paths librdkafka reads itself) are ordinary settings.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from streambandit.config import schema
from streambandit.config.environment import PREFIX, kafka_setting
from streambandit.redaction import is_secret

__all__ = ["FILE_SUFFIX", "read_secret_files", "read_file_settings"]

FILE_SUFFIX = "_FILE"
# librdkafka's settings whose names end in .file: a path librdkafka reads, not a file of ours.
_LIBRDKAFKA_FILE_SETTINGS = {
    "sasl.oauthbearer.assertion.file",
    "sasl.oauthbearer.assertion.jwt.template.file",
    "sasl.oauthbearer.assertion.private.key.file",
}
_KAFKA_TABLES = (["kafka"], ["kafka", "consumer"], ["kafka", "producer"])


def _read_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _credential(path: Any, what: str, read: Callable[[str], str]) -> str:
    """The credential in file ``path``; ValueError naming ``what`` and the path, never the
    file's text."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"{what}: the file must be a path (a non-empty string), got {path!r}")
    try:
        text = read(path).rstrip("\r\n")
    except UnicodeDecodeError:
        raise ValueError(f"{what}: {path} is not UTF-8 text") from None
    except OSError as exc:
        raise ValueError(
            f"{what}: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    if not text:
        raise ValueError(f"{what}: {path} is empty")
    return text


def _not_a_credential(what: str, instead: str) -> ValueError:
    return ValueError(
        f"{what}: only a credential may come from a file, and this setting is not one; "
        f"{instead} (docs/security.md)"
    )


def read_secret_files(
    environ: Mapping[str, str], read: Callable[[str], str] = _read_text
) -> dict[str, str]:
    """A copy of ``environ`` in which each ``STREAMBANDIT_KAFKA__..._FILE`` variable of a
    credential is replaced by the variable it stands for, its value the credential ``read``
    from the path. ValueError, one line naming the variable, the setting and the path, for a
    file that cannot be read or is empty, a variable set both ways, or a ``_FILE`` variable of
    a setting that is not a credential."""
    out = dict(environ)
    for name in sorted(environ):
        if not (name.startswith(PREFIX) and "__" in name and name.endswith(FILE_SUFFIX)):
            continue
        own = kafka_setting(name)
        if own is not None and own[1] in _LIBRDKAFKA_FILE_SETTINGS:
            continue
        table, _, key = name[len(PREFIX) :].lower().partition("__")
        if table in ("worker", "topics") and key in schema.table(table):
            continue  # a setting of ours named *_file, should there be one
        base = name.removesuffix(FILE_SUFFIX)
        setting = kafka_setting(base)
        if setting is None or not is_secret(setting[1]):
            where = f"[{'.'.join(setting[0])}] {setting[1]}" if setting else base
            raise _not_a_credential(f"{name} ({where})", f"set {base} itself")
        where = f"[{'.'.join(setting[0])}] {setting[1]}"
        if base in environ:
            raise ValueError(f"{name} and {base} are both set: give {where} one way")
        out[base] = _credential(environ[name], f"{name} ({where})", read)
        del out[name]
    return out


def read_file_settings(
    raw: dict[str, Any], source: str = "<config>", read: Callable[[str], str] = _read_text
) -> dict[str, Any]:
    """A copy of the parsed document ``raw`` in which each credential given as ``{ file =
    PATH }`` holds the credential ``read`` from PATH. ValueError, one line naming the setting
    and the path, for a file that cannot be read or is empty, or a ``{ file = ... }`` of a
    setting that is not a credential."""
    out = copy.deepcopy(raw)
    for path in _KAFKA_TABLES:
        table: Any = out
        for part in path:
            table = table.get(part) if isinstance(table, dict) else None
        if not isinstance(table, dict):
            continue  # none, or the wrong shape: parse_worker_config says so
        name = f"[{'.'.join(path)}]"
        for key, value in table.items():
            if not isinstance(value, dict) or (len(path) == 1 and key in ("consumer", "producer")):
                continue
            what = f"{source}: {name} {key}"
            if set(value) != {"file"}:
                raise ValueError(f"{what}: a credential's file is {{ file = PATH }} alone")
            if not is_secret(key):
                raise _not_a_credential(what, "give its value")
            table[key] = _credential(value["file"], what, read)
    return out
