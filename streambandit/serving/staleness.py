"""How far behind the learners a replica's copy may be: the bound, and the bookkeeping (pure).

A replica cannot see a clock in the log; what it can check is whether it has read everything
the log held some moments ago. So every ``interval_s`` its follower reads where the joined log
ends (one query per partition) and where its own reading stands. When its positions have reached
the ends read at the check before, the copy holds everything the learners had committed at that
earlier check: it is at most (now - that check's time) behind them. A follower cut off from the
broker, or stuck behind a transaction that never ends, stops confirming, and its staleness grows
until the replica refuses to decide (``stale_replica``) and reports itself not ready.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["Staleness"]


class Staleness:
    """The time since the copy last held everything the log had (see the module docstring)."""

    def __init__(self, start_s: float) -> None:
        self.fresh_at_s = start_s  # the copy held the whole log as it stood at this time
        self._ends: dict[int, int] | None = None  # where the log ended at the previous check
        self._checked_at_s = start_s

    def check(
        self, now_s: float, positions: Mapping[int, int], ends: Mapping[int, int] | None
    ) -> None:
        """One check: ``positions`` (partition -> the next offset the follower reads) and
        ``ends`` (partition -> the log's end now, or None when the broker did not answer)."""
        if self._ends is not None and all(
            positions.get(p, -1) >= end for p, end in self._ends.items()
        ):
            self.fresh_at_s = max(self.fresh_at_s, self._checked_at_s)
        if ends is not None:
            self._ends, self._checked_at_s = dict(ends), now_s
        # Ends the broker did not give are not renewed: the last ones stay the test, and the time
        # they were read stays the most the copy can be credited with.

    def behind_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.fresh_at_s)
