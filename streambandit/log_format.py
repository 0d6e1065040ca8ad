"""Log line formats for ``streambandit serve``: text for a terminal, JSON lines for containers."""

from __future__ import annotations

import json
import logging
import time

__all__ = ["TEXT_FORMAT", "JsonFormatter", "configure_logging"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the exception
    when there is one; a log collector needs no pattern to read it."""

    def format(self, record: logging.LogRecord) -> str:
        t = time.gmtime(record.created)
        out = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z",
               "level": record.levelname, "logger": record.name, "message": record.getMessage()}
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
