"""Ends a worker process stuck inside a librdkafka call long past that call's own timeout.

librdkafka's ``send_offsets_to_transaction`` can block past its timeout, for good, once the group
coordinator it knew has gone (a node killed, every node of the cluster restarted): seen on Apache
Kafka with librdkafka 2.16 (tests/integration/test_cluster_faults.py), and reported upstream as
librdkafka issues 5456 (a coordinator request's timeout is never checked) and 5511 (a coordinator
that left the cluster's metadata is asked again only when another broker changes state). The
worker then neither works nor stops on SIGTERM (Python runs a signal's handler only when the call
returns), and its transaction stays open until the broker's transaction timeout. Ending the process is what a crash
does, which the worker is built for: its supervisor or orchestrator starts it again, and the same
transactional id ends the open transaction at once.

``streambandit serve`` arms it; in-process (tests, benchmarks, an application embedding the
worker) ending the process is not the worker's call, and :class:`Watchdog` is given no action.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from typing import Callable, Iterator

from streambandit.log_format import json_logs

__all__ = ["Watchdog", "exit_process"]

log = logging.getLogger("streambandit")

GRACE_S = 15.0  # past the call's own timeout


def exit_process(reason: str) -> None:
    """Say why on stderr, as the CLI says an error, and end the process at once (exit code 1: a
    supervisor restarts it)."""
    log.critical("%s", reason)
    if not json_logs():  # with JSON lines, the line above is the one
        sys.stderr.write(f"streambandit: error: {reason}\n")
        sys.stderr.flush()
    os._exit(1)


class Watchdog:
    """``with watchdog.bound("what", timeout_s): call(..., timeout_s)``: if the call has not
    returned ``grace_s`` after ``timeout_s``, ``on_stuck(reason)`` runs, from a daemon thread that
    checks once a second. ``on_stuck`` None: no thread, nothing checked."""

    def __init__(self, on_stuck: Callable[[str], None] | None, grace_s: float = GRACE_S) -> None:
        self.on_stuck = on_stuck
        self.grace_s = grace_s
        self._call: tuple[str, float, float] | None = None  # what, its timeout, the deadline
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def bound(self, what: str, timeout_s: float) -> Iterator[None]:
        if self.on_stuck is None:
            yield
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)
            self._thread.start()
        self._call = (what, timeout_s, time.monotonic() + timeout_s + self.grace_s)
        try:
            yield
        finally:
            self._call = None

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.grace_s / 4))
            call = self._call
            if call is not None and time.monotonic() > call[2]:
                what, timeout_s, _ = call
                assert self.on_stuck is not None
                self.on_stuck(
                    f"librdkafka's {what} has not returned {self.grace_s:.0f} s after its own "
                    f"{timeout_s:.0f} s timeout (a coordinator that went away); exiting: started "
                    f"again, this instance ends its open transaction at once"
                )
                self._call = None
