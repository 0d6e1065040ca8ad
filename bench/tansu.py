"""The embedded broker's behaviours that docs/notes/tansu.md reports, measured again.

    python -m bench.tansu            # ~2 min, writes bench/results/tansu.{md,json}
    python -m bench.tansu --no-demo  # without the 60 s demo CPU sampling

1. Delivery delay of one record to an idle consumer, per ``fetch.wait.max.ms``.
2. Reported high watermark after ten records in one non-transactional batch, and in a transaction.
3. Time to stop on SIGTERM and on SIGINT.
4. Commit time of the worker's transaction pattern (produce to two topics + send offsets) over
   3,000 transactions.
5. CPU share of the broker and of streambandit during a 60 s ``streambandit demo``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench import harness
from streambandit.dev.tansu import EmbeddedBroker


def fetch_delay(b: EmbeddedBroker) -> list[dict]:
    b.create_topics(["probe-fetch"], partitions=1)
    p = Producer({"bootstrap.servers": b.bootstrap_servers, "linger.ms": 0})
    out = []
    for wait in (500, 100, 10):
        c = Consumer(
            {
                "bootstrap.servers": b.bootstrap_servers,
                "group.id": "probe",
                "fetch.wait.max.ms": wait,
                "enable.auto.commit": False,
            }
        )
        c.assign([TopicPartition("probe-fetch", 0, 0)])
        c.consume(100, 1.0)
        lat = []
        for _ in range(15):
            time.sleep(0.137)
            t0 = time.perf_counter()
            p.produce("probe-fetch", b"x")
            p.flush()
            c.consume(1, 5.0)
            lat.append((time.perf_counter() - t0) * 1000)
        c.close()
        out.append({"fetch_wait_ms": wait, "median_ms": statistics.median(lat), "max_ms": max(lat)})
    return out


def high_watermark(b: EmbeddedBroker) -> list[dict]:
    b.create_topics(["probe-batch", "probe-txn"], partitions=1)
    p = Producer({"bootstrap.servers": b.bootstrap_servers, "linger.ms": 50})
    for i in range(10):
        p.produce("probe-batch", b"v%d" % i)
    p.flush()
    tp = Producer(
        {"bootstrap.servers": b.bootstrap_servers, "transactional.id": "probe", "linger.ms": 50}
    )
    tp.init_transactions(10)
    tp.begin_transaction()
    for i in range(10):
        tp.produce("probe-txn", b"v%d" % i)
    tp.commit_transaction(10)
    out = []
    c = Consumer(
        {
            "bootstrap.servers": b.bootstrap_servers,
            "group.id": "probe",
            "enable.partition.eof": True,
        }
    )
    for topic, how in (
        ("probe-batch", "one batch, no transaction"),
        ("probe-txn", "one transaction"),
    ):
        _, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5, cached=False)
        c.assign([TopicPartition(topic, 0, 0)])
        n = 0
        while (m := c.poll(2)) is not None and not m.error():
            n += 1
        c.unassign()
        out.append({"written": how, "records": 10, "high_watermark": hi, "read": n})
    c.close()
    return out


def stop_time() -> list[dict]:
    out = []
    for connected in (False, True):
        for sig in (signal.SIGTERM, signal.SIGINT):
            b = EmbeddedBroker().start()
            client = None
            if connected:
                client = Consumer({"bootstrap.servers": b.bootstrap_servers, "group.id": "probe"})
                client.list_topics(timeout=5)
            proc = b._proc
            t0 = time.monotonic()
            proc.send_signal(sig)
            try:
                proc.wait(timeout=15)
                out.append(
                    {
                        "signal": sig.name,
                        "connected": connected,
                        "seconds": time.monotonic() - t0,
                        "exit_code": proc.returncode,
                    }
                )
            except subprocess.TimeoutExpired:
                out.append(
                    {"signal": sig.name, "connected": connected, "seconds": None, "exit_code": None}
                )
            b.stop()
            del client
    return out


def commit_time(b: EmbeddedBroker) -> list[dict]:
    b.create_topics(["probe-in", "probe-a", "probe-j"], partitions=2)
    c = Consumer(
        {
            "bootstrap.servers": b.bootstrap_servers,
            "group.id": "probe-g",
            "enable.auto.commit": False,
        }
    )
    p = Producer(
        {"bootstrap.servers": b.bootstrap_servers, "transactional.id": "probe-w", "linger.ms": 0}
    )
    p.init_transactions(10)
    out, off = [], 0
    for block in range(6):
        ts = []
        for _ in range(500):
            t0 = time.perf_counter()
            p.begin_transaction()
            for i in range(5):
                p.produce("probe-a", b"x" * 300, partition=i % 2)
                p.produce("probe-j", b"x" * 300, partition=i % 2)
            off += 5
            p.send_offsets_to_transaction(
                [TopicPartition("probe-in", 0, off), TopicPartition("probe-in", 1, off)],
                c.consumer_group_metadata(),
                10,
            )
            p.commit_transaction(10)
            ts.append((time.perf_counter() - t0) * 1000)
        out.append({"transactions": (block + 1) * 500, "median_ms": statistics.median(ts)})
    c.close()
    return out


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _broker_pid(parent: int) -> int | None:
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (
                    "tansu" in (d / "cmdline").read_text()
                    and f" {parent} " in (d / "stat").read_text()
                ):
                    return int(d.name)
            except OSError:
                continue
    return None


def demo_cpu(seconds: int = 60) -> list[dict]:
    with open(os.devnull, "w") as null:
        demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streambandit",
                "demo",
                "--duration",
                str(seconds),
                "--out",
                "/tmp/probe-demo",
            ],
            stdout=null,
            stderr=null,
        )
        time.sleep(3)
        broker = _broker_pid(demo.pid)
        out, last = (
            [],
            (time.monotonic(), _cpu_seconds(demo.pid), _cpu_seconds(broker) if broker else 0.0),
        )
        while demo.poll() is None:
            time.sleep(10)
            try:
                now = (
                    time.monotonic(),
                    _cpu_seconds(demo.pid),
                    _cpu_seconds(broker) if broker else 0.0,
                )
            except OSError:
                break
            dt = now[0] - last[0]
            out.append(
                {
                    "t_s": len(out) * 10 + 10,
                    "broker": (now[2] - last[2]) / dt,
                    "streambandit": (now[1] - last[1]) / dt,
                }
            )
            last = now
        demo.wait()
    return out


def measure(args: argparse.Namespace) -> dict:
    with EmbeddedBroker() as b:
        res = {
            "fetch_delay": fetch_delay(b),
            "high_watermark": high_watermark(b),
            "commit": commit_time(b),
        }
    res["stop"] = stop_time()
    if not args.no_demo:
        res["demo_cpu"] = demo_cpu(20 if args.quick else 60)
    return res


def render(res: dict) -> str:
    stops = [
        f"| {r['signal']} | {'yes' if r['connected'] else 'no'} | "
        + (
            f"{r['seconds']:.2f} | {r['exit_code']} |"
            if r["seconds"] is not None
            else "> 15 | still running |"
        )
        for r in res["stop"]
    ]
    lines = [
        "# The embedded broker (Tansu), probed",
        "",
        harness.provenance(res, "Explained in docs/notes/tansu.md."),
        "",
        "## Delivery delay of one record to an idle consumer (15 records each)",
        "",
        "| fetch.wait.max.ms | median ms | max ms |",
        "|---:|---:|---:|",
        *(
            f"| {r['fetch_wait_ms']} | {r['median_ms']:.0f} | {r['max_ms']:.0f} |"
            for r in res["fetch_delay"]
        ),
        "",
        "## Reported high watermark (ListOffsets) against records delivered",
        "",
        "| written | records | reported high watermark | records a consumer reads |",
        "|---|---:|---:|---:|",
        *(
            f"| {r['written']} | {r['records']} | {r['high_watermark']} | {r['read']} |"
            for r in res["high_watermark"]
        ),
        "",
        "## Time to stop",
        "",
        "| signal | a client connected | seconds | exit code |",
        "|---|---|---:|---:|",
        *stops,
        "",
        "## The worker's commit pattern (10 records over 2 topics x 2 partitions + offsets), median per 500",
        "",
        "| transactions so far | ms per commit |",
        "|---:|---:|",
        *(f"| {r['transactions']} | {r['median_ms']:.1f} |" for r in res["commit"]),
        "",
    ]
    if "demo_cpu" in res:
        lines += [
            "## CPU share over 10 s windows during a `streambandit demo` (500 requests/s)",
            "",
            "| t (s) | broker | streambandit |",
            "|---:|---:|---:|",
            *(
                f"| {r['t_s']} | {r['broker']:.0%} | {r['streambandit']:.0%} |"
                for r in res["demo_cpu"]
            ),
            "",
        ]
    return "\n".join(lines)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--no-demo", action="store_true", help="without the demo's CPU sampling")


if __name__ == "__main__":
    raise SystemExit(harness.main("tansu", __doc__, measure, render, add_arguments=_options))
