"""Log lines of ``streambandit serve`` and ``api``: text for a terminal or JSON lines for a
container, and lines that repeat (a broker that is down, a stream of bad records) held back to one
per kind and interval with a count of the rest.

With JSON lines, everything the process writes on stderr is one: its log lines, librdkafka's (each
client's ``logger`` setting, stream/kafka_checks.py), Python's warnings, an uncaught exception's
traceback (in the ``exception`` field) and the error a command ends with (:func:`error_line`).
In either format each of these is written with the process's credentials masked
(redaction.py), whatever the line quotes: a librdkafka error, an exception's message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
import traceback
from typing import Any, Callable

from streambandit.redaction import redact

__all__ = [
    "TEXT_FORMAT",
    "JsonFormatter",
    "TextFormatter",
    "redact_uncaught",
    "configure_logging",
    "json_logs",
    "error_line",
    "RepeatFilter",
]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception
    when there is one; a log collector needs no pattern to read it."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, credentials masked (a traceback's too)."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(level: int, fmt: str = "text") -> None:
    """The root logger on stderr at ``level``, in ``fmt`` ("text" or "json"), with Python's
    warnings as log lines; with "json", uncaught exceptions too (of the main thread, of other
    threads, and those Python can only report as ignored); with "text", their tracebacks as
    Python prints them (:func:`redact_uncaught`)."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # numba logs each compile's internals at DEBUG, thousands of lines a kernel: not what -v is
    # for (a kernel the install's warmup missed is compiled on a worker's first batch).
    logging.getLogger("numba").setLevel(max(level, logging.INFO))
    logging.captureWarnings(True)
    if fmt == "json":
        sys.excepthook = _log_uncaught
        threading.excepthook = lambda a: _log_uncaught(
            a.exc_type, a.exc_value, a.exc_traceback, f" in thread {a.thread and a.thread.name}"
        )
        sys.unraisablehook = lambda u: _log_uncaught(
            u.exc_type, u.exc_value, u.exc_traceback, f" (ignored) in {u.object!r}"
        )
    else:
        redact_uncaught()


def redact_uncaught() -> None:
    """Uncaught exceptions' tracebacks on stderr as Python prints them, credentials masked (of
    the main thread and of other threads): an exception's message may quote a setting."""

    def write(text: str) -> None:
        sys.stderr.write(redact(text))
        sys.stderr.flush()

    sys.excepthook = lambda kind, value, tb: write(
        "".join(traceback.format_exception(kind, value, tb))
    )

    def thread_hook(a: Any) -> None:
        if a.exc_type is not SystemExit:  # as Python's own hook: a thread's exit is no error
            write(
                f"Exception in thread {a.thread and a.thread.name}:\n"
                + "".join(traceback.format_exception(a.exc_type, a.exc_value, a.exc_traceback))
            )

    threading.excepthook = thread_hook


def _log_uncaught(kind: Any, value: Any, tb: Any, where: str = "") -> None:
    logging.getLogger("streambandit").critical(
        "uncaught exception%s: %s", where, value, exc_info=(kind, value, tb)
    )


def json_logs() -> bool:
    """Whether the log lines are JSON (:func:`configure_logging` with "json")."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def error_line(message: str) -> None:
    """The error a command ends with: ``streambandit: error: message`` on stderr, or a JSON log
    line (level ERROR) when the log lines are JSON."""
    if json_logs():
        logging.getLogger("streambandit").error("%s", message)
    else:
        sys.stderr.write(f"streambandit: error: {redact(message)}\n")
        sys.stderr.flush()


class RepeatFilter(logging.Filter):
    """Passes a kind of line at most once per ``every_s``; the next one that passes says how many
    were held back. As a logging filter, a line's kind is its text with numbers and client names
    blanked; a caller that knows the kind (a dead letter's reason) asks :meth:`admit` before it
    builds the line at all."""

    MAX_KINDS = 1000  # bounded, whatever a broker or a client sends

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self._clock = every_s, clock
        self._seen: dict[Any, list[float]] = {}  # kind -> [last passed at, held back since]

    def admit(self, kind: Any) -> int | None:
        """None: hold this one back; else pass it, with the count held back since the last."""
        now = self._clock()
        seen = self._seen.get(kind)
        if seen is not None and now - seen[0] < self.every_s:
            seen[1] += 1
            return None
        if len(self._seen) >= self.MAX_KINDS:
            self._seen.clear()
        self._seen[kind] = [now, 0]
        return 0 if seen is None else int(seen[1])

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.admit(re.sub(r"#\w+-\d+|\d+", "#", record.getMessage()))
        if held is None:
            return False
        if held:
            record.msg = f"{record.getMessage()} ({held} like it held back)"
            record.args = ()
        return True
