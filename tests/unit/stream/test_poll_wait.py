"""An empty poll waits up to a held record's merge deadline, and a little once that has passed: a
record held past it waits for input the broker has not delivered, and a wait of zero spun the
worker's loop at a full core until that input came."""

import numpy as np
from confluent_kafka import Message

from streambandit.stream.batch import HELD_RECHECK_MS
from streambandit.wire import Context, encode

from .test_ticks import processor

WAIT_MS = 50
POLL_MS = 100


def test_an_empty_poll_waits_to_a_held_record_s_deadline_and_never_zero_past_it():
    b = processor("g", WAIT_MS)
    assert b.poll_wait_ms(POLL_MS, 1_000) == POLL_MS  # nothing held
    ctx = Message(
        topic="c",
        partition=0,
        offset=0,
        key=b"m1",
        value=encode(Context("e1", "m1", 1_000, ("a", "b"), np.eye(2))),
        timestamp=(1, 1_000),
    )
    out: list = []
    rewards_behind, delivered = {0: (False, True)}, {0: (False, False)}
    b.process([ctx], 1_000, rewards_behind, out.extend)
    assert b.partitions[0].merger.pending() == 1 and not out
    assert b.poll_wait_ms(POLL_MS, 1_010) == WAIT_MS - 10  # released when its wait runs out
    assert b.poll_wait_ms(20, 1_010) == 20
    # The wait ran out, but the broker holds rewards not delivered yet: the merge waits for them,
    # and the poll waits a little for them (markers alone would wake no poll).
    b.process([], 1_000 + 2 * WAIT_MS, rewards_behind, out.extend)
    assert b.partitions[0].merger.pending() == 1 and not out
    assert b.poll_wait_ms(POLL_MS, 1_000 + 2 * WAIT_MS) == HELD_RECHECK_MS > 0
    # Everything the broker held delivered (none of it a reward): it goes.
    b.process([], 1_000 + 3 * WAIT_MS, delivered, out.extend)
    assert b.partitions[0].merger.pending() == 0 and [topic for topic, *_ in out] == ["a"]
    assert b.poll_wait_ms(POLL_MS, 1_000 + 3 * WAIT_MS) == POLL_MS
