"""librdkafka's fetcher after an incremental revocation, with no streambandit code in the loop.

    python -m bench.fetch_pause            # 3 runs of each case (~4 min), writes results
    python -m bench.fetch_pause --quick    # 1 run of each, printed

Apache Kafka (one node, ``streambandit.dev.kafka``), a topic of 8 partitions, a producer writing
to every partition every 40 ms. Consumer A (the consumer protocol, KIP-848) holds all 8; consumer
B joins and takes 4. A's revoke callback sleeps ``--callback-s`` (0.3 s: a callback that outlasts
a fetch round trip, as the worker's, which snapshots what it gives up, does). The figure: the
longest time one of the 4 partitions A keeps went without a record, around the rebalance.

*plain*: A does nothing more. *woken*: after the ``poll()`` in which its revoke callback ran, A
asks the partitions' leader for one end offset (``get_watermark_offsets(cached=False)``), as the
worker does (``Worker._wake_fetchers``). librdkafka pauses the whole assignment while the callback
runs; a fetcher that saw the pause sleeps until its next periodic wake-up, up to a second, unless
a request to its broker wakes it: *plain* shows that wait on top of the callback, *woken* the
callback alone.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench import harness
from streambandit.dev.kafka import ApacheKafka

PARTITIONS = 8
STEADY_S = 8.0  # A alone, before B joins
AFTER_S = 6.0  # both, after B's start


def _one(bootstrap: str, topic: str, woken: bool, callback_s: float) -> dict:
    """One rebalance: the longest gap of A's kept partitions around it, and the callback's span."""
    stop = threading.Event()

    def produce() -> None:
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        while not stop.is_set():
            for part in range(PARTITIONS):
                p.produce(topic, b"x", partition=part)
            p.poll(0)
            time.sleep(0.04)
        p.flush(10)

    group = f"g-{topic}"
    settings = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.protocol": "consumer",
        "auto.offset.reset": "latest",
    }
    revoked_at: list[float] = []
    last: dict[int, float] = {}
    gaps: dict[int, float] = {}

    def on_revoke(consumer, parts) -> None:
        revoked_at.append(time.monotonic())
        time.sleep(callback_s)

    a = Consumer(settings)
    a.subscribe([topic], on_revoke=on_revoke)

    def run_b() -> None:
        b = Consumer(settings)
        b.subscribe([topic])
        while not stop.is_set():
            b.poll(0.05)
        b.close()

    threading.Thread(target=produce, daemon=True).start()
    start = time.monotonic()
    b_thread = threading.Thread(target=run_b, daemon=True)
    nudged = b_started = False
    while time.monotonic() < start + STEADY_S + AFTER_S:
        if not b_started and time.monotonic() >= start + STEADY_S:
            b_started = True
            b_thread.start()
        m = a.poll(0.05)
        if revoked_at and woken and not nudged:
            nudged = True
            a.get_watermark_offsets(TopicPartition(topic, 0), timeout=1, cached=False)
        if m is None or m.error():
            continue
        now, p = time.monotonic(), m.partition()
        if revoked_at and p in last and now - last[p] > gaps.get(p, 0.0):
            gaps[p] = now - last[p]
        last[p] = now
    kept = {tp.partition for tp in a.assignment()}
    stop.set()
    b_thread.join(10)
    a.close()
    return {
        "kept": sorted(kept),
        "longest_gap_s": max((gaps.get(p, 0.0) for p in kept), default=0.0),
        "revoked": bool(revoked_at),
    }


def measure(args: argparse.Namespace) -> dict:
    runs = 1 if args.quick else args.runs
    out: dict = {"callback_s": args.callback_s, "runs": {"plain": [], "woken": []}}
    with ApacheKafka() as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
        for r in range(runs):
            for case in ("plain", "woken"):
                topic = f"t-{case}-{r}"
                admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
                res = _one(kafka.bootstrap_servers, topic, case == "woken", args.callback_s)
                out["runs"][case].append(res)
                print(f"run {r} {case}: {res}", flush=True)
    return out


def render(res: dict) -> str:
    lines = [
        "# librdkafka's fetcher after an incremental revocation (plain consumers, no worker)",
        "",
        harness.provenance(res),
        "",
        f"Apache Kafka, one node; a topic of {PARTITIONS} partitions written every 40 ms; A holds "
        f"all, B joins and takes half; A's revoke callback sleeps {res['callback_s']} s. The "
        "longest time one of the partitions A keeps went without a record (s). *woken*: one "
        "end-offset request to the leader after the callback (`Worker._wake_fetchers`).",
        "",
        "| case | runs | longest gap of a kept partition, s (each run) | median |",
        "|---|---:|---|---:|",
    ]
    for case, rows in res["runs"].items():
        gaps = [r["longest_gap_s"] for r in rows if r["revoked"]]
        each = ", ".join(f"{g:.2f}" for g in gaps)
        med = f"{statistics.median(gaps):.2f}" if gaps else "n/a"
        lines.append(f"| {case} | {len(gaps)} | {each} | {med} |")
    lines.append("")
    return "\n".join(lines)


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--callback-s", type=float, default=0.3)


if __name__ == "__main__":
    raise SystemExit(harness.main("fetch_pause", __doc__, measure, render, add_arguments=_options))
