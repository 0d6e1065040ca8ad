"""Event ids as the keys of a hash table held in arrays, for compiled code.

The engine looks an event id up once or twice per event: in the open decisions, in the recently
joined ids. A dict does that for Python strings; a compiled pass over a batch has the ids as bytes
(the decoder's id buffer, wire/batch_decode.py) and no Python object per id. This table keeps each
key's bytes in an arena of its own and finds them by open addressing with linear probing:

- A key is an *entry*, a small integer that stays the key's while it is in the table: the arrays
  of what is stored under the keys (an open decision's fields, say) are indexed by it.
- Removal moves the rest of the probe chain back into the hole (no tombstones), so a lookup does
  not slow down with the removals of a long-running worker.
- The entries keep the order they were added in (a list linked through two arrays): the open
  decisions are decided in an order that their eviction and their snapshot follow, and the
  recently joined ids leave oldest first.
- Nothing grows inside compiled code: before a pass the caller reserves room for the keys and the
  bytes it may add (:meth:`IdTable.reserve`), which grows the arrays, or compacts the arena, in
  Python, between passes.

The slot array is at most half full, so an unsuccessful lookup probes about 2.5 slots on average
(Knuth's analysis of linear probing at load 1/2). The hash is 64-bit FNV-1a of the key's bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

__all__ = ["IdTable", "fnv1a", "table_find", "table_add", "table_remove"]

# meta's fields: the keys held, the arena's bytes used and of those the removed keys', the first
# free entry, the oldest and the newest entry held (-1: none).
COUNT, ARENA_USED, GARBAGE, FREE_HEAD, OLDEST, NEWEST = 0, 1, 2, 3, 4, 5

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)


@njit(cache=CACHE, inline="always")
def fnv1a(buf: np.ndarray, start: int, length: int) -> np.uint64:
    """64-bit FNV-1a of ``buf[start:start + length]`` (uint8)."""
    h = _FNV_OFFSET
    for i in range(start, start + length):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@njit(cache=CACHE, inline="always")
def _same(arena: np.ndarray, at: int, buf: np.ndarray, start: int, length: int) -> bool:
    for i in range(length):
        if arena[at + i] != buf[start + i]:
            return False
    return True


@njit(cache=CACHE, inline="always")
def table_find(
    slots: np.ndarray,
    entry_start: np.ndarray,
    entry_len: np.ndarray,
    entry_hash: np.ndarray,
    arena: np.ndarray,
    buf: np.ndarray,
    start: int,
    length: int,
    h: np.uint64,
) -> int:
    """The entry of the key ``buf[start:start + length]`` (hash ``h``), or -1."""
    mask = len(slots) - 1
    i = np.int64(h & np.uint64(mask))
    while True:
        e = slots[i]
        if e < 0:
            return -1
        if (
            entry_hash[e] == h
            and entry_len[e] == length
            and _same(arena, entry_start[e], buf, start, length)
        ):
            return e
        i = (i + 1) & mask


@njit(cache=CACHE, inline="always")
def table_add(
    slots: np.ndarray,
    entry_start: np.ndarray,
    entry_len: np.ndarray,
    entry_hash: np.ndarray,
    next_free: np.ndarray,
    older: np.ndarray,
    newer: np.ndarray,
    arena: np.ndarray,
    meta: np.ndarray,
    buf: np.ndarray,
    start: int,
    length: int,
    h: np.uint64,
) -> int:
    """Add the key ``buf[start:start + length]`` (hash ``h``), which the table does not hold, in
    the room reserved for it, as the newest; its entry."""
    e = meta[FREE_HEAD]
    meta[FREE_HEAD] = next_free[e]
    last = meta[NEWEST]
    older[e], newer[e] = last, -1
    if last >= 0:
        newer[last] = e
    else:
        meta[OLDEST] = e
    meta[NEWEST] = e
    at = meta[ARENA_USED]
    arena[at : at + length] = buf[start : start + length]
    meta[ARENA_USED] = at + length
    entry_start[e], entry_len[e], entry_hash[e] = at, length, h
    mask = len(slots) - 1
    i = np.int64(h & np.uint64(mask))
    while slots[i] >= 0:
        i = (i + 1) & mask
    slots[i] = e
    meta[COUNT] += 1
    return e


@njit(cache=CACHE, inline="always")
def table_remove(
    slots: np.ndarray,
    entry_len: np.ndarray,
    entry_hash: np.ndarray,
    next_free: np.ndarray,
    older: np.ndarray,
    newer: np.ndarray,
    meta: np.ndarray,
    e: int,
) -> None:
    """Remove entry ``e`` (held): its slot is refilled from the rest of its probe chain, each key
    moved back that may sit there (its home slot not cyclically within the hole and itself)."""
    mask = len(slots) - 1
    hole = np.int64(entry_hash[e] & np.uint64(mask))
    while slots[hole] != e:
        hole = (hole + 1) & mask
    j = hole
    while True:
        j = (j + 1) & mask
        f = slots[j]
        if f < 0:
            break
        home = np.int64(entry_hash[f] & np.uint64(mask))
        stays = (hole < home <= j) if hole <= j else (home > hole or home <= j)
        if not stays:
            slots[hole] = f
            hole = j
    slots[hole] = -1
    before, after = older[e], newer[e]
    if before >= 0:
        newer[before] = after
    else:
        meta[OLDEST] = after
    if after >= 0:
        older[after] = before
    else:
        meta[NEWEST] = before
    meta[GARBAGE] += entry_len[e]
    entry_len[e] = -1
    next_free[e] = meta[FREE_HEAD]
    meta[FREE_HEAD] = e
    meta[COUNT] -= 1


@njit(cache=CACHE)
def _rehash(slots: np.ndarray, entry_len: np.ndarray, entry_hash: np.ndarray) -> None:
    mask = len(slots) - 1
    slots[:] = -1
    for e in range(len(entry_len)):
        if entry_len[e] >= 0:
            i = np.int64(entry_hash[e] & np.uint64(mask))
            while slots[i] >= 0:
                i = (i + 1) & mask
            slots[i] = e


@njit(cache=CACHE)
def _compact(
    arena: np.ndarray, new: np.ndarray, entry_start: np.ndarray, entry_len: np.ndarray
) -> int:
    """Copy the live keys' bytes into ``new``, in entry order; the bytes used."""
    at = 0
    for e in range(len(entry_len)):
        n = entry_len[e]
        if n >= 0:
            s = entry_start[e]
            new[at : at + n] = arena[s : s + n]
            entry_start[e] = at
            at += n
    return at


class IdTable:
    """Byte-string keys to entries (see the module's docstring). The arrays are public: compiled
    code passes them to :func:`table_find`, :func:`table_add` and :func:`table_remove`, after
    :meth:`reserve`; the methods here are the same operations for Python callers."""

    __slots__ = (
        "slots",
        "entry_start",
        "entry_len",
        "entry_hash",
        "next_free",
        "older",
        "newer",
        "arena",
        "meta",
    )

    def __init__(self, entries: int = 16, arena_bytes: int = 256) -> None:
        entries = max(1, entries)
        self.slots = np.full(_slots_for(entries), -1, dtype=np.int64)
        cap = len(self.slots) // 2
        self.entry_start = np.zeros(cap, dtype=np.int64)
        self.entry_len = np.full(cap, -1, dtype=np.int64)  # -1: a free entry
        self.entry_hash = np.zeros(cap, dtype=np.uint64)
        self.next_free = np.arange(1, cap + 1, dtype=np.int64)  # the free list, in entry order
        self.older = np.full(cap, -1, dtype=np.int64)
        self.newer = np.full(cap, -1, dtype=np.int64)
        self.arena = np.zeros(max(16, arena_bytes), dtype=np.uint8)
        self.meta = np.array([0, 0, 0, 0, -1, -1], dtype=np.int64)

    @property
    def capacity(self) -> int:
        """How many keys fit before :meth:`reserve` must grow the table."""
        return len(self.entry_len)

    def __len__(self) -> int:
        return int(self.meta[COUNT])

    def reserve(self, keys: int, key_bytes: int) -> None:
        """Room for ``keys`` more keys of ``key_bytes`` bytes in all, without growing."""
        need = int(self.meta[COUNT]) + keys
        if need > self.capacity:
            self._grow_entries(need)
        used, garbage = int(self.meta[ARENA_USED]), int(self.meta[GARBAGE])
        if used + key_bytes > len(self.arena):
            live = used - garbage
            size = len(self.arena)
            while live + key_bytes > size // 2:  # at most half full after the compaction
                size *= 2
            new = np.zeros(size, dtype=np.uint8)
            self.meta[ARENA_USED] = _compact(self.arena, new, self.entry_start, self.entry_len)
            self.meta[GARBAGE] = 0
            self.arena = new

    def _grow_entries(self, need: int) -> None:
        cap = self.capacity
        new_cap = _slots_for(need) // 2
        grow = new_cap - cap
        self.entry_start = np.concatenate([self.entry_start, np.zeros(grow, dtype=np.int64)])
        self.entry_len = np.concatenate([self.entry_len, np.full(grow, -1, dtype=np.int64)])
        self.entry_hash = np.concatenate([self.entry_hash, np.zeros(grow, dtype=np.uint64)])
        # The new entries go after the free ones already listed: the list's end points to cap.
        self.next_free = np.concatenate(
            [self.next_free, np.arange(cap + 1, new_cap + 1, dtype=np.int64)]
        )
        self.older = np.concatenate([self.older, np.full(grow, -1, dtype=np.int64)])
        self.newer = np.concatenate([self.newer, np.full(grow, -1, dtype=np.int64)])
        self.slots = np.full(2 * new_cap, -1, dtype=np.int64)
        _rehash(self.slots, self.entry_len, self.entry_hash)

    def find(self, key: bytes) -> int:
        """The entry of ``key``, or -1."""
        buf = np.frombuffer(key, dtype=np.uint8)
        return int(
            table_find(
                self.slots,
                self.entry_start,
                self.entry_len,
                self.entry_hash,
                self.arena,
                buf,
                0,
                len(buf),
                np.uint64(fnv1a(buf, 0, len(buf))),  # numba returns it as a Python int
            )
        )

    def add(self, key: bytes) -> int:
        """The entry of ``key``, added if the table does not hold it."""
        e = self.find(key)
        if e >= 0:
            return e
        self.reserve(1, len(key))
        buf = np.frombuffer(key, dtype=np.uint8)
        return int(
            table_add(
                self.slots,
                self.entry_start,
                self.entry_len,
                self.entry_hash,
                self.next_free,
                self.older,
                self.newer,
                self.arena,
                self.meta,
                buf,
                0,
                len(buf),
                np.uint64(fnv1a(buf, 0, len(buf))),  # numba returns it as a Python int
            )
        )

    def remove(self, entry: int) -> None:
        """Remove the key of ``entry`` (a held entry)."""
        if not 0 <= entry < self.capacity or self.entry_len[entry] < 0:
            raise KeyError(f"entry {entry} is not held")
        table_remove(
            self.slots,
            self.entry_len,
            self.entry_hash,
            self.next_free,
            self.older,
            self.newer,
            self.meta,
            entry,
        )

    def oldest(self) -> int:
        """The entry added longest ago of those held, or -1."""
        return int(self.meta[OLDEST])

    def in_order(self) -> list[int]:
        """The entries held, oldest first."""
        return self.order().tolist()

    def order(self) -> np.ndarray:
        """:meth:`in_order` as an array."""
        return _in_order(self.meta, self.newer)

    def keys_of(self, entries: np.ndarray) -> list[str]:
        """The keys of held ``entries``, decoded (a snapshot's ids: one slice per key of the
        arena's bytes, no numpy call per key)."""
        raw = self.arena.tobytes()
        starts = self.entry_start[entries].tolist()
        ends = (self.entry_start[entries] + self.entry_len[entries]).tolist()
        return [raw[s:t].decode() for s, t in zip(starts, ends)]

    def key(self, entry: int) -> bytes:
        """The key of ``entry`` (a held entry)."""
        n = int(self.entry_len[entry])
        if n < 0:
            raise KeyError(f"entry {entry} is not held")
        s = int(self.entry_start[entry])
        return self.arena[s : s + n].tobytes()


@njit(cache=CACHE)
def _in_order(meta, newer):
    out = np.empty(meta[COUNT], dtype=np.int64)
    e, i = meta[OLDEST], 0
    while e >= 0:
        out[i] = e
        e = newer[e]
        i += 1
    return out[:i]


def _slots_for(entries: int) -> int:
    """The slot count (a power of two) that holds ``entries`` keys at most half full."""
    n = 2
    while n < 2 * entries:
        n *= 2
    return n
