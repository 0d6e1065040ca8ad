"""Noticing a worker that makes no progress while it should: pure, fed by the worker's checks.

Three ways a worker can sit still without an error of its own:

- it has had no assignment since it joined the group or was revoked, input or none: the group's
  rebalance does not end. On the embedded broker two members leaving at once, or one leaving
  inside a rebalance, can leave a member that is gone but still counted, and no later join ever
  completes (docs/notes/tansu.md); a member with an empty assignment (more members than
  partitions) has had its assignment and is not reported;
- it holds no partition while its inputs have lag: this worker was never given work although
  work is waiting;
- it commits, but the group's committed offsets stay behind the ones it committed: the broker did
  not apply its commits, so every restart would read the same input again.

Each is reported once it has lasted ``after_s``, then again every ``after_s`` while it lasts, as
one line saying what and for how long; the worker logs it at ERROR and counts it in its metrics.
"""

from __future__ import annotations

__all__ = ["StallWatch", "WEDGED_ADVICE"]

# What ends a rebalance that does not end, as measured (python -m bench.group_restarts).
WEDGED_ADVICE = (
    "on the embedded broker restarting the members does not end it, only a new group id does "
    "(its partitions start again from the beginning of their input); on Apache Kafka restart "
    "the members"
)


class StallWatch:
    """Feed :meth:`check` the worker's view now and then; it returns the lines to report."""

    def __init__(self, after_s: float, rebalance_after_s: float | None = None) -> None:
        """``rebalance_after_s``: how long a rebalance may last before it is reported (default
        ``after_s``); a joining member's first assignment may take a session or more."""
        self.after_s = after_s
        self.rebalance_after_s = after_s if rebalance_after_s is None else rebalance_after_s
        self._since: dict[str, float] = {}  # condition -> when it was first seen
        self._reported: dict[str, float] = {}  # condition -> when it was last reported

    def check(
        self,
        now_s: float,
        *,
        assigned: int,
        input_lag: int | None,
        behind: dict[tuple[str, int], tuple[int, int]],
        rebalancing: bool = False,
    ) -> list[str]:
        """``assigned``: partitions this worker holds; ``input_lag``: records of the group's inputs
        not yet committed (None: unknown); ``behind``: (topic, partition) -> (offset this worker
        committed, offset the group has) wherever the group's is lower; ``rebalancing``: no
        assignment since this worker joined the group or was last revoked."""
        lines = []
        if rebalancing:
            lines += self._lasting(
                "rebalancing",
                now_s,
                "this worker has had no assignment since it joined the group or was revoked: "
                f"the group's rebalance does not end; {WEDGED_ADVICE}",
                after_s=self.rebalance_after_s,
            )
        else:
            self._clear("rebalancing")
        if assigned == 0 and input_lag and not rebalancing:
            lines += self._lasting(
                "unassigned",
                now_s,
                f"this worker holds no partition while the group's inputs have {input_lag} "
                f"record{'' if input_lag == 1 else 's'} not yet committed: its assignment was "
                f"empty (more members than partitions?) and the members that hold them do not "
                f"commit",
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

    def _lasting(
        self, what: str, now_s: float, line: str, after_s: float | None = None
    ) -> list[str]:
        after_s = self.after_s if after_s is None else after_s
        since = self._since.setdefault(what, now_s)
        if now_s - since < after_s:
            return []
        last = self._reported.get(what)
        if last is not None and now_s - last < after_s:
            return []
        self._reported[what] = now_s
        return [f"{line} (for {now_s - since:.0f} s)"]

    def _clear(self, what: str) -> None:
        self._since.pop(what, None)
        self._reported.pop(what, None)
