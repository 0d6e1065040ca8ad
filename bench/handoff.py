"""A partition with 100,000 models moves to another worker: how soon it serves again.

    python -m bench.handoff            # oful and glb_omd, a clean leave and a SIGKILL, 100,000 models (~5 min)
    python -m bench.handoff --quick    # 10,000 models, oful only, printed

One partition. Its state, N models (d = 20, one decision and update each), is built in this
process and stored as a worker stores a base snapshot in the group's snapshot directory, so that
worker A (``streambandit serve``) starts by recovering it; worker B, a second ``serve``, joins the
group (and may take the partition at its join: the range assignor gives it to the member whose id
sorts first). Probe contexts for the partition's models flow at 100/s, and their committed actions
are read back. Then the worker holding the partition leaves (SIGTERM: it commits, snapshots and
leaves the group) or dies (SIGKILL: the group notices after ``session.timeout.ms``, 6 s), and the
other is assigned it; from the taker's log, the time from that assignment to the partition
recovered (its snapshot loaded and the joined log after it re-applied) and to the first probe it
answered (the first action read back after the assignment). The group's own join time, before the
assignment, is not counted: the issue's target is 2 s from the assignment.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

from bench import harness, kafka_io, traffic
from bench.memory import HYPER, WINDOW_MS, D, K, close_windows, feature_pool, run_engine
from bench.probes import Probes
from streambandit.dev.tansu import EmbeddedBroker

PROBE_RATE = 100.0
TARGET_S = 2.0


def _models_toml(policy: str) -> str:
    hyper = "".join(f"{k} = {traffic.toml_value(v)}\n" for k, v in HYPER[policy].items())
    return (
        f'[[models]]\nmatch = "m-*"\npolicy = "{policy}"\ndim = {D}\nreward_window_ms = {WINDOW_MS}\n'
        f'default_reward = 0.0\naggregation = "first"\n'
        + (f"[models.hyper]\n{hyper}" if hyper else "")
    )


def packed_state(policy: str, n: int) -> tuple[bytes, float]:
    """N models in one partition's base snapshot, packed as the worker packs it; seconds to pack."""
    from streambandit.wire import pack_snapshot

    engine = run_engine(policy, n, feature_pool())
    close_windows(engine)
    head = {
        "partition": 0,
        "created_ms": int(time.time() * 1000),
        "chain": 1,
        "seq": 0,
        "contexts_offset": 0,
        "rewards_offset": 0,
        "actions_offset": 0,
        "joined_offset": 0,
        "dead_letter_offset": 0,
    }
    started = time.perf_counter()
    data = pack_snapshot(head | {"engine": engine.snapshot()})
    took = time.perf_counter() - started
    del engine
    gc.collect()
    return data, took


def _log_ms(line: str) -> float:
    """The wall time (s) a worker's log line was written (its leading timestamp)."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def _wait_line(path: Path, pattern: str, timeout_s: float, after: int = 0) -> tuple[str, int]:
    """The first line of the log file at ``path`` matching ``pattern`` from line ``after`` on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines() if path.exists() else []
        for i, line in enumerate(lines[after:], start=after):
            if re.search(pattern, line):
                return line, i
        time.sleep(0.05)
    raise TimeoutError(f"no {pattern!r} in {path} within {timeout_s} s:\n" + "\n".join(lines[-15:]))


def _holder_after_join(logs: dict[str, Path], a_before: int) -> str:
    """Which of A and B holds the partition once B has joined: the range assignor gives it to the
    member whose id sorts first, so B may have taken it at its join. B may then still be
    recovering it, or A still giving it up (its revoke snapshots the partition): the partition
    has moved when A revoked it after B started and did not get it back, and B holds it once
    recovered."""
    a_lines = logs["A"].read_text().splitlines()[a_before:]
    a_gave_up = False
    for line in a_lines:
        if re.search(r"rebalance: (revoked|lost) partitions=\[0\]", line):
            a_gave_up = True
        elif re.search(r"rebalance: assigned partitions=\[0\]", line):
            a_gave_up = False
    if not a_gave_up and "rebalance: assigned partitions=[0]" not in logs["B"].read_text():
        return "A"
    _wait_line(logs["B"], r"partition assigned partition=0", 300)
    return "B"


def one_case(
    broker: kafka_io.Broker,
    workdir: Path,
    policy: str,
    n: int,
    how: str,
    *,
    packed: tuple[bytes, float] | None = None,
    snapshot_topic: Callable[[kafka_io.Broker, str], None] | None = None,
) -> dict:
    """One handoff. ``packed``: the state (``packed_state``), built here when None.
    ``snapshot_topic``: the workers keep their snapshots in a topic, which this creates
    (``snapshot_topic(broker, name)``), instead of the snapshot directory."""
    from streambandit.stream.snapshots import DirectoryStore, TopicStore

    t = kafka_io.fresh_topics(broker, partitions=1)
    group = f"handoff-{t.contexts}"
    data, pack_s = packed or packed_state(policy, n)
    fetch = kafka_io.fetch_settings(broker)
    topic = None
    if snapshot_topic is not None:
        topic = f"s-{t.contexts}"
        snapshot_topic(broker, topic)
        with TopicStore(broker.bootstrap_servers, topic, kafka={"consumer": fetch}) as store:
            store.scoped(group).save(0, data)
    else:
        DirectoryStore(workdir / group).scoped(group).save(0, data)
    del data
    cfg = workdir / f"{group}.toml"
    cfg.write_text(
        kafka_io.worker_toml(
            group, t, _models_toml(policy), worker={"snapshot_interval_s": 3600}, fetch=fetch
        )
    )
    logs = {w: workdir / f"{group}-{w}.log" for w in "AB"}

    def serve(w: str) -> subprocess.Popen:
        return kafka_io.serve_to_file(
            broker, cfg, workdir / group, f"{group}-{w}", logs[w], snapshot_topic=topic
        )

    procs = {"A": serve("A")}
    probes = None
    try:
        line, _ = _wait_line(logs["A"], r"partition assigned partition=0", 300)
        a_recovered_ms = int(re.search(r"recovered_in_ms=(\d+)", line).group(1))
        probes = Probes(
            broker,
            t,
            partitions=1,
            key=lambda i: f"m-{(i * 7919) % n}",
            rate=PROBE_RATE,
            group="handoff-probe",
        )
        a_before = len(logs["A"].read_text().splitlines())
        procs["B"] = serve("B")
        _wait_line(logs["B"], r"worker started", 120)
        time.sleep(8.0)  # B joins the group while the probes flow
        holder = _holder_after_join(logs, a_before)
        taker = "A" if holder == "B" else "B"
        after = len(logs[taker].read_text().splitlines())
        if how == "kill":
            # No transaction of the holder's may be open at the kill: the embedded broker never ends
            # a dead producer's transaction (docs/notes/tansu.md; Apache Kafka aborts it at
            # transaction.timeout.ms), and the taker's recovery would wait for it. The probes pause
            # while the holder commits what it has, and go on once it is dead.
            probes.paused.set()
            time.sleep(1.0)
        procs[holder].send_signal(signal.SIGTERM if how == "leave" else signal.SIGKILL)
        procs[holder].wait(120)
        stopped = time.time()
        probes.paused.clear()
        line, _ = _wait_line(logs[taker], r"rebalance: assigned partitions=\[0\]", 120, after=after)
        assigned = _log_ms(line)
        line, _ = _wait_line(logs[taker], r"partition assigned partition=0", 300, after=after)
        recovered_ms = int(re.search(r"recovered_in_ms=(\d+)", line).group(1))
        joined_line = re.search(r"models=(\d+)", line)
        deadline = time.monotonic() + 60
        # The first action read after the assignment is the taker's: the holder, revoked or dead
        # before it, committed its last ones earlier, and they were read within a fetch.
        while (
            served := probes.first_answer_after(assigned)
        ) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if probes is not None:
            probes.close()
        kafka_io.stop_all(procs.values(), 120)
    return {
        "policy": policy,
        "models": n,
        "how": how,
        "pack_s": pack_s,
        "a_recovered_ms": a_recovered_ms,
        "stop_to_assign_s": assigned - stopped,
        "recovered_ms": recovered_ms,
        "assign_to_serve_s": None if served is None else served - assigned,
        "taker_models": int(joined_line.group(1)) if joined_line else None,
        "taker": taker,
    }


def measure(args: argparse.Namespace) -> dict:
    n = 10_000 if args.quick else 100_000
    policies = ("oful",) if args.quick else ("oful", "glb_omd")
    res: dict = {"models": n, "d": D, "K": K, "probe_rate": PROBE_RATE, "cases": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        for policy in policies:
            for how in ("leave", "kill"):
                row = one_case(broker, Path(tmp), policy, n, how)
                res["cases"].append(row)
                print(", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    return res


def render(res: dict) -> str:
    rows, verdict = [], []
    for r in res["cases"]:
        serve = r["assign_to_serve_s"]
        rows.append(
            f"| {r['policy']} | {r['how']} | {r.get('taker', 'B')} | {r['models']:,} | {r['stop_to_assign_s']:.1f} | "
            f"{r['recovered_ms']:,} | "
            + ("no probe answered" if serve is None else f"{serve:.2f}")
            + " |"
        )
        if serve is not None:
            verdict.append(
                f"{r['policy']} ({'clean leave' if r['how'] == 'leave' else 'SIGKILL'}): {serve:.2f} s, the "
                f"{TARGET_S:g} s target {'met' if serve <= TARGET_S else 'NOT met'}"
            )
    return "\n".join(
        [
            "# A partition with many models moves to another worker",
            "",
            harness.provenance(res, "BLAS pinned to one thread."),
            "",
            f"One partition holding {res['models']:,} models (d = {res['d']}, K = {res['K']}), "
            "stored as a base snapshot "
            "in the group's snapshot directory; worker A (`streambandit serve`) recovers it and serves probe contexts "
            f"({res['probe_rate']:.0f}/s) for those models; worker B joins the group (and may take the partition at "
            "its join). The worker holding it then "
            "leaves (SIGTERM) or is killed (SIGKILL), "
            "and the other one takes it. *stop -> assigned*: the holder's exit until the taker's log says it was "
            "assigned the partition (negative when the taker had it before the holder's process ended). *recovered*: "
            "the taker's own time from the assignment to the partition "
            "rebuilt (snapshot loaded, the joined log after it re-applied). "
            "*assigned -> serving*: from the assignment to "
            "the first action read back (read_committed) after it, which only the taker can have written. For the "
            "SIGKILL the probes pause for a second before it and resume after it, so that no "
            "transaction of the holder's is open when it dies "
            "(why: docs/architecture.md, instance ids). One run per case.",
            "",
            "| policy | the holder stops by | taker | models | stop -> assigned s | recovered ms "
            "| assigned -> serving s |",
            "|---|---|---|---:|---:|---:|---:|",
            *rows,
            "",
            "; ".join(verdict) + ".",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("handoff", __doc__, measure, render))
