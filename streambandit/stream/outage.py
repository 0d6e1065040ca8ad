"""A broker the worker cannot reach, as a state of the worker rather than a call that hangs: pure,
fed by the loop, read by the telemetry thread.

The loop waits on the broker only in bounded steps (stream/transaction.py retries a commit, an
abort or a new producer's start a few seconds at a time). Each step that fails because the broker
does not answer (a retriable error: a timeout, no coordinator, a lost connection) is reported to
:meth:`BrokerOutage.waiting`; the first success after it to :meth:`BrokerOutage.over`. Between
the two the worker is alive (``/healthz`` 200: a restart cannot bring a broker back) and not ready
(``/ready`` 503 with :meth:`BrokerOutage.reason`), exports how long it has waited, and logs one
line now and then saying what it waits for and since when.
"""

from __future__ import annotations

import time
from typing import Callable

__all__ = ["BrokerOutage", "broker_unavailable"]


def broker_unavailable(err: object) -> bool:
    """Whether a librdkafka error says the broker did not answer (worth waiting for), as opposed
    to one that ends or aborts the transaction: retriable, neither fatal nor abortable."""
    retriable = getattr(err, "retriable", None)
    if retriable is None:
        return False
    return bool(retriable()) and not err.fatal() and not err.txn_requires_abort()  # type: ignore[attr-defined]


class BrokerOutage:
    """Since when the loop has waited for the broker, for what, and the last error it saw.

    ``log_every_s``: how often :meth:`waiting` returns a line to log while the outage lasts (the
    first wait always returns one)."""

    def __init__(self, log_every_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.log_every_s = log_every_s
        self._clock = clock
        self.since: float | None = None  # monotonic time of the first failed wait; None: no outage
        self.since_wall: float | None = None  # the same, as wall time, for the log line
        self.what = ""
        self.error = ""
        self._logged_at = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def seconds(self) -> float:
        """How long the loop has waited for the broker (0 when it is not waiting)."""
        return 0.0 if self.since is None else self._clock() - self.since

    def waiting(self, what: str, error: object) -> str | None:
        """A bounded wait for ``what`` failed with ``error``: the line to log, or None when one
        was logged less than ``log_every_s`` ago."""
        now = self._clock()
        self.what, self.error = what, str(error)
        if self.since is None:
            self.since, self.since_wall = now, time.time()
        elif now - self._logged_at < self.log_every_s:
            return None
        self._logged_at = now
        started = time.strftime("%H:%M:%S", time.gmtime(self.since_wall or 0))
        return (
            f"broker unavailable: waiting for {what} since {started} UTC ({now - self.since:.0f} s) "
            f"error={self.error}"
        )

    def over(self) -> str | None:
        """The broker answered: the line to log if the loop had been waiting, else None."""
        if self.since is None:
            return None
        line = f"broker available again after {self.seconds():.1f} s (waited for {self.what})"
        self.since = self.since_wall = None
        self.what = self.error = ""
        self._logged_at = 0.0
        return line

    def reason(self) -> str:
        """``/ready``'s body during an outage."""
        return f"broker unavailable for {self.seconds():.0f} s: waiting for {self.what}"
