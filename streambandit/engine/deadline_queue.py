"""The deadlines of open decisions and early rewards, in arrays, for compiled code.

The engine closes what the watermark has passed in (deadline, seq) order, ``seq`` being the order
the deadlines were set in: the order of equal deadlines, which decides the order of the joined
records. Event time is mostly in order, so most deadlines come no earlier than the one set before
them: those go to a *run* (a ring buffer, sorted as pushed), the rest to a binary heap, and the
next deadline is the smaller of the two heads. The order is that of one heap of them all, without
a heap push and pop per decision (engine/partition.py keeps its deadlines the same way, in Python
objects).

An item is four int64: deadline, seq, kind (what the entry indexes: a decision, an early reward)
and entry. Nothing grows inside compiled code: :meth:`DeadlineQueue.reserve` makes room before a
pass.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

__all__ = ["DeadlineQueue", "NONE", "queue_push", "queue_pop_due", "queue_next_deadline"]

NONE = np.iinfo(np.int64).max  # the next deadline of an empty queue

# meta's fields: the run's first item's index in its ring and its length; the heap's length.
RUN_HEAD, RUN_LEN, HEAP_LEN = 0, 1, 2


@njit(cache=CACHE, inline="always")
def _before(a: np.ndarray, b: np.ndarray) -> bool:
    """Item ``a`` comes before item ``b``: (deadline, seq) order (seq is unique)."""
    return a[0] < b[0] or (a[0] == b[0] and a[1] < b[1])


@njit(cache=CACHE, inline="always")
def queue_push(
    run: np.ndarray,
    heap: np.ndarray,
    meta: np.ndarray,
    deadline: int,
    seq: int,
    kind: int,
    entry: int,
) -> None:
    """Add an item, in the room reserved (``seq`` larger than any pushed before)."""
    cap = len(run)
    n = meta[RUN_LEN]
    if n == 0 or deadline >= run[(meta[RUN_HEAD] + n - 1) % cap, 0]:
        at = (meta[RUN_HEAD] + n) % cap
        run[at, 0], run[at, 1], run[at, 2], run[at, 3] = deadline, seq, kind, entry
        meta[RUN_LEN] = n + 1
        return
    i = meta[HEAP_LEN]
    meta[HEAP_LEN] = i + 1
    heap[i, 0], heap[i, 1], heap[i, 2], heap[i, 3] = deadline, seq, kind, entry
    while i > 0:  # sift up
        parent = (i - 1) // 2
        if not _before(heap[i], heap[parent]):
            break
        for c in range(4):
            heap[i, c], heap[parent, c] = heap[parent, c], heap[i, c]
        i = parent


@njit(cache=CACHE, inline="always")
def _heap_pop(heap: np.ndarray, meta: np.ndarray, out: np.ndarray) -> None:
    out[:] = heap[0]
    n = meta[HEAP_LEN] - 1
    meta[HEAP_LEN] = n
    if n == 0:
        return
    heap[0] = heap[n]
    i = 0
    while True:  # sift down
        small, left, right = i, 2 * i + 1, 2 * i + 2
        if left < n and _before(heap[left], heap[small]):
            small = left
        if right < n and _before(heap[right], heap[small]):
            small = right
        if small == i:
            return
        for c in range(4):
            heap[i, c], heap[small, c] = heap[small, c], heap[i, c]
        i = small


@njit(cache=CACHE, inline="always")
def queue_pop_due(
    run: np.ndarray, heap: np.ndarray, meta: np.ndarray, watermark: int, out: np.ndarray
) -> bool:
    """Take the first item whose deadline the watermark has reached (``deadline <= watermark``)
    into ``out`` (four int64); False when there is none."""
    n = meta[RUN_LEN]
    head = meta[RUN_HEAD]
    if n > 0 and (meta[HEAP_LEN] == 0 or _before(run[head], heap[0])):
        if run[head, 0] > watermark:
            return False
        out[:] = run[head]
        meta[RUN_HEAD] = (head + 1) % len(run)
        meta[RUN_LEN] = n - 1
        return True
    if meta[HEAP_LEN] > 0 and heap[0, 0] <= watermark:
        _heap_pop(heap, meta, out)
        return True
    return False


@njit(cache=CACHE, inline="always")
def queue_next_deadline(run: np.ndarray, heap: np.ndarray, meta: np.ndarray) -> int:
    """The smallest deadline held, or :data:`NONE`."""
    nxt = NONE
    if meta[RUN_LEN] > 0:
        nxt = run[meta[RUN_HEAD], 0]
    if meta[HEAP_LEN] > 0 and heap[0, 0] < nxt:
        nxt = heap[0, 0]
    return nxt


class DeadlineQueue:
    """The run, the heap and their lengths (see the module's docstring); the methods are the
    compiled operations for Python callers."""

    __slots__ = ("run", "heap", "meta")

    def __init__(self, capacity: int = 16) -> None:
        capacity = max(1, capacity)
        self.run = np.zeros((capacity, 4), dtype=np.int64)
        self.heap = np.zeros((capacity, 4), dtype=np.int64)
        self.meta = np.zeros(3, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.meta[RUN_LEN] + self.meta[HEAP_LEN])

    def reserve(self, items: int) -> None:
        """Room for ``items`` more pushes without growing."""
        need = len(self) + items
        if need > len(self.run):
            size = len(self.run)
            while size < need:
                size *= 2
            n, head = int(self.meta[RUN_LEN]), int(self.meta[RUN_HEAD])
            run = np.zeros((size, 4), dtype=np.int64)
            run[:n] = np.take(self.run, np.arange(head, head + n) % len(self.run), axis=0)
            heap = np.zeros((size, 4), dtype=np.int64)
            heap[: self.meta[HEAP_LEN]] = self.heap[: self.meta[HEAP_LEN]]
            self.run, self.heap = run, heap
            self.meta[RUN_HEAD] = 0

    def push(self, deadline: int, seq: int, kind: int, entry: int) -> None:
        self.reserve(1)
        queue_push(self.run, self.heap, self.meta, deadline, seq, kind, entry)

    def pop_due(self, watermark: int) -> tuple[int, int, int, int] | None:
        """The first item due at ``watermark`` (deadline, seq, kind, entry), taken; or None."""
        out = np.empty(4, dtype=np.int64)
        if not queue_pop_due(self.run, self.heap, self.meta, watermark, out):
            return None
        return tuple(int(v) for v in out)

    def next_deadline(self) -> int:
        return int(queue_next_deadline(self.run, self.heap, self.meta))
