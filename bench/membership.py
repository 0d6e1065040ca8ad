"""Group membership on Apache Kafka: a static member restarted, a worker leaving.

    python -m bench.membership          # 3 runs of each case, ~8 min
    python -m bench.membership --quick  # 1 run of each, printed

Apache Kafka (the consumer protocol, KIP-848, chosen by the workers at start), 8 partitions,
three ``streambandit serve`` workers A, B and C, probe contexts for every partition at
PROBE_RATE in all, their committed actions read back (read_committed). Each worker's partitions
are followed from its per-partition log lines, as in bench.join.

*Restart*: ``[worker] static_membership = true``. C is stopped and at once started again under
the same instance id. The others' partitions: their probes' p99 in the STEADY_S before the
signal against those sent from the signal until C's partitions serve again plus MARGIN_S, and
every rebalance line A and B logged in that window. C's partitions: from the restart's process
start until each answers its first probe sent after the signal (decided by whoever holds it
then), against the restart time (process start to its ``worker started`` line) plus 2 s. Three
cases:

- SIGKILL, the consumer protocol (the default on Apache Kafka): the broker refuses the restarted
  member the instance id ("The instance ID is still used by another member") until the killed
  member's session ends; the worker joins again each second (its ``joining:`` line) and is in
  once the id is released (its ``joined:`` line).
- SIGTERM, the consumer protocol: a static member that stops cleanly keeps its assignment for
  the session, and the restart under the same instance id gets the same partitions back with no
  rebalance of the others.
- SIGKILL, ``[worker] group_protocol = classic``, for contrast: the classic protocol hands the
  instance id to the new member at once.

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
# What the restarted member logs about its join (stream/worker.py _rejoin_later) or librdkafka's
# fatal error, one line of each kind per run.
_RESTART_LINES = re.compile(r"joining:|joined:|FATAL")


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


def _restart_lines(log: Path) -> list[str]:
    """The first line of each kind in _RESTART_LINES, in the order they came."""
    first: dict[str, str] = {}
    for x in log.read_text().splitlines():
        if m := _RESTART_LINES.search(x):
            first.setdefault(m.group(), x[24:].strip()[:400])
    return list(first.values())


def restart_run(
    broker: ApacheKafka, workdir: Path, run: int, protocol: str, stop: signal.Signals
) -> dict:
    g = Group(broker, workdir, static=True, protocol=protocol)
    try:
        g.start()
        steady_from = time.time()
        time.sleep(STEADY_S)
        killed_at = time.time()
        own = g.held("C", killed_at)
        others = g.held("A", killed_at) | g.held("B", killed_at)
        g.procs["C"].send_signal(stop)
        g.procs["C"].wait(120)
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
        restarted_lines = _restart_lines(g.logs["C2"])
        ran = protocol_of(g.logs["A"])
    finally:
        g.close()
    serve_s = {p: None if s is None else s - restarted_at for p, s in served.items()}
    worst = None if None in serve_s.values() else max(serve_s.values())
    row = {
        "run": run,
        "stop": stop.name,
        "own": sorted(own),
        "protocol": ran,
        "own_after": sorted(c2_held),
        "owners_after": owners,
        "restarted_lines": restarted_lines,
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


RESTARTS = ("restart", "restart_clean", "restart_classic")
CASES = (*RESTARTS, "leave", "static_leave")


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
                ("restart", lambda: restart_run(broker, work, r + 1, "auto", signal.SIGKILL)),
                (
                    "restart_clean",
                    lambda: restart_run(broker, work, r + 1, "auto", signal.SIGTERM),
                ),
                (
                    "restart_classic",
                    lambda: restart_run(broker, work, r + 1, "classic", signal.SIGKILL),
                ),
                ("leave", lambda: leave_run(broker, work, r + 1, static=False)),
                ("static_leave", lambda: leave_run(broker, work, r + 1, static=True)),
            ):
                row = run()
                res[key].append(row)
                print(key, ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    for key in CASES:
        done = [r["serve_max_s"] for r in res[key] if r["serve_max_s"] is not None]
        res[f"{key}_serve_max_s"] = harness.median(done) if done else None
    for key in RESTARTS:
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


def _restart_section(res: dict, key: str, title: str, what: str) -> list[str]:
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
    logged = [f"- run {r['run']}: `{x}`" for r in rows for x in r["restarted_lines"]]
    protocols = sorted({r["protocol"] for r in rows})
    return [
        f"### {title}",
        "",
        what,
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
        *(
            [
                "What the restarted C logged about its join (lines with `joining:`, `joined:` or "
                "`FATAL`, the first of each kind per run):",
                "",
                *logged,
                "",
            ]
            if logged
            else []
        ),
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
            "# Group membership on Apache Kafka: a static restart, a leave",
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
            "## A static member restarted under the same instance id",
            "",
            "`[worker] static_membership = true`. C is stopped (SIGKILL or SIGTERM) and, once "
            "it has exited, started again at once with the same `--instance-id` (so the same "
            "`group.instance.id`). *Their owners at the end*: who holds C's partitions once they "
            "serve again (C2: the restarted C). *restart*: from its process start to its `worker "
            "started` line. *serving*: from its process start until the last of C's partitions "
            "answers a probe sent after the signal (target: restart + 2 s). The others' "
            f"partitions: the p99 (ms) of their probes in the {res['steady_s']:.0f} s before the "
            "signal (*before*) and from the signal until C's partitions serve plus "
            f"{res['margin_s']:.0f} s (*during*), and the rebalance lines (`rebalance:` and "
            "per-partition) A and B logged in that window.",
            "",
            *_restart_section(
                res,
                "restart",
                "SIGKILL, the consumer protocol (the default on Apache Kafka)",
                "The killed member did not leave, so the group still counts its instance id as a "
                "live member: the broker refuses the restarted C's join under that id (\"The "
                "instance ID is still used by another member\") until the killed member's "
                f"session ends ({res['session_timeout_ms']:,} ms). The worker joins again each "
                "second (its `joining:` line) and is in once the id is released (its `joined:` "
                "line). C's partitions serve again only then: on the restarted C if the broker "
                "hands them to it at once, or first on A or B (their rebalance lines) and then "
                "back to C.",
            ),
            *_restart_section(
                res,
                "restart_clean",
                "SIGTERM, the consumer protocol",
                "C stops cleanly (it commits, snapshots and leaves as a static member): the group "
                "keeps its assignment for it for the session, and the restart under the same "
                "instance id gets the same partitions back with no rebalance of the others.",
            ),
            *_restart_section(
                res,
                "restart_classic",
                "SIGKILL, `[worker] group_protocol = classic`, for contrast",
                "Under the classic protocol the broker gives the instance id to the new member "
                "at once, and with it the killed member's partitions.",
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
            "back with no rebalance (the SIGTERM restart above); that is what static "
            "membership is. They move only when the session ends. The 2 s target is the "
            "dynamic member's.",
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
