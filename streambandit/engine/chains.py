"""Snapshot chains: a base (every model) and the increments written after it (only the models
created or updated since the previous snapshot of the chain), and how they make one snapshot.

Why: a base of a partition with many models takes time and bytes in proportion to all of them,
however few changed; an increment follows the rate of change. Recovery lays the increments over
their base (:func:`compose`) and then reads the joined log from the last increment's positions,
exactly as from one full snapshot: an increment holds each changed model's whole state, the ids
joined since the previous snapshot, and every other part of the partition's state (positions,
open decisions, early rewards, watermark, counters) whole, so the composition is the state the
last increment was taken in.

Pure: no I/O. The stores keep the bytes (stream/snapshots.py), the worker decides when to write
which (:func:`plan_snapshot`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Mapping
from typing import Any

from streambandit.wire import Snapshot
from streambandit.wire.snapshot_header import POSITIONS

__all__ = ["ChainPosition", "compose", "plan_snapshot", "next_chain_id"]

log = logging.getLogger("streambandit")


@dataclasses.dataclass(frozen=True)
class ChainPosition:
    """Where a partition's snapshots stand: the chain its last snapshot belongs to, and that
    snapshot's number in it (0: the base)."""

    chain: int
    seq: int


def next_chain_id(now_ms: int, previous: int) -> int:
    """The id of a new base: the wall clock in ms, and always above the chain it replaces, so a
    partition's chain ids grow even when two bases fall in one millisecond or a new owner's clock
    is behind the previous owner's."""
    return max(now_ms, previous + 1)


def plan_snapshot(
    position: ChainPosition | None, changed: int, models: int, base_every: int
) -> str:
    """``"base"`` or ``"increment"``: the next snapshot of a partition whose last one is at
    ``position`` (None: no usable chain, e.g. a failed write) with ``changed`` of its ``models``
    changed since. A base when there is no chain to continue, when the chain has ``base_every``
    increments (recovery reads them all), or when half the models changed (an increment would be
    nearly a base, and a base ends the chain)."""
    if position is None or position.seq >= base_every or 2 * changed >= max(models, 1):
        return "base"
    return "increment"


class _Overlay(Mapping):
    """Model states from several snapshots: each key from the last one that holds it. Lazy, like
    the snapshots' own model mappings (wire/snapshot.py decodes a model when it is read)."""

    def __init__(self, layers: list[Mapping[str, Any]]) -> None:
        self.layers = layers  # what a restore reads, oldest first (policies/state_blocks.layers_of)
        self._where: dict[str, Mapping[str, Any]] | None = None

    def _index(self) -> dict[str, Mapping[str, Any]]:
        if self._where is None:
            self._where = {}
            for layer in self.layers:
                for key in layer:
                    self._where[key] = layer
        return self._where

    def __getitem__(self, key: str) -> Any:
        return self._index()[key][key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._index())

    def __len__(self) -> int:
        return len(self._index())


def compose(
    base: Snapshot | Mapping[str, Any], increments: list[Snapshot | Mapping[str, Any]]
) -> Snapshot:
    """The snapshot ``base`` and its ``increments`` make (unpacked snapshots, increments in any
    order; a mapping is taken as ``Snapshot.of`` takes it). Increments are used in sequence from
    1 while they continue the chain: the first one missing, of another chain or moving a position
    backwards ends it (reported), and the result is the state of the last one used. The result is
    a base (``seq`` 0 in a chain of its own) only when no increment is used."""
    base = Snapshot.of(base)
    b = base.header
    if b.seq != 0:
        raise ValueError(f"snapshot seq {b.seq} is an increment, not a base")
    by_seq = {
        inc.header.seq: inc for inc in map(Snapshot.of, increments) if inc.header.chain == b.chain
    }
    used: list[Snapshot] = []
    last = base
    while (inc := by_seq.get(len(used) + 1)) is not None:
        behind = [k for k in POSITIONS if getattr(inc.header, k) < getattr(last.header, k)]
        if inc.header.partition != b.partition or behind:
            log.error(
                "snapshot increment does not continue its chain partition=%d chain=%d seq=%d behind=%s; "
                "using the chain up to seq %d",
                b.partition,
                b.chain,
                inc.header.seq,
                behind,
                len(used),
            )
            break
        used.append(inc)
        last = inc
    if len(used) < len(by_seq):
        log.warning(
            "snapshot chain partition=%d chain=%d: increments %s not used (a gap before them)",
            b.partition,
            b.chain,
            sorted(set(by_seq) - set(range(1, len(used) + 1))),
        )
    if not used:
        return base
    engine = dict(last.engine)
    engine["models"] = _Overlay([base.engine["models"], *(inc.engine["models"] for inc in used)])
    # An increment's recent ids are those joined since the previous snapshot: in join order after
    # the base's (restore keeps the newest max_recent of them, as the live engine did).
    engine["recent"] = [r for snap in (base, *used) for r in snap.engine["recent"]]
    return Snapshot(last.header, engine)
