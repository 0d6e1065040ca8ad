"""``streambandit bench``: streambandit's learners and the libraries a user would pick instead, on
the same synthetic stream, in the same run.

Each row (a learner and a code path) runs in its own spawned process, so that its peak memory is
its own: C++ allocations (Vowpal Wabbit's weights) count, and one library's arena does not hide
another's. Inside that process the stream is generated (same seed, same bits everywhere), put in
the library's input format (VW text, River dicts) and a short warm-up run is made (numba compiles,
VW loads its code paths); then, for each repeat, the parent asks for one timed run:

  1. reset the peak-RSS mark (Linux ``/proc/self/clear_refs``) and read the RSS;
  2. build a fresh learner; time decide + update over the row's n events (time.perf_counter);
  3. peak memory = the peak RSS after the run (VmHWM, ``ru_maxrss`` off Linux) minus step 1's RSS.

The repeats are interleaved row by row (repeat 1 of every row, then repeat 2, ...) so machine
noise hits all rows alike; medians are reported, with every ratio taken against streambandit
``oful`` (play path) measured in the same run. Slow peers (MABWiser, River) are timed on the first
``--n-slow`` events, and their regret ratio is against ``oful``'s regret on that same prefix.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from streambandit.benchmarks import cpu_model

__all__ = [
    "main",
    "build_parser",
    "run_from_args",
    "run_benchmark",
    "render_markdown",
    "pin_one_thread",
    "REFERENCE",
]

REFERENCE = "oful_play"
BLAS_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)
# The targets at d = 20, K = 10, one core.
TARGET_EVENTS_PER_S = 200_000
TARGET_BATCH_PER_S = 1_000_000
TARGET_VS_NAIVE = 10.0
TARGET_VS_VW = 50.0
MIB = 1024.0 * 1024.0
# Below this a memory figure is measurement noise (page granularity, allocator slack): ratios
# against a smaller reference are taken against this floor and shown as lower bounds.
MEMORY_FLOOR_MIB = 0.25
PEER_DISTRIBUTIONS = {"vowpalwabbit": "vowpalwabbit", "mabwiser": "mabwiser", "river": "river"}


def pin_one_thread() -> None:
    """One BLAS / numba thread in every process started after this (the figures are per core)."""
    for var in BLAS_THREAD_VARS:
        os.environ.setdefault(var, "1")


def _fixed_mmap_threshold() -> None:
    """glibc: serve every allocation >= 128 KiB by its own mmap, returned to the OS on free. By
    default the threshold grows after a large free, and later large blocks come from the heap,
    where freed pages are reused without showing in the peak RSS. Applies to the row processes."""
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))


# -- memory ------------------------------------------------------------------------------------


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _rss_bytes() -> int:
    """Resident set now. VmRSS and VmHWM are read from the same kernel counters; ru_maxrss can lag
    the current RSS by the per-thread counter batching (a fraction of a MiB), so on Linux both
    figures come from /proc/self/status and ru_maxrss is the fallback elsewhere."""
    kib = _proc_status_kib("VmRSS")
    return kib * 1024 if kib is not None else _peak_bytes()


def _peak_bytes() -> int:
    kib = _proc_status_kib("VmHWM")
    if kib is not None:
        return kib * 1024
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r if sys.platform == "darwin" else r * 1024)  # bytes on macOS, KiB on Linux


def _reset_peak() -> bool:
    """Reset the process's peak-RSS mark (Linux >= 4.0); False where that is not possible, in
    which case the peak is since process start and the figure is an upper bound."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


# -- the per-row process -----------------------------------------------------------------------


def _worker(conn: Any, spec: dict[str, Any]) -> None:
    """Run in a spawned process: set the row up, then answer "run" requests until "stop"."""
    try:
        from streambandit.benchmarks import peers
        from streambandit.benchmarks.stream import make_stream

        adapter = peers.adapters(
            dim=spec["d"], n_arms=spec["K"], noise_sd=spec["noise_sd"], seed=spec["seed"]
        )[spec["key"]]
        stream = make_stream(
            spec["n"], spec["d"], spec["K"], noise_sd=spec["noise_sd"], seed=spec["seed"]
        )
        n_row = min(spec["n_slow"], spec["n"]) if adapter.slow else spec["n"]
        data = adapter.prepare(stream, n_row)
        # Warm-up on a tiny stream of 2 arms: numba compiles the same kernels (they are typed by
        # dtype and rank, not by size) and VW loads its code paths, while the memory it frees is
        # too small for the allocator to hand back to the timed learner and hide its footprint.
        tiny = peers.adapters(
            dim=spec["d"], n_arms=2, noise_sd=spec["noise_sd"], seed=spec["seed"]
        )[spec["key"]]
        warm_stream = make_stream(
            spec["warmup"], spec["d"], 2, noise_sd=spec["noise_sd"], seed=spec["seed"] + 1
        )
        warm = tiny.prepare(warm_stream, spec["warmup"])
        learner = tiny.new()
        if tiny.train is not None:
            tiny.train(learner, warm)
        tiny.run(learner, warm)
        tiny.close(learner)
        del learner, warm, tiny
        info: dict[str, Any] = {"n": n_row}
        if adapter.module is None:
            info["path"] = _streambandit_path(spec["key"])
        else:
            info["version"] = importlib.metadata.version(PEER_DISTRIBUTIONS[adapter.module])
        conn.send({"ready": info})
    except BaseException as exc:  # noqa: BLE001 - reported as the row's result, not raised
        conn.send({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})
        return
    while conn.recv() == "run":
        try:
            exact = _reset_peak()
            before = _rss_bytes()
            learner = adapter.new()
            if adapter.train is not None:
                adapter.train(learner, data)
            start = time.perf_counter()
            chosen = adapter.run(learner, data)
            seconds = time.perf_counter() - start
            adapter.close(learner)
            peak = _peak_bytes() - before
            del learner
            conn.send(
                {
                    "seconds": seconds,
                    "chosen": chosen,
                    "peak_mib": max(peak, 0) / MIB,
                    "peak_exact": exact,
                }
            )
            del chosen  # every repeat starts from the same heap
        except BaseException as exc:  # noqa: BLE001
            conn.send(
                {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            )
            return


def _streambandit_path(key: str) -> str:
    """Which code path a streambandit row really ran: the compiled one or the loop fallback."""
    from streambandit.benchmarks import peers
    from streambandit.benchmarks.peers import has_method

    name, path = key.rsplit("_", 1)
    if key == peers.DEFAULTS_KEY:
        path = "play"
    if path == "play":
        return "play()" if has_method(name, "play") else "loop (play() not in this build)"
    if path == "batch":
        return (
            "select_batch()"
            if has_method(name, "select_batch")
            else "select() loop (select_batch() not in this build)"
        )
    return "select + update"


# -- the run -----------------------------------------------------------------------------------


def run_benchmark(
    *,
    n: int = 20_000,
    n_slow: int = 2_000,
    d: int = 20,
    K: int = 10,
    repeats: int = 7,
    slow_repeats: int = 3,
    noise_sd: float = 0.1,
    seed: int = 0,
    warmup: int = 50,
    only: list[str] | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Time every row (see the module docstring); returns the JSON-able result."""
    from streambandit.benchmarks import peers
    from streambandit.benchmarks.stream import cumulative_regret, make_stream

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    pin_one_thread()
    _fixed_mmap_threshold()
    table = peers.adapters(dim=d, n_arms=K, noise_sd=noise_sd, seed=seed)
    keys = [k for k in table if only is None or k in only or k == REFERENCE]
    unknown = sorted(set(only or ()) - set(table))
    if unknown:
        raise ValueError(f"unknown rows {unknown}; known: {', '.join(table)}")

    load_start = _loadavg()
    rows: dict[str, dict[str, Any]] = {}
    ctx = mp.get_context("spawn")
    procs: dict[str, tuple[Any, Any]] = {}
    for key in keys:
        a = table[key]
        rows[key] = {
            "key": key,
            "label": a.label,
            "config": a.config,
            "kind": a.kind,
            "slow": a.slow,
            "peer": a.module is not None,
        }
        reason = peers.missing(a.module)
        if reason:
            rows[key]["status"] = reason
            continue
        parent, child = ctx.Pipe()
        spec = {
            "key": key,
            "n": n,
            "n_slow": n_slow,
            "d": d,
            "K": K,
            "noise_sd": noise_sd,
            "seed": seed,
            "warmup": warmup,
        }
        proc = ctx.Process(target=_worker, args=(child, spec), daemon=True)
        proc.start()
        procs[key] = (proc, parent)
    try:
        for key, (_, conn) in list(procs.items()):
            msg = conn.recv()
            if "error" in msg:
                rows[key]["status"] = f"failed: {msg['error']}"
                log(msg["traceback"])
                del procs[key]
            else:
                rows[key].update(msg["ready"], status="ok", runs=[])
                log(f"ready: {key} (n = {msg['ready']['n']})")
        for r in range(repeats):
            for key, (_, conn) in list(procs.items()):
                if rows[key]["slow"] and r >= slow_repeats:
                    continue
                conn.send("run")
                msg = conn.recv()
                if "error" in msg:
                    rows[key]["status"] = f"failed: {msg['error']}"
                    log(msg["traceback"])
                    del procs[key]
                    continue
                rows[key]["runs"].append(msg)
                log(
                    f"repeat {r + 1}/{repeats} {key}: {msg['seconds'] / rows[key]['n'] * 1e6:.2f} us/event"
                )
    finally:
        for proc, conn in procs.values():
            try:
                conn.send("stop")
            except OSError:
                pass
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()

    load_end = _loadavg()
    stream = make_stream(n, d, K, noise_sd=noise_sd, seed=seed)
    for row in rows.values():
        runs = row.pop("runs", None)
        if not runs:
            continue
        secs = [m["seconds"] for m in runs]
        row["repeats"] = len(runs)
        row["us_per_event"] = statistics.median(secs) / row["n"] * 1e6
        row["events_per_s"] = row["n"] / statistics.median(secs)
        row["us_runs"] = [s / row["n"] * 1e6 for s in secs]
        row["peak_mib_runs"] = [m["peak_mib"] for m in runs]
        row["peak_mib"] = statistics.median(row["peak_mib_runs"])
        row["peak_exact"] = all(m["peak_exact"] for m in runs)
        if row["kind"] == "stream":
            regrets = [float(cumulative_regret(stream, m["chosen"])[-1]) for m in runs]
            row["regret"] = statistics.median(regrets)
            row["regret_per_1000"] = row["regret"] / row["n"] * 1000.0
        row["_chosen"] = runs[-1]["chosen"]

    ref = rows.get(REFERENCE, {})
    ref_ok = ref.get("status") == "ok"
    ref_cum = cumulative_regret(stream, ref["_chosen"]) if ref_ok else None
    # Each peer against oful with defaults on the peer's own prefix of the stream.
    defaults = rows.get(peers.DEFAULTS_KEY, {})
    if defaults.get("_chosen") is not None:
        defaults_cum = cumulative_regret(stream, defaults["_chosen"])
        for row in rows.values():
            if row["peer"] and row.get("regret") is not None:
                row["defaults_regret_same_n"] = float(defaults_cum[row["n"] - 1])
    for row in rows.values():
        chosen = row.pop("_chosen", None)
        if not ref_ok or chosen is None:
            continue
        row["us_ratio"] = row["us_per_event"] / ref["us_per_event"]
        if row["kind"] == "stream":
            ref_regret = float(ref_cum[row["n"] - 1])
            row["ref_regret_same_n"] = ref_regret
            row["regret_ratio"] = row["regret"] / ref_regret if ref_regret > 0 else None
        # A ratio of two figures below the floor is noise: left out. Against a reference below
        # the floor, the ratio is taken against the floor and is a lower bound.
        if row["key"] == REFERENCE:
            row["memory_ratio"] = 1.0
        elif max(row["peak_mib"], ref["peak_mib"]) >= MEMORY_FLOOR_MIB:
            row["memory_ratio"] = row["peak_mib"] / max(ref["peak_mib"], MEMORY_FLOOR_MIB)
            row["memory_ratio_is_lower_bound"] = ref["peak_mib"] < MEMORY_FLOOR_MIB
    return {
        "config": {
            "n": n,
            "n_slow": n_slow,
            "d": d,
            "K": K,
            "repeats": repeats,
            "slow_repeats": slow_repeats,
            "noise_sd": noise_sd,
            "seed": seed,
            "warmup": warmup,
            "reference": REFERENCE,
        },
        "rows": list(rows.values()),
        "targets": _targets(rows),
        "load_average_1min": {"start": load_start, "end": load_end},
    }


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _targets(rows: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured figure and whether it is met."""
    out: list[dict[str, Any]] = []

    def add(what: str, target: str, measured: float | None, met: bool | None, unit: str) -> None:
        out.append({"target": what, "goal": target, "measured": measured, "unit": unit, "met": met})

    def get(key: str, field: str) -> float | None:
        row = rows.get(key, {})
        return row.get(field) if row.get("status") == "ok" else None

    for name in ("oful", "glb_omd"):
        eps = get(f"{name}_play", "events_per_s")
        add(
            f"{name} decide + update, play()",
            f">= {TARGET_EVENTS_PER_S:,} events/s",
            eps,
            None if eps is None else eps >= TARGET_EVENTS_PER_S,
            "events/s",
        )
    for name in ("oful", "glb_omd"):
        bps = get(f"{name}_batch", "events_per_s")
        add(
            f"{name} batch scoring, select_batch()",
            f">= {TARGET_BATCH_PER_S:,} decisions/s",
            bps,
            None if bps is None else bps >= TARGET_BATCH_PER_S,
            "decisions/s",
        )
    naive = get("naive_oful", "us_ratio")
    add(
        "naive numpy OFUL / oful play()",
        f">= {TARGET_VS_NAIVE:g}x",
        naive,
        None if naive is None else naive >= TARGET_VS_NAIVE,
        "x",
    )
    # The best peer is the one oful with defaults compares worst against, each on its own prefix.
    vs_peers = [
        r["defaults_regret_same_n"] / r["regret"]
        for r in rows.values()
        if r.get("defaults_regret_same_n") is not None and r["regret"] > 0
    ]
    worst = max(vs_peers) if vs_peers else None
    add(
        "oful with defaults / the best peer, regret on the same events",
        "<= 1.0x (default regret <= best peer's regret)",
        worst,
        None if worst is None else worst <= 1.0,
        "x",
    )
    for key in ("vw_squarecb", "vw_epsilon"):
        ratio, rr = get(key, "us_ratio"), get(key, "regret_ratio")
        met = None if ratio is None or rr is None else (ratio >= TARGET_VS_VW and rr >= 1.0)
        add(
            f"{rows[key]['label'] if key in rows else key} / oful play(), regret no worse",
            f">= {TARGET_VS_VW:g}x, and VW's regret ratio >= 1 (ours no worse)",
            ratio,
            met,
            "x",
        )
    return out


# -- the report --------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine and library versions, for the report."""
    cpu = cpu_model()
    versions = {}
    for dist in ("streambandit", "numpy", "numba", *PEER_DISTRIBUTIONS.values()):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "versions": versions,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _f(x: float | None, fmt: str) -> str:
    return "—" if x is None else format(x, fmt)


def _label(row: dict[str, Any]) -> str:
    """A row's name, with the path noted when this build lacks the call it names."""
    path = row.get("path")
    return row["label"] + (f" [{path}]" if path and "not in this build" in path else "")


def render_markdown(
    result: dict[str, Any], *, command: str, machine_desc: dict[str, Any], note: str = ""
) -> str:
    c = result["config"]
    m = machine_desc
    vers = ", ".join(f"{k} {v}" for k, v in m.get("versions", {}).items() if v)
    lines = [
        "# streambandit against the libraries a user would pick instead",
        "",
        f"Command: `{command}` (BLAS and numba pinned to one thread). Machine: {m.get('cpu')}, "
        f"{m.get('cores')} cores, Python {m.get('python')}; {vers}; {m.get('date', '')}"
        + (f"; commit {m['commit']}" if m.get("commit") else "")
        + ".",
        "",
        f"Stream: d = {c['d']} features per arm, K = {c['K']} arms, a reward for every decision; arms and "
        f"theta* uniform on the unit sphere, reward = x'theta* + N(0, {c['noise_sd']:g}^2), seed {c['seed']} "
        "(streambandit/benchmarks/stream.py). Regret = sum_t max_k mu_tk - mu_t,chosen (expected rewards).",
        "",
        f"Each row runs in its own process; median of {c['repeats']} repeats ({c['slow_repeats']} for the rows timed "
        f"on the first {c['n_slow']:,} events), repeats interleaved row by row. Ratios are the row over streambandit "
        "oful with play(), measured in the same run: us ratio > 1 means the row is slower, regret ratio > 1 that it "
        "regrets more (against oful's regret on the same prefix of the stream), memory ratio > 1 that it needs more. "
        "Peak memory = peak RSS during the run minus the RSS before the learner was built (the stream and the "
        "prepared input are not counted; the warm-up is a 2-arm stream, "
        "and glibc's mmap threshold is fixed at 128 KiB so "
        "freed large blocks are not silently reused). "
        f"Memory ratios against a reference below {MEMORY_FLOOR_MIB:g} MiB are taken against {MEMORY_FLOOR_MIB:g} MiB "
        "and marked >=; when both figures are below it, no ratio is given.",
    ]
    load = result.get("load_average_1min") or {}
    if load.get("start") is not None:
        lines += [
            "",
            f"1-minute load average {load['start']:g} at the start and {load.get('end')} at the end, on "
            f"{m.get('cores')} cores: above 1, other work shared the machine, which the medians and the "
            "same-run ratios are meant to absorb (every repeat is in the JSON).",
        ]
    if note:
        lines += ["", note]
    lines += [
        "",
        "## Decide + update, a reward after every decision",
        "",
        "| library / path | n timed | us / decide+update | events/s | regret at end | regret / 1000 events "
        "| peak MiB | us ratio | regret ratio | memory ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = result["rows"]
    for r in rows:
        if r["kind"] != "stream":
            continue
        label = _label(r)
        if r.get("status") != "ok":
            lines.append(f"| {label} | {r.get('status')} |  |  |  |  |  |  |  |  |")
            continue
        if r.get("memory_ratio") is None:
            mem_ratio = f"both < {MEMORY_FLOOR_MIB:g} MiB"
        else:
            mem_ratio = (
                ">= " if r.get("memory_ratio_is_lower_bound") else ""
            ) + f"{r['memory_ratio']:.1f}x"
        lines.append(
            f"| {label} | {r['n']:,} | {r['us_per_event']:.2f} | {r['events_per_s']:,.0f} | {r['regret']:.1f} | "
            f"{r['regret_per_1000']:.2f} | {r['peak_mib']:.2f} | {_f(r.get('us_ratio'), '.1f')}x | "
            f"{_f(r.get('regret_ratio'), '.2f')} | {mem_ratio} |"
        )
    lines += [
        "",
        "## Batch scoring: decisions against the current state, no interleaved update",
        "",
        "| library / path | n scored | us / decision | decisions/s | fastest repeat, decisions/s "
        "| peak MiB (incl. training) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["kind"] != "batch":
            continue
        label = _label(r)
        if r.get("status") != "ok":
            lines.append(f"| {label} | {r.get('status')} |  |  |  |  |")
            continue
        best = 1e6 / min(r["us_runs"])
        lines.append(
            f"| {label} | {r['n']:,} | {r['us_per_event']:.3f} | {r['events_per_s']:,.0f} | {best:,.0f} "
            f"| {r['peak_mib']:.2f} |"
        )
    lines += [
        "",
        "## Targets (d = 20, K = 10, one core)"
        if (c["d"], c["K"]) == (20, 10)
        else f"## Targets (stated for d = 20, K = 10; this run: d = {c['d']}, K = {c['K']})",
        "",
        "| target | goal | measured | met |",
        "|---|---|---:|---|",
    ]
    for t in result["targets"]:
        fmt = ",.0f" if t["unit"] != "x" else ".2f" if (t["measured"] or 0) < 10 else ".1f"
        measured = (
            "—"
            if t["measured"] is None
            else format(t["measured"], fmt) + (" x" if t["unit"] == "x" else f" {t['unit']}")
        )
        met = {True: "yes", False: "no", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t['goal']} | {measured} | {met} |")
    lines += ["", "## How each row was configured", ""]
    for r in rows:
        extra = f" ({r['version']})" if r.get("version") else ""
        lines.append(f"- **{r['label']}**{extra}: {r['config']}.")
    lines += [
        "",
        "MABWiser's LinUCB and River's LinUCBDisjoint keep one model per arm and take one context per "
        "decision, shared by all arms: they cannot be given each arm's own features. The context a user "
        "can pass them is the K arm vectors concatenated, so arm k's model must find theta* in its own "
        "block of K d numbers. River's building blocks allow the other reading, one shared model on each "
        "arm's own features (the model this stream follows), which is the last row, written by hand. "
        "VW's ADF format takes per-arm features natively. MABWiser and River are timed on fewer events "
        "because they take milliseconds per event; their regret ratio is against oful's regret on the same prefix.",
        "",
    ]
    return "\n".join(lines)


# -- the command line --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="streambandit bench",
        description="streambandit's learners against Vowpal Wabbit, MABWiser and River on the same synthetic stream "
        "(us per decide + update, regret, peak memory, as ratios to streambandit oful). "
        "The peers are optional: pip install 'streambandit[bench]'.",
    )
    add_stream_options(ap)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: n 2000, n-slow 200, 2 repeats, 1 for slow peers",
    )
    ap.add_argument(
        "--json", type=Path, default=None, metavar="PATH", help="write the result as JSON"
    )
    ap.add_argument(
        "--md", type=Path, default=None, metavar="PATH", help="write the markdown report"
    )
    return ap


def add_stream_options(ap: argparse.ArgumentParser) -> None:
    """The options of the run itself (sizes, repeats, stream), shared with the checkout's
    ``python -m bench.peers``, which writes its results in its own place."""
    ap.add_argument("--n", type=int, default=20_000, help="events in the stream (default 20000)")
    ap.add_argument(
        "--n-slow",
        type=int,
        default=2_000,
        help="events the slow peers (MABWiser, River) are timed on (default 2000)",
    )
    ap.add_argument("--d", type=int, default=20, help="features per arm (default 20)")
    ap.add_argument("--K", type=int, default=10, help="arms per decision (default 10)")
    ap.add_argument(
        "--repeats", type=int, default=7, help="timed repeats per row, median reported (default 7)"
    )
    ap.add_argument(
        "--slow-repeats", type=int, default=3, help="repeats for the slow peers (default 3)"
    )
    ap.add_argument(
        "--noise-sd", type=float, default=0.1, help="sd of the Gaussian reward noise (default 0.1)"
    )
    ap.add_argument("--seed", type=int, default=0, help="stream seed (default 0)")
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated row keys (the reference oful_play always runs)",
    )


def run_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run_benchmark` with the options of :func:`build_parser` (``--quick`` applied)."""
    if args.quick:
        args.n, args.n_slow, args.repeats, args.slow_repeats = 2_000, 200, 2, 1
    for name in ("n", "n_slow", "d", "K", "repeats", "slow_repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    pin_one_thread()
    return run_benchmark(
        n=args.n,
        n_slow=args.n_slow,
        d=args.d,
        K=args.K,
        repeats=args.repeats,
        slow_repeats=args.slow_repeats,
        noise_sd=args.noise_sd,
        seed=args.seed,
        only=args.only.split(",") if args.only else None,
    )


def main(
    argv: list[str] | None = None,
    *,
    command: str | None = None,
    machine_desc: dict[str, Any] | None = None,
) -> int:
    """Run the benchmark, print the markdown report, optionally write --json / --md. Returns the
    exit code: 0, or 1 when the reference row (streambandit oful, play) could not be measured."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        result = run_from_args(args)
    except ValueError as exc:
        print(f"streambandit bench: {exc}", file=sys.stderr)
        return 2
    command = command or "streambandit bench" + "".join(f" {a}" for a in argv)
    desc = machine_desc or machine()
    result["machine"] = desc
    result["command"] = command
    md = render_markdown(result, command=command, machine_desc=desc)
    print(md)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=_jsonable) + "\n")
    if args.md:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md)
    ref = next((r for r in result["rows"] if r["key"] == REFERENCE), {})
    return 0 if ref.get("status") == "ok" else 1


def _jsonable(x: Any) -> Any:
    if hasattr(x, "tolist"):
        return x.tolist()
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


if __name__ == "__main__":
    raise SystemExit(main())
