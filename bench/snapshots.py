"""Snapshots of one partition with many models: the loop's pause and the bytes, base and increments.

    python -m bench.snapshots            # ~5 min: 100,000 models, oful and glb_omd, d = 20
    python -m bench.snapshots --quick    # 10,000 models, printed only

The worker takes a snapshot in two halves (stream/worker.py, stream/snapshot_writer.py): on the
loop, the copy of the state (``PartitionEngine.snapshot``: every model for a base, the changed ones
for an increment); on the writer's thread, the packing (Avro, zlib) and the store's write. This
measures both halves for a base and for increments of 100, 1,000 and 10,000 changed models, the
bytes written, and the longest step of a loop that keeps deciding and updating while the writer
works (one context and its reward per step; the writer's packing shares the GIL with it), against
the same loop with no snapshot in flight.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time

from bench import harness
from bench.memory import D, K, close_windows, feature_pool, run_engine

CHANGED = (100, 1_000, 10_000)


def _update(engine, keys: list[int], pool, serial: int) -> int:
    """One decision and its reward for each model in ``keys``, windows closed: those models change."""
    from streambandit.wire import Context, Reward

    arm_ids = tuple(f"ad-{j}" for j in range(K))
    for i in keys:
        serial += 1
        t = engine.watermark_ms + 1
        engine.on_context(Context(f"u-{serial}", f"m-{i}", t, arm_ids, pool[serial % len(pool)]))
        engine.on_reward(Reward(f"u-{serial}", f"m-{i}", t, float(serial % 2)))
    close_windows(engine)
    return serial


def _head(chain: int, seq: int) -> dict:
    return {"partition": 0, "created_ms": 0, "contexts_offset": 0, "rewards_offset": 0, "actions_offset": 0,
            "joined_offset": 0, "dead_letter_offset": 0, "chain": chain, "seq": seq}


def _longest_step(engine, pool, serial: int, busy, min_steps: int = 200) -> tuple[float, int, int]:
    """Steps of one context and its reward (on models that exist) while ``busy()`` (at least
    ``min_steps``): the longest step in ms, the steps taken, and the serial reached."""
    from streambandit.wire import Context, Reward

    arm_ids = tuple(f"ad-{j}" for j in range(K))
    longest, steps = 0.0, 0
    while busy() or steps < min_steps:
        serial += 1
        key = f"m-{serial % 1000}"
        t0 = time.perf_counter()
        t = engine.watermark_ms + 1
        engine.on_context(Context(f"s-{serial}", key, t, arm_ids, pool[serial % len(pool)]))
        engine.on_reward(Reward(f"s-{serial}", key, t, 1.0))
        longest = max(longest, time.perf_counter() - t0)
        steps += 1
    return longest * 1000, steps, serial


def one_policy(policy: str, n: int, repeats: int) -> dict:
    from streambandit.stream.snapshot_writer import SnapshotWriter
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import freeze_long_lived

    pool = feature_pool()
    t0 = time.perf_counter()
    engine = run_engine(policy, n, pool)
    close_windows(engine)
    engine.take_changed()
    freeze_long_lived()  # as the worker does after a recovery: the models leave the collector's walks
    print(f"{policy}: {n:,} models built in {time.perf_counter() - t0:.0f} s", flush=True)
    metrics: collections.Counter = collections.Counter()
    out: dict = {"policy": policy, "models": n, "dim": D}
    with tempfile.TemporaryDirectory() as tmp:
        writer = SnapshotWriter(DirectoryStore(tmp), metrics)
        serial = 0
        # The loop with nothing in flight: what a step costs anyway (a GC, a kernel's first call).
        quiet, _, serial = _longest_step(engine, pool, serial, lambda: False, min_steps=2000)
        out["longest_step_quiet_ms"] = quiet
        # A base: every model copied on the loop, then packed and written by the writer.
        copies, writes, sizes, during = [], [], [], []
        for r in range(repeats):
            t1 = time.perf_counter()
            snap = _head(r + 1, 0) | {"engine": engine.snapshot()}
            copies.append((time.perf_counter() - t1) * 1000)
            engine.take_changed()
            writer.submit(0, snap)
            del snap
            longest, _, serial = _longest_step(engine, pool, serial, lambda: writer.busy(0))
            during.append(longest)
            writer.wait()
            writes.append(metrics["snapshot_write_ms"])
            sizes.append(metrics["snapshot_bytes"])
        out["base"] = {"loop_copy_ms": harness.median(copies), "write_ms": harness.median(writes),
                       "bytes": harness.median(sizes), "longest_step_while_writing_ms": max(during)}
        print(f"{policy}: base {out['base']}", flush=True)
        out["increments"] = []
        chain, seq = repeats, 0
        for changed in CHANGED:
            if changed > n // 2:
                continue  # half the models or more: the worker writes a base (stream/chains.py)
            copies, writes, sizes, during = [], [], [], []
            for r in range(repeats):
                start = (r * changed) % n
                serial = _update(engine, [(start + j) % n for j in range(changed)], pool, serial)
                t1 = time.perf_counter()
                keys = sorted(engine.take_changed())
                seq += 1
                snap = _head(chain, seq) | {"engine": engine.snapshot(keys)}
                copies.append((time.perf_counter() - t1) * 1000)
                writer.submit(0, snap)
                del snap
                longest, _, serial = _longest_step(engine, pool, serial, lambda: writer.busy(0))
                during.append(longest)
                writer.wait()
                engine.take_changed()  # the steps' models: not part of the next measured increment
                writes.append(metrics["snapshot_write_ms"])
                sizes.append(metrics["snapshot_bytes"])
                assert len(keys) >= changed
            row = {"changed": changed, "loop_copy_ms": harness.median(copies), "write_ms": harness.median(writes),
                   "bytes": harness.median(sizes), "bytes_per_changed": harness.median(sizes) / changed,
                   "longest_step_while_writing_ms": max(during)}
            print(f"{policy}: increment {row}", flush=True)
            out["increments"].append(row)
        writer.close()
    return out


def measure(a: argparse.Namespace) -> dict:
    n = 10_000 if a.quick else a.models
    return {"models": n, "repeats": a.repeats,
            "policies": [one_policy(p, n, a.repeats) for p in ("oful", "glb_omd")]}


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)


def render(res: dict) -> str:
    lines = ["# Snapshots: the loop's pause and the bytes, base and increments", "",
             harness.provenance(res, f"One partition with {res['models']:,} models (d = {D}); medians of "
                                     f"{res['repeats']} snapshots, the longest step the worst of them."), "",
             "On the loop: the copy of the state (every model for a base, the changed ones for an increment). "
             "On the writer's thread: packing and writing to a directory store. *Longest step*: the slowest "
             "decision-and-update of a loop that keeps running while the writer works (the writer's packing "
             "shares the GIL with it); *quiet*: the same loop with nothing in flight.", "",
             "| policy | snapshot | models in it | loop pause (copy), ms | writer, ms | bytes | bytes per model "
             "| longest step while writing, ms | longest step quiet, ms |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for p in res["policies"]:
        b = p["base"]
        lines.append(f"| {p['policy']} | base | {p['models']:,} | {b['loop_copy_ms']:,.0f} | {b['write_ms']:,.0f} | "
                     f"{b['bytes']:,.0f} | {b['bytes'] / p['models']:,.0f} | {b['longest_step_while_writing_ms']:.1f} | "
                     f"{p['longest_step_quiet_ms']:.1f} |")
        for r in p["increments"]:
            lines.append(f"| {p['policy']} | increment | {r['changed']:,} | {r['loop_copy_ms']:,.1f} | "
                         f"{r['write_ms']:,.0f} | {r['bytes']:,.0f} | {r['bytes_per_changed']:,.0f} | "
                         f"{r['longest_step_while_writing_ms']:.1f} | {p['longest_step_quiet_ms']:.1f} |")
    lines += ["", "An increment's bytes and loop pause follow the models changed, not the models held; a base's "
              "copy is a pause in proportion to all of them (the worker writes one every `snapshot_base_every` "
              "increments, when half the models changed, and when a partition has no chain to continue).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("snapshots", __doc__, measure, render, _options))
