"""The error a worker stops with."""

from streambandit.errors import StreambanditError

__all__ = ["WorkerError"]


class WorkerError(StreambanditError, RuntimeError):
    """The worker cannot continue (configuration that does not fit the cluster, a log that fits
    no model configuration, a fatal producer error). Raised from ``Worker.run``; a supervisor
    restarts the process, which then recovers."""
