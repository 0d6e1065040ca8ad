"""The report's figures drawn by a child process forked when a command starts.

Importing matplotlib and drawing a figure costs a replay command about 0.6 s of one core
(``python -m bench.replay``: the command's fixed cost), while the replay itself runs on one core
only. A child forked before the replay imports matplotlib on the other core while the parent
replays, then draws what the parent sends it when the results are known: the figures' cost is
hidden behind the replay instead of added to it.

The child never touches the parent's state: it imports matplotlib, waits for one message (the
figure calls, pickled), runs them and answers with their results, then ends with ``os._exit`` (no
buffered output of the parent is flushed twice, no ``atexit`` handler runs). A parent that ends
without sending (an error, a KeyboardInterrupt) closes the pipe, and the child ends on that.
Where ``os.fork`` does not exist, or fails, the figures are drawn in process as before.
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable
from typing import Any

Call = tuple[Callable[..., bool], tuple, dict[str, Any]]


class FigureProcess:
    """A forked child that draws figures on request; :meth:`draw` runs calls in it (or in
    process, when the child could not be made), :meth:`close` ends it."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._to_child = self._from_child = -1
        self._calls: list[Call] = []  # handed over by send(), answered by results()
        if not hasattr(os, "fork"):
            return
        down_r, down_w = os.pipe()
        up_r, up_w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            for fd in (down_r, down_w, up_r, up_w):
                os.close(fd)
            return
        if pid == 0:  # the child
            os.close(down_w)
            os.close(up_r)
            _serve(down_r, up_w)  # never returns
        os.close(down_r)
        os.close(up_w)
        self._pid, self._to_child, self._from_child = pid, down_w, up_r

    def draw(self, calls: list[Call]) -> list[bool]:
        """Each call's result (True: its figure was written), in order. In the child if there is
        one; in process if not, or if the child failed."""
        self.send(calls)
        return self.results()

    def send(self, calls: list[Call]) -> None:
        """Hand ``calls`` to the child, which starts on them while the caller goes on (writing
        the report's other files); :meth:`results` waits for them."""
        self._calls = calls
        if self._pid is not None:
            try:
                _write_all(self._to_child, pickle.dumps(calls, protocol=pickle.HIGHEST_PROTOCOL))
                os.close(self._to_child)
                self._to_child = -1
            except (OSError, pickle.PickleError):
                self.close()

    def results(self) -> list[bool]:
        """The results of the calls :meth:`send` handed over, from the child; the calls run in
        process when there is no child or it failed."""
        calls, self._calls = self._calls, []
        if self._pid is not None:
            try:
                answer = _read_all(self._from_child)
                if answer:
                    return pickle.loads(answer)
            except (OSError, pickle.PickleError):
                pass
            finally:
                self.close()
        return [fn(*args, **kwargs) for fn, args, kwargs in calls]

    def close(self) -> None:
        """End the child (it ends on the closed pipe) and reap it; idempotent."""
        for fd in (self._to_child, self._from_child):
            if fd >= 0:
                os.close(fd)
        self._to_child = self._from_child = -1
        if self._pid is not None:
            os.waitpid(self._pid, 0)
            self._pid = None

    def __enter__(self) -> "FigureProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(down: int, up: int) -> None:
    status = 1
    try:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401  (imported now, while the parent replays)
        except ImportError:
            pass  # the figure functions return False themselves
        message = _read_all(down)
        if message:
            calls: list[Call] = pickle.loads(message)
            _write_all(up, pickle.dumps([fn(*args, **kwargs) for fn, args, kwargs in calls]))
        status = 0
    except BaseException:  # noqa: BLE001  (the parent draws in process when no answer comes)
        status = 1
    finally:
        os._exit(status)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
