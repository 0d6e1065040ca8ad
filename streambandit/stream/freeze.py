"""Noticing that this process was frozen: a stopped process (SIGSTOP, a paused VM, a machine
starved for seconds) cannot heartbeat, so its group may have given its partitions to another
member while it stood still, and librdkafka learns that only some time after the process runs
again: its member id still looks valid for the first moments after a resume.

A worker that resumes inside a batch must not commit that batch if the group may have moved on.
Apache Kafka protects the next owner by itself (KIP-447: a pending transactional offset commit
holds the new owner's offset fetch until the transaction ends); the embedded broker does not, and
a zombie's commit that lands after the new owner has recovered would put both owners' outputs in
the logs (transaction.py, step 3). A long step is not the sign: a worker that waits for the broker
or works through a large batch keeps its heartbeats, which librdkafka sends from a thread of its
own. A long gap between two ticks of a thread that does nothing else is: only a process that did
not run leaves one.
"""

from __future__ import annotations

import threading
import time

__all__ = ["FreezeWatch"]


class FreezeWatch:
    """A daemon thread that ticks every ``tick_s``; :meth:`longest_gap_s` is the longest time
    between two ticks (or from the last tick to now) since :meth:`reset`. Without a freeze it
    stays near ``tick_s`` (plus the time a busy interpreter holds its lock, milliseconds)."""

    def __init__(self, tick_s: float = 0.1) -> None:
        self.tick_s = tick_s
        self._lock = threading.Lock()
        self._last = time.monotonic()
        self._longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freeze-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            now = time.monotonic()
            with self._lock:
                self._longest = max(self._longest, now - self._last)
                self._last = now

    def reset(self) -> None:
        """Start a new period: the gaps before now no longer count."""
        with self._lock:
            self._last = time.monotonic()
            self._longest = 0.0

    def longest_gap_s(self) -> float:
        """The longest gap since :meth:`reset`, counting the one still open: right after a resume
        the main thread can run before this thread has ticked again."""
        with self._lock:
            return max(self._longest, time.monotonic() - self._last)

    def close(self) -> None:
        self._stop.set()
