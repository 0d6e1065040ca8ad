"""A partition's snapshot as typed values: where it stands (:class:`SnapshotHeader`) and, with
it, the engine's state (:class:`Snapshot`). The bytes are wire/snapshot.py's: the header's fields
are the first fields of the snapshot's Avro record, by the same names (schemas/snapshot.avsc).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["SnapshotHeader", "Snapshot", "POSITIONS"]

# The positions in the topics a snapshot's state corresponds to, in the record's order.
POSITIONS = (
    "contexts_offset",
    "rewards_offset",
    "actions_offset",
    "joined_offset",
    "dead_letter_offset",
)


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """The partition, when, and where in every topic the state stands; and the snapshot's place
    in its chain (engine/chains.py): ``seq`` 0 is a base, ``chain`` 0 a base of no chain."""

    partition: int
    created_ms: int  # wall clock; informational
    contexts_offset: (
        int  # the next offset of the first input (contexts, or a learner's decisions) to process
    )
    rewards_offset: int  # the next offset of rewards to process
    actions_offset: int  # the position in actions after the last record this state includes
    joined_offset: int  # ... in joined
    dead_letter_offset: int  # ... in dead-letter
    chain: int = 0
    seq: int = 0

    @classmethod
    def of(cls, header: SnapshotHeader | Mapping[str, Any]) -> SnapshotHeader:
        """``header``, or the header of a snapshot given by name (as scripts and older callers
        build one): its fields, ``chain`` and ``seq`` 0 when absent; other names ignored."""
        if isinstance(header, SnapshotHeader):
            return header
        return cls(
            **{name: header[name] for name in _REQUIRED},
            chain=header.get("chain", 0),
            seq=header.get("seq", 0),
        )

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _FIELDS}


_FIELDS = tuple(f.name for f in dataclasses.fields(SnapshotHeader))
_REQUIRED = tuple(
    f.name for f in dataclasses.fields(SnapshotHeader) if f.default is dataclasses.MISSING
)


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class Snapshot(Mapping):
    """A partition's snapshot: its header and the engine's state (``PartitionEngine.snapshot``:
    models, pending, early, recent, watermark_ms, counters).

    Also read by name, ``snap["joined_offset"]`` or ``snap["engine"]``: the scripts and tests
    that build and read snapshots as dicts (bench/, tests/) go on working unchanged."""

    header: SnapshotHeader
    engine: dict[str, Any]

    @classmethod
    def of(cls, snap: Snapshot | Mapping[str, Any]) -> Snapshot:
        """``snap``, or a snapshot given by name: the header's fields and ``engine``."""
        if isinstance(snap, Snapshot):
            return snap
        return cls(SnapshotHeader.of(snap), snap["engine"])

    def __getitem__(self, name: str) -> Any:
        if name == "engine":
            return self.engine
        if name in _FIELDS:
            return getattr(self.header, name)
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter((*_FIELDS, "engine"))

    def __len__(self) -> int:
        return len(_FIELDS) + 1
