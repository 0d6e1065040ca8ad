"""The merge on columns releases what the record-by-record merge (engine/merge.py) releases, in
its order, with its counters, its wait deadline and what it holds, whatever the interleaving of
arrivals, the event-time jitter, the records with no time, the idle waits and the fetches behind."""

import numpy as np
import pytest

from streambandit.engine.column_merge import ColumnMerger
from streambandit.engine.merge import CONTEXTS, REWARDS, InputMerger


class _Batch:
    """A stand-in for a fetched batch: only its identity matters to the merge."""


def _released(out) -> list[tuple]:
    return [
        (
            int(out.ts[j]),
            int(out.src[j]),
            int(out.off[j]),
            (out.batches[int(out.batch[j])], int(out.row[j])),
        )
        for j in range(len(out))
    ]


def _check_same(ref: InputMerger, cols: ColumnMerger) -> None:
    assert (cols.released, cols.forced, cols.out_of_order) == (
        ref.released,
        ref.forced,
        ref.out_of_order,
    )
    assert cols.pending() == ref.pending()
    assert cols.wait_deadline_ms() == ref.wait_deadline_ms()


@pytest.mark.parametrize("seed", range(60))
def test_releases_what_the_record_by_record_merge_releases(seed):
    rng = np.random.default_rng(seed)
    wait = int(rng.choice([0, 5, 50]))
    ref, cols = InputMerger(wait), ColumnMerger(wait)
    next_off, clock = [0, 0], [0, 0]  # per source: next offset, its event-time clock
    now = 0
    jitter = int(rng.choice([0, 3, 40]))  # event times out of order within a source
    for _ in range(int(rng.integers(5, 40))):
        now += int(rng.integers(0, 20))
        if rng.random() < 0.6:  # a fetch: stretches of both sources from one batch
            batch = _Batch()
            row = 0
            for src in rng.permutation([CONTEXTS, REWARDS]).tolist():
                if rng.random() < 0.3:
                    continue
                n = int(rng.integers(1, 30))
                steps = rng.integers(0, 6, n)
                ts = clock[src] + np.cumsum(steps) - rng.integers(0, jitter + 1, n)
                clock[src] += int(steps.sum())
                offs = next_off[src] + np.arange(n) + rng.integers(0, 2, n).cumsum()
                next_off[src] = int(offs[-1]) + 1
                rows = row + np.arange(n)
                row += n
                untimed = rng.random(n) < 0.05  # the batch's records with no event time
                at = 0
                for b in [*np.flatnonzero(untimed).tolist(), n]:
                    items = [
                        (int(ts[j]), src, int(offs[j]), (batch, int(rows[j]))) for j in range(at, b)
                    ]
                    ref.extend(src, items, now)
                    cols.extend(src, ts[at:b], offs[at:b], rows[at:b], batch, now)
                    if b < n:
                        ref.push(src, int(offs[b]), None, (batch, int(rows[b])), now)
                        cols.push_untimed(src, int(offs[b]), int(rows[b]), batch, now)
                    at = b + 1
        else:  # a release, with the broker maybe holding more of either source
            behind = (bool(rng.random() < 0.3), bool(rng.random() < 0.3))
            expected = ref.pop_ready(now, behind)
            assert _released(cols.pop_ready(now, behind)) == expected
        _check_same(ref, cols)
    now += 10_000  # every wait run out: what is held goes
    assert _released(cols.pop_ready(now)) == ref.pop_ready(now)
    _check_same(ref, cols)


def test_a_batch_is_one_batch_whichever_source_its_records_came_on():
    m = ColumnMerger(0)
    batch = _Batch()
    m.extend(CONTEXTS, np.array([1, 3]), np.array([0, 1]), np.array([0, 1]), batch, 0)
    m.extend(REWARDS, np.array([2, 4]), np.array([0, 1]), np.array([2, 3]), batch, 0)
    out = m.pop_ready(0)
    assert out.ts.tolist() == [1, 2, 3, 4] and out.row.tolist() == [0, 2, 1, 3]
    assert len(set(out.batch.tolist())) == 1 and list(out.batches.values()) == [batch]


def test_offsets_must_increase_per_source():
    m = ColumnMerger(0)
    m.extend(CONTEXTS, np.array([5]), np.array([3]), np.array([0]), _Batch(), 0)
    with pytest.raises(ValueError, match="offset 3 pushed after 3"):
        m.extend(CONTEXTS, np.array([6]), np.array([3]), np.array([1]), _Batch(), 0)


def test_a_large_backlog_of_one_source_is_held_and_released_in_order():
    """The held records' arrays grow past their first size and move back as the head advances."""
    m = ColumnMerger(0)
    batch = _Batch()
    n = 5_000
    for at in range(0, n, 700):
        k = min(700, n - at)
        m.extend(REWARDS, np.arange(at, at + k), np.arange(at, at + k), np.arange(k), batch, 0)
    assert len(m.pop_ready(0, (True, False))) == 0 and m.pending() == n
    m.extend(CONTEXTS, np.array([2_500]), np.array([0]), np.array([0]), batch, 0)
    out = m.pop_ready(0, (True, False))
    assert out.ts.tolist() == list(range(2_500)) + [2_500]
    assert out.src.tolist() == [REWARDS] * 2_500 + [CONTEXTS]
    assert m.pending() == n - 2_500
