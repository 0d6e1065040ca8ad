"""engine/merge.py's merge on columns: a poll batch's records buffered and released as arrays.

:class:`~streambandit.engine.merge.InputMerger` states the merge record by record: a tuple per
record buffered, a comparison of the two heads per record released. The worker buffers and
releases thousands of records per poll, and that per-record Python was a large share of
bench.worker_path's buffer and engine stages. :class:`ColumnMerger` releases the same
records in the same order, with the same counters, from per-source arrays, a few numpy calls
per poll (tests/unit/engine/test_column_merge.py holds it to InputMerger on random streams).

The merge of two heads, one record at a time, is a merge of two sorted sequences once each
source's event times are replaced by their running maximum from its head: a record behind a
later one in its own source waits for that one to go first, and goes right after it unless the
other source's head comes before it, which it then does before the later one too. So the order
is a ``searchsorted`` of one running maximum in the other, and the merge stops where one source
runs out, as the record-by-record merge does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streambandit.engine.merge import CONTEXTS, REWARDS

__all__ = ["ColumnMerger", "Released"]

_NO_TIME = -(2**63)


class Released:
    """Records released, in merge order: per record its event time, source, offset, row (its
    index in the batch it came in) and batch (a key of ``batches``, which holds the batch)."""

    __slots__ = ("ts", "src", "off", "row", "batch", "batches")

    def __init__(self, ts, src, off, row, batch, batches: dict[int, Any]) -> None:
        self.ts, self.src, self.off, self.row, self.batch = ts, src, off, row, batch
        self.batches = batches

    def __len__(self) -> int:
        return len(self.ts)


class _Queue:
    """One source's buffered records from its head, as columns in arrays that grow by doubling
    and move back to the start when the head has passed half of them."""

    __slots__ = ("cols", "head", "tail")

    # Columns: event time, offset, row, batch, arrival (wall ms of the extend that brought it).
    TS, OFF, ROW, BATCH, ARRIVED = range(5)

    def __init__(self) -> None:
        self.cols = np.empty((5, 64), dtype=np.int64)
        self.head = self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def append(self, ts: np.ndarray, off: np.ndarray, row: np.ndarray, batch: int, now: int):
        n, live = len(ts), self.tail - self.head
        cap = self.cols.shape[1]
        if self.tail + n > cap:
            grown = max(cap, 2 * (live + n)) if live + n > cap // 2 else cap
            cols = np.empty((5, grown), dtype=np.int64) if grown != cap else self.cols
            cols[:, :live] = self.cols[:, self.head : self.tail]
            self.cols, self.head, self.tail = cols, 0, live
        c, at = self.cols, self.tail
        c[self.TS, at : at + n] = ts
        c[self.OFF, at : at + n] = off
        c[self.ROW, at : at + n] = row
        c[self.BATCH, at : at + n] = batch
        c[self.ARRIVED, at : at + n] = now
        self.tail += n

    def live(self, field: int) -> np.ndarray:
        return self.cols[field, self.head : self.tail]

    def last(self, field: int) -> int:
        return int(self.cols[field, self.tail - 1])

    def take(self, n: int) -> np.ndarray:
        """The next ``n`` records' columns (a copy: the arrays are reused), removed."""
        out = self.cols[:, self.head : self.head + n].copy()
        self.head += n
        if self.head == self.tail:
            self.head = self.tail = 0
        return out


class ColumnMerger:
    """InputMerger's merge (engine/merge.py: the order, the bounded wait for an idle source, the
    counters) on columns. A source's records come in by :meth:`extend`, a batch's stretch of
    them at a time, with the object they are rows of (``batch``, handed back in
    :class:`Released`); :meth:`pop_ready` releases them."""

    def __init__(self, max_wait_ms: int) -> None:
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_wait_ms = max_wait_ms
        self._queues = (_Queue(), _Queue())
        # The batches records are held from, by number; a number is given per batch object, so
        # a batch's contexts and rewards are one batch to whoever gathers them.
        self._batches: dict[int, Any] = {}
        self._batch_numbers = 0
        self._last_batch: Any = None
        self._last: tuple[int, int, int] | None = None  # the largest key released so far
        # Per source, the largest key released because the wait for the other source ran out.
        self._forced_max: list[tuple[int, int, int] | None] = [None, None]
        self.released = 0
        self.forced = 0
        self.out_of_order = 0

    def extend(
        self,
        source: int,
        ts: np.ndarray,
        offsets: np.ndarray,
        rows: np.ndarray,
        batch: Any,
        now_ms: int,
    ) -> None:
        """Buffer records of ``source`` in offset order: their event times, offsets and rows in
        ``batch`` (only the first offset is checked against what is buffered)."""
        if not len(ts):
            return
        q = self._queues[source]
        if len(q) and offsets[0] <= q.last(_Queue.OFF):
            raise ValueError(
                f"source {source}: offset {int(offsets[0])} pushed after {q.last(_Queue.OFF)}"
            )
        if batch is not self._last_batch:
            self._batch_numbers += 1
            self._batches[self._batch_numbers] = self._last_batch = batch
        q.append(ts, offsets, rows, self._batch_numbers, now_ms)

    def push_untimed(self, source: int, offset: int, row: int, batch: Any, now_ms: int) -> None:
        """Buffer one record with no event time (bytes that do not decode, or a time the engine
        refuses): it takes the time of what came before it, so it neither holds back nor
        overtakes its neighbours (InputMerger.push with no time)."""
        q = self._queues[source]
        ts = max(
            self._last[0] if self._last is not None else _NO_TIME,
            q.last(_Queue.TS) if len(q) else _NO_TIME,
        )
        one = np.array([ts]), np.array([offset]), np.array([row])
        self.extend(source, *one, batch, now_ms)

    def pending(self) -> int:
        return len(self._queues[0]) + len(self._queues[1])

    def wait_deadline_ms(self) -> int | None:
        """When a held record's wait for the idle source runs out, or None when none is held."""
        heads = [int(q.cols[_Queue.ARRIVED, q.head]) for q in self._queues if len(q)]
        return min(heads) + self.max_wait_ms if heads else None

    def pop_ready(self, now_ms: int, behind: tuple[bool, bool] = (False, False)) -> Released:
        """InputMerger.pop_ready: every record that may go now, in merge order."""
        a, b = self._queues
        taken: list[np.ndarray] = []
        sources: list[np.ndarray] = []
        if len(a) and len(b):
            # The running maxima are sorted: the merge is where one falls in the other, contexts
            # first at equal times, up to where one source runs out.
            ta = np.maximum.accumulate(a.live(_Queue.TS))
            tb = np.maximum.accumulate(b.live(_Queue.TS))
            if ta[-1] <= tb[-1]:
                na, nb = len(ta), int(np.searchsorted(tb, ta[-1], "left"))
            else:
                na, nb = int(np.searchsorted(ta, tb[-1], "right")), len(tb)
            at_b = np.searchsorted(ta[:na], tb[:nb], "right") + np.arange(nb)
            is_b = np.zeros(na + nb, dtype=bool)
            is_b[at_b] = True
            merged = np.empty((5, na + nb), dtype=np.int64)
            merged[:, ~is_b] = a.take(na)
            merged[:, is_b] = b.take(nb)
            taken.append(merged)
            sources.append(is_b.astype(np.int64))  # CONTEXTS 0, REWARDS 1
        n_forced = 0
        for src in (CONTEXTS, REWARDS):
            q = self._queues[src]
            if not len(q) or len(self._queues[1 - src]) or behind[1 - src]:
                continue
            # The idle source's wait has run out for the records that came max_wait_ms ago: the
            # head and each after it in turn, until one came later.
            young = np.flatnonzero(now_ms - q.live(_Queue.ARRIVED) < self.max_wait_ms)
            n_forced = len(q) if not len(young) else int(young[0])
            if n_forced:
                taken.append(q.take(n_forced))
                sources.append(np.full(n_forced, src, dtype=np.int64))
        if not taken:
            return Released(*(np.empty(0, dtype=np.int64),) * 5, {})
        cols = taken[0] if len(taken) == 1 else np.concatenate(taken, axis=1)
        src_col = sources[0] if len(sources) == 1 else np.concatenate(sources)
        ts, off = cols[_Queue.TS], cols[_Queue.OFF]
        self._count(ts, src_col, off, n_forced)
        batch = cols[_Queue.BATCH]
        held = [int(q.cols[_Queue.BATCH, q.head]) for q in self._queues if len(q)]
        released = {int(k): self._batches[int(k)] for k in np.unique(batch).tolist()}
        if held:  # a batch number below every held record's is no longer needed here
            oldest = min(held)
            for k in [k for k in self._batches if k < oldest]:
                del self._batches[k]
        else:
            self._batches = {}
            self._last_batch = None
        return Released(ts, src_col, off, cols[_Queue.ROW], batch, released)

    def _count(self, ts: np.ndarray, src: np.ndarray, off: np.ndarray, n_forced: int) -> None:
        """Counters of a release whose last ``n_forced`` records were released by force, as
        InputMerger counts them: a record below the other source's largest forced release so
        far is out of order (the forced maxima as of the release's start: within one release,
        records of the other source never follow a forced one)."""
        n = len(ts)
        for s, fm in enumerate(self._forced_max):
            if fm is None:
                continue
            mine = src == 1 - s  # records of the other source, compared with s's forced max
            below = (ts < fm[0]) | (
                (ts == fm[0]) & ((src < fm[1]) | ((src == fm[1]) & (off < fm[2])))
            )
            self.out_of_order += int(np.count_nonzero(mine & below))
        if n_forced:
            self.forced += n_forced
            fs = int(src[n - 1])
            top = _largest(ts[n - n_forced :], src[n - n_forced :], off[n - n_forced :])
            if self._forced_max[fs] is None or top > self._forced_max[fs]:
                self._forced_max[fs] = top
        top = _largest(ts, src, off)
        if self._last is None or top > self._last:
            self._last = top
        self.released += n


def _largest(ts: np.ndarray, src: np.ndarray, off: np.ndarray) -> tuple[int, int, int]:
    """The largest (ts, src, off) key of non-empty columns."""
    at = np.flatnonzero(ts == ts.max())
    at = at[src[at] == src[at].max()]
    i = at[np.argmax(off[at])]
    return int(ts[i]), int(src[i]), int(off[i])
