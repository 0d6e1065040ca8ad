"""Several workers from one command: ``streambandit serve --processes N``.

A worker is one Python process on one core, so a machine's cores need as many workers. The
supervisor starts N children, each ``streambandit serve`` with ``--processes 1`` and an instance id
of its own (``<instance id>-<i>``: its transactional id, stable across restarts, so a restarted
child fences its dead predecessor exactly as a restarted pod does). It restarts a child that
exits with an error, after a backoff that doubles while the child keeps failing within
``STABLE_S`` of its start; a child that exits with 2 (a configuration the worker refused) is not
restarted, and stops the others. SIGTERM or SIGINT stops the children cleanly (snapshot, leave the
group) one at a time: the next is sent SIGTERM ``LEAVE_GAP_S`` after the one before it has
exited, by when it has heard of the rebalance that exit started, and it waits for that
rebalance's assignment before it leaves (``Worker._leave_when_settled``). Members that leave
together, or one inside the rebalance another's leave started, can leave the embedded broker's
group with a member that is gone but still counted, and no later start of the group is given a
partition (docs/notes/tansu.md). Two children stop in 4 to 5 s on the embedded broker
(``python -m bench.group_restarts``). The supervisor returns when all have exited.

A child dies with its supervisor (``PR_SET_PDEATHSIG`` on Linux): a supervisor killed outright
leaves no orphan worker behind holding partitions and a transactional id.

The pure part, the restart rule, is :class:`RestartPolicy`; :class:`Supervisor` does the processes.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

__all__ = ["RestartPolicy", "Supervisor", "STABLE_S", "CONFIG_ERROR"]

log = logging.getLogger("streambandit")

STABLE_S = 60.0  # a child that ran this long before failing starts again without delay
CONFIG_ERROR = 2  # the exit code of a refused configuration: restarting would refuse it again
# Between one child's exit and the next one's SIGTERM while stopping: time for the others to hear
# of the rebalance the exit started (at their next heartbeat, every second by default), so that
# the next waits for that rebalance to end before it leaves (Worker._leave_when_settled).
LEAVE_GAP_S = 2.0


@dataclasses.dataclass
class RestartPolicy:
    """When a failed child starts again: at once if it had run ``STABLE_S``, else after a delay
    that doubles with each quick failure, from ``first_s`` up to ``max_s``."""

    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = STABLE_S
    _delay: float = 0.0

    def after_failure(self, ran_s: float) -> float:
        """The delay before restarting a child that failed after running ``ran_s`` seconds."""
        if ran_s >= self.stable_s:
            self._delay = 0.0
            return 0.0
        self._delay = min(self.max_s, max(self.first_s, 2 * self._delay))
        return self._delay


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass  # not Linux: a killed supervisor may leave its children running


@dataclasses.dataclass
class _Child:
    index: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    restart_at: float | None = None
    signalled: bool = False  # sent SIGTERM by stop()
    policy: RestartPolicy = dataclasses.field(default_factory=RestartPolicy)


class Supervisor:
    """Runs ``command(i)`` for i in range(n) as child processes (see the module docstring)."""

    def __init__(
        self,
        command: Callable[[int], Sequence[str]],
        n: int,
        *,
        poll_s: float = 0.2,
        policy: Callable[[], RestartPolicy] = RestartPolicy,
        leave_gap_s: float = LEAVE_GAP_S,
    ) -> None:
        if n < 1:
            raise ValueError(f"--processes must be >= 1, got {n}")
        self.command = command
        self.children = [_Child(i, policy=policy()) for i in range(n)]
        self.poll_s = poll_s
        self.restarts = 0
        self._stopping = False
        self._code = 0
        self.leave_gap_s = leave_gap_s
        self._last_exit = float("-inf")  # when a child last exited

    def _start(self, child: _Child) -> None:
        child.proc = subprocess.Popen(
            list(self.command(child.index)),
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        child.started, child.restart_at, child.signalled = time.monotonic(), None, False
        log.info("worker process started index=%d pid=%d", child.index, child.proc.pid)

    def stop(self) -> None:
        """Stop the children cleanly, one at a time (SIGTERM to the next once the one before has
        exited, see the module docstring); :meth:`run` returns when all have exited. Safe from a
        signal handler: it only signals the first child, and :meth:`run` the others."""
        self._stopping = True
        self._stop_next()

    def _stop_next(self) -> None:
        """While stopping: SIGTERM to the first running child, unless one is stopping already
        or the last exit was less than ``leave_gap_s`` ago."""
        if time.monotonic() - self._last_exit < self.leave_gap_s:
            return
        for child in self.children:
            if child.proc is None or child.proc.poll() is not None:
                continue
            if not child.signalled:
                child.signalled = True
                child.proc.send_signal(signal.SIGTERM)
            return  # this one stops first

    def run(self, max_seconds: float | None = None) -> int:
        """Until every child has exited after :meth:`stop` (or ``max_seconds``); the exit code:
        0, or the configuration error that stopped them."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        for child in self.children:
            self._start(child)
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline and not self._stopping:
                self.stop()
            running = 0
            for child in self.children:
                code = child.proc.poll() if child.proc is not None else None
                if code is None and child.proc is not None:
                    running += 1
                    continue
                if child.proc is not None:  # exited since the last look
                    self._exited(child, code, now)
                if child.restart_at is not None and now >= child.restart_at and not self._stopping:
                    self.restarts += 1
                    self._start(child)
                    running += 1
            if self._stopping:
                if running == 0:
                    return self._code
                self._stop_next()
            time.sleep(self.poll_s)

    def _exited(self, child: _Child, code: int, now: float) -> None:
        ran = now - child.started
        child.proc = None
        self._last_exit = now
        if self._stopping:
            if code not in (0, -signal.SIGTERM):
                log.warning(
                    "worker process exited while stopping index=%d code=%d", child.index, code
                )
            return
        if code == CONFIG_ERROR:
            log.error(
                "worker process refused its configuration index=%d code=%d; stopping all",
                child.index,
                code,
            )
            self._code = CONFIG_ERROR
            self.stop()
            return
        delay = child.policy.after_failure(ran) if code != 0 else 0.0
        child.restart_at = now + delay
        log.error(
            "worker process exited index=%d code=%d after %.1f s; restarting in %.1f s",
            child.index,
            code,
            ran,
            delay,
        )
