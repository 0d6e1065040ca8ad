"""Snapshots packed and stored off the worker's loop.

The loop takes a partition's state as plain data (``PartitionEngine.snapshot``: copies of the
models' arrays, the other parts as values nothing changes later) and hands it over; this thread
packs it (Avro, zlib) and saves it to the store, while the loop goes on deciding. zlib and the
stores' file and network writes release the GIL, so the two overlap on two cores.

A snapshot of many models is not copied on the loop at all (``submit_forked``): the loop forks,
and the child, holding the parent's memory as it was at the fork (copy-on-write), takes the
snapshot, packs it, writes it to the store and exits; this thread waits for it and reports. The
loop pays for the fork (page tables, in proportion to the process's memory) instead of a copy in
proportion to the models (bench.snapshots measures both). Redis's BGSAVE does the same. A store
that is not ``fork_safe`` (the snapshot topic: a child must not use the parent's Kafka producer)
gets the child's packed bytes through the pipe, and this thread stores them.

At most one snapshot per partition is in flight (``busy``): the loop skips a due snapshot while
the previous one is still being written (its changed models stay in the next one), so memory
holds at most one hand-over per partition. A revocation or a stop waits only for what is in
flight (``wait``). A failed write is reported once (``take_failures``): the worker then starts a
new chain with a base, since the failed snapshot's changes are in no stored one.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import gc
import logging
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Iterator

import numpy as np

from streambandit.stream.authorization import refusal_code
from streambandit.stream.snapshots import SnapshotStore
from streambandit.wire import Snapshot, SnapshotHeader, pack_snapshot

__all__ = ["SnapshotWriter", "LockedReads", "CAN_FORK"]

# Linux only: the child must die with its parent (prctl PR_SET_PDEATHSIG), or a worker killed
# while a child writes would leave it to overwrite the snapshots of the partition's next owner.
CAN_FORK = sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
# Looked up here, not in the child: loading a library takes the loader's lock, which another
# thread may hold at the fork.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if CAN_FORK else None

# Far above a base of a million models (bench.snapshots: seconds per 100,000), far below forever.
CHILD_LIMIT_S = 600.0

log = logging.getLogger("streambandit")


class LockedReads:
    """The reading half of a store, under the writer's lock: a store's clients (the snapshot
    topic's consumer) are not shared between two threads at once."""

    def __init__(self, store: SnapshotStore, lock: threading.Lock) -> None:
        self._store, self._lock = store, lock

    def candidates(self, partition: int) -> Iterator[bytes]:
        it = iter(self._store.candidates(partition))
        while True:  # the lock for each read, not while the caller unpacks what it read
            with self._lock:
                data = next(it, None)
            if data is None:
                return
            yield data

    def increments(self, partition: int, chain: int) -> list[bytes]:
        with self._lock:
            return self._store.increments(partition, chain)


class SnapshotWriter:
    def __init__(self, store: SnapshotStore, metrics: collections.Counter) -> None:
        self.store = store
        self.metrics = metrics  # this thread owns the snapshot_* write counters
        # Present from the start: the thread then only changes values, never the dict's size,
        # so the loop may iterate the metrics (a report, the exit line) while it runs.
        for key in (
            "snapshots",
            "snapshot_bases",
            "snapshot_increments",
            "snapshot_failures",
            "snapshot_bytes",
            "snapshot_write_us",
        ):
            metrics.setdefault(key, 0)
        metrics.setdefault("snapshot_forks", 0)
        self.lock = threading.Lock()
        self.reads = LockedReads(store, self.lock)
        # (partition, header, the snapshot to pack or None, the forked child writing it or None,
        # when it was handed over)
        self._queue: queue.Queue[
            tuple[int, SnapshotHeader, Snapshot | None, tuple[int, int, bool] | None, float] | None
        ] = queue.Queue()
        self._in_flight: collections.Counter[int] = collections.Counter()
        self._done = threading.Condition()
        self._failures: dict[int, str] = {}
        self.refused: BaseException | None = None  # a store that refused this principal
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self._thread.start()

    def submit(self, partition: int, snap: Snapshot | Mapping[str, Any]) -> None:
        """Pack and store ``snap`` (a base when its header's ``seq`` is 0, else an increment; a
        mapping taken as ``Snapshot.of`` takes it)."""
        snap = Snapshot.of(snap)
        with self._done:
            self._in_flight[partition] += 1
        self._queue.put((partition, snap.header, snap, None, time.monotonic()))

    def submit_forked(
        self,
        partition: int,
        head: SnapshotHeader | Mapping[str, Any],
        engine: Any,
        models: list[str] | None,
    ) -> None:
        """Store ``head`` with ``engine.snapshot(models)`` (``models`` None: a base) as they are
        now, taken and packed by a forked child, which also stores it into a ``fork_safe``
        store; into another, it sends the bytes back and this thread stores them.

        Waits first for what is in flight for ``partition``: the child writes to the store at
        once, and must not overtake an earlier snapshot of the same partition."""
        if not CAN_FORK:
            raise ValueError("snapshots are forked on Linux only")
        head = SnapshotHeader.of(head)
        self.wait(partition)
        direct = getattr(self.store, "fork_safe", False)
        read_end, write_end = os.pipe()
        if not direct:
            try:  # fewer, larger reads of the bytes the child sends (Linux caps it, 1 MiB by default)
                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 1 << 20)
            except OSError:
                pass
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child_writes(
                write_end, parent, self.store if direct else None, partition, head, engine, models
            )
        os.close(write_end)
        self.metrics["snapshot_forks"] += 1
        with self._done:
            self._in_flight[partition] += 1
        self._queue.put((partition, head, None, (pid, read_end, not direct), time.monotonic()))

    def busy(self, partition: int) -> bool:
        with self._done:
            return self._in_flight[partition] > 0

    def wait(self, partition: int | None = None, timeout_s: float | None = None) -> bool:
        """Until nothing of ``partition`` (None: of any) is in flight; False on timeout."""

        def idle() -> bool:
            return not +self._in_flight if partition is None else self._in_flight[partition] == 0

        with self._done:
            return self._done.wait_for(idle, timeout_s)

    def take_failures(self) -> dict[int, str]:
        """Partitions whose snapshot was not stored since the last call, with the error."""
        with self._done:
            failed, self._failures = self._failures, {}
        return failed

    def close(self, timeout_s: float = 60.0) -> None:
        """Write what was handed over, then stop the thread."""
        if not self.wait(timeout_s=timeout_s):
            log.error("snapshot writer: snapshots still unwritten after %.0f s at stop", timeout_s)
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _store(self, partition: int, head: SnapshotHeader, data: bytes | memoryview) -> None:
        with self.lock:
            _save(self.store, partition, head, data)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            partition, head, snap, child, handed_over = item
            started = time.monotonic()
            kind = "increment" if head.seq else "base"
            try:
                if child is None:
                    data = pack_snapshot(snap)
                    self._store(partition, head, data)
                    size, models, pending = (
                        len(data),
                        len(snap.engine["models"]),
                        len(snap.engine["pending"]),
                    )
                else:
                    pid, read_end, sent = child
                    size, models, pending, data = _wait_for_child(pid, read_end, with_data=sent)
                    if sent:
                        self._store(partition, head, data)
                del data
            except Exception as exc:  # noqa: BLE001 (reported to the loop, which starts a new chain)
                log.error(
                    "snapshot not stored partition=%d chain=%d seq=%d error=%s",
                    partition,
                    head.chain,
                    head.seq,
                    exc,
                )
                with self._done:
                    self._failures[partition] = str(exc)
                    if refusal_code(exc) is not None:  # a missing ACL: the worker stops on it
                        self.refused = exc
                self.metrics["snapshot_failures"] += 1
            else:
                self.metrics["snapshots"] += 1
                self.metrics["snapshot_increments" if head.seq else "snapshot_bases"] += 1
                self.metrics["snapshot_bytes"] = size
                self.metrics["snapshot_write_us"] = int((time.monotonic() - started) * 1e6)
                # age_ms: from the state taken to the snapshot stored. A process that was stopped
                # (a zombie) logs its earlier snapshots late, and this tells them apart.
                log.info(
                    "snapshot partition=%d %s chain=%d seq=%d bytes=%d models=%d pending=%d "
                    "age_ms=%d%s",
                    partition,
                    kind,
                    head.chain,
                    head.seq,
                    size,
                    models,
                    pending,
                    (time.monotonic() - handed_over) * 1000,
                    "" if child is None else " forked",
                )
            finally:
                del snap, item
                with self._done:
                    self._in_flight[partition] -= 1
                    self._done.notify_all()


class ChildFailed(RuntimeError):
    """A forked snapshot child exited without storing its snapshot."""


def _wait_for_child(
    pid: int, read_end: int, limit_s: float | None = None, with_data: bool = False
) -> tuple[int, int, int, memoryview | None]:
    """The child's report (bytes, models, pending) once it exited, and with ``with_data`` the
    snapshot's bytes it sent after its report line; or ChildFailed with its error. A child still
    running after ``limit_s`` is killed and failed: a child stuck on a lock some thread held at the
    fork must not keep its partition busy, and the worker's stop, for good."""
    limit_s = CHILD_LIMIT_S if limit_s is None else limit_s
    deadline = time.monotonic() + limit_s
    report = bytearray()
    data: memoryview | None = None
    got = 0
    poller = select.poll()
    poller.register(read_end, select.POLLIN | select.POLLHUP)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise ChildFailed(f"snapshot child killed: not done within {limit_s:.0f} s")
            if data is not None and got < len(data):
                # Straight into the snapshot's buffer: the read releases the GIL, and no join
                # copies hundreds of MB while holding it.
                if not (n := os.readv(read_end, [data[got:]])):
                    break
                got += n
                continue
            if not (chunk := os.read(read_end, 65536)):
                break
            report += chunk
            if with_data and data is None and report.startswith(b"ok ") and b"\n" in report:
                line, rest = bytes(report).split(b"\n", 1)
                # np.empty: a bytearray would zero hundreds of MB first, holding the GIL.
                data = memoryview(np.empty(int(line.split()[1]), np.uint8))
                data[: len(rest)] = rest
                got, report = len(rest), bytearray(line)
    finally:
        os.close(read_end)
    _, status = os.waitpid(pid, 0)
    text = report.decode("utf-8", "replace").strip()
    if os.waitstatus_to_exitcode(status) != 0 or not text.startswith("ok "):
        raise ChildFailed(
            f"snapshot child exited with {os.waitstatus_to_exitcode(status)}: {text or 'no report'}"
        )
    size, models, pending = map(int, text.split()[1:4])
    if with_data and (data is None or got != size):
        raise ChildFailed(f"snapshot child sent {got} of its {size} bytes")
    return size, models, pending, data


def _save(
    store: SnapshotStore, partition: int, head: SnapshotHeader, data: bytes | memoryview
) -> None:
    """Into the store as a base or as an increment of its chain, as ``head`` says."""
    if head.seq == 0:
        store.save(partition, data)
    else:
        store.save_increment(partition, head.chain, head.seq, data)


def _child_writes(
    write_end: int,
    parent: int,
    store: SnapshotStore | None,
    partition: int,
    head: SnapshotHeader,
    engine: Any,
    models: list[str] | None,
) -> None:
    """In the forked child: snapshot, pack, store (``store`` None: send the bytes after the
    report line instead), report on ``write_end``, exit. Nothing here may return into the
    worker's code (os._exit in every case), take a lock another thread held at the fork (no
    logging, no store lock: the parent waits for this partition's writes before forking and
    reads it only after this child exited), or touch the Kafka clients."""
    code = 1
    try:
        # Stop and interrupt are the parent's to handle: it waits for this child. If the parent
        # dies, so does the child, at once (also if it died before this line: the parent id).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
        gc.disable()  # garbage is freed at exit; a collection would only copy pages
        snap = Snapshot(head, engine.snapshot(models))
        data = pack_snapshot(snap)
        report = (
            f"ok {len(data)} {len(snap.engine['models'])} {len(snap.engine['pending'])}\n".encode()
        )
        if store is None:
            _write_all(write_end, report)
            _write_all(write_end, data)
        else:
            _save(store, partition, head, data)
            _write_all(write_end, report)
        code = 0
    except BaseException as exc:  # noqa: BLE001 (reported to the parent through the pipe)
        try:
            os.write(write_end, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:4000])
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
