"""End to end on the embedded broker: the broker's ceiling, the worker's profile, throughput, latency.

    python -m bench.e2e --broker-per-run  # full run (~10 min), writes bench/results/e2e.{md,json}
    python -m bench.e2e --quick         # smoke run with small sizes (printed, not written)
    python -m bench.e2e --only ceiling  # one part (printed, not written): ceiling, codec, profile, throughput,
                                        # hops, latency, floor, snapshot
    python -m bench.e2e --only latency --only floor --max-rate 6767 --broker-per-run  # latency vs its floor

The parts, one module each (its docstring says what it measures):

1.  bench/e2e_ceiling.py     the broker's ceiling: a producer alone, a bare transactional pass-through
2.  bench/e2e_codec.py       decode and encode per record, by wire layout
3.  bench/e2e_profile.py     a cProfile of ``Worker.step()`` draining a backlog, by stage
4.  bench/e2e_throughput.py  one worker draining a backlog, next to the pass-through in the same runs
5a. bench/e2e_hops.py        one record at a time through the pass-through, each hop timed
5.  bench/e2e_latency.py     decision latency at 10/50/90 % of the live maximum (a ``serve`` subprocess)
5b. bench/e2e_latency.py     the same load on the bare pass-through: the floor
6.  bench/e2e_snapshot.py    a snapshot of one partition at half the live maximum
"""

from __future__ import annotations

import argparse
import json
import os

from bench import (
    e2e_ceiling,
    e2e_codec,
    e2e_hops,
    e2e_latency,
    e2e_profile,
    e2e_snapshot,
    e2e_throughput,
    harness,
    traffic,
)
from streambandit.config.worker import WorkerConfig
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.stream.batch import EMIT_EVERY

D, K, PARTITIONS = traffic.D, traffic.K, traffic.PARTITIONS

# The report's sections, in its order (5a, one record at a time, comes before 5).
RENDERERS = (
    ("ceiling", e2e_ceiling.render),
    ("codec", e2e_codec.render),
    ("profile", e2e_profile.render),
    ("throughput", e2e_throughput.render),
    ("hops", e2e_hops.render),
    ("latency", e2e_latency.render_latency),
    ("floor", e2e_latency.render_floor),
    ("snapshot", e2e_snapshot.render),
)


def render(res: dict) -> str:
    partitions = res["partitions"]
    lines = [
        "# End to end on the embedded broker",
        "",
        harness.provenance(
            res,
            "The cores are shared by the broker, the worker, librdkafka's threads and the load "
            "generator (and other jobs: figures are medians and the comparisons are ratios within one "
            f"run). Broker: embedded Tansu (in-memory). d = {res['d']}, K = {res['K']}, {partitions} "
            "partitions, 4 model keys, a reward for every third context; events = input records "
            "(contexts + rewards). Transactions on, read_committed everywhere.",
        ),
        "",
    ]
    for key, part in RENDERERS:
        if key in res:
            lines += part(res)
    return "\n".join(lines) + "\n"


PARTS = ("ceiling", "codec", "profile", "throughput", "hops", "latency", "floor", "snapshot")


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--only", choices=PARTS, action="append", help="run only these parts (printed, not written)"
    )
    ap.add_argument(
        "--max-rate",
        type=float,
        help="contexts/s that latency and floor take fractions of (latency: "
        "no live-maximum probe; floor's default: this run's live maximum, else the one in e2e.json)",
    )
    ap.add_argument(
        "--seconds",
        type=float,
        help="measured seconds per latency / floor run (default 8, --quick 5)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        help="runs per rate and knob set of latency / floor (default 2, --quick 1)",
    )
    ap.add_argument(
        "--broker-per-run", action="store_true", help="each latency / floor run on a fresh broker"
    )


def measure(args: argparse.Namespace) -> dict:
    if args.only:  # a partial result must not replace the whole one in bench/results/
        args.print_only = True
    parts = args.only or PARTS
    repeats, n = (1, 6000) if args.quick else (3, 30_000)
    lat_s = args.seconds or (5.0 if args.quick else 8.0)
    lat_repeats = args.repeats or (1 if args.quick else 2)
    if os.environ.get("E2E_N"):
        n = int(os.environ["E2E_N"])
    res: dict = {
        "d": D,
        "K": K,
        "partitions": PARTITIONS,
        "batch_max_records": WorkerConfig.batch_max_records,
        "emit_every": EMIT_EVERY,
        "snapshot_every_updates": WorkerConfig.snapshot_every_updates,
        "snapshot_interval_s": WorkerConfig.snapshot_interval_s,
        "broker_per_run": args.broker_per_run,
    }
    policies = ("oful", "glb_omd")
    with EmbeddedBroker() as broker:
        if "ceiling" in parts:
            res["ceiling"] = e2e_ceiling.ceiling(broker, n, repeats)
        if "codec" in parts:
            res["codec"] = e2e_codec.codec()
        if "profile" in parts:
            res["profile"] = {p: e2e_profile.profile(broker, p, n // 2) for p in policies}
        if "throughput" in parts:
            res["throughput"] = e2e_throughput.throughput(broker, policies, n, repeats)
        if "hops" in parts:
            res["hops"] = [
                e2e_hops.hops(broker, fetch_wait=fw, linger=lg)
                for fw, lg in ((10, 5), (10, 0), (5, 0), (1, 0))
            ]
        if "latency" in parts:
            tp = res.get("throughput")
            max_ctx = (
                harness.median([x["contexts_per_s"] for x in tp["oful"]["worker"]])
                if tp
                else float(os.environ.get("E2E_MAX_CONTEXTS", 8000))
            )
            knob_sets = e2e_latency.LATENCY_SETS
            if os.environ.get("E2E_KNOBS"):
                knob_sets = json.loads(os.environ["E2E_KNOBS"])
            res["latency_max_contexts_per_s"] = max_ctx
            res["latency"] = e2e_latency.latency(
                broker,
                "oful",
                max_ctx,
                lat_s,
                lat_repeats,
                knob_sets,
                given_max=args.max_rate,
                broker_per_run=args.broker_per_run,
            )
        if "floor" in parts:
            if args.max_rate:
                max_ctx, src = args.max_rate, "given"
            elif "latency" in res:
                max_ctx, src = (
                    res["latency"]["live_max"]["answered_per_s"],
                    "this run's live maximum",
                )
            else:
                max_ctx = harness.load("e2e")["latency"]["live_max"]["answered_per_s"]
                src = "the live maximum recorded in bench/results/e2e.json"
            knob_sets = (
                json.loads(os.environ["E2E_FLOOR_KNOBS"])
                if os.environ.get("E2E_FLOOR_KNOBS")
                else e2e_latency.FLOOR_SETS
            )
            res["floor_max"] = {"contexts_per_s": max_ctx, "from": src}
            res["floor"] = e2e_latency.floor(
                broker, max_ctx, lat_s, lat_repeats, knob_sets, args.broker_per_run
            )
        if "snapshot" in parts:
            live_max = res.get("latency", {}).get("live_max", {}).get("answered_per_s", 11_000)
            res["snapshot"] = e2e_snapshot.snapshot_pause(live_max / 2)
    return res


if __name__ == "__main__":
    raise SystemExit(harness.main("e2e", __doc__, measure, render, add_arguments=_options))
