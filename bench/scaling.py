"""Events/s of 1, 2 and 4 workers on 8 partitions from one command, and per worker CPU-second.

    python -m bench.scaling                   # both brokers, ~12 min, writes bench/results/scaling.{md,json}
    python -m bench.scaling --broker kafka    # Apache Kafka only
    python -m bench.scaling --quick           # small backlog, one repeat, printed only

Each run: fresh topics of 8 partitions holding a backlog (the ad traffic of bench/traffic.py,
d = 20, K = 10, on 64 placements so that every partition has work, a click for every third
request; oful), drained by ``streambandit serve --processes W`` with transactions on, as deployed.
The rate is taken between 10 % and 90 % of the backlog committed (the group's committed input
offsets), so the start-up and the group's first rebalances are not in it; over the same window
the CPU seconds of the worker processes and of the broker (from /proc). On the embedded broker
(Tansu) and on Apache Kafka (one node, ``streambandit.dev.kafka.ApacheKafka``; the workers join
with the consumer protocol, KIP-848). This machine has 2 cores, which the broker shares: 4
workers are CPU-bound here, the absolute rates are this machine's; the ratio to one worker,
measured in the same run, and the events per worker CPU-second are what carry over.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import harness, kafka_io, traffic

PARTITIONS = 8
PLACEMENTS = 64
WORKERS = (1, 2, 4)
KINDS = ("tansu", "kafka")
NAMES = {"tansu": "Embedded broker (Tansu)", "kafka": "Apache Kafka"}


def events(n: int) -> list:
    """The ad-traffic backlog with its requests spread over PLACEMENTS model keys."""
    out = []
    for i, (ctx, rew) in enumerate(traffic.backlog(n)):
        key = f"placement-{i % PLACEMENTS}"
        out.append(
            (
                dataclasses.replace(ctx, model_key=key),
                rew and dataclasses.replace(rew, model_key=key),
            )
        )
    return out


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += kafka_io.broker_cpu(pid)
        except FileNotFoundError:
            pass
    return total


def committed(broker: kafka_io.Broker, group: str, ends: dict) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        got = c.committed([TopicPartition(topic, p) for topic, p in ends], timeout=10)
        return sum(max(tp.offset, 0) for tp in got)
    finally:
        c.close()


def one_run(broker: kafka_io.Broker, workers: int, evs: list, workdir: Path) -> dict:
    t = kafka_io.fresh_topics(broker, partitions=PARTITIONS)
    ends = kafka_io.produce(broker, t, evs)
    total = sum(ends.values())
    group = f"scale-{workers}-{t.contexts}"
    cfg = workdir / f"{group}.toml"
    cfg.write_text(
        kafka_io.worker_toml(
            group, t, traffic.models_toml("oful"), fetch=kafka_io.fetch_settings(broker)
        )
    )
    log = open(workdir / f"{group}.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "-v",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--snapshot-dir",
            str(workdir / group),
            "--processes",
            str(workers),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    broker_pid = kafka_io.broker_pid(broker)
    marks: dict[str, tuple[float, int, float, float]] = {}
    try:
        deadline = time.monotonic() + 600
        while "end" not in marks:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(
                    f"{workers} workers: {committed(broker, group, ends)} of {total} committed; "
                    f"log {workdir / f'{group}.log'}"
                )
            pids = [proc.pid, *_children(proc.pid)]  # the supervisor (W > 1) and its workers
            done = committed(broker, group, ends)
            now, cpu_w, cpu_b = time.perf_counter(), _cpu(pids), kafka_io.broker_cpu(broker_pid)
            if "start" not in marks and done >= 0.1 * total:
                marks["start"] = (now, done, cpu_w, cpu_b)
            if "start" in marks and done >= 0.9 * total:
                marks["end"] = (now, done, cpu_w, cpu_b)
            time.sleep(0.05)
    finally:
        kafka_io.stop(proc)
        log.close()
    (t0, d0, w0, b0), (t1, d1, w1, b1) = marks["start"], marks["end"]
    seconds = t1 - t0
    out = {
        "workers": workers,
        "events": d1 - d0,
        "seconds": seconds,
        "events_per_s": (d1 - d0) / seconds,
        "worker_cpu_s": w1 - w0,
        "broker_cpu_s": b1 - b0,
        "events_per_worker_cpu_s": (d1 - d0) / (w1 - w0),
    }
    print(
        f"{workers} workers: {out['events_per_s']:,.0f} events/s, {out['events_per_worker_cpu_s']:,.0f} per worker "
        f"CPU-s (workers {out['worker_cpu_s'] / seconds:.2f} cores, broker {out['broker_cpu_s'] / seconds:.2f})",
        flush=True,
    )
    return out


def _rows(runs: dict[int, list]) -> list[dict]:
    rows = []
    for w in WORKERS:
        rs = runs[w]
        rows.append(
            {
                "workers": w,
                "events_per_s": harness.median([r["events_per_s"] for r in rs]),
                "events_per_worker_cpu_s": harness.median(
                    [r["events_per_worker_cpu_s"] for r in rs]
                ),
                "worker_cores": harness.median([r["worker_cpu_s"] / r["seconds"] for r in rs]),
                "broker_cores": harness.median([r["broker_cpu_s"] / r["seconds"] for r in rs]),
                "broker_cpu_s_per_million": harness.median(
                    [r["broker_cpu_s"] / r["events"] * 1e6 for r in rs]
                ),
                "runs": rs,
            }
        )
    one = rows[0]["events_per_s"]
    for r in rows:
        r["ratio_to_one_worker"] = r["events_per_s"] / one
    return rows


def measure(a: argparse.Namespace) -> dict:
    n = 20_000 if a.quick else a.contexts
    repeats = 1 if a.quick else a.repeats
    kinds = KINDS if a.broker == "both" else (a.broker,)
    evs = events(n)
    out: dict = {
        "contexts": n,
        "repeats": repeats,
        "partitions": PARTITIONS,
        "placements": PLACEMENTS,
        "brokers": {},
    }
    for kind in kinds:
        runs: dict[int, list] = {w: [] for w in WORKERS}
        with kafka_io.BROKERS[kind]() as broker, tempfile.TemporaryDirectory() as tmp:
            # Interleaved, so that a slow spell of the machine hits every count alike.
            for _ in range(repeats):
                for w in WORKERS:
                    print(kind, end=": ", flush=True)
                    runs[w].append(one_run(broker, w, evs, Path(tmp)))
        out["brokers"][kind] = {"rows": _rows(runs)}
    return out


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--contexts", type=int, default=120_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--broker", choices=(*KINDS, "both"), default="both")


def _section(kind: str, b: dict) -> list[str]:
    rows = b["rows"]
    lines = [
        f"## {NAMES[kind]}",
        "",
        "| workers | events/s | ratio to 1 worker | events per worker CPU-second | worker cores busy "
        "| broker cores busy | broker CPU-s per million events |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workers']} | {r['events_per_s']:,.0f} | {r['ratio_to_one_worker']:.2f} | "
            f"{r['events_per_worker_cpu_s']:,.0f} | {r['worker_cores']:.2f} | "
            f"{r['broker_cores']:.2f} | {r['broker_cpu_s_per_million']:,.1f} |"
        )
    low = min(rows, key=lambda r: r["events_per_worker_cpu_s"])  # the cautious one
    per_cpu = low["events_per_worker_cpu_s"]
    cores = 1_000_000 / per_cpu
    broker = max(r["broker_cpu_s_per_million"] for r in rows)
    one = rows[0]
    lines += [
        "",
        f"**For 1,000,000 events/s**, from the lowest events per worker CPU-second above "
        f"({per_cpu:,.0f}, {low['workers']} worker{'s' if low['workers'] > 1 else ''}): "
        f"1,000,000 / {per_cpu:,.0f} = {cores:,.1f} worker cores busy, so about "
        f"{math.ceil(cores):,} worker processes at one core each, and at least as many partitions of "
        "`contexts` and `rewards` (a partition is served by one worker at a time; 1.5-2x that "
        "many leaves room to rebalance evenly and to grow). One worker alone ran "
        f"{one['events_per_s']:,.0f} events/s on {one['worker_cores']:.2f} cores: "
        f"1,000,000 / {one['events_per_s']:,.0f} = {1_000_000 / one['events_per_s']:,.1f} "
        f"workers at that rate. The broker here spent up to {broker:,.1f} CPU-seconds per "
        f"million events, so 1,000,000 events/s is {broker:,.1f} broker cores at this "
        "machine's per-event cost, spread over the brokers of the cluster.",
        "",
    ]
    return lines


def render(res: dict) -> str:
    lines = [
        "# Scaling: 1, 2 and 4 workers on 8 partitions",
        "",
        harness.provenance(
            res,
            f"A backlog of {res['contexts']:,} contexts "
            f"(and a click for every third) on {res['placements']} placements, oful, d = 20, "
            f"K = 10; `streambandit serve --processes W`, transactions on; the broker on the same "
            f"machine; medians of {res['repeats']} runs, taken between 10 % and 90 % of the "
            "backlog committed. On Apache Kafka (one node) the workers join with the consumer "
            "protocol (KIP-848); on the embedded broker with the classic protocol.",
        ),
        "",
        "The machine has 2 cores and the broker needs a share of them: 2 workers already compete "
        "with the broker for them, and 4 workers are CPU-bound, dividing the same cores. The "
        "events per worker CPU-second are the figure that carries over to a machine with a core "
        "per worker.",
        "",
    ]
    for kind in KINDS:
        if kind in res["brokers"]:
            lines += _section(kind, res["brokers"][kind])
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("scaling", __doc__, measure, render, _options))
