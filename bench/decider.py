"""The in-process Decider: microseconds per ``rank`` and per ``reward``, and events per second.

    python -m bench.decider            # 20,000 requests x 3 runs (~1 min), writes results
    python -m bench.decider --quick    # 2,000 requests, prints only

d = 20, K = 10 arms given as ids and a matrix, `oful` with epsilon 0.1 on 4 model keys, a reward
for one request in two (the rest close with the default reward when their 1 s window passes),
event time 1 ms per request. Each call is timed alone (``perf_counter_ns``); p50 and p99 over the
calls of a run, median over the runs. The bare learner (``select`` + ``update`` of the same
model, no engine) is timed in the same run as the reference: what the Decider adds is the
engine's bookkeeping (windows, the exploration draw, the records).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bench import harness
from streambandit import Decider, make_policy

D, K, KEYS = 20, 10, 4
TARGET_P99_US = 100.0  # each call
TARGET_RANK_P99_US = 20.0  # rank, on an idle machine
MODELS = {
    "models": [
        {
            "match": "ads-*",
            "policy": "oful",
            "dim": D,
            "reward_window_ms": 1_000,
            "default_reward": 0.0,
            "epsilon": 0.1,
        }
    ]
}


def _run(n: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    arms = rng.standard_normal((n, K, D)) / np.sqrt(D)
    clicks = rng.random(n) < 0.5
    ids = tuple(f"ad-{k}" for k in range(K))
    d = Decider(MODELS)
    rank_ns, reward_ns = np.empty(n, dtype=np.int64), []
    start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter_ns()
        r = d.rank(f"req-{i}", f"ads-{i % KEYS}", ids, arms[i], timestamp_ms=i)
        t1 = time.perf_counter_ns()
        rank_ns[i] = t1 - t0
        if clicks[i]:
            t0 = time.perf_counter_ns()
            d.reward(r.event_id, 1.0, timestamp_ms=i)
            reward_ns.append(time.perf_counter_ns() - t0)
    seconds = time.perf_counter() - start
    bare = make_policy("oful", dim=D)
    bare_ns = np.empty(n, dtype=np.int64)
    for i in range(n):
        t0 = time.perf_counter_ns()
        j = bare.select(arms[i])
        bare.update(arms[i, j], float(clicks[i]))
        bare_ns[i] = time.perf_counter_ns() - t0
    rw = np.array(reward_ns)
    return {
        "rank_p50_us": np.percentile(rank_ns, 50) / 1e3,
        "rank_p99_us": np.percentile(rank_ns, 99) / 1e3,
        "reward_p50_us": np.percentile(rw, 50) / 1e3,
        "reward_p99_us": np.percentile(rw, 99) / 1e3,
        "events_per_s": (n + len(rw)) / seconds,
        "requests_per_s": n / seconds,
        "bare_p50_us": np.percentile(bare_ns, 50) / 1e3,
        "bare_p99_us": np.percentile(bare_ns, 99) / 1e3,
    }


def measure(args: argparse.Namespace) -> dict:
    n, repeats = (2_000, 1) if args.quick else (20_000, 3)
    load_before = os.getloadavg()[0]
    runs = []
    for r in range(repeats):
        runs.append(_run(n, r))
        print(", ".join(f"{k} {v:,.1f}" for k, v in runs[-1].items()), flush=True)
    return {
        "d": D,
        "K": K,
        "keys": KEYS,
        "requests": n,
        "repeats": repeats,
        "runs": runs,
        # The tail of a microseconds call is the machine's other work as much as the call's.
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }


def render(res: dict) -> str:
    med = {k: harness.median([r[k] for r in res["runs"]]) for k in res["runs"][0]}
    verdict = (
        "met"
        if med["rank_p99_us"] < TARGET_P99_US and med["reward_p99_us"] < TARGET_P99_US
        else "not met"
    )
    rank_verdict = "met" if med["rank_p99_us"] <= TARGET_RANK_P99_US else "not met"
    load = res.get("load_average_1min")
    load_note = (
        f" 1-minute load average {load[0]:.2f} at the start and {load[1]:.2f} at the end, on "
        f"{res['machine'].get('cores', '?')} cores (above 1, other work shared the machine)."
        if load
        else ""
    )
    return "\n".join(
        [
            "# The in-process Decider: rank and reward",
            "",
            harness.provenance(res, "BLAS pinned to one thread."),
            "",
            f"d = {res['d']}, K = {res['K']} arms (ids and a matrix), `oful` with epsilon 0.1 on "
            f"{res['keys']} model keys, "
            f"a reward for one request in two; {res['requests']:,} requests per run, "
            f"median of {res['repeats']} runs of "
            "each run's percentiles. *bare learner*: `select` + `update` of a lone `oful`, timed in the same run.",
            "",
            "| call | p50 us | p99 us |",
            "|---|---:|---:|",
            f"| rank | {med['rank_p50_us']:.1f} | {med['rank_p99_us']:.1f} |",
            f"| reward | {med['reward_p50_us']:.1f} | {med['reward_p99_us']:.1f} |",
            f"| bare learner select + update | {med['bare_p50_us']:.1f} | {med['bare_p99_us']:.1f} |",
            "",
            f"{med['requests_per_s']:,.0f} requests/s "
            f"({med['events_per_s']:,.0f} rank and reward calls/s) on one core. "
            f"The target of a p99 under {TARGET_P99_US:g} us for each call is {verdict}; that of "
            f"rank's p99 <= {TARGET_RANK_P99_US:g} us on an idle machine is {rank_verdict}. Rank's "
            f"p50 is {med['rank_p50_us'] / med['bare_p50_us']:.1f}x the bare learner's select + "
            f"update.{load_note}",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("decider", __doc__, measure, render))
