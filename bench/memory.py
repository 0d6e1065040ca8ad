"""Resident memory per live model: RSS growth with 100,000 models next to ``state_nbytes()``.

    python -m bench.memory            # full run (~3 min), writes bench/results/memory.{md,json}
    python -m bench.memory --quick    # a smoke run with 5,000 models (printed, not written)

The package is imported from wherever ``streambandit`` resolves, and ``python -m`` puts the working
directory first; to measure a clean commit while the working tree is being edited, export it and
run from there: ``git archive HEAD streambandit | tar -x -C /tmp/sb_head; git rev-parse --short HEAD
> /tmp/sb_head/COMMIT; cd /tmp/sb_head && PYTHONPATH=CHECKOUT python -m bench.memory`` (the results
record the package path and that commit).

Every case runs in a fresh subprocess (``--child``) so that one case's heap does not hide or inflate
the next one's. A case measures the resident set (``/proc/self/statm``) after imports and a warm-up
(one model built, decided and updated, so lazy imports and caches are paid), then again after the
models are live, both after ``gc.collect()``:

- ``bare``: N learners built by ``ModelsConfig.resolve(key).build()`` in a dict keyed by model key,
  each decided once (``select``) and updated once -- what the learners cost by themselves.
- ``engine``: one ``PartitionEngine`` driven through ``on_context`` / ``on_reward`` with one
  context per model key (so every model is built and decided once) and one reward for it
  (aggregation ``first``: the reward joins at once, so every model is updated once). Measured
  right after the last reward, and again after ``advance_to`` has closed every reward window (the
  deadline heap is then empty; the engine still remembers the last ``max_recent`` joined event
  ids). Per-event bookkeeping (recent ids, the deadline heap, pending decisions) is bounded by the
  engine's limits and the traffic in one reward window, not by the number of models; with one
  event per model it happens to scale with N here, so it is reported separately.

The attribution (``--child`` with ``attribute``) runs the same cases with a small N under
``tracemalloc`` and splits the bytes per model by cause with ``sys.getsizeof`` over the objects a
model owns (reachable from it and not shared with another model): array data, numpy array
headers (the ndarray object), the ``_config`` dict and the values only it holds, other
scalars and sub-objects, the instance itself (object, inline attribute values) and the model's
entry in the dict that holds it (key string + slot). The compiled learners (oful, glb_omd) keep
their state as a row of chunked arrays shared by the models of a configuration
(``streambandit.policies.rows``): their row is counted by ``ownership.owned_rows`` (state arrays
and state scalars), and since tracemalloc counts a new chunk whole while the rows not yet handed
out are untouched ``np.empty`` pages (not resident), the traced totals count the rows in use
instead. RSS growth minus the traced bytes is the allocator's own overhead (malloc chunk
headers, alignment, pool slack).

RSS is not timing-sensitive, so other jobs on the machine do not bias it; the figures do depend
on the Python and numpy versions and on glibc's malloc (both recorded in the results).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness
from streambandit.benchmarks.ownership import owned, owned_rows
from streambandit.sim.ads import ad_hyper

D, K = 20, 10
N_FULL, N_QUICK, N_ATTRIBUTE = 100_000, 5_000, 2_000
WINDOW_MS = 60_000
HYPER = {
    "oful": {},
    "glb_omd": ad_hyper("glb_omd"),
    "soful": {
        "sketch_size": 5
    },  # a sketched learner, for contrast: small state, more Python objects
}
POLICIES = tuple(HYPER)
RESTORE_POLICIES = ("oful", "glb_omd")  # packing 100,000 models takes ~20 s each
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def settled_rss() -> int:
    gc.collect()
    return rss_bytes()


def trimmed_rss() -> int:
    """RSS after glibc's malloc_trim(0) has returned every wholly free page to the OS: what is
    left is live data plus fragmentation."""
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_bytes()


def models_config(policy: str):
    from streambandit.config.models import parse_models_config

    return parse_models_config(
        {
            "models": [
                {
                    "match": "m-*",
                    "policy": policy,
                    "dim": D,
                    "hyper": HYPER[policy],
                    "reward_window_ms": WINDOW_MS,
                    "default_reward": 0.0,
                    "aggregation": "first",
                }
            ]
        }
    )


def feature_pool(n: int = 64, seed: int = 0) -> list[np.ndarray]:
    """A few (K, d) context matrices with rows of norm <= 1, shared by all events (so the inputs
    themselves do not grow with N)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(K, D))
        out.append(x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True)))
    return out


# -- the two ways of holding N live models ---------------------------------------------------


def run_bare(policy: str, n: int, pool: list[np.ndarray], start: int = 0) -> dict:
    spec = models_config(policy).resolve("m-0")
    models = {}
    for i in range(start, start + n):
        key = f"m-{i}"
        p = models[key] = spec.build()
        x = pool[i % len(pool)]
        a = p.select(x)
        p.update(x[a], float(i % 2))
    return models


def run_engine(policy: str, n: int, pool: list[np.ndarray], start: int = 0, engine=None):
    from streambandit.engine.partition import PartitionEngine
    from streambandit.wire import Context, Reward

    if engine is None:
        engine = PartitionEngine(models_config(policy))
    arm_ids = tuple(f"ad-{j}" for j in range(K))
    for i in range(start, start + n):
        key, event_id, t = f"m-{i}", f"e-{i}", 1_000 + 2 * i
        out = engine.on_context(Context(event_id, key, t, arm_ids, pool[i % len(pool)]))
        assert type(out[-1]).__name__ == "Action", out
        out = engine.on_reward(Reward(event_id, key, t + 1, float(i % 2)))
        assert type(out[-1]).__name__ == "Joined", out
    return engine


def close_windows(engine) -> None:
    engine.advance_to(engine.watermark_ms + WINDOW_MS)


# -- child: RSS of one case ------------------------------------------------------------------


def pack(engine) -> bytes:
    from streambandit.wire import pack_snapshot

    return pack_snapshot(
        {
            "partition": 0,
            "created_ms": 0,
            "contexts_offset": 0,
            "rewards_offset": 0,
            "actions_offset": 0,
            "joined_offset": 0,
            "dead_letter_offset": 0,
            "engine": engine.snapshot(),
        }
    )


def child_restore(policy: str, n: int, path: str) -> dict:
    """RSS growth of a worker partition recovered from a snapshot: the packed bytes are read first
    (and kept, so they are in the baseline), then unpacked and restored, and the unpacked
    snapshot dropped -- what the worker holds after ``_recover_from``."""
    from streambandit.engine.partition import PartitionEngine
    from streambandit.wire import unpack_snapshot

    pool = feature_pool()
    warm = pack(run_engine(policy, 1, pool, start=10**9))
    PartitionEngine.restore(models_config(policy), unpack_snapshot(warm)["engine"])
    data = Path(path).read_bytes()
    rss0 = settled_rss()
    t0 = time.perf_counter()
    snap = unpack_snapshot(data)
    engine = PartitionEngine.restore(models_config(policy), snap["engine"])
    del snap
    rss1 = settled_rss()
    assert len(engine.models) == n
    return {
        "policy": policy,
        "mode": "restore",
        "n": n,
        "rss_growth": rss1 - rss0,
        "rss_growth_trimmed": trimmed_rss() - rss0,
        "snapshot_bytes": len(data),
        "seconds": time.perf_counter() - t0,
        "recent": len(engine.recent),
    }


def child_rss(policy: str, mode: str, n: int, snapshot_path: str | None = None) -> dict:
    pool = feature_pool()
    warm = (
        run_engine(policy, 1, pool, start=10**9)
        if mode == "engine"
        else run_bare(policy, 1, pool, start=10**9)
    )
    rss0 = settled_rss()
    t0 = time.perf_counter()
    if mode == "bare":
        models = run_bare(policy, n, pool)
        rss1 = settled_rss()
        res = {"rss_growth": rss1 - rss0, "rss_growth_trimmed": trimmed_rss() - rss0}
        holder = models
    else:
        engine = run_engine(policy, n, pool)
        rss1 = settled_rss()
        close_windows(engine)
        rss2 = settled_rss()
        res = {
            "rss_growth": rss1 - rss0,
            "rss_growth_windows_closed": rss2 - rss0,
            "rss_growth_windows_closed_trimmed": trimmed_rss() - rss0,
            "recent": len(engine.recent),
            "pending": len(engine.pending),
        }
        holder = engine.models
        assert len(holder) == n + 0 and engine.counters["joined_observed"] >= n, engine.counters
    elapsed = time.perf_counter() - t0
    if snapshot_path:
        t1 = time.perf_counter()
        data = pack(engine)
        res["pack_seconds"] = time.perf_counter() - t1  # what Worker._snapshot spends packing
        Path(snapshot_path).write_bytes(data)
    first = next(iter(holder.values()))
    res.update(
        policy=policy,
        mode=mode,
        n=n,
        seconds=elapsed,
        state_nbytes=first.state_nbytes(),
        state_nbytes_total=sum(m.state_nbytes() for m in holder.values()),
    )
    del warm
    return res


# -- child: attribution under tracemalloc ----------------------------------------------------


def split_model(p, other) -> dict:
    """Bytes of one live model by cause (sys.getsizeof over what it owns, and its row)."""
    parts = {
        "array_data": 0,
        "array_headers": 0,
        "row_scalars": 0,
        "config_dict": 0,
        "config_values": 0,
        "other_objects": 0,
        "instance": 0,
    }
    for column, nbytes in owned_rows(p).items():
        parts["array_data" if column in p._state_arrays else "row_scalars"] += nbytes
    cfg = p._config
    cfg_values = {id(v) for v in cfg.values()}
    for o in owned(p, [other]):
        if o is p:
            parts["instance"] += sys.getsizeof(o)
        elif isinstance(o, np.ndarray):
            data = o.nbytes if o.flags.owndata else 0
            parts["array_data"] += data
            # the ndarray object (numpy 2 keeps shape and strides in it for small ndim)
            parts["array_headers"] += sys.getsizeof(o) - data
        elif o is cfg:
            parts["config_dict"] += sys.getsizeof(o)
        elif id(o) in cfg_values:
            parts["config_values"] += sys.getsizeof(o)
        else:
            parts["other_objects"] += sys.getsizeof(o)
    return parts


def traced(fn):
    """(result, bytes traced while fn ran and still held after it)."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    res = fn()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return res, after - before


class RowsInUse:
    """tracemalloc counts a row store's new chunk whole; its rows not yet handed out are np.empty
    pages never touched (not resident). ``correction()``: the bytes to add to a traced total so
    that it counts only the rows the models built since ``start()`` hold (0 without a row store)."""

    def __init__(self, model) -> None:
        self.store = getattr(model, "_store", None)  # the warm-up model keeps its store alive

    def start(self) -> None:
        self.capacity, self.live = (self.store.capacity, self.store.live) if self.store else (0, 0)

    def correction(self) -> int:
        if self.store is None:
            return 0
        allocated = self.store.capacity - self.capacity
        return (self.store.live - self.live - allocated) * self.store.row_nbytes


def child_attribute(policy: str, n: int) -> dict:
    pool = feature_pool()
    warm_b = run_bare(policy, 1, pool, start=10**9)
    warm_e = run_engine(policy, 1, pool, start=10**9)
    rows_in_use = RowsInUse(next(iter(warm_b.values())))
    rows_in_use.start()
    models, bare_traced = traced(lambda: run_bare(policy, n, pool))
    bare_traced += rows_in_use.correction()
    ms = list(models.values())
    split = split_model(ms[n // 2], ms[n // 2 + 1])
    # The instance's attribute values (3.11 keeps them inline, outside the object, until __dict__
    # is asked for) are what tracemalloc saw per model beyond the objects counted above and the
    # models dict; sys.getsizeof cannot see them without materialising the dict.
    # The models dict and its key strings, traced alone (same keys, same insertion pattern).
    _, dict_bytes = traced(lambda: {f"m-{i}": None for i in range(n)})
    dict_entry = dict_bytes / n
    counted = sum(split.values()) + dict_entry
    split["inline_attribute_values"] = bare_traced / n - counted
    split["models_dict_entry"] = dict_entry
    # The engine, traced; then its bookkeeping: what tracemalloc sees freed when each per-event
    # structure is emptied (windows still open), and its models dict entry by sys.getsizeof.
    import tracemalloc

    gc.collect()
    rows_in_use.start()
    tracemalloc.start()
    mb = tracemalloc.get_traced_memory()[0]
    e = run_engine(policy, n, pool)
    gc.collect()
    m0 = tracemalloc.get_traced_memory()[0]
    engine_traced = m0 - mb + rows_in_use.correction()
    n_heap, n_recent, n_pending = len(e._deadlines) + len(e._run), len(e.recent), len(e.pending)
    e._deadlines, e._run = [], type(e._run)()  # the deadlines: the heap and the in-order run
    gc.collect()
    m1 = tracemalloc.get_traced_memory()[0]
    e.recent = type(e.recent)()  # the event ids go with it (the heap no longer holds them)
    gc.collect()
    m2 = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    engine_split = {
        "deadline_heap": (m0 - m1) / n,
        "recent_ids": (m1 - m2) / n,
        "pending": sys.getsizeof(e.pending) / n,
        "engine_models_dict_entry": (
            sys.getsizeof(e.models) + sum(sys.getsizeof(k) for k in e.models)
        )
        / n,
        "heap_entries": n_heap,
        "recent_entries": n_recent,
        "pending_entries": n_pending,
    }
    del warm_b, warm_e
    return {
        "policy": policy,
        "n": n,
        "bare_traced_per_model": bare_traced / n,
        "engine_traced_per_model": engine_traced / n,
        "split": split,
        "engine_split": engine_split,
        "state_nbytes": ms[0].state_nbytes(),
        "instance_getsizeof": sys.getsizeof(ms[0]),
        "row_nbytes": rows_in_use.store.row_nbytes if rows_in_use.store else None,
        "rows_per_chunk": rows_in_use.store.rows_per_chunk if rows_in_use.store else None,
    }


# -- parent ----------------------------------------------------------------------------------


def run_child(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.memory", "--child", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(argv: list[str]) -> None:
    kind, policy, *rest = argv
    if kind == "attribute":
        res = child_attribute(policy, int(rest[0]))
    elif kind == "restore":
        res = child_restore(policy, int(rest[0]), rest[1])
    else:
        res = child_rss(policy, kind, int(rest[0]), *rest[1:])
    print(json.dumps(res))


def measure(a: argparse.Namespace) -> dict:
    n = N_QUICK if a.quick else N_FULL
    policies = a.policies.split(",")
    t0 = time.perf_counter()
    import streambandit

    pkg = Path(streambandit.__file__).resolve().parent
    source = {"streambandit": str(pkg)}
    if (
        pkg.parent / "COMMIT"
    ).exists():  # an exported package: its commit, not the working tree's HEAD
        source["commit"] = (pkg.parent / "COMMIT").read_text().strip()
    else:  # the working tree: say so when the measured package differs from that commit
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", str(pkg)],
            capture_output=True,
            text=True,
            check=False,
            cwd=pkg.parent,
        )
        source["uncommitted"] = bool(status.stdout.strip())
    res: dict = {
        **source,
        "d": D,
        "K": K,
        "n_models": n,
        "n_attribute": N_ATTRIBUTE,
        "hyper": {p: HYPER[p] for p in policies},
        "cases": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for p in policies:
            c = res["cases"][p] = {}
            snap = str(Path(tmp) / f"{p}.snap")
            for mode in ("bare", "engine"):
                extra = [snap] if (mode == "engine" and p in RESTORE_POLICIES) else []
                c[mode] = run_child([mode, p, str(n), *extra])
                print(
                    f"{p} {mode}: {c[mode]['rss_growth'] / n:,.0f} B/model ({c[mode]['seconds']:.1f} s)",
                    file=sys.stderr,
                )
            if p in RESTORE_POLICIES:
                c["restore"] = run_child(["restore", p, str(n), snap])
                print(
                    f"{p} restore: {c['restore']['rss_growth'] / n:,.0f} B/model", file=sys.stderr
                )
            c["attribute"] = run_child(["attribute", p, str(N_ATTRIBUTE)])
    res["seconds"] = time.perf_counter() - t0
    return res


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--policies", default=",".join(POLICIES), help="comma-separated (default: %(default)s)"
    )


def render(res: dict) -> str:
    n = res["n_models"]
    if res.get("commit"):
        source = f"the package exported from commit {res['commit']} ({res['streambandit']})"
    else:
        source = f"the package at {res['streambandit']}" + (
            ", with uncommitted changes" if res.get("uncommitted") else ""
        )
    lines = [
        "# Resident memory per live model",
        "",
        harness.provenance(
            res,
            f"{res['seconds']:.0f} s; {source}; glibc malloc. d = {res['d']}, "
            f"K = {res['K']}, {n:,} models, each decided once and updated once; every case in a fresh "
            "subprocess. RSS from /proc/self/statm after gc.collect(), growth over the same process "
            "after imports and a one-model warm-up. RSS is not timing-sensitive: other jobs running on "
            "the machine at the same time do not bias it.",
        ),
        "",
        "Last column of the first table: RSS growth / the learner's own state (`state_nbytes()`).",
        "",
        "## RSS growth per model",
        "",
        "`bare`: the learners in a dict keyed by model key. `engine`: one `PartitionEngine` fed one context and "
        "one reward per model key through `on_context` / `on_reward`; measured right after the last reward, and "
        "after `advance_to` closed every reward window (deadline heap drained; the last `max_recent` = 100,000 "
        "joined event ids are still remembered -- one per model here, but bounded by `max_recent`, not by the "
        "number of models). `restored`: a fresh process reads the packed snapshot of the engine case (kept, so "
        "its bytes are in the baseline), unpacks it, `PartitionEngine.restore`s it and drops the unpacked "
        "snapshot. Last column: the same process after glibc's `malloc_trim(0)` returned every wholly free page "
        "to the OS (live data plus fragmentation).",
        "",
        "| policy | case | RSS growth B / model | state_nbytes | overhead B / model | RSS / state | "
        "after malloc_trim(0) B / model |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for p, c in res["cases"].items():
        s = c["bare"]["state_nbytes_total"] / c["bare"]["n"]
        rows = [
            ("bare", c["bare"]["rss_growth"], c["bare"]["rss_growth_trimmed"]),
            ("engine, windows open", c["engine"]["rss_growth"], None),
            (
                "engine, windows closed",
                c["engine"]["rss_growth_windows_closed"],
                c["engine"]["rss_growth_windows_closed_trimmed"],
            ),
        ]
        if "restore" in c:
            rows.append(
                (
                    "engine restored from its snapshot",
                    c["restore"]["rss_growth"],
                    c["restore"]["rss_growth_trimmed"],
                )
            )
        for name, g, tr in rows:
            g /= n
            trim = "" if tr is None else f"{tr / n:,.0f}"
            lines.append(
                f"| {p} | {name} | {g:,.0f} | {s:,.0f} | {g - s:,.0f} | {g / s:.2f} | {trim} |"
            )
    lines += [
        "",
        f"## Where the bytes go ({res['n_attribute']:,} models under tracemalloc, "
        "sys.getsizeof over what each model owns)",
        "",
        "Per model, bare learner: array data (= state_nbytes), numpy array headers (the ndarray objects the "
        "model holds), the state scalars kept in its row of a row store, the `_config` dict and the values only "
        "it holds, other scalars and sub-objects, the instance (object + its inline attribute values or slots) "
        "and its entry in the models dict (key string + slot). `traced` is the tracemalloc total, counting only "
        "the rows in use of a row store's chunks; RSS - traced is what the allocator adds.",
        "",
        "| policy | array data | array headers | row scalars | _config dict + values | other "
        "scalars / objects | instance + inline attrs | dict entry | traced | RSS growth (bare, N above) | "
        "allocator (RSS - traced) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, c in res["cases"].items():
        s = c["attribute"]["split"]
        t = c["attribute"]["bare_traced_per_model"]
        r = c["bare"]["rss_growth"] / n
        inst = s["instance"] + s["inline_attribute_values"]
        lines.append(
            f"| {p} | {s['array_data']:,.0f} | {s['array_headers']:,.0f} | {s['row_scalars']:,.0f} | "
            f"{s['config_dict'] + s['config_values']:,.0f} ({s['config_dict']:,} + {s['config_values']:,}) | "
            f"{s['other_objects']:,.0f} | {inst:,.0f} | {s['models_dict_entry']:,.0f} | {t:,.0f} | "
            f"{r:,.0f} | {r - t:,.0f} |"
        )
    lines += [
        "",
        "Engine bookkeeping per model (same small run, windows still open): the engine's own "
        "models dict entry (sys.getsizeof), and, as the bytes tracemalloc sees freed when each structure is emptied, "
        "the deadline heap, the recent ids and the pending decisions (aggregation `first`). `traced` is "
        "tracemalloc's engine total per model.",
        "",
        "| policy | models dict entry | deadline heap | recent ids | pending | engine traced "
        "| bare traced | engine - bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, c in res["cases"].items():
        a, e = c["attribute"], c["attribute"]["engine_split"]
        lines.append(
            f"| {p} | {e['engine_models_dict_entry']:,.0f} | {e['deadline_heap']:,.0f} | "
            f"{e['recent_ids']:,.0f} | {e['pending']:,.0f} | {a['engine_traced_per_model']:,.0f} | "
            f"{a['bare_traced_per_model']:,.0f} | "
            f"{a['engine_traced_per_model'] - a['bare_traced_per_model']:,.0f} |"
        )
    lines += ["", "Snapshot bytes per model at d = 20 and 100: bench/results/recovery.md."]
    snaps = [
        (p, c["engine"], c["restore"])
        for p, c in res["cases"].items()
        if "restore" in c and "pack_seconds" in c["engine"]
    ]
    if snaps:
        lines += [
            "",
            f"## A snapshot of the partition with {n:,} models",
            "",
            "The engine case's partition packed (`engine.snapshot()` then `pack_snapshot`), and the restore "
            "case's unpack + `PartitionEngine.restore`. The worker's own way and the loop's pause: "
            "`python -m bench.snapshots`.",
            "",
            "| policy | snapshot MB | pack s | us per model | unpack + restore s |",
            "|---|---:|---:|---:|---:|",
        ]
        for p, e, r in snaps:
            lines.append(
                f"| {p} | {r['snapshot_bytes'] / 1e6:,.0f} | {e['pack_seconds']:.1f} | "
                f"{1e6 * e['pack_seconds'] / n:,.0f} | {r['seconds']:.1f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        raise SystemExit(harness.main("memory", __doc__, measure, render, add_arguments=_options))
