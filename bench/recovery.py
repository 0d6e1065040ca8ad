"""What a restart costs: the time to rebuild a partition after SIGKILL, and a model's size in a snapshot.

    python -m bench.recovery            # full run (~3 min), writes bench/results/recovery.{md,json}
    python -m bench.recovery --quick    # a smoke run with small sizes (printed, not written)

1. Recovery: a ``streambandit serve`` subprocess (the worker as deployed) drains a backlog of the
   shared ad traffic (bench/traffic.py) with no periodic snapshot, is killed with SIGKILL, and
   restarts: it rebuilds every partition from the snapshot taken at its first assignment (empty)
   plus the logs, so every joined record is re-applied. Killed again right after, it restarts from
   the snapshot it took on recovery (nothing to re-apply). Times from the worker's log.
2. Snapshot size per model: a partition engine with many models, packed as the worker stores them.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness, kafka_io, traffic
from streambandit.config.models import parse_models_config
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import pack_snapshot

POLICIES = ("oful", "glb_omd")


def recovery(broker: EmbeddedBroker, policy: str, events: list, workdir: Path) -> dict:
    t = kafka_io.fresh_topics(broker)
    ends = kafka_io.produce(broker, t, events)
    group = f"rec-{t.contexts}"
    config = kafka_io.worker_toml(
        group,
        t,
        traffic.models_toml(policy),
        worker={"snapshot_interval_s": 1e9, "snapshot_every_updates": 10**9, "idle_tick_ms": 10**9},
    )
    proc = kafka_io.serve(broker, config, workdir, group)
    kafka_io.wait_for_line(proc, r"partition assigned", traffic.PARTITIONS)
    while not kafka_io.caught_up(broker, group, ends):
        time.sleep(0.5)
    kafka_io.stop(proc, signal.SIGKILL)
    out = {}
    for case in ("from_logs", "from_snapshot"):
        started = time.perf_counter()
        proc = kafka_io.serve(broker, config, workdir, group)
        # From the logs, also the base snapshot of each partition it rebuilt (written off the loop,
        # its line before or after the assignment's), for the next case to start from.
        assigned = r"partition assigned partition=\d+ recovered_in_ms=(\d+)"
        lines = traffic.PARTITIONS * (2 if case == "from_logs" else 1)
        got = kafka_io.wait_for_line(proc, assigned + r"|snapshot partition=\d+ base", lines)
        resumed_s = time.perf_counter() - started
        out[case] = {
            "recover_ms": [int(m.group(1)) for m in got if m.group(1)],
            "restart_to_resumed_s": resumed_s,
        }
        kafka_io.stop(proc, signal.SIGKILL)
    out["joined_replayed"] = len(events)
    return out


def snapshot_bytes_per_model(
    policy: str, dim: int, n_models: int = 100, updates_per_model: int = 50
) -> dict:
    cfg = parse_models_config(traffic.models(policy, 10**12, match="m-*", dim=dim))
    engine = PartitionEngine(cfg)
    rng = np.random.default_rng(0)
    for i in range(n_models):
        model = engine.models[f"m-{i}"] = cfg.resolve(f"m-{i}").build()
        for _ in range(updates_per_model):
            x = rng.standard_normal(dim) / np.sqrt(dim)
            model.update(x, float(rng.random() < 0.1))
    empty = len(pack_snapshot(_snap(PartitionEngine(cfg))))
    full = len(pack_snapshot(_snap(engine)))
    return {
        "bytes_per_model": (full - empty) / n_models,
        "state_nbytes": engine.models["m-0"].state_nbytes(),
        "models": n_models,
    }


def _snap(engine: PartitionEngine) -> dict:
    return {
        "partition": 0,
        "created_ms": 0,
        "contexts_offset": 0,
        "rewards_offset": 0,
        "actions_offset": 0,
        "joined_offset": 0,
        "dead_letter_offset": 0,
        "engine": engine.snapshot(),
    }


def measure(args: argparse.Namespace) -> dict:
    n, repeats = (2000, 1) if args.quick else (20_000, 2)
    res: dict = {
        "d": traffic.D,
        "K": traffic.K,
        "partitions": traffic.PARTITIONS,
        "contexts": n,
        "repeats": repeats,
    }
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        res["recovery"] = {
            p: [recovery(broker, p, traffic.backlog(n, seed=1), Path(tmp)) for _ in range(repeats)]
            for p in POLICIES
        }
    res["snapshot"] = {
        f"{p}@d={d}": snapshot_bytes_per_model(p, d) for p in POLICIES for d in (20, 100)
    }
    return res


def render(res: dict) -> str:
    med = harness.median
    lines = [
        "# What a restart costs",
        "",
        harness.provenance(
            res,
            f"Broker: embedded Tansu (in-memory), same machine. d = {res['d']}, K = {res['K']} arms, "
            f"{res['partitions']} partitions, 4 model keys, transactions on (read_committed).",
        ),
        "",
        f"## Recovery after SIGKILL ({res['contexts']:,} contexts, one model version per joined record)",
        "",
        "`recover` is the worker's own time to rebuild one partition (load the snapshot, read the logs after it, "
        "re-apply the joined records); `restart -> resumed` is from starting the process to both partitions "
        "recovered, group join included. From logs: no periodic snapshot, so every joined record is re-applied; "
        "from snapshot: killed once a recovery stored the snapshots of the partitions it rebuilt. Median of "
        f"{res['repeats']} runs.",
        "",
        "| policy | case | joined re-applied (both partitions) | recover ms per partition (median) | "
        "restart -> resumed s (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for p, runs in res["recovery"].items():
        for case in ("from_logs", "from_snapshot"):
            ms = med([v for x in runs for v in x[case]["recover_ms"]])
            s = med([x[case]["restart_to_resumed_s"] for x in runs])
            n = runs[0]["joined_replayed"] if case == "from_logs" else 0
            lines.append(f"| {p} | {case.replace('_', ' ')} | {n:,} | {ms:,.0f} | {s:.1f} |")
    lines += [
        "",
        "## Snapshot size per model",
        "",
        "Bytes a model adds to its partition's snapshot (100 models, 50 updates each, packed by `pack_snapshot`), "
        "next to the policy's own `state_nbytes()`.",
        "",
        "| policy | d | snapshot bytes per model | state_nbytes |",
        "|---|---:|---:|---:|",
    ]
    for key, v in res["snapshot"].items():
        p, d = key.split("@d=")
        lines.append(f"| {p} | {d} | {v['bytes_per_model']:,.0f} | {v['state_nbytes']:,} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(harness.main("recovery", __doc__, measure, render))
