"""What a reward for an unknown event costs the engine while the early-reward store is full.

    python -m bench.early_rewards            # ~10 s, writes bench/results/early_rewards.{md,json}
    cd OLD_TREE && PYTHONPATH=THIS_CHECKOUT python -m bench.early_rewards --print   # another checkout

A client can send rewards for event ids no context will ever carry: each is held as an early
reward until its window passes, and once ``max_early_rewards`` are held every new one evicts the
oldest (dead-lettered ``unknown_event``). This times ``PartitionEngine.on_reward`` for such
rewards with the store full at several bounds, the worker's default (10,000) among them. A cost
that grows with the bound is a rate any client can impose on a partition. Microseconds per
reward: the minimum over REPEATS runs of N rewards each (short CPU-bound calls; the slower runs
are the shared machine's other work).
"""

from __future__ import annotations

import argparse
import time

from bench import harness
from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import Reward

BOUNDS, N, REPEATS = (100, 1_000, 10_000), 2_000, 5


def _us_per_reward(bound: int) -> float:
    cfg = parse_models_config(
        {
            "models": [
                {
                    "match": "m",
                    "policy": "oful",
                    "dim": 4,
                    "reward_window_ms": 10**9,  # nothing expires: every reward stays early
                    "default_reward": 0.0,
                }
            ]
        }
    )
    best = float("inf")
    for _ in range(REPEATS):
        e = PartitionEngine(cfg, max_early_rewards=bound)
        for i in range(bound):
            e.on_reward(Reward(f"u{i}", "m", 1_000, 1.0))
        start = time.perf_counter()
        for i in range(N):
            e.on_reward(Reward(f"v{i}", "m", 1_000, 1.0))
        best = min(best, (time.perf_counter() - start) / N * 1e6)
        if e.counters["evicted_early"] != N:
            raise RuntimeError(f"expected {N} evictions, got {e.counters['evicted_early']}")
    return best


def measure(args: argparse.Namespace) -> dict:
    bounds = BOUNDS[:2] if args.quick else BOUNDS
    us = {b: _us_per_reward(b) for b in bounds}
    return {"us_per_reward": us, "ratio_to_smallest": {b: us[b] / us[bounds[0]] for b in bounds}}


def render(res: dict) -> str:
    rows = "\n".join(
        f"| {int(b):,} | {us:.1f} | {res['ratio_to_smallest'][b]:.2f} |"
        for b, us in res["us_per_reward"].items()
    )
    return (
        "# A reward for an unknown event, with the early-reward store full\n\n"
        + harness.provenance(res)
        + "\n\nEach reward is held as early and evicts the oldest held one (dead-lettered "
        "`unknown_event`). Minimum over 5 runs of 2,000 rewards.\n\n"
        "| max_early_rewards (held) | us per reward | ratio to the smallest bound, same run |\n"
        "|---:|---:|---:|\n" + rows + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("early_rewards", __doc__, measure, render))
