"""Freshness: how long a reward takes to reach a replica's model, on the embedded broker.

    python -m bench.freshness           # 2 fetch settings x 3 runs x 15 s at 200 events/s (~4 min)
    python -m bench.freshness --quick   # 1 run of 4 s per setting, prints only

A learn-only worker (``streambandit serve`` with ``[worker] learn_only = true``, a subprocess)
learns from the decisions and rewards a replica (``serving/replica.py``, in this process) logs.
Each event: ``rank`` through the replica, then its reward (aggregation ``first``: the learner
applies it when it arrives) through the replica. Freshness is the time from the reward's
``reward`` call to the moment the replica has applied the joined record of that event (its
``on_update``). d = 20, K = 10, ``oful`` with epsilon 0.1 on 4 model keys, 200 events/s; 3 s of
warm-up are not counted.

What bounds it, by configuration: the learner's fetch of the reward (``fetch.wait.max.ms`` of
``[kafka.consumer]``; the embedded broker waits the whole of it even when records are there,
docs/notes/tansu.md), its batch's transaction commit, and the replica's fetch of the joined record
(the same setting, read from the same file). The benchmark runs two values of that setting.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench import harness, kafka_io, traffic
from streambandit.dev.tansu import EmbeddedBroker

D, K, RATE = traffic.D, traffic.K, 200.0
KEYS = len(traffic.MODEL_KEYS)
FETCH_WAITS = (10, 100)
WARM_S = 3.0
RUNS = 3


def _run(broker: EmbeddedBroker, workdir: Path, fetch_wait: int, seconds: float, seed: int) -> dict:
    from streambandit.config.app import load_worker_config
    from streambandit.config.worker import Topics
    from streambandit.serving.replica import Replica
    from streambandit.stream.snapshots import DirectoryStore

    t0 = kafka_io.fresh_topics(broker)
    t = Topics(
        contexts=t0.contexts,
        decisions=f"dec-{t0.contexts}",
        rewards=t0.rewards,
        actions=t0.actions,
        joined=t0.joined,
        dead_letter=t0.dead_letter,
    )
    broker.create_topics([t.decisions], partitions=traffic.PARTITIONS)
    group = f"fresh-{t.decisions}"
    text = kafka_io.worker_toml(
        group,
        t,
        traffic.models_toml("oful", epsilon=0.1),
        worker={"learn_only": True},
        consumer={"fetch.wait.max.ms": fetch_wait},
    )
    proc = kafka_io.serve(broker, text, workdir, group)
    rewarded: dict[str, float] = {}
    fresh: list[float] = []
    lock = threading.Lock()

    def applied(j) -> None:
        now = time.perf_counter()
        with lock:
            at = rewarded.pop(j.event_id, None)
        if at is not None:
            fresh.append((now - at) * 1e3)

    try:
        kafka_io.wait_for_line(proc, r"partition assigned", traffic.PARTITIONS)
        proc.stderr.close()
        config, _ = load_worker_config(
            workdir / f"{group}.toml", bootstrap_servers=broker.bootstrap_servers
        )
        replica = Replica(
            config, DirectoryStore(workdir / group), on_update=applied, poll_s=fetch_wait / 1e3
        ).start(60)
        rng = np.random.default_rng(seed)
        pool = rng.standard_normal((64, K, D)) / 5
        ids = [f"ad-{k}" for k in range(K)]
        rank_us: list[float] = []
        total = int(RATE * (WARM_S + seconds))
        start = time.perf_counter()
        try:
            for i in range(total):
                delay = start + i / RATE - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                counted = i / RATE >= WARM_S
                a = time.perf_counter()
                replica.rank(f"q{i}", traffic.MODEL_KEYS[i % KEYS], ids, pool[i % 64])
                b = time.perf_counter()
                if counted:
                    rank_us.append((b - a) * 1e6)
                replica.reward(f"q{i}", float(rng.random() < 0.3))
                if counted:
                    with lock:
                        rewarded[f"q{i}"] = time.perf_counter()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with lock:
                    if not rewarded:
                        break
                time.sleep(0.05)
        finally:
            replica.close()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    f, r = np.array(fresh), np.array(rank_us)
    return {
        "fetch_wait_ms": fetch_wait,
        "events": len(rank_us),
        "applied": len(fresh),
        "missing": len(rewarded),
        "fresh_p50_ms": float(np.percentile(f, 50)),
        "fresh_p99_ms": float(np.percentile(f, 99)),
        "fresh_max_ms": float(f.max()),
        "rank_p50_us": float(np.percentile(r, 50)),
        "rank_p99_us": float(np.percentile(r, 99)),
    }


def measure(args: argparse.Namespace) -> dict:
    seconds, runs = (4.0, 1) if args.quick else (15.0, RUNS)
    res: dict = {"d": D, "K": K, "keys": KEYS, "rate": RATE, "seconds": seconds, "runs": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        for run in range(runs):
            for fw in FETCH_WAITS:
                row = _run(broker, Path(tmp), fw, seconds, seed=run) | {"run": run}
                res["runs"].append(row)
                print(", ".join(f"{k} {v:,.2f}" for k, v in row.items()), flush=True)
    return res


def render(res: dict) -> str:
    rows, verdict = [], []
    for fw in FETCH_WAITS:
        mine = [r for r in res["runs"] if r["fetch_wait_ms"] == fw]
        med = {
            k: harness.median([r[k] for r in mine])
            for k in ("fresh_p50_ms", "fresh_p99_ms", "fresh_max_ms", "rank_p50_us", "rank_p99_us")
        }
        missing = sum(r["missing"] for r in mine)
        rows.append(
            f"| {fw} | {len(mine)} | {sum(r['events'] for r in mine):,} | {med['fresh_p50_ms']:.1f} | "
            f"{med['fresh_p99_ms']:.1f} | {med['fresh_max_ms']:.1f} | {missing} | {med['rank_p50_us']:.0f} | "
            f"{med['rank_p99_us']:.0f} |"
        )
        verdict.append(
            f"fetch.wait.max.ms = {fw}: p50 {med['fresh_p50_ms']:.0f} ms, p99 {med['fresh_p99_ms']:.0f} ms "
            f"({med['fresh_p50_ms'] / fw:.1f}x the setting at the median)"
        )
    return "\n".join(
        [
            "# Freshness: a reward through a replica until the replica's model has learned it",
            "",
            harness.provenance(res, "BLAS pinned to one thread."),
            "",
            f"d = {res['d']}, K = {res['K']}, `oful` (epsilon 0.1) on {res['keys']} model keys, "
            f"{res['rate']:.0f} events/s "
            f"(rank + reward each) for {res['seconds']:g} s after {WARM_S:g} s of warm-up, per run. One replica in the "
            "benchmark's process, one learn-only `streambandit serve` worker as a subprocess, "
            "the embedded broker: all on "
            "the machine's two cores. Freshness: the reward's `reward` call returned -> "
            "the replica applied the event's "
            "joined record. Medians over the runs of each run's percentile. Rank times are of calls paced 5 ms apart "
            "(back to back: `python -m bench.decider`).",
            "",
            "| fetch.wait.max.ms | runs | events | freshness p50 ms | p99 ms | max ms | never applied | rank p50 us | "
            "rank p99 us |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "; ".join(verdict) + ".",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("freshness", __doc__, measure, render))
