"""A replica's staleness: the time since it last held everything the log held at a check."""

from streambandit.serving.staleness import Staleness


def test_a_follower_that_keeps_up_is_never_more_than_two_checks_behind():
    s = Staleness(0.0)
    for t in range(1, 50):
        # Each check: the follower has read what the log held at the previous one (ends grow by 10).
        s.check(float(t), {0: 10 * (t - 1), 1: 5 * (t - 1)}, {0: 10 * t, 1: 5 * t})
        assert s.behind_s(float(t)) <= 1.0


def test_a_follower_that_stops_reading_grows_stale_and_recovers_when_it_reads_again():
    s = Staleness(0.0)
    s.check(1.0, {0: 0}, {0: 100})
    for t in range(2, 10):  # stuck at offset 50 while the log ends at 100
        s.check(float(t), {0: 50}, {0: 100})
    assert s.behind_s(9.0) == 9.0  # never confirmed since the start
    s.check(10.0, {0: 100}, {0: 120})  # it read to where the log stood at t = 9
    assert s.behind_s(10.0) == 1.0


def test_a_broker_that_does_not_answer_gives_no_new_credit():
    s = Staleness(0.0)
    s.check(1.0, {0: 0}, {0: 10})
    s.check(2.0, {0: 10}, None)  # read to the ends of t = 1; no new ends
    assert s.behind_s(2.0) == 1.0
    for t in range(3, 8):
        s.check(float(t), {0: 10}, None)
    assert s.behind_s(7.0) == 6.0  # the credit stays that of t = 1
