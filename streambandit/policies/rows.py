"""Rows of shared chunked arrays: where the compiled learners (OFUL, GLB-OMD, Hvt-UCB) keep each
model's state.

Why: a worker holds one model per key. With three numpy arrays per model, each model costs
hundreds of bytes beyond its state (array headers, a malloc per array, per-model scalars and
argument tuples; ``python -m bench.memory`` accounts for them). Here every model of one
configuration is a row of a few
arrays shared by all of them, so a model costs its row (the documented state, plus its two
scalars) and a small slotted instance.

A store holds, per chunk of ``rows_per_chunk`` rows, one array per column: ``theta`` (d), the
inverse the UCB uses (d x d), the learner's third array, ``scalars`` (float64 per-model scalars such
as OFUL's log det) and ``count`` (int64, n_updates). Chunks are ``np.empty``, so the pages of rows
never handed out are not resident; a chunk's rows are handed out in order, and the rows of
garbage-collected models go to a free list and are handed out again, fully re-initialised.
Chunks are kept while the store lives (freed rows are reused, not returned, like the allocator's
free memory); a store lives while any model of its configuration does.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np

from streambandit.numerics import row_calls

__all__ = ["RowStore", "store_for", "by_chunk", "pinned_view", "CHUNK_ROWS", "CHUNK_BYTES"]

CHUNK_ROWS = 1024
# At most this many bytes per chunk (fewer rows for a large d), so that one model of a large
# configuration does not reserve gigabytes of address space.
CHUNK_BYTES = 8 << 20

# In-chunk row indices as shared int objects: an int above 256 is a new 32-byte object each time
# it is computed, which every model would otherwise own.
_INDEX = tuple(range(CHUNK_ROWS))


class Chunk(tuple):
    """A chunk's columns (a tuple of arrays, theta, inverse, third array, scalars, count), and
    ``table``: the address of its table (``numerics/row_calls.py``), what a model's per-call
    entry points take instead of the columns. The chunk keeps the table, and the store's
    parameters it points to, alive."""

    def __new__(cls, columns: Any, params: np.ndarray, kind: int) -> "Chunk":
        chunk = super().__new__(cls, columns)
        chunk._table = row_calls.chunk_table(chunk, params, kind)
        chunk._params, chunk._kind = params, kind
        chunk.table = int(chunk._table.__array_interface__["data"][0])
        return chunk

    def __reduce__(self) -> tuple:
        # A copy (pickle, copy, deepcopy) gets a table of its own arrays' addresses, never the
        # original's.
        return Chunk, (tuple(self), self._params, self._kind)


class RowStore:
    """The rows of every live model of one configuration, and what the configuration derives.

    ``initial`` holds one row's initial value per column (theta, inverse, third array, scalars,
    count); ``params`` the float64 parameters the compiled kernels take; ``kind`` the learner's
    confidence radius (``kernels.RADIUS_OFUL``, ...); ``consts`` the constants the learner derives
    from its configuration; ``config`` the shared configuration dict.
    """

    __slots__ = (
        "config",
        "consts",
        "params",
        "kind",
        "initial",
        "rows_per_chunk",
        "chunks",
        "index",
        "_free",
        "_used",
        "_lock",
        "__weakref__",
    )

    def __init__(
        self,
        config: dict[str, Any],
        initial: tuple[np.ndarray, ...],
        params: np.ndarray,
        consts: dict[str, Any],
        kind: int,
    ) -> None:
        self.config = config
        self.consts = consts
        self.params = np.ascontiguousarray(params, dtype=np.float64)
        self.kind = kind
        self.initial = tuple(np.array(a, order="C") for a in initial)
        row_bytes = sum(a.nbytes for a in self.initial)
        self.rows_per_chunk = max(1, min(CHUNK_ROWS, len(_INDEX), CHUNK_BYTES // max(row_bytes, 1)))
        self.chunks: list[Chunk] = []
        self.index = _INDEX  # referenced here so that ownership accounting sees the ints as shared
        self._free: list[tuple[Chunk, int]] = []
        self._used = self.rows_per_chunk  # rows of the last chunk handed out (none yet: no chunk)
        # Guards the bump allocation only. release() takes no lock: it runs from __del__, which the
        # garbage collector may call inside allocate() (np.empty can trigger a collection).
        self._lock = threading.Lock()

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row, all columns."""
        return sum(a.nbytes for a in self.initial)

    @property
    def capacity(self) -> int:
        """Rows allocated in chunks (handed out or not)."""
        return len(self.chunks) * self.rows_per_chunk

    @property
    def live(self) -> int:
        """Rows held by models now."""
        return self.capacity - (self.rows_per_chunk - self._used) - len(self._free)

    @property
    def spare(self) -> int:
        """Rows allocated and held by no model: freed, or not yet handed out in the last chunk."""
        return len(self._free) + (self.rows_per_chunk - self._used if self.chunks else 0)

    def allocate(self) -> tuple[Chunk, int]:
        """A row for a new model, set to the initial values: ``(chunk, index in the chunk)``."""
        try:
            chunk, i = self._free.pop()
        except IndexError:
            with self._lock:
                if self._used == self.rows_per_chunk:
                    self.chunks.append(self._new_chunk())
                    self._used = 0
                chunk, i = self.chunks[-1], self.index[self._used]
                self._used += 1
        # Every column, so that a recycled row keeps nothing of the model that held it.
        for column, value in zip(chunk, self.initial):
            column[i] = value
        return chunk, i

    def allocate_many(self, n: int) -> list[tuple[Chunk, int]]:
        """``n`` rows for new models, their contents left as they are: for a caller that writes
        every column of every row at once (a restore, state_blocks.py)."""
        out: list[tuple[Chunk, int]] = []
        while self._free and len(out) < n:
            out.append(self._free.pop())
        with self._lock:
            while len(out) < n:
                if self._used == self.rows_per_chunk:
                    self.chunks.append(self._new_chunk())
                    self._used = 0
                take = min(n - len(out), self.rows_per_chunk - self._used)
                chunk = self.chunks[-1]
                out.extend((chunk, i) for i in self.index[self._used : self._used + take])
                self._used += take
        return out

    def adopt(self, columns: tuple[np.ndarray, ...]) -> list[tuple[Chunk, int]]:
        """Rows for ``n = len(columns[0])`` new models whose states are already laid out, one
        array per column with a row per model (a restored snapshot's private mapping,
        state_blocks.py): the full chunks are views of ``columns``, not copies, and only the last
        ``n % rows_per_chunk`` rows are copied, into a chunk of the store's own that later
        models fill. The caller hands ``columns`` over: the models write into them.

        Why: a restore that copies every row first makes the kernel provide (zero) a fresh page
        for each, and that, not the copy, is most of a large restore on a cold machine
        (``python -m bench.handoff`` measures the handoff it bounds)."""
        n = len(columns[0])
        if len(columns) != len(self.initial) or any(
            c.shape != (n, *a.shape)
            or c.dtype != a.dtype
            or not c.flags.c_contiguous
            or not c.flags.writeable
            for c, a in zip(columns, self.initial)
        ):
            raise ValueError(
                "adopted columns do not match the store's columns (shape, dtype, C order, writable)"
            )
        per = self.rows_per_chunk
        full, tail = divmod(n, per)
        out: list[tuple[Chunk, int]] = []
        with self._lock:
            # The unused rows of the chunk being filled stay usable: the new chunks go after it.
            if self.chunks:
                self._free.extend((self.chunks[-1], i) for i in self.index[self._used : per])
            for k in range(full):
                chunk = Chunk((c[k * per : (k + 1) * per] for c in columns), self.params, self.kind)
                self.chunks.append(chunk)
                out.extend((chunk, i) for i in self.index[:per])
            self._used = per
            if tail:
                chunk = self._new_chunk()
                for column, c in zip(chunk, columns):
                    column[:tail] = c[full * per :]
                self.chunks.append(chunk)
                self._used = tail
                out.extend((chunk, i) for i in self.index[:tail])
        return out

    def _new_chunk(self) -> Chunk:
        return Chunk(
            (np.empty((self.rows_per_chunk, *a.shape), a.dtype) for a in self.initial),
            self.params,
            self.kind,
        )

    def release(self, chunk: Chunk, i: int) -> None:
        """Give a dead model's row back (list.append is atomic under the GIL)."""
        self._free.append((chunk, i))


# One store per configuration, held by its models: a configuration's store (and its chunks) goes
# when its last model does, so a parameter sweep does not accumulate them.
_STORES: "weakref.WeakValueDictionary[tuple, RowStore]" = weakref.WeakValueDictionary()


def store_for(key: tuple, build: Callable[[], RowStore]) -> RowStore:
    """The live store of configuration ``key``, built by ``build()`` if there is none."""
    store = _STORES.get(key)
    if store is None:
        store = _STORES.setdefault(key, build())
    return store


def by_chunk(rows: list[tuple[Chunk, int]]) -> list[tuple[Chunk, np.ndarray, np.ndarray]]:
    """``rows`` grouped by chunk: ``(chunk, indices in the chunk, positions in rows)`` each, so a
    column of many rows is read or written with one fancy index per chunk."""
    chunks: dict[int, Chunk] = {}  # id of the chunk's first column -> the chunk
    number = np.empty(len(rows), np.int64)
    index = np.empty(len(rows), np.intp)
    for j, (c, i) in enumerate(rows):
        number[j] = k = id(c[0])
        chunks[k] = c
        index[j] = i
    order = np.argsort(number, kind="stable")
    cuts = np.flatnonzero(np.diff(number[order])) + 1
    return (
        [(chunks[int(number[pos[0]])], index[pos], pos) for pos in np.split(order, cuts)]
        if len(rows)
        else []
    )


class _RowView:
    # The array interface of a row, and the model owning the row: numpy keeps this object as the
    # base of the array it builds, so the model (and its row) lives as long as the array.
    __slots__ = ("__array_interface__", "model")


def pinned_view(model: Any, view: np.ndarray) -> np.ndarray:
    """``view`` (a row of a chunk) as an array that keeps ``model`` alive, so that a view taken
    from a model never sees the row handed to another model after the first one was freed."""
    pin = _RowView()
    pin.__array_interface__ = view.__array_interface__
    pin.model = model
    return np.asarray(pin)
