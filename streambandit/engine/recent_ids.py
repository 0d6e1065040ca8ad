"""The recently joined event ids of a partition in arrays, for compiled code.

engine/partition.py remembers the last ``max_recent`` joined ids, each with whether its reward
was observed, in an OrderedDict: a reward for one of them is a duplicate (observed) or late (the
default was joined), not unknown; a context with one of them was decided before. Here they are
the entries of an :class:`~streambandit.engine.id_table.IdTable`, oldest first, with the flag in
a column; the oldest leaves when a join would hold more than the bound. :meth:`RecentIds.items`
and :meth:`RecentIds.add_items` are the snapshot's ``recent`` list.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.engine.id_table import (
    COUNT,
    NEWEST,
    OLDEST,
    IdTable,
    fnv1a,
    table_add,
    table_find,
    table_remove,
)
from streambandit.numerics.jit import CACHE

__all__ = ["RecentIds"]


class RecentIds:
    """At most ``bound`` ids, each with its observed flag, oldest first."""

    __slots__ = ("ids", "observed", "bound")

    def __init__(self, bound: int, capacity: int = 16) -> None:
        self.bound = bound
        self.ids = IdTable(entries=min(max(1, bound), capacity) + 1, arena_bytes=16 * capacity)
        self.observed = np.zeros(self.ids.capacity, dtype=np.bool_)

    def __len__(self) -> int:
        return len(self.ids)

    def reserve(self, ids: int, id_bytes: int) -> None:
        """Room for ``ids`` more joins of ``id_bytes`` bytes in all, without growing (one more
        entry than the bound: a join adds before the oldest leaves)."""
        self.ids.reserve(min(ids, self.bound + 1), id_bytes)
        if self.ids.capacity > len(self.observed):
            grow = self.ids.capacity - len(self.observed)
            self.observed = np.concatenate([self.observed, np.zeros(grow, np.bool_)])

    def __contains__(self, event_id: str) -> bool:
        return self.ids.find(event_id.encode()) >= 0

    def __getitem__(self, event_id: str) -> bool:
        observed = self.get(event_id)
        if observed is None:
            raise KeyError(event_id)
        return observed

    def get(self, event_id: str) -> bool | None:
        """Whether ``event_id``'s reward was observed; None when it is not remembered."""
        e = self.ids.find(event_id.encode())
        return None if e < 0 else bool(self.observed[e])

    def remember(self, event_id: str, observed: bool) -> None:
        """Remember a join (an id remembered already keeps its place and takes the new flag, as an
        OrderedDict's assignment does), then let the oldest go past the bound."""
        key = event_id.encode()
        self.reserve(1, len(key))
        e = self.ids.add(key)
        self.observed[e] = observed
        while len(self.ids) > self.bound:
            self.ids.remove(self.ids.oldest())

    def items(self) -> list[tuple[str, bool]]:
        """Every id remembered with its flag, oldest first."""
        order = self.ids.order()
        return list(zip(self.ids.keys_of(order), self.observed[order].tolist()))

    def tail(self, n: int) -> list[tuple[str, bool]]:
        """The ``n`` newest, oldest of them first (what an increment snapshot carries)."""
        out, e = [], int(self.ids.meta[NEWEST])
        while e >= 0 and len(out) < n:  # back from the newest: an increment costs its tail only
            out.append((self.ids.key(e).decode(), bool(self.observed[e])))
            e = int(self.ids.older[e])
        out.reverse()
        return out

    def add_items(self, items: list[tuple[str, bool]]) -> None:
        """Remember a snapshot's ``recent`` list, in its order: :meth:`remember` of each, in one
        compiled loop (a restore remembers up to ``max_recent`` ids: bench.kafka's handoff)."""
        if not items:
            return
        keys = [event_id.encode() for event_id, _ in items]
        n = len(keys)
        lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
        starts = np.zeros(n, dtype=np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        flags = np.fromiter((bool(v) for _, v in items), dtype=np.bool_, count=n)
        self.reserve(n, int(lens.sum()))
        t = self.ids
        _remember_all(
            np.frombuffer(b"".join(keys) or b"\0", dtype=np.uint8), starts, lens, flags,
            t.slots, t.entry_start, t.entry_len, t.entry_hash, t.next_free, t.older, t.newer,
            t.arena, t.meta, self.observed, self.bound,
        )  # fmt: skip


@njit(cache=CACHE)
def _remember_all(buf, starts, lens, flags, slots, entry_start, entry_len, entry_hash, next_free,
                  older, newer, arena, meta, observed, bound):  # fmt: skip
    """:meth:`RecentIds.remember` of each key ``buf[starts[q]:starts[q] + lens[q]]`` in turn."""
    for q in range(starts.shape[0]):
        s, m = starts[q], lens[q]
        h = fnv1a(buf, s, m)
        e = table_find(slots, entry_start, entry_len, entry_hash, arena, buf, s, m, h)
        if e < 0:
            e = table_add(slots, entry_start, entry_len, entry_hash, next_free, older, newer,
                          arena, meta, buf, s, m, h)  # fmt: skip
        observed[e] = flags[q]
        while meta[COUNT] > bound:
            table_remove(slots, entry_len, entry_hash, next_free, older, newer, meta, meta[OLDEST])
