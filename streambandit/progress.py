"""A progress bar for long command-line work, on stderr: redrawn in place on a terminal, a line
every 10% otherwise (CI logs). Only the CLI creates one; library code takes a ``progress(n)``
callback."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    def __init__(
        self, total: int, label: str, stream: TextIO | None = None, width: int = 30
    ) -> None:
        self.total, self.label, self.width = max(int(total), 1), label, width
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.done = 0
        self._start = self._last = time.monotonic()
        self._last_decile = -1

    def advance(self, n: int = 1) -> None:
        self.done = min(self.done + n, self.total)
        now = time.monotonic()
        if self.tty and now - self._last >= 0.2:
            self._last = now
            self.stream.write("\r" + self._line(now))
            self.stream.flush()
        elif not self.tty and (decile := 10 * self.done // self.total) > self._last_decile:
            self._last_decile = decile
            self.stream.write(self._line(now) + "\n")
            self.stream.flush()

    def close(self) -> None:
        now = time.monotonic()
        self.stream.write(("\r" if self.tty else "") + self._line(now, final=True) + "\n")
        self.stream.flush()

    def _line(self, now: float, final: bool = False) -> str:
        frac = self.done / self.total
        bar = "#" * int(frac * self.width) + "." * (self.width - int(frac * self.width))
        elapsed = now - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if final:
            tail = f"{elapsed:.0f} s"
        else:
            tail = f"eta {((self.total - self.done) / rate):.0f} s" if rate > 0 else "eta ?"
        return f"{self.label} [{bar}] {100 * frac:5.1f}% {self.done}/{self.total} rounds, {tail}"
