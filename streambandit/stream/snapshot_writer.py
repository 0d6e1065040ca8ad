"""Snapshots packed and stored off the worker's loop.

The loop takes a partition's state as plain data (``PartitionEngine.snapshot``: copies of the
models' arrays, the other parts as values nothing changes later) and hands it over; this thread
packs it (Avro, zlib) and saves it to the store, while the loop goes on deciding. zlib and the
stores' file and network writes release the GIL, so the two overlap on two cores.

At most one snapshot per partition is in flight (``busy``): the loop skips a due snapshot while
the previous one is still being written (its changed models stay in the next one), so memory
holds at most one hand-over per partition. A revocation or a stop waits only for what is in
flight (``wait``). A failed write is reported once (``take_failures``): the worker then starts a
new chain with a base, since the failed snapshot's changes are in no stored one.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import Any

from streambandit.stream.snapshots import SnapshotStore
from streambandit.wire import pack_snapshot

__all__ = ["SnapshotWriter", "LockedReads"]

log = logging.getLogger("streambandit")


class LockedReads:
    """The reading half of a store, under the writer's lock: a store's clients (the snapshot
    topic's consumer) are not shared between two threads at once."""

    def __init__(self, store: SnapshotStore, lock: threading.Lock) -> None:
        self._store, self._lock = store, lock

    def candidates(self, partition: int) -> list[bytes]:
        with self._lock:
            return self._store.candidates(partition)

    def increments(self, partition: int, chain: int) -> list[bytes]:
        with self._lock:
            return self._store.increments(partition, chain)


class SnapshotWriter:
    def __init__(self, store: SnapshotStore, metrics: collections.Counter) -> None:
        self.store = store
        self.metrics = metrics  # this thread owns the snapshot_* write counters
        # Present from the start: the thread then only changes values, never the dict's size,
        # so the loop may iterate the metrics (a report, the exit line) while it runs.
        for key in ("snapshots", "snapshot_bases", "snapshot_increments", "snapshot_failures", "snapshot_bytes",
                    "snapshot_write_ms"):
            metrics.setdefault(key, 0)
        self.lock = threading.Lock()
        self.reads = LockedReads(store, self.lock)
        self._queue: queue.Queue[tuple[int, dict] | None] = queue.Queue()
        self._in_flight: collections.Counter[int] = collections.Counter()
        self._done = threading.Condition()
        self._failures: dict[int, str] = {}
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self._thread.start()

    def submit(self, partition: int, snap: dict[str, Any]) -> None:
        """Pack and store ``snap`` (a base when ``snap["seq"]`` is 0, else an increment)."""
        with self._done:
            self._in_flight[partition] += 1
        self._queue.put((partition, snap))

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

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            partition, snap = item
            started = time.monotonic()
            try:
                data = pack_snapshot(snap)
                with self.lock:
                    if snap["seq"] == 0:
                        self.store.save(partition, data)
                    else:
                        self.store.save_increment(partition, snap["chain"], snap["seq"], data)
            except Exception as exc:  # noqa: BLE001 (reported to the loop, which starts a new chain)
                log.error("snapshot not stored partition=%d chain=%d seq=%d error=%s", partition, snap["chain"],
                          snap["seq"], exc)
                with self._done:
                    self._failures[partition] = str(exc)
                self.metrics["snapshot_failures"] += 1
            else:
                self.metrics["snapshots"] += 1
                self.metrics["snapshot_increments" if snap["seq"] else "snapshot_bases"] += 1
                self.metrics["snapshot_bytes"] = len(data)
                self.metrics["snapshot_write_ms"] = int((time.monotonic() - started) * 1000)
                log.info("snapshot partition=%d %s chain=%d seq=%d bytes=%d models=%d pending=%d", partition,
                         "increment" if snap["seq"] else "base", snap["chain"], snap["seq"], len(data),
                         len(snap["engine"]["models"]), len(snap["engine"]["pending"]))
            finally:
                del snap, item
                with self._done:
                    self._in_flight[partition] -= 1
                    self._done.notify_all()
