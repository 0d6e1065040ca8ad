"""The root of the errors streambandit raises on purpose.

Each module defines its own short subclass next to the code that raises it, also deriving from
the built-in it behaves like (``ValueError`` for bad input, ``RuntimeError`` for a state the
process cannot continue from), so ``except StreambanditError`` catches all of ours and nothing
else. Errors from librdkafka are wrapped at the boundary (``raise WorkerError(...) from exc``).
"""

__all__ = ["StreambanditError"]


class StreambanditError(Exception):
    """Something streambandit refused or could not do, with a message saying what and why."""
