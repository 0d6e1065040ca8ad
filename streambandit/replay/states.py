"""Model states on disk, for a replay target to start from (a frozen target is usually one).

Two sources, told apart by their first bytes:

- a **model state file**, written by :func:`write_model_states` (``streambandit replay
  --save-state``): an Avro object container file whose records are the snapshot's
  ``ModelState`` records (model key, arrays, scalars), so any Avro reader can list what it holds;
- a **worker snapshot**: the bytes of one partition's base snapshot as a
  :class:`~streambandit.stream.snapshots.DirectoryStore` keeps them (``p<N>.snap``). Its models
  are the worker's models at that moment. An increment is refused: it holds only the models
  changed since its base.

Both hold numbers and strings only (no pickle), and a state is checked against its target's
configuration when it is loaded (``Policy.load_state_dict``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro

from streambandit.wire.snapshot import (
    MODEL_STATE_SCHEMA,
    SnapshotError,
    state_from_avro,
    state_to_avro,
    unpack_snapshot,
)

__all__ = ["write_model_states", "read_model_states"]

_AVRO_MAGIC = b"Obj\x01"


def write_model_states(
    path: str | os.PathLike, models: Mapping[str, dict[str, Any]], *, codec: str = "deflate"
) -> int:
    """Write ``model key -> state dict`` (e.g. ``ReplayResult.models``); returns how many."""

    def records() -> Iterator[dict[str, Any]]:
        for key in sorted(models):
            yield state_to_avro(key, models[key])

    with open(path, "wb") as f:
        fastavro.writer(f, MODEL_STATE_SCHEMA, records(), codec=codec)
    return len(models)


def read_model_states(path: str | os.PathLike) -> Mapping[str, dict[str, Any]]:
    """``model key -> state dict`` from a model state file or a worker's base snapshot. A file
    that is neither, or a snapshot increment, is a ValueError naming the file."""
    with open(path, "rb") as f:
        head = f.read(len(_AVRO_MAGIC))
        f.seek(0)
        if head == _AVRO_MAGIC:
            try:
                return {
                    r["model_key"]: state_from_avro(r["arrays"], r["scalars"])
                    for r in fastavro.reader(f)
                }
            except Exception as exc:  # fastavro raises many kinds on a corrupt or foreign file
                raise ValueError(f"{path}: not a file of model states ({exc!r})") from None
        data = f.read()
    try:
        snap = unpack_snapshot(data)
    except SnapshotError as exc:
        raise ValueError(
            f"{path}: neither a file of model states nor a worker snapshot ({exc})"
        ) from None
    if snap.header.seq != 0:
        raise ValueError(
            f"{path}: a snapshot increment (it holds only the models changed since its base); "
            "give the base snapshot"
        )
    return snap.engine["models"]
