"""The deterministic merge of one partition's two inputs (contexts[p] and rewards[p]).

Records are released in the order of the key (event timestamp, source, offset), where the source
order is fixed (contexts before rewards at equal timestamps), the way learning-loop's joiner merge-
sorts its inputs (DESIGN.md 3.4). A record at the head of one source is released when the other
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
import dataclasses
from typing import Any, Iterator

__all__ = ["CONTEXTS", "REWARDS", "MergedRecord", "InputMerger"]

CONTEXTS = 0
REWARDS = 1


@dataclasses.dataclass(slots=True, order=True)
class MergedRecord:
    """A record in merge order; ``item`` (the decoded event or raw message) does not take part in
    the ordering."""

    timestamp_ms: int
    source: int
    offset: int
    item: Any = dataclasses.field(compare=False)


class InputMerger:
    """Merge-sorts two per-partition input streams with a bounded wait for an idle one."""

    def __init__(self, max_wait_ms: int) -> None:
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        self.max_wait_ms = max_wait_ms
        self._queues: tuple[collections.deque, collections.deque] = (collections.deque(), collections.deque())
        # Wall time each buffered record arrived, per source (parallel to the queues): a record
        # waits at most max_wait_ms from its own arrival, as a Kafka Streams record waits at most
        # max.task.idle.ms. (Counting from when it became the head made queued records wait one
        # after another: a partition with an idle source drained one record per max_wait_ms.)
        self._arrived_ms: tuple[collections.deque, collections.deque] = (collections.deque(), collections.deque())
        self._last: MergedRecord | None = None
        self.released = 0
        self.forced = 0  # releases made because the wait for the idle source ran out
        self.out_of_order = 0  # records released with a key below one released before them

    def push(self, source: int, offset: int, timestamp_ms: int | None, item: Any, now_ms: int) -> None:
        """Buffer one record; each source must be pushed in offset order.

        ``timestamp_ms=None`` is for a record with no event time (bytes that do not decode): it
        takes the time of what came before it, so it neither holds back nor overtakes its
        neighbours (its only effect is a dead letter, whose position does not change any state).
        """
        q = self._queues[source]
        if q and offset <= q[-1].offset:
            raise ValueError(f"source {source}: offset {offset} pushed after {q[-1].offset}")
        if timestamp_ms is None:
            before = [self._last.timestamp_ms if self._last is not None else -(2**63)]
            if q:
                before.append(q[-1].timestamp_ms)
            timestamp_ms = max(before)
        q.append(MergedRecord(timestamp_ms, source, offset, item))
        self._arrived_ms[source].append(now_ms)

    def pending(self) -> int:
        return len(self._queues[0]) + len(self._queues[1])

    def wait_deadline_ms(self) -> int | None:
        """The wall time at which a held record's wait for the idle source runs out (the earliest
        head's arrival + ``max_wait_ms``), or None when nothing is held. A caller that blocks
        waiting for input should wake up by then."""
        heads = [arrived[0] for arrived in self._arrived_ms if arrived]
        return min(heads) + self.max_wait_ms if heads else None

    def pop_ready(self, now_ms: int, behind: tuple[bool, bool] = (False, False)) -> Iterator[MergedRecord]:
        """Release, in merge order, every record that may go now. ``behind[source]``: the broker
        holds records of that source that have not been pushed yet."""
        while True:
            a, b = self._queues
            if a and b:
                # (timestamp, source, offset) order; the heads are of different sources, so at equal
                # timestamps contexts (0) come first (the same as comparing the records, cheaper).
                src = CONTEXTS if a[0].timestamp_ms <= b[0].timestamp_ms else REWARDS
            elif a or b:
                src = CONTEXTS if a else REWARDS
                if behind[1 - src]:
                    return  # the other source's next records exist: wait for them, not for a clock
                waited = now_ms - self._arrived_ms[src][0]
                if waited < self.max_wait_ms:
                    return
                self.forced += 1
            else:
                return
            yield self._release(src, now_ms)

    def drain(self, now_ms: int) -> Iterator[MergedRecord]:
        """Release everything buffered, in merge order (at shutdown or partition revocation)."""
        while self.pending():
            a, b = self._queues
            src = CONTEXTS if (a and (not b or a[0].timestamp_ms <= b[0].timestamp_ms)) else REWARDS
            yield self._release(src, now_ms)

    def _release(self, src: int, now_ms: int) -> MergedRecord:
        q = self._queues[src]
        rec = q.popleft()
        self._arrived_ms[src].popleft()
        last = self._last
        if last is not None and (rec.timestamp_ms, rec.source, rec.offset) < (last.timestamp_ms, last.source, last.offset):
            self.out_of_order += 1
        else:
            self._last = rec
        self.released += 1
        return rec
