"""Files written whole or not at all (write, fsync, rename), also across a crash."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["write_atomically"]


def write_atomically(tmp: Path, path: Path, data: bytes, keep: Path | None = None) -> None:
    """``path`` holds ``data`` whole or not at all, also after a crash; its previous content
    moves to ``keep`` when given. ``tmp`` must be on the same file system as ``path``."""
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if keep is not None and path.exists():
        os.replace(path, keep)
    os.replace(tmp, path)
