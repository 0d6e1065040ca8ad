"""The error a worker stops with."""

from streambandit.errors import StreambanditError

__all__ = ["WorkerError", "NotAuthorized", "NOT_AUTHORIZED_EXIT"]


class WorkerError(StreambanditError, RuntimeError):
    """The worker cannot continue (configuration that does not fit the cluster, a log that fits
    no model configuration, a fatal producer error). Raised from ``Worker.run``; a supervisor
    restarts the process, which then recovers."""


#: The exit code of a process stopped by a refused ACL or refused credentials.
NOT_AUTHORIZED_EXIT = 3


class NotAuthorized(WorkerError):
    """The broker refused this principal an operation it needs (a missing ACL) or refused its
    credentials: one line saying which (stream/authorization.py), exit code 3. Retrying at once
    would only be refused again; a supervisor restarts the process after its back-off."""
