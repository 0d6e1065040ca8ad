"""The deterministic merge of one partition's two inputs (contexts[p] and rewards[p]).

Records are released in the order of the key (event timestamp, source, offset), where the source
order is fixed (contexts before rewards at equal timestamps), the way learning-loop's joiner merge-
sorts its inputs (docs/design.md, invariant 5). A record at the head of one source is released when the other
source's head is known to come after it. When the other source has nothing buffered:

- if the broker holds records of it not yet delivered (the caller says so: ``behind``), they will
  come, so the record waits for them however long the fetch takes. This is what keeps a backlog
  exact: contexts are large and rewards small, so when a worker catches up the rewards input runs
  thousands of records ahead, and releasing them early would push the watermark past every
  window (Kafka Streams waits the same way for a partition with lag, KIP-695);
- if not, the worker cannot know what the source will deliver next, so the record waits at most
  ``max_wait_ms`` of wall time from its own arrival (``max.task.idle.ms``) and is then released.

That is the one case where the live order may differ from the canonical order a replay of the
logs computes: a record that then arrives on the idle source with a key below one already
released is processed after it. The merger counts every such record (``out_of_order``), so the
divergence is observable in the metrics rather than silent. Crash recovery does not depend on
the merge order (it re-applies the joined log, the exact update sequence).

Pure: no clock is read; the caller passes ``now_ms``.
"""

from __future__ import annotations

import collections
from typing import Any

__all__ = ["CONTEXTS", "REWARDS", "InputMerger"]

CONTEXTS = 0
REWARDS = 1


class InputMerger:
    """Merge-sorts two per-partition input streams with a bounded wait for an idle one.

    A buffered record is the tuple ``(timestamp_ms, source, offset, item)``, and that is what
    ``pop_ready`` and ``drain`` return, in merge order: tuples compare in the merge key's order
    (``(source, offset)`` is unique, so a comparison never reaches ``item``), and building one costs
    a fraction of a record object's constructor, once per input record in the worker."""

    def __init__(self, max_wait_ms: int) -> None:
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_wait_ms = max_wait_ms
        self._queues: tuple[collections.deque, collections.deque] = (
            collections.deque(),
            collections.deque(),
        )
        # When each buffered record arrived (wall time), per source, one entry per ``extend``:
        # (records pushed to the source up to and including that call, its now_ms). A record waits
        # at most max_wait_ms from its own arrival, as a Kafka Streams record waits at most
        # max.task.idle.ms (counting from when it became the head made queued records wait one
        # after another: a partition with an idle source drained one record per max_wait_ms).
        self._arrivals: tuple[collections.deque, collections.deque] = (
            collections.deque(),
            collections.deque(),
        )
        self._pushed = [0, 0]
        self._last: tuple | None = None  # the largest key released so far
        # Per source, the largest key released because the wait for the other source ran out.
        self._forced_max: list[tuple | None] = [None, None]
        self.released = 0
        self.forced = 0  # releases made because the wait for the idle source ran out
        # Records released after a record of the other source with a larger key that was released
        # by force: the cases where the order differs from a replay's. (Within one source the
        # order is the offset order live and in replay alike, whatever the timestamps do.)
        self.out_of_order = 0

    def push(
        self, source: int, offset: int, timestamp_ms: int | None, item: Any, now_ms: int
    ) -> None:
        """Buffer one record; each source must be pushed in offset order.

        ``timestamp_ms=None`` is for a record with no event time (bytes that do not decode): it
        takes the time of what came before it, so it neither holds back nor overtakes its
        neighbours (its only effect is a dead letter, whose position does not change any state).
        """
        if timestamp_ms is None:
            q = self._queues[source]
            before = [self._last[0] if self._last is not None else -(2**63)]
            if q:
                before.append(q[-1][0])
            timestamp_ms = max(before)
        self.extend(source, [(timestamp_ms, source, offset, item)], now_ms)

    def extend(self, source: int, records: list[tuple[int, int, int, Any]], now_ms: int) -> None:
        """Buffer records of one source, ``(timestamp_ms, source, offset, item)`` each, in offset
        order (as one fetch delivers them: only the first is checked against what is buffered)."""
        if not records:
            return
        q = self._queues[source]
        first = records[0]
        if first[1] != source:
            raise ValueError(f"a record of source {first[1]} pushed as source {source}")
        if q and first[2] <= q[-1][2]:
            raise ValueError(f"source {source}: offset {first[2]} pushed after {q[-1][2]}")
        q.extend(records)
        self._pushed[source] += len(records)
        self._arrivals[source].append((self._pushed[source], now_ms))

    def pending(self) -> int:
        return len(self._queues[0]) + len(self._queues[1])

    def _head_arrived_ms(self, source: int) -> int:
        """When the head of ``source`` (non-empty) arrived."""
        arrivals = self._arrivals[source]
        head = self._pushed[source] - len(
            self._queues[source]
        )  # records of the source released so far
        while arrivals[0][0] <= head:
            arrivals.popleft()
        return arrivals[0][1]

    def wait_deadline_ms(self) -> int | None:
        """The wall time at which a held record's wait for the idle source runs out (the earliest
        head's arrival + ``max_wait_ms``), or None when nothing is held. A caller that blocks
        waiting for input should wake up by then."""
        heads = [self._head_arrived_ms(src) for src in (CONTEXTS, REWARDS) if self._queues[src]]
        return min(heads) + self.max_wait_ms if heads else None

    def pop_ready(self, now_ms: int, behind: tuple[bool, bool] = (False, False)) -> list[tuple]:
        """Release, in merge order, every record that may go now. ``behind[source]``: the broker
        holds records of that source that have not been pushed yet."""
        a, b = self._queues
        out: list[tuple] = []
        start = 0  # out[start:] is counted against the forced releases before it
        while True:
            if a and b:
                # (timestamp, source, offset) order; the heads are of different sources, so at equal
                # timestamps contexts (a) come first. Each side's head time is read once per
                # record it releases (a worker's per-record path: the engine stage of
                # bench.worker_path).
                append, pop_a, pop_b = out.append, a.popleft, b.popleft
                ta, tb = a[0][0], b[0][0]
                while True:
                    if ta <= tb:
                        append(pop_a())
                        if not a:
                            break
                        ta = a[0][0]
                    else:
                        append(pop_b())
                        if not b:
                            break
                        tb = b[0][0]
                continue
            if not (a or b):
                break
            src = CONTEXTS if a else REWARDS
            if behind[1 - src]:
                break  # the other source's next records exist: wait for them, not for a clock
            if now_ms - self._head_arrived_ms(src) < self.max_wait_ms:
                break
            self.forced += 1
            rec = self._queues[src].popleft()
            out.append(rec)
            self._count(out, start, len(out))
            start = len(out)
            if self._forced_max[src] is None or rec > self._forced_max[src]:
                self._forced_max[src] = rec
        self._count(out, start, len(out))
        return out

    def drain(self, now_ms: int) -> list[tuple]:
        """Release everything buffered, in merge order (at shutdown or partition revocation)."""
        a, b = self._queues
        out: list[tuple] = []
        while a or b:
            out.append((a if (a and (not b or a[0][0] <= b[0][0])) else b).popleft())
        self._count(out)
        return out

    def _count(self, released: list[tuple], start: int = 0, stop: int | None = None) -> None:
        """Count ``released[start:stop]`` (released in that order, after every forced release so
        far): a record below a forced release of the other source is out of order."""
        stop = len(released) if stop is None else stop
        forced = self._forced_max
        if forced[0] is not None or forced[1] is not None:
            for rec in released[start:stop]:
                other = forced[1 - rec[1]]
                if other is not None and rec < other:
                    self.out_of_order += 1
        if stop > start:
            top = max(released if start == 0 and stop == len(released) else released[start:stop])
            if self._last is None or top > self._last:
                self._last = top
        self.released += stop - start
