"""engine/recent_ids.py: the recently joined ids in arrays behave as the Python engine's bounded
OrderedDict: lookups, the flag, the oldest leaving first, the snapshot's list and its tail."""

import collections

import numpy as np
import pytest

from streambandit.engine.recent_ids import RecentIds


@pytest.mark.parametrize("bound", [1, 7, 100])
def test_remembering_agrees_with_a_bounded_ordered_dict(bound):
    rng = np.random.default_rng(bound)
    recent, oracle = RecentIds(bound, capacity=2), collections.OrderedDict()
    for step in range(3000):
        eid = f"event-{int(rng.integers(400))}"
        observed = bool(rng.random() < 0.5)
        recent.remember(eid, observed)
        oracle[eid] = observed  # the engine's _remember
        if len(oracle) > bound:
            oracle.popitem(last=False)
        probe = f"event-{int(rng.integers(400))}"
        assert recent.get(probe) == oracle.get(probe)
        if step % 250 == 0:
            assert recent.items() == list(oracle.items())
            for n in (0, 1, 5, bound + 3):
                assert recent.tail(n) == list(oracle.items())[len(oracle) - min(n, len(oracle)) :]
    again = RecentIds(bound)
    again.add_items(recent.items())
    assert again.items() == list(oracle.items())
    # A longer list than the bound keeps its newest, as restore does.
    short = RecentIds(max(1, bound // 2))
    short.add_items(list(oracle.items()))
    assert short.items() == list(oracle.items())[-max(1, bound // 2) :]
