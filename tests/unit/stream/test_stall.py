"""StallWatch: a worker idle while work waits, or whose commits the broker does not apply, is
reported once the condition has lasted, then at that interval while it lasts, and no more."""

from streambandit.stream.stall import StallWatch


def test_no_partition_while_inputs_have_lag_is_reported_after_the_bound_and_then_periodically():
    w = StallWatch(after_s=60)
    assert w.check(0, assigned=0, input_lag=50, behind={}) == []
    assert w.check(59, assigned=0, input_lag=50, behind={}) == []
    [line] = w.check(60, assigned=0, input_lag=50, behind={})
    assert "holds no partition" in line and "50 records" in line and "(for 60 s)" in line
    assert w.check(90, assigned=0, input_lag=50, behind={}) == []
    assert len(w.check(120, assigned=0, input_lag=50, behind={})) == 1


def test_an_idle_worker_with_nothing_to_do_or_with_partitions_is_not_reported():
    w = StallWatch(after_s=10)
    for t in range(0, 100, 5):
        assert w.check(t, assigned=0, input_lag=0, behind={}) == []
        assert w.check(t, assigned=0, input_lag=None, behind={}) == []
    w2 = StallWatch(after_s=10)
    assert w2.check(0, assigned=0, input_lag=5, behind={}) == []
    assert (
        w2.check(5, assigned=2, input_lag=5, behind={}) == []
    )  # assigned again: the clock restarts
    assert w2.check(12, assigned=0, input_lag=5, behind={}) == []
    assert len(w2.check(22, assigned=0, input_lag=5, behind={})) == 1


def test_commits_the_group_does_not_show_are_reported_with_where():
    w = StallWatch(after_s=30)
    behind = {("rewards", 1): (7, 5), ("contexts", 0): (12, 12 - 2)}
    assert w.check(0, assigned=2, input_lag=None, behind=behind) == []
    [line] = w.check(30, assigned=2, input_lag=None, behind=behind)
    assert "contexts[0] 12 vs 10" in line and "rewards[1] 7 vs 5" in line
    assert w.check(40, assigned=2, input_lag=None, behind={}) == []  # caught up: cleared
    assert (
        w.check(65, assigned=2, input_lag=None, behind=behind) == []
    )  # a new episode starts at 65


def test_a_rebalance_that_does_not_end_is_reported_with_or_without_input_waiting():
    w = StallWatch(after_s=30)
    assert w.check(0, assigned=0, input_lag=0, behind={}, rebalancing=True) == []
    assert w.check(29, assigned=0, input_lag=None, behind={}, rebalancing=True) == []
    [line] = w.check(30, assigned=0, input_lag=0, behind={}, rebalancing=True)
    assert "no assignment since it joined" in line and "new group id" in line
    assert "(for 30 s)" in line
    # With input waiting it is the one line, not also the one about an empty assignment.
    assert len(w.check(60, assigned=0, input_lag=9, behind={}, rebalancing=True)) == 1
    # Assigned (even nothing: more members than partitions): cleared.
    assert w.check(61, assigned=0, input_lag=0, behind={}) == []
    assert w.check(80, assigned=0, input_lag=0, behind={}, rebalancing=True) == []


def test_a_rebalance_is_reported_only_after_its_own_longer_bound():
    # The worker gives a rebalance two group sessions (a member's first join waits for others'
    # heartbeats), while the other stalls keep stall_report_s.
    w = StallWatch(after_s=1, rebalance_after_s=90)
    assert w.check(0, assigned=0, input_lag=0, behind={}, rebalancing=True) == []
    assert w.check(89, assigned=0, input_lag=0, behind={}, rebalancing=True) == []
    [line] = w.check(90, assigned=0, input_lag=0, behind={}, rebalancing=True)
    assert "rebalance does not end" in line
    other = StallWatch(after_s=1, rebalance_after_s=90)
    other.check(0, assigned=0, input_lag=5, behind={})
    assert len(other.check(1, assigned=0, input_lag=5, behind={})) == 1
