"""Group membership on Apache Kafka: a static member restarted, a dynamic member leaving.

    python -m bench.membership          # 3 runs of each case, ~6 min
    python -m bench.membership --quick  # 1 run of each, printed

Apache Kafka (the consumer protocol, KIP-848, chosen by the workers at start), 8 partitions,
three ``streambandit serve`` workers A, B and C, probe contexts for every partition at
PROBE_RATE in all, their committed actions read back (read_committed). Each worker's partitions
are followed from its per-partition log lines, as in bench.join.

*Restart*: ``[worker] static_membership = true``. C is SIGKILLed and at once started again under
the same instance id. The others' partitions: their probes' p99 in the STEADY_S before the kill
against those sent from the kill until C's partitions serve again plus MARGIN_S, and every
rebalance line A and B logged in that window. C's partitions: from the restart's process start
until each answers its first probe sent after the kill (decided by whoever holds it then),
against the restart time (process start to its ``worker started`` line) plus 2 s. Under the
default protocol on Apache Kafka (the consumer protocol), and, for contrast, with
``[worker] group_protocol = classic``.

*Leave*: C stops with SIGTERM (it commits, snapshots and leaves the group). From its leave (its
last log line) until each of its partitions answers a probe sent after it, on the others; target
2 s. Under dynamic membership (``static_membership = false``), and, for contrast, as a static
member: a static member that stops cleanly keeps its partitions for ``session.timeout.ms``
(that is what static membership is for: a restart within it gets them back with no rebalance).
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from bench import harness, kafka_io
from bench.handoff import _log_ms, _wait_line
from bench.join import (
    PROTOCOLS,
    _latencies,
    _models_toml,
    _pct,
    held_at,
    partition_events,
    protocol_of,
    settled,
)
from bench.probes import Probes
from streambandit.dev.kafka import ApacheKafka

PARTITIONS = 8
PROBE_RATE = 200.0
STEADY_S = 10.0
MARGIN_S = 3.0
SERVE_WAIT_S = 60.0
TARGET_EXTRA_S = 2.0  # a restart's partitions serve within the restart time plus this
TARGET_LEAVE_S = 2.0
_REBALANCE = re.compile(r"rebalance: |partition (assigned|revoked|lost) partition=")


class Group:
    """Three workers of one group on fresh topics, their logs, and the probes."""

    def __init__(
        self, broker: ApacheKafka, workdir: Path, static: bool, protocol: str = "auto"
    ) -> None:
        self.broker, self.workdir = broker, workdir
        self.t = kafka_io.fresh_topics(broker, partitions=PARTITIONS)
        self.group = f"member-{self.t.contexts}"
        self.cfg = workdir / f"{self.group}.toml"
        self.cfg.write_text(
            kafka_io.worker_toml(
                self.group,
                self.t,
                _models_toml(),
                worker={
                    "snapshot_interval_s": 3600,
                    "static_membership": static,
                    "group_protocol": protocol,
                },
                fetch=kafka_io.fetch_settings(broker),
            )
        )
        self.logs: dict[str, Path] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.probes: Probes | None = None

    def serve(self, w: str, instance: str) -> subprocess.Popen:
        """Worker ``w`` (a log of its own) under ``instance``."""
        self.logs[w] = self.workdir / f"{self.group}-{w}.log"
        self.procs[w] = kafka_io.serve_to_file(
            self.broker,
            self.cfg,
            self.workdir / self.group,
            f"{self.group}-{instance}",
            self.logs[w],
        )
        return self.procs[w]

    def held(self, w: str, t: float) -> set[int]:
        return held_at(partition_events(self.logs[w]), t)

    def start(self) -> None:
        for w in "ABC":
            self.serve(w, w)
        for w in "ABC":
            _wait_line(self.logs[w], r"worker started", 120)
        self.probes = Probes(
            self.broker,
            self.t,
            partitions=PARTITIONS,
            key=lambda i: f"m-{i % PARTITIONS}-{(i // PARTITIONS) % 50}",
            rate=PROBE_RATE,
            group="member-probe",
        )
        deadline = time.monotonic() + 120
        while not settled(h := [self.held(w, time.time()) for w in "ABC"], PARTITIONS) or not all(
            h
        ):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the group never settled: {h}")
            time.sleep(0.2)
        time.sleep(3.0)

    def served_again(self, parts: set[int], after: float) -> dict[int, float | None]:
        """Per partition, when the first action was read for a context of it sent after
        ``after`` (None: not within SERVE_WAIT_S)."""
        deadline = time.monotonic() + SERVE_WAIT_S
        got: dict[int, float | None] = {p: None for p in parts}
        while time.monotonic() < deadline and None in got.values():
            for p in parts:
                if got[p] is None:
                    got[p] = self.probes.first_answer_to_context_after(after, p)
            time.sleep(0.05)
        return got

    def rebalance_lines(self, members: str, t0: float, t1: float) -> list[str]:
        out = []
        for w in members:
            for line in self.logs[w].read_text().splitlines():
                if _REBALANCE.search(line) and t0 <= _log_ms(line) <= t1:
                    out.append(f"{w}: {line[24:].strip()}")
        return out

    def close(self) -> None:
        if self.probes is not None:
            self.probes.close()
        kafka_io.stop_all(self.procs.values(), 60)


def restart_run(broker: ApacheKafka, workdir: Path, run: int, protocol: str) -> dict:
    g = Group(broker, workdir, static=True, protocol=protocol)
    try:
        g.start()
        steady_from = time.time()
        time.sleep(STEADY_S)
        killed_at = time.time()
        own = g.held("C", killed_at)
        others = g.held("A", killed_at) | g.held("B", killed_at)
        g.procs["C"].send_signal(signal.SIGKILL)
        g.procs["C"].wait(30)
        restarted_at = time.time()
        g.serve("C2", "C")  # the same instance id: the same group.instance.id
        line, _ = _wait_line(g.logs["C2"], r"worker started", 120)
        restart_s = _log_ms(line) - restarted_at
        served = g.served_again(own, killed_at)
        back = [s for s in served.values() if s is not None]
        window_end = (max(back) if back else time.time()) + MARGIN_S
        time.sleep(max(0.0, window_end - time.time()) + 2.0)
        now = time.time()
        steady, _ = _latencies(g.probes, others, steady_from, steady_from + STEADY_S, now)
        during, unanswered = _latencies(g.probes, others, killed_at, window_end, now)
        lines = g.rebalance_lines("AB", killed_at, window_end)
        c2_held = g.held("C2", now)
        owners = {p: [w for w in ("A", "B", "C2") if p in g.held(w, now)] for p in own}
        complaints = [
            x[24:].strip()[:300]
            for x in g.logs["C2"].read_text().splitlines()
            if re.match(r"\S+ \S+ (WARNING|ERROR|CRITICAL)", x)
        ][:2]
        ran = protocol_of(g.logs["A"])
    finally:
        g.close()
    serve_s = {p: None if s is None else s - restarted_at for p, s in served.items()}
    worst = None if None in serve_s.values() else max(serve_s.values())
    row = {
        "run": run,
        "own": sorted(own),
        "protocol": ran,
        "own_after": sorted(c2_held),
        "owners_after": owners,
        "restarted_warnings": complaints,
        "restart_s": restart_s,
        "serve_s": serve_s,
        "serve_max_s": worst,
        "target_met": worst is not None and worst <= restart_s + TARGET_EXTRA_S,
        "steady_n": len(steady),
        "steady_p99_ms": _pct(steady, 0.99),
        "during_n": len(during),
        "during_p99_ms": _pct(during, 0.99),
        "unanswered": unanswered,
        "others_rebalance_lines": lines,
    }
    row["p99_ratio"] = row["during_p99_ms"] / row["steady_p99_ms"]
    return row


def leave_run(broker: ApacheKafka, workdir: Path, run: int, static: bool) -> dict:
    g = Group(broker, workdir, static=static)
    try:
        g.start()
        signalled = time.time()
        own = g.held("C", signalled)
        g.procs["C"].send_signal(signal.SIGTERM)
        g.procs["C"].wait(120)
        exited = time.time()
        last = g.logs["C"].read_text().splitlines()
        left = max(_log_ms(x) for x in last if x[:4].isdigit())
        served = g.served_again(own, left)
        taken = {}
        for w in "AB":
            for when, what, p in partition_events(g.logs[w]):
                if what == "assigned" and p in own and when >= signalled:
                    taken.setdefault(p, when)
    finally:
        g.close()
    serve_s = {p: None if s is None else s - left for p, s in served.items()}
    worst = None if None in serve_s.values() else max(serve_s.values())
    return {
        "run": run,
        "static": static,
        "own": sorted(own),
        "stop_s": exited - signalled,
        "exit_after_last_line_s": exited - left,
        "assigned_s": {p: w - left for p, w in taken.items()},
        "serve_s": serve_s,
        "serve_max_s": worst,
        "target_met": worst is not None and worst <= TARGET_LEAVE_S,
    }


CASES = ("restart", "restart_classic", "leave", "static_leave")


def measure(args: argparse.Namespace) -> dict:
    runs = 1 if args.quick else args.runs
    res: dict = {
        "partitions": PARTITIONS,
        "probe_rate": PROBE_RATE,
        "steady_s": STEADY_S,
        "margin_s": MARGIN_S,
        "session_timeout_ms": 6000,  # streambandit.dev.kafka: group.consumer.session.timeout.ms
        **{key: [] for key in CASES},
    }
    with tempfile.TemporaryDirectory() as tmp, ApacheKafka() as broker:
        work = Path(tmp)
        for r in range(runs):
            for key, run in (
                ("restart", lambda: restart_run(broker, work, r + 1, "auto")),
                ("restart_classic", lambda: restart_run(broker, work, r + 1, "classic")),
                ("leave", lambda: leave_run(broker, work, r + 1, static=False)),
                ("static_leave", lambda: leave_run(broker, work, r + 1, static=True)),
            ):
                row = run()
                res[key].append(row)
                print(key, ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    for key in CASES:
        done = [r["serve_max_s"] for r in res[key] if r["serve_max_s"] is not None]
        res[f"{key}_serve_max_s"] = harness.median(done) if done else None
    for key in ("restart", "restart_classic"):
        res[f"{key}_p99_ratio"] = harness.median([r["p99_ratio"] for r in res[key]])
        res[f"{key}_restart_s"] = harness.median([r["restart_s"] for r in res[key]])
    return res


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--runs", type=int, default=3)


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.2f}"


def _parts(xs) -> str:
    return ", ".join(map(str, xs)) or "none"


def _per_partition(d: dict) -> str:
    return ", ".join(f"{p}: {_s(v)}" for p, v in sorted(d.items(), key=lambda kv: int(kv[0])))


def _restart_section(res: dict, key: str, title: str) -> list[str]:
    rows = res[key]
    table = [
        f"| {r['run']} | {_parts(r['own'])} | "
        + "; ".join(f"{p}: {'+'.join(o) or 'none'}" for p, o in sorted(r["owners_after"].items()))
        + f" | {r['restart_s']:.2f} | {_s(r['serve_max_s'])} | "
        f"{'yes' if r['target_met'] else 'NO'} | {r['steady_p99_ms']:.0f} | "
        f"{r['during_p99_ms']:,.0f} | {r['p99_ratio']:.1f} | {len(r['others_rebalance_lines'])} |"
        for r in rows
    ]
    seen = [f"- run {r['run']}: `{x}`" for r in rows for x in r["others_rebalance_lines"]]
    warned = [f"- run {r['run']}: `{x}`" for r in rows for x in r["restarted_warnings"]]
    protocols = sorted({r["protocol"] for r in rows})
    return [
        f"### {title}",
        "",
        "Group protocol (the workers' `group protocol=` line): "
        + "; ".join(PROTOCOLS.get(x, x) for x in protocols)
        + ".",
        "",
        "| run | C's partitions | their owners at the end | restart s | serving s | within "
        "restart + 2 s | others p99 before | others p99 during | during / before | others' "
        "rebalance lines |",
        "|---|---|---|---:|---:|---|---:|---:|---:|---:|",
        *table,
        "",
        f"Medians: restart {res[f'{key}_restart_s']:.2f} s, serving again "
        f"{_s(res[f'{key}_serve_max_s'])} s after the restart's start; the others' p99 during / "
        f"before {res[f'{key}_p99_ratio']:.1f}x.",
        "",
        *(["Rebalance lines A and B logged in the window:", "", *seen, ""] if seen else []),
        *(["Warnings the restarted C logged:", "", *warned, ""] if warned else []),
    ]


def render(res: dict) -> str:
    def leave_rows(key: str) -> list[str]:
        return [
            f"| {r['run']} | {_parts(r['own'])} | {r['stop_s']:.2f} | "
            f"{_per_partition(r['assigned_s']) or 'none'} | {_per_partition(r['serve_s'])} | "
            f"{'yes' if r['target_met'] else 'NO'} |"
            for r in res[key]
        ]

    leave_head = [
        "| run | C's partitions | SIGTERM -> exit s | assigned on A/B, s after the leave | "
        "serving again, s after the leave | within 2 s |",
        "|---|---|---:|---|---|---|",
    ]
    return "\n".join(
        [
            "# Group membership on Apache Kafka: a static restart, a clean leave",
            "",
            harness.provenance(res, "BLAS pinned to one thread."),
            "",
            f"Apache Kafka (one node; session {res['session_timeout_ms']:,} ms, heartbeat "
            f"1,000 ms), {res['partitions']} partitions, workers A, B and C (`streambandit "
            f"serve`), probe contexts at {res['probe_rate']:.0f}/s over all partitions, their "
            "actions read back read_committed; each worker's partitions followed from its "
            "`partition assigned` / `revoked` / `lost` lines. One broker for all runs, fresh "
            "topics and group per run.",
            "",
            "## A static member SIGKILLed and restarted under the same instance id",
            "",
            "`[worker] static_membership = true`. C is SIGKILLed and started again at once with "
            "the same `--instance-id` (so the same `group.instance.id`). *Their owners at the "
            "end*: who holds C's partitions once they serve again (C2: the restarted C). "
            "*restart*: from its process start to its `worker started` line. *serving*: from its "
            "process start until the last of C's partitions answers a probe sent after the kill "
            "(target: restart + 2 s). The others' partitions: the p99 (ms) of their probes in "
            f"the {res['steady_s']:.0f} s before the kill (*before*) and from the kill until C's "
            f"partitions serve plus {res['margin_s']:.0f} s (*during*), and the rebalance lines "
            "(`rebalance:` and per-partition) A and B logged in that window.",
            "",
            *_restart_section(res, "restart", "The default on Apache Kafka: the consumer protocol"),
            *_restart_section(
                res, "restart_classic", "`[worker] group_protocol = classic`, for contrast"
            ),
            "## A worker leaving cleanly (SIGTERM)",
            "",
            "C is sent SIGTERM: it commits, snapshots its partitions and leaves the group. *The "
            "leave*: C's last log line. *Serving again*: until each of its partitions answers a "
            "probe sent after the leave (only A or B can have decided it). The default protocol "
            "(the consumer protocol).",
            "",
            "### Dynamic membership (`static_membership = false`)",
            "",
            *leave_head,
            *leave_rows("leave"),
            "",
            f"Median of the slowest partition: {_s(res['leave_serve_max_s'])} s after the leave.",
            "",
            "### Static membership (`static_membership = true`), for contrast",
            "",
            "A static member that stops cleanly leaves the group as a static member: the group "
            "keeps its partitions for it for `session.timeout.ms` "
            f"({res['session_timeout_ms']:,} ms here), so that a restart within it gets them "
            "back with no rebalance; that is what static membership is. They move only when "
            "the session ends. The 2 s target is the dynamic member's.",
            "",
            *leave_head,
            *leave_rows("static_leave"),
            "",
            f"Median of the slowest partition: {_s(res['static_leave_serve_max_s'])} s after the "
            "leave.",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("membership", __doc__, measure, render, _options))
