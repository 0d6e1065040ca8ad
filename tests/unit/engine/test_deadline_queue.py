"""engine/deadline_queue.py: the run and the heap in arrays give the deadlines in the order of one
heap of them all, (deadline, seq), through growth and a run that wraps around its ring."""

import heapq

import numpy as np
import pytest

from streambandit.engine.deadline_queue import NONE, DeadlineQueue


@pytest.mark.parametrize("seed", range(6))
def test_items_come_due_in_the_order_of_one_heap(seed):
    rng = np.random.default_rng(seed)
    queue, oracle = DeadlineQueue(capacity=1), []
    seq, clock, watermark = 0, 0, -1
    for _ in range(4000):
        if rng.random() < 0.6:
            # Mostly in order (the run), sometimes earlier (the heap), ties often.
            clock += int(rng.integers(0, 3))
            deadline = clock - int(rng.integers(0, 50)) * (rng.random() < 0.2)
            seq += 1
            kind, entry = int(rng.integers(2)), int(rng.integers(1000))
            queue.push(deadline, seq, kind, entry)
            heapq.heappush(oracle, (deadline, seq, kind, entry))
        else:
            watermark = max(watermark, clock - int(rng.integers(0, 30)))
            while True:
                got = queue.pop_due(watermark)
                want = heapq.heappop(oracle) if oracle and oracle[0][0] <= watermark else None
                assert got == want
                if got is None:
                    break
        assert len(queue) == len(oracle)
        assert queue.next_deadline() == (oracle[0][0] if oracle else NONE)
    while oracle:
        assert queue.pop_due(NONE) == heapq.heappop(oracle)
    assert queue.pop_due(NONE) is None and queue.next_deadline() == NONE


def test_the_run_wraps_around_its_ring_and_keeps_its_order_when_it_grows():
    queue = DeadlineQueue(capacity=4)
    for seq in range(1, 4):
        queue.push(10 * seq, seq, 0, seq)
    assert queue.pop_due(10) == (10, 1, 0, 1) and queue.pop_due(20) == (20, 2, 0, 2)
    for seq in range(4, 7):  # the run's ring wraps: head at 2 of 4
        queue.push(10 * seq, seq, 1, seq)
    assert int(queue.meta[0]) == 2 and len(queue) == 4
    for seq in range(7, 12):  # grows while wrapped
        queue.push(10 * seq, seq, 0, seq)
    assert [queue.pop_due(NONE)[1] for _ in range(len(queue))] == list(range(3, 12))
