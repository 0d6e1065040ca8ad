"""Log lines of ``streambandit serve``: text for a terminal or JSON lines for a container, and
lines that repeat (a broker that is down, a stream of bad records) held back to one per kind and
interval with a count of the rest."""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any, Callable

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging", "RepeatFilter"]

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
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(level: int, fmt: str = "text") -> None:
    """The root logger on stderr at ``level``, in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


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
