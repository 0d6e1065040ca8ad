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


@pytest.mark.parametrize("bound", [1, 5, 60])
def test_adding_a_list_in_one_go_is_remembering_each_in_turn(bound):
    """add_items (one compiled loop) against remember item by item, on a list that repeats ids
    and is longer than the bound, into a table that holds ids already."""
    rng = np.random.default_rng(bound)
    items = [(f"e-{int(rng.integers(80))}", bool(rng.random() < 0.5)) for _ in range(300)]
    one_by_one, at_once = RecentIds(bound, capacity=2), RecentIds(bound, capacity=2)
    for table in (one_by_one, at_once):
        table.remember("e-3", True)
        table.remember("held", False)
    for eid, observed in items:
        one_by_one.remember(eid, observed)
    at_once.add_items(items)
    assert at_once.items() == one_by_one.items()
    at_once.add_items([])
    assert at_once.items() == one_by_one.items()
