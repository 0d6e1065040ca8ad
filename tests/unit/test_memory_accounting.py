"""Per-model memory accounting (issue 7; bench/bench_memory.py measures the resident size).

- ``state_nbytes()`` follows each learner's documented formula, and it counts every array a live
  model owns (no hidden per-model scratch arrays outside it).
- What one live model costs beyond ``state_nbytes()`` (Python objects, array headers, its config)
  stays under a stated bound: 0.7-1.1 KiB at d = 20 today (bench/results/memory.md); the
  bound catches a per-model structure that grows with d or with the data.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import numpy as np
import pytest

from streambandit.benchmarks.ownership import owned
from streambandit.policies.base import make_policy

D = 20
HYPER = {"oful": {}, "glb_omd": {"link": "logistic", "S": 8.0}, "soful": {"sketch_size": 5}}
# Documented state per model, in float64 numbers (module docstrings of oful.py and glb_omd.py).
FORMULA = {"oful": lambda d: d * d + 2 * d, "glb_omd": lambda d: 2 * d * d + d}
OVERHEAD_BOUND = 1536  # bytes per model beyond state_nbytes(), traced by tracemalloc (today: 0.7-1.1 KiB)


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
    assert sum(a.nbytes for a in _owned_arrays(p, other)) == p.state_nbytes()


@pytest.mark.parametrize("policy", sorted(HYPER))
def test_per_model_overhead_beyond_state_is_bounded(policy):
    n = 300
    _live(policy, 0)  # lazy imports and caches
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        models = [_live(policy, i) for i in range(n)]
        gc.collect()
        per_model = (tracemalloc.get_traced_memory()[0] - before - sys.getsizeof(models)) / n
    finally:
        tracemalloc.stop()
    state = sum(m.state_nbytes() for m in models) / n
    overhead = per_model - state
    assert 0 < overhead < OVERHEAD_BOUND, f"{policy}: {per_model:.0f} B per model, state {state:.0f} B"
