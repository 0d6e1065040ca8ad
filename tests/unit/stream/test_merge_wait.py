"""The worker's poll is woken for a held record's merge wait only while that wait can release
the record. A record still held at a release past its wait is held for an input the broker holds
and has not delivered yet: only that input releases it, so the poll waits for input. (A poll
timeout of 0 at such a deadline spun the worker's loop at a full core for as long as the broker
took to deliver.)"""

import numpy as np
from confluent_kafka import Message

from streambandit.wire import Context, encode

from .test_ticks import processor

WAIT_MS = 50


def test_a_record_held_for_input_the_broker_has_not_delivered_sets_no_wake_up():
    b = processor("g", WAIT_MS)
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
    held = b.partitions[0].merger
    assert held.pending() == 1 and not out
    assert b.wait_deadline_ms() == 1_000 + WAIT_MS  # its wait may still release it
    # The wait ran out, but the broker holds rewards not delivered yet: the merge waits for them.
    b.process([], 1_000 + 2 * WAIT_MS, rewards_behind, out.extend)
    assert held.pending() == 1 and not out
    assert b.wait_deadline_ms() is None  # only input releases it: no wake-up at a past deadline
    # Everything the broker held delivered (none of it a reward): the wait has run out, it goes.
    b.process([], 1_000 + 3 * WAIT_MS, delivered, out.extend)
    assert held.pending() == 0 and [topic for topic, *_ in out] == ["a"]
    assert b.wait_deadline_ms() is None
