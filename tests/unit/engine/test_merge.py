"""The input merge: canonical order whatever the arrival interleaving, bounded wait, and the
divergence case counted."""

import numpy as np
import pytest

from streambandit.engine.merge import CONTEXTS, REWARDS, InputMerger


def keys(records):
    return [(r[0], r[1], r[2]) for r in records]


def test_releases_in_timestamp_then_source_then_offset_order():
    m = InputMerger(max_wait_ms=1000)
    m.push(REWARDS, 0, 100, "r0", now_ms=0)
    m.push(CONTEXTS, 0, 100, "c0", now_ms=0)  # same timestamp: contexts first
    m.push(CONTEXTS, 1, 150, "c1", now_ms=0)
    m.push(REWARDS, 1, 120, "r1", now_ms=0)
    out = list(m.pop_ready(now_ms=0))
    # c1 (150) must wait: the rewards source is empty after r1 and could still deliver ts < 150.
    assert [r[3] for r in out] == ["c0", "r0", "r1"]
    assert m.pending() == 1 and m.forced == 0


def test_an_idle_source_is_waited_for_a_bounded_time_then_counted_as_forced():
    m = InputMerger(max_wait_ms=50)
    m.push(CONTEXTS, 0, 10, "c0", now_ms=1000)
    assert list(m.pop_ready(now_ms=1049)) == []
    assert [r[3] for r in m.pop_ready(now_ms=1050)] == ["c0"]
    assert m.forced == 1 and m.out_of_order == 0
    # A reward with an earlier timestamp arrives after the forced release: processed late, counted.
    m.push(REWARDS, 0, 5, "r0", now_ms=1060)
    assert [r[3] for r in m.pop_ready(now_ms=2000)] == ["r0"]
    assert m.out_of_order == 1


def test_timestamps_out_of_order_within_one_input_are_not_counted():
    """Within one input the order is the offset order, live and in a replay alike: a reward with
    an earlier timestamp than the one before it is jitter, not a divergence (it was counted, tens
    of thousands of times in a run identical to its replay)."""
    m = InputMerger(max_wait_ms=0)
    m.push(CONTEXTS, 0, 100, "c0", now_ms=0)
    m.push(REWARDS, 0, 90, "r0", now_ms=0)
    m.push(REWARDS, 1, 80, "r1", now_ms=0)  # earlier than r0, later in the log
    m.push(REWARDS, 2, 95, "r2", now_ms=0)
    assert [r[3] for r in m.pop_ready(now_ms=0)] == ["r0", "r1", "r2", "c0"]
    assert m.out_of_order == 0 and m.forced == 1  # c0 went when the rewards ran out
    # Only a record released after a forced release of the other input with a later key counts.
    m.push(CONTEXTS, 1, 200, "c1", now_ms=10)
    assert [r[3] for r in m.pop_ready(now_ms=10)] == ["c1"] and m.forced == 2
    m.push(REWARDS, 3, 150, "r3", now_ms=20)
    m.push(REWARDS, 4, 250, "r4", now_ms=20)
    assert [r[3] for r in m.pop_ready(now_ms=20)] == ["r3", "r4"]
    assert m.out_of_order == 1  # r3: a replay puts it before c1; r4 after, as here


@pytest.mark.parametrize("seed", range(20))
def test_any_arrival_interleaving_gives_the_replay_order(seed):
    rng = np.random.default_rng(seed)
    streams = {
        src: [
            (off, int(ts))
            for off, ts in enumerate(np.sort(rng.integers(0, 500, size=int(rng.integers(1, 40)))))
        ]
        for src in (CONTEXTS, REWARDS)
    }
    # Replay: everything present, merged at once.
    replay = InputMerger(max_wait_ms=10**9)
    for src, recs in streams.items():
        for off, ts in recs:
            replay.push(src, off, ts, None, now_ms=0)
    expected = keys(replay.drain(now_ms=0))

    # Live: records arrive in random interleavings and chunks, pops in between; the wait never runs out.
    live = InputMerger(max_wait_ms=10**9)
    cursors = {CONTEXTS: 0, REWARDS: 0}
    out = []
    now = 0
    while any(cursors[s] < len(streams[s]) for s in streams):
        src = int(rng.integers(2))
        if cursors[src] >= len(streams[src]):
            src = 1 - src
        for _ in range(int(rng.integers(1, 5))):
            if cursors[src] < len(streams[src]):
                off, ts = streams[src][cursors[src]]
                live.push(src, off, ts, None, now_ms=now)
                cursors[src] += 1
        out += keys(live.pop_ready(now_ms=now))
        now += 1
    out += keys(live.drain(now_ms=now))
    assert out == expected
    assert live.out_of_order == 0 and live.forced == 0
    assert expected == sorted(expected)


def test_offsets_must_increase_per_source():
    m = InputMerger(max_wait_ms=0)
    m.push(CONTEXTS, 5, 0, None, now_ms=0)
    with pytest.raises(ValueError, match="offset 5 pushed after 5"):
        m.push(CONTEXTS, 5, 0, None, now_ms=0)
    with pytest.raises(ValueError):
        InputMerger(max_wait_ms=-1)


def test_a_record_without_event_time_takes_its_predecessors_place():
    m = InputMerger(max_wait_ms=1000)
    m.push(CONTEXTS, 0, 100, "c0", now_ms=0)
    m.push(CONTEXTS, 1, None, "garbage", now_ms=0)
    m.push(CONTEXTS, 2, 300, "c2", now_ms=0)
    m.push(REWARDS, 0, 150, "r0", now_ms=0)
    m.push(REWARDS, 1, 400, "r1", now_ms=0)
    assert [r[3] for r in m.pop_ready(now_ms=0)] == ["c0", "garbage", "r0", "c2"]
    assert m.out_of_order == 0


def test_each_record_waits_from_its_own_arrival_not_one_after_another():
    # Rewards idle: ten contexts that arrived together all go once the wait has run out, not one
    # per max_wait_ms (which capped a partition with a quiet source at 1000 / max_wait_ms per s).
    m = InputMerger(max_wait_ms=20)
    for i in range(10):
        m.push(CONTEXTS, i, 100 + i, f"c{i}", now_ms=i)
    assert [r[3] for r in m.pop_ready(now_ms=19)] == []
    assert [r[3] for r in m.pop_ready(now_ms=24)] == ["c0", "c1", "c2", "c3", "c4"]
    assert [r[3] for r in m.pop_ready(now_ms=29)] == ["c5", "c6", "c7", "c8", "c9"]
    assert m.forced == 10


def test_a_source_with_undelivered_records_is_waited_for_however_long():
    # Contexts idle in the buffer but known to be on the broker: rewards do not overtake them.
    m = InputMerger(max_wait_ms=20)
    m.push(REWARDS, 0, 105, "r0", now_ms=0)
    assert list(m.pop_ready(now_ms=10_000, behind=(True, False))) == []
    m.push(CONTEXTS, 0, 100, "c0", now_ms=10_000)
    m.push(CONTEXTS, 1, 110, "c1", now_ms=10_000)
    assert [r[3] for r in m.pop_ready(now_ms=10_000, behind=(True, False))] == ["c0", "r0"]
    assert m.forced == 0 and m.out_of_order == 0
    # Rewards are not behind: c1 waits the bounded time from its arrival, then goes.
    assert list(m.pop_ready(now_ms=10_019)) == []
    assert [r[3] for r in m.pop_ready(now_ms=10_020)] == ["c1"] and m.forced == 1


def test_the_wait_deadline_is_the_earliest_held_arrival_plus_the_wait():
    """The worker blocks for input no longer than this, so a held record is released when its
    merge wait runs out, not when the (longer) poll timeout does."""
    m = InputMerger(max_wait_ms=20)
    assert m.wait_deadline_ms() is None
    m.push(CONTEXTS, 0, 10, "c0", now_ms=1000)
    m.push(CONTEXTS, 1, 11, "c1", now_ms=1005)
    assert m.wait_deadline_ms() == 1020
    assert list(m.pop_ready(now_ms=1019)) == []
    assert [r[3] for r in m.pop_ready(now_ms=1020)] == ["c0"]
    assert m.wait_deadline_ms() == 1025
    assert [r[3] for r in m.pop_ready(now_ms=1025)] == ["c1"]
    assert m.wait_deadline_ms() is None


def test_equal_timestamps_release_contexts_first_whatever_the_offsets():
    m = InputMerger(max_wait_ms=1000)
    m.push(REWARDS, 0, 100, "r0", now_ms=0)
    m.push(CONTEXTS, 7, 100, "c7", now_ms=0)
    m.push(REWARDS, 1, 200, "r1", now_ms=0)
    m.push(CONTEXTS, 8, 200, "c8", now_ms=0)
    assert [r[3] for r in m.pop_ready(now_ms=0)] == ["c7", "r0", "c8"]
    assert [r[3] for r in m.drain(now_ms=0)] == ["r1"]
    assert m.out_of_order == 0
