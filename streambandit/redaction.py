"""Credentials kept out of everything a process writes (pure but for one registry, no I/O).

Which librdkafka settings hold a credential (:func:`is_secret`), the configuration with them
masked (:func:`masked`), and the text of any line with them masked (:func:`redact`): the values
a configuration holds are registered (:func:`hide`, by config/app.py as it loads one), and every
line the process writes passes :func:`redact` on its way out: log lines of both formats, the
error a command ends with, uncaught tracebacks (log_format.py), and the api's error bodies.

A value is masked wherever it occurs, whole, if it has at least :data:`SHORTEST` characters: a
shorter one would mask every like piece of text (a one-letter test password, every such letter)
and hides nothing worth hiding; ``--print-config`` and ``repr`` mask every credential.
librdkafka prints no credential in its configuration dump (``[redacted]``) nor in its errors,
with one exception: a ``sasl.oauthbearer.config`` it cannot parse is echoed from the first word
it does not recognise, so the rest of such a line is masked too.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["MASK", "SHORTEST", "is_secret", "masked", "secret_values", "hide", "redact"]

MASK = "********"
#: The shortest value :func:`redact` masks in free text.
SHORTEST = 4

# librdkafka settings that hold a credential though their name says none of the words below
# (sasl.jaas.config: the Java clients' form, a password inside).
_SECRET_KEYS = {"sasl.oauthbearer.config", "sasl.jaas.config"}
_SECRET_WORDS = {"password", "passwd", "passphrase", "secret", "token", "credentials"}
# Settings whose name has one of those words but whose value says where or who, not a secret:
# sasl.oauthbearer.token.endpoint.url, sasl.oauthbearer.client.credentials.client.id.
_NOT_SECRET_ENDS = {"url", "id", "location", "file"}


def is_secret(key: str) -> bool:
    """Whether librdkafka setting ``key`` holds a credential: a password, passphrase, secret or
    token, or a private key itself (``ssl.key.pem``, not ``ssl.key.location``, a file's path, nor
    ``ssl.certificate.pem``, public); not an address, an id or a path whose name mentions one."""
    words = re.split(r"[._]", key.lower())
    if key in _SECRET_KEYS:
        return True
    if words[-1] in _NOT_SECRET_ENDS:
        return False
    private_key = "key" in words and words[-1] in ("pem", "key")
    return private_key or bool(_SECRET_WORDS & set(words))


def masked(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (a ``[kafka]`` table, its ``consumer`` and ``producer`` sub-tables too) with
    every credential's value :data:`MASK`."""
    return {
        k: masked(v) if isinstance(v, Mapping) else MASK if is_secret(k) else v
        for k, v in settings.items()
    }


def secret_values(settings: Any) -> list[str]:
    """The credentials of a ``[kafka]`` table as text, sub-tables included; anything else (a
    table of the wrong shape, which the configuration's checks refuse) has none."""
    if not isinstance(settings, Mapping):
        return []
    out = []
    for key, value in settings.items():
        if isinstance(value, Mapping):
            out += secret_values(value)
        elif is_secret(str(key)) and not isinstance(value, bool) and str(value) != "":
            out.append(str(value))
    return out


# librdkafka's line for a sasl.oauthbearer.config it cannot parse ends with the configuration's
# text from the first word it does not know: masked up to the end of the line or of its quoted
# error, unless masked already (by a caller that had librdkafka's text alone, whose end is
# known, and then said more after it).
_ECHOES = re.compile(r"(sasl\.oauthbearer\.config beginning at: )(?!\*{8})[^\"\n]*")

_lock = threading.Lock()
_hidden: tuple[str, ...] = ()  # longest first: a value inside another is masked with it


def hide(values: Iterable[str]) -> None:
    """Mask ``values`` in every line :func:`redact` sees from now on (for the process's life)."""
    global _hidden
    with _lock:
        more = {v for v in values if len(v) >= SHORTEST}
        _hidden = tuple(sorted(set(_hidden) | more, key=len, reverse=True))


def redact(text: str) -> str:
    """``text`` with every hidden value, and what librdkafka echoes of a credential, masked."""
    for value in _hidden:
        if value in text:
            text = text.replace(value, MASK)
    if "sasl.oauthbearer.config" in text:
        text = _ECHOES.sub(r"\g<1>" + MASK, text)
    return text
