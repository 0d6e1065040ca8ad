"""Where partition snapshots are kept: a directory (the embedded demo) or a compacted topic.

Both keep the latest two snapshots per partition, so that a corrupt latest one falls back to the
previous (and, when both are unusable, recovery replays the joined log from the start: never a
silently fresh model).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Protocol

from streambandit.events import SnapshotError, unpack_snapshot

__all__ = ["SnapshotStore", "DirectoryStore", "load_latest"]

log = logging.getLogger("streambandit")


class SnapshotStore(Protocol):
    def save(self, partition: int, data: bytes) -> None: ...
    def candidates(self, partition: int) -> list[bytes]:
        """Stored snapshots of a partition, newest first."""
        ...


class DirectoryStore:
    """``DIR/p<partition>.snap`` (latest) and ``.prev``; writes are atomic (write, fsync, rename)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def _file(self, partition: int, suffix: str) -> Path:
        return self.path / f"p{partition}.{suffix}"

    def save(self, partition: int, data: bytes) -> None:
        latest, prev, tmp = (self._file(partition, s) for s in ("snap", "prev", "tmp"))
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if latest.exists():
            os.replace(latest, prev)
        os.replace(tmp, latest)

    def candidates(self, partition: int) -> list[bytes]:
        out = []
        for suffix in ("snap", "prev"):
            f = self._file(partition, suffix)
            if f.exists():
                out.append(f.read_bytes())
        return out


def load_latest(store: SnapshotStore, partition: int) -> dict | None:
    """The newest snapshot of ``partition`` that passes its checksum, or None. A damaged one is
    reported (logged) and skipped."""
    for i, data in enumerate(store.candidates(partition)):
        try:
            snap = unpack_snapshot(data)
        except SnapshotError as exc:
            log.error("snapshot unusable partition=%d candidate=%d error=%s; trying an older one", partition, i, exc)
            continue
        if snap["partition"] != partition:
            log.error("snapshot for partition=%d is labelled partition=%d; skipped", partition, snap["partition"])
            continue
        return snap
    return None
