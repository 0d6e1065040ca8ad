"""The engine's rules per event: in Python, and in the compiled pass over arrays.

    python -m bench.engine_pass            # ~30 min on 2 cores, writes bench/results/engine_pass.{md,json}
    python -m bench.engine_pass --quick    # 300 contexts, printed only

The same records (bench/traffic.py's ad-traffic backlog, per partition in the order the merge
releases them, d = 20, K = 10) go through three implementations of the engine's rules, each alone:

1. ``python``: engine/partition.py's ``PartitionEngine``, a call per record (the worker's engine
   stage today);
2. ``arrays``: engine/array_partition.py's ``ArrayPartitionEngine.process`` on runs of 256 records
   (the worker's hand-over size): the records' columns built in Python from the records, the
   compiled pass (engine/compiled_pass.py), its outputs made into Action and Joined objects;
3. ``pass``: the same with the columns built beforehand and the outputs left as columns: the
   rules' own cost once the decoder writes the columns and the encoders read them.

Each is counted by callgrind (instructions per event, and of them numba's compiled code: the
learners' kernels and the pass), as bench.worker_instructions counts, and timed (CPU time of the
thread, median of REPEATS runs, all in one process). The outputs of 2 and 3 are the Python
engine's, byte for byte (tests/unit/engine/test_compiled_pass.py).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness, traffic

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("oful", "glb_omd")
LEVELS = ("python", "arrays", "pass")
RUN = 256  # records per call of process: the worker's hand-over (stream/batch.py, EMIT_EVERY)
REPEATS = 5


def streams(n: int) -> list[list]:
    """Per partition, the backlog's records with their sources, in the merge's release order
    (event time: the backlog is in it)."""
    from streambandit.wire import InputRef

    parts: list[list] = [[] for _ in range(traffic.PARTITIONS)]
    offsets = [[0, 0] for _ in range(traffic.PARTITIONS)]
    for ctx, rew in traffic.backlog(n):
        p = int(ctx.model_key.rsplit("-", 1)[1]) % traffic.PARTITIONS
        for src, ev in ((0, ctx), (1, rew)):
            if ev is not None:
                ref = InputRef(src, p, offsets[p][src], ev.model_key.encode(), b"", ev.timestamp_ms)
                offsets[p][src] += 1
                parts[p].append((ev, ref))
    return parts


def _engines(policy: str, cls) -> list:
    from streambandit.config.models import parse_models_config

    cfg = parse_models_config(traffic.models(policy, 100))
    return [cls(cfg) for _ in range(traffic.PARTITIONS)]


def _python(policy: str, parts: list[list], prepared: object) -> None:
    from streambandit.engine.partition import PartitionEngine
    from streambandit.wire import Context

    for eng, records in zip(_engines(policy, PartitionEngine), parts):
        on_context, on_reward = eng.on_context, eng.on_reward
        for ev, ref in records:
            (on_context if type(ev) is Context else on_reward)(ev, ref)


def _arrays(policy: str, parts: list[list], prepared: object) -> None:
    from streambandit.engine.array_partition import ArrayPartitionEngine

    for eng, records in zip(_engines(policy, ArrayPartitionEngine), parts):
        for at in range(0, len(records), RUN):
            eng.process(records[at : at + RUN])


def _prepare(parts: list[list]) -> list[list]:
    from streambandit.engine.record_columns import RecordColumns

    return [
        [(RecordColumns(records[at : at + RUN]), records[at : at + RUN])
         for at in range(0, len(records), RUN)]
        for records in parts
    ]  # fmt: skip


def _pass(policy: str, parts: list[list], prepared: list[list]) -> None:
    from streambandit.engine.array_partition import ArrayPartitionEngine

    for eng, runs in zip(_engines(policy, ArrayPartitionEngine), prepared):
        for cols, records in runs:
            eng.process_columns(cols, records, None)


_RUNNERS = {"python": _python, "arrays": _arrays, "pass": _pass}


def _child(policy: str, n: int, timed: bool) -> None:
    """The counted (or timed) process: a warm-up of every level, then each level once inside its
    own ``operator.call`` (counted), or REPEATS times each (timed)."""
    import operator

    parts = streams(n)
    events = sum(map(len, parts))
    warm = streams(300)
    for level in LEVELS:
        _RUNNERS[level](policy, warm, _prepare(warm))
    prepared = _prepare(parts)
    if timed:
        for level in LEVELS:
            times = []
            for _ in range(REPEATS):
                t = time.thread_time()
                _RUNNERS[level](policy, parts, prepared)
                times.append(time.thread_time() - t)
            print(f"TIME {level} {statistics.median(times) / events * 1e6:.4f}", flush=True)
    else:
        for level in LEVELS:
            operator.call(_RUNNERS[level], policy, parts, prepared)
    print("EVENTS", events, flush=True)


def _run_child(policy: str, n: int, timed: bool, wrap: list[str]) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"}
    cmd = [*wrap, sys.executable, str(Path(__file__).resolve()), "--child", policy, str(n)]
    cmd += ["--timed"] if timed else []
    return subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout


def _count(policy: str, n: int) -> dict:
    from bench.worker_instructions import _compiled, _total

    _run_child(policy, 300, False, [])  # numba's cache filled outside valgrind
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cg.out"
        wrap = ["valgrind", "--tool=callgrind", "--toggle-collect=_operator_call",
                "--dump-after=_operator_call", f"--callgrind-out-file={out}"]  # fmt: skip
        stdout = _run_child(policy, n, False, wrap)
        events = int(re.search(r"^EVENTS (\d+)$", stdout, re.M).group(1))
        dumps = sorted(Path(d).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) != len(LEVELS):
            raise RuntimeError(f"{len(dumps)} counts for {len(LEVELS)} levels")
        return {
            "events": events,
            "per_event": {lv: _total(p) / events for lv, p in zip(LEVELS, dumps)},
            "compiled_per_event": {lv: _compiled(p) / events for lv, p in zip(LEVELS, dumps)},
        }


def _time(policy: str, n: int) -> dict:
    stdout = _run_child(policy, n, True, [])
    return {
        m.group(1): float(m.group(2)) for m in re.finditer(r"^TIME (\w+) ([\d.]+)$", stdout, re.M)
    }


def measure(args: argparse.Namespace) -> dict:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed: apt-get install valgrind")
    n = 300 if args.quick else 2000
    # The counts side by side, one process each (instructions do not depend on what runs beside
    # them); then the timings, one at a time on a machine left quiet.
    with ThreadPoolExecutor(max_workers=len(POLICIES)) as pool:
        counts = list(pool.map(lambda policy: _count(policy, n), POLICIES))
    runs = [
        {"policy": policy, **count, "us_per_event": _time(policy, n)}
        for policy, count in zip(POLICIES, counts)
    ]
    return {"contexts": n, "runs": runs}


def render(res: dict) -> str:
    lines = [
        "# The engine's rules per event: Python, and the compiled pass over arrays",
        "",
        harness.provenance(
            res,
            f"{res['contexts']:,} contexts of the ad-traffic backlog (d = {traffic.D}, "
            f"K = {traffic.K}) and their rewards, per partition in release order; instructions "
            f"counted by callgrind, CPU time the median of {REPEATS} runs in one process.",
        ),
        "",
        "| policy | level | instructions per event | of which compiled | us per event | "
        "instructions / python |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in res["runs"]:
        py = r["per_event"]["python"]
        for level in LEVELS:
            lines.append(
                f"| {r['policy']} | {level} | {r['per_event'][level]:,.0f} | "
                f"{r['compiled_per_event'][level]:,.0f} | {r['us_per_event'][level]:.2f} | "
                f"{r['per_event'][level] / py:.3f} |"
            )
    lines += [
        "",
        "*python*: engine/partition.py, a call per record. *arrays*: "
        "ArrayPartitionEngine.process on runs of 256 records (columns built from the records, "
        "the compiled pass, its outputs made into objects). *pass*: the compiled pass alone, "
        "its columns built beforehand and its outputs left as columns. *of which compiled*: "
        "numba's code (the learners' kernels, the pass), as bench.worker_instructions counts it.",
    ]
    return "\n".join(lines) + "\n"


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]), "--timed" in sys.argv)
        raise SystemExit(0)
    raise SystemExit(harness.main("engine_pass", __doc__, measure, render, add_arguments=_options))
