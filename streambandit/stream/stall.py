"""Noticing a worker that makes no progress while it should: pure, fed by the worker's checks.

Two ways a worker can sit still without an error of its own:

- it holds no partition while its inputs have lag: the group is stuck (a member that left in the
  middle of a rebalance can leave every member unassigned), or this worker was never given work
  although work is waiting;
- it commits, but the group's committed offsets stay behind the ones it committed: the broker did
  not apply its commits, so every restart would read the same input again.

Each is reported once it has lasted ``after_s``, then again every ``after_s`` while it lasts, as
one line saying what and for how long; the worker logs it at ERROR and counts it in its metrics.
"""

from __future__ import annotations

__all__ = ["StallWatch"]


class StallWatch:
    """Feed :meth:`check` the worker's view now and then; it returns the lines to report."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._since: dict[str, float] = {}  # condition -> when it was first seen
        self._reported: dict[str, float] = {}  # condition -> when it was last reported

    def check(
        self,
        now_s: float,
        *,
        assigned: int,
        input_lag: int | None,
        behind: dict[tuple[str, int], tuple[int, int]],
    ) -> list[str]:
        """``assigned``: partitions this worker holds; ``input_lag``: records of the group's inputs
        not yet committed (None: unknown); ``behind``: (topic, partition) -> (offset this worker
        committed, offset the group has) wherever the group's is lower."""
        lines = []
        if assigned == 0 and input_lag:
            lines += self._lasting(
                "unassigned",
                now_s,
                f"this worker holds no partition while the group's inputs have {input_lag} "
                f"record{'' if input_lag == 1 else 's'} not yet committed; the group may be "
                f"stuck in a rebalance (restart its members)",
            )
        else:
            self._clear("unassigned")
        if behind:
            where = ", ".join(
                f"{t}[{p}] {ours} vs {group}" for (t, p), (ours, group) in sorted(behind.items())
            )
            lines += self._lasting(
                "offsets",
                now_s,
                f"the group's committed offsets stay behind the ones this worker committed ({where}); "
                f"the broker is not applying its commits, and a restart would read that input again",
            )
        else:
            self._clear("offsets")
        return lines

    def _lasting(self, what: str, now_s: float, line: str) -> list[str]:
        since = self._since.setdefault(what, now_s)
        if now_s - since < self.after_s:
            return []
        last = self._reported.get(what)
        if last is not None and now_s - last < self.after_s:
            return []
        self._reported[what] = now_s
        return [f"{line} (for {now_s - since:.0f} s)"]

    def _clear(self, what: str) -> None:
        self._since.pop(what, None)
        self._reported.pop(what, None)
