"""Per-model memory accounting (issue 7; bench/memory.py measures the resident size).

- ``state_nbytes()`` follows each learner's documented formula, and it counts every array a live
  model owns (no hidden per-model scratch arrays outside it).
- What one live model costs beyond ``state_nbytes()`` (Python objects, array headers, its config)
  stays under a stated bound; the bound catches a per-model structure that grows with d or with
  the data. The row-store learners (oful, glb_omd) cost their row's scalars (log det, the update
  count) and a slotted instance, ~80-90 B at d = 20; soful, which keeps its own arrays and sketch
  objects, ~1.1 KiB (bench/results/memory.md).
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from streambandit.benchmarks.ownership import owned, owned_rows
from streambandit.policies.base import make_policy

D = 20
HYPER = {"oful": {}, "glb_omd": {"link": "logistic", "S": 8.0}, "soful": {"sketch_size": 5}}
# Documented state per model, in float64 numbers (module docstrings of oful.py and glb_omd.py).
FORMULA = {"oful": lambda d: d * d + 2 * d, "glb_omd": lambda d: 2 * d * d + d}
# Bytes per model beyond state_nbytes(), traced by tracemalloc. Row store: 8 B per state scalar in
# the row plus the instance (72 B: object header, GC header, five slots); the bound leaves room
# for one more pointer-sized object but not for a per-model array (a d = 20 vector is 160 B of
# data plus a 112 B header).
OVERHEAD_BOUND = {"oful": 128, "glb_omd": 128, "soful": 1536}


def _arms(seed: int, k: int = 10, d: int = D) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(k, d))
    return x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))


def _live(policy: str, seed: int, d: int = D):
    p = make_policy(policy, d, **HYPER[policy])
    x = _arms(seed, d=d)
    p.update(x[p.select(x)], float(seed % 2))
    return p


def _owned_arrays(root, other) -> list[np.ndarray]:
    """The ndarrays (data owners) reachable from ``root`` and not from ``other``."""
    return [o for o in owned(root, [other]) if isinstance(o, np.ndarray) and o.flags.owndata]


@pytest.mark.parametrize("policy", sorted(FORMULA))
@pytest.mark.parametrize("d", [3, 20])
def test_state_nbytes_follows_the_documented_formula(policy, d):
    assert make_policy(policy, d, **HYPER[policy]).state_nbytes() == 8 * FORMULA[policy](d)
    assert _live(policy, 1, d).state_nbytes() == 8 * FORMULA[policy](d)


@pytest.mark.parametrize("policy", sorted(HYPER))
def test_state_nbytes_counts_every_array_a_model_owns(policy):
    p, other = _live(policy, 1), _live(policy, 2)
    rows = owned_rows(p)
    array_rows = sum(v for k, v in rows.items() if k in p._state_arrays)
    assert sum(a.nbytes for a in _owned_arrays(p, other)) + array_rows == p.state_nbytes()
    if rows:  # a row holds the state arrays and the state scalars, 8 bytes each, and nothing else
        assert set(rows) == {*p._state_arrays, "scalars", "count"}
        assert rows["scalars"] + rows["count"] == 8 * len(p._state_scalars)
        assert sum(rows.values()) == p._store.row_nbytes


@pytest.mark.parametrize("policy", sorted(HYPER))
def test_per_model_overhead_beyond_state_is_bounded(policy):
    n = 300
    warm = _live(policy, 0)  # lazy imports and caches; keeps the configuration's row store alive
    store = getattr(warm, "_store", None)
    gc.collect()
    capacity0 = store.capacity if store else 0
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        models = [_live(policy, i) for i in range(n)]
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(models)
    finally:
        tracemalloc.stop()
    if store:
        # tracemalloc counts a new chunk whole, but its rows not yet handed out are np.empty pages
        # never touched (not resident): count the n rows the models hold instead.
        assert all(m._store is store for m in models)
        traced += (n - (store.capacity - capacity0)) * store.row_nbytes
    per_model = traced / n
    state = sum(m.state_nbytes() for m in models) / n
    overhead = per_model - state
    assert 0 < overhead < OVERHEAD_BOUND[policy], (
        f"{policy}: {per_model:.0f} B per model, state {state:.0f} B"
    )
