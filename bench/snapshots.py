"""Snapshots of one partition with many models: the loop's pause and the bytes, base and increments.

    python -m bench.snapshots            # ~15 min: 100,000 models, oful and glb_omd, d = 20
    python -m bench.snapshots --quick    # 10,000 models, printed only

The worker takes a snapshot in one of two ways (stream/worker.py, stream/snapshot_writer.py):
copied on the loop (``PartitionEngine.snapshot``: every model for a base, the changed ones for an
increment), then packed (Avro, zlib) and written by the writer's thread; or, for a snapshot of
``snapshot_fork_models`` models or more, by a forked child that copies, packs and writes while the
loop goes on (into the snapshot topic, the child sends the packed bytes back and the writer's
thread produces them: the ``fork-topic`` case, bases only, with an embedded broker on the same
machine). This measures both ways for a base and for increments of 100, 1,000 and 10,000
changed models: the loop's pause, the time to write, the bytes, and the longest step of a loop
that keeps deciding and updating meanwhile (one context and its reward per step), against the
same loop with no snapshot in flight. Last, the chain the forked snapshots left is loaded in a fresh
process, as a moved partition's next owner loads it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
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
    return {
        "partition": 0,
        "created_ms": 0,
        "contexts_offset": 0,
        "rewards_offset": 0,
        "actions_offset": 0,
        "joined_offset": 0,
        "dead_letter_offset": 0,
        "chain": chain,
        "seq": seq,
    }


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


def _one_snapshot(
    engine,
    writer,
    metrics,
    pool,
    serial: int,
    how: str,
    chain: int,
    seq: int,
    keys: list[str] | None,
) -> tuple[dict, int]:
    """One snapshot (``keys`` None: a base) taken ``how`` ("loop": copied on the loop and packed
    by the writer's thread; "fork": by a forked child), while the loop keeps stepping."""
    t1 = time.perf_counter()
    if how == "loop":
        writer.submit(0, _head(chain, seq) | {"engine": engine.snapshot(keys)})
    else:
        writer.submit_forked(0, _head(chain, seq), engine, keys)
    pause = (time.perf_counter() - t1) * 1000
    longest, _, serial = _longest_step(engine, pool, serial, lambda: writer.busy(0))
    writer.wait()
    assert not writer.take_failures()
    return {
        "pause_ms": pause,
        "write_ms": metrics["snapshot_write_us"] / 1000,
        "bytes": metrics["snapshot_bytes"],
        "longest_ms": longest,
    }, serial


def _row(policy: str, kind: str, models: int, how: str, runs: list[dict]) -> dict:
    row = {
        "policy": policy,
        "snapshot": kind,
        "models": models,
        "taken_by": how,
        "loop_pause_ms": harness.median([r["pause_ms"] for r in runs]),
        "write_ms": harness.median([r["write_ms"] for r in runs]),
        "bytes": harness.median([r["bytes"] for r in runs]),
        "longest_step_while_writing_ms": max(r["longest_ms"] for r in runs),
    }
    print(f"{policy}: {row}", file=sys.stderr, flush=True)
    return row


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def one_case(policy: str, how: str, n: int, repeats: int) -> dict:
    """One policy, snapshots taken one way, in a process of its own (``--child``): a fork's
    pause follows the process's memory, which an earlier case's garbage would inflate."""
    from streambandit.stream.snapshot_writer import SnapshotWriter
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import freeze_long_lived

    pool = feature_pool()
    t0 = time.perf_counter()
    engine = run_engine(policy, n, pool)
    close_windows(engine)
    engine.take_changed()
    freeze_long_lived()  # as the worker does after a recovery: the models leave the collector's walks
    print(
        f"{policy}, {how}: {n:,} models built in {time.perf_counter() - t0:.0f} s",
        file=sys.stderr,
        flush=True,
    )
    metrics: collections.Counter = collections.Counter()
    out: dict = {"policy": policy, "taken_by": how, "models": n, "rss_mb": _rss_mb(), "rows": []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if how == "fork-topic":  # into the snapshot topic of an embedded broker sharing the machine
            from streambandit.dev.tansu import EmbeddedBroker
            from streambandit.stream.snapshots import TopicStore, create_snapshot_topic

            broker = stack.enter_context(EmbeddedBroker())
            create_snapshot_topic(broker.bootstrap_servers, "snapshots", partitions=1)
            store = stack.enter_context(TopicStore(broker.bootstrap_servers, "snapshots"))
        else:
            store = DirectoryStore(tmp)
        writer = SnapshotWriter(store, metrics)
        serial = 0
        # The loop with nothing in flight: what a step costs anyway (a GC, a kernel's first call).
        quiet, _, serial = _longest_step(engine, pool, serial, lambda: False, min_steps=2000)
        out["longest_step_quiet_ms"] = quiet
        runs = []
        for r in range(repeats):
            run, serial = _one_snapshot(engine, writer, metrics, pool, serial, how, r + 1, 0, None)
            runs.append(run)
            engine.take_changed()
        out["rows"].append(_row(policy, "base", n, how, runs))
        for changed in CHANGED:
            if changed > n // 2 or how == "fork-topic":
                continue  # half the models or more, or the topic: the worker writes a base (engine/chains.py)
            runs = []
            for r in range(repeats):
                start = (r * changed) % n
                serial = _update(engine, [(start + j) % n for j in range(changed)], pool, serial)
                keys = sorted(engine.take_changed())
                assert len(keys) >= changed
                run, serial = _one_snapshot(
                    engine, writer, metrics, pool, serial, how, repeats, r + 1, keys
                )
                runs.append(run)
                engine.take_changed()  # the steps' models: not part of the next measured increment
            out["rows"].append(_row(policy, "increment", changed, how, runs))
        writer.close()
        if how != "loop":  # what was just written, as the next owner of the partition loads it
            where = tmp if how == "fork" else f"topic:{broker.bootstrap_servers}"
            runs = [
                json.loads(
                    subprocess.run(
                        [sys.executable, "-m", "bench.snapshots", "--restore", policy, where],
                        stdout=subprocess.PIPE,
                        text=True,
                        check=True,
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                for _ in range(repeats)
            ]
            out["restore"] = {k: harness.median([r[k] for r in runs]) for k in runs[0]}
            print(f"{policy}: restore {out['restore']}", file=sys.stderr, flush=True)
    return out


def restore_case(policy: str, where: str) -> dict:
    """In a fresh process, as a partition's next owner: the newest chain of the directory
    ``where`` (or the newest base in the snapshot topic of the broker ``topic:BOOTSTRAP``) read,
    checked, unpacked and composed (``usable_snapshots``), then ``PartitionEngine.restore``."""
    from bench.memory import models_config
    from streambandit.engine.partition import PartitionEngine
    from streambandit.stream.snapshots import DirectoryStore, TopicStore, usable_snapshots

    config = models_config(policy)
    store = (
        TopicStore(where[len("topic:") :], "snapshots")
        if where.startswith("topic:")
        else DirectoryStore(where)
    )
    t0 = time.perf_counter()
    snap = next(usable_snapshots(store, 0))
    t1 = time.perf_counter()
    snap_seq = snap["seq"]
    engine = PartitionEngine.restore(config, snap["engine"])
    t2 = time.perf_counter()
    del snap
    # The restored rows are the mapped file's pages until a model is first updated, which copies
    # its pages then: the first update of a model against its second.
    pool = feature_pool()
    key = next(iter(engine.models))
    config.resolve(key).build().update(
        pool[0][0], 1.0
    )  # the compiled update loaded, on a model of its own
    models = list(engine.models.values())[::5]
    per_update = []
    for reward in (1.0, 0.0):
        t = time.perf_counter()
        for j, m in enumerate(models):
            m.update(pool[j % len(pool)][0], reward)
        per_update.append((time.perf_counter() - t) / len(models) * 1e6)
    return {
        "load_ms": (t1 - t0) * 1000,
        "restore_ms": (t2 - t1) * 1000,
        "total_ms": (t2 - t0) * 1000,
        "models": len(engine.models),
        "increments": snap_seq,
        "first_update_us": per_update[0],
        "second_update_us": per_update[1],
    }


def measure(a: argparse.Namespace) -> dict:
    n = 10_000 if a.quick else a.models
    cases = []
    for policy in ("oful", "glb_omd"):
        for how in ("loop", "fork", "fork-topic"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.snapshots",
                    "--child",
                    policy,
                    how,
                    str(n),
                    str(a.repeats),
                ],
                stdout=subprocess.PIPE,
                text=True,
                check=True,
            )
            cases.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"models": n, "repeats": a.repeats, "cases": cases}


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)


def render(res: dict) -> str:
    lines = [
        "# Snapshots: the loop's pause and the bytes, base and increments",
        "",
        harness.provenance(
            res,
            f"One partition with {res['models']:,} models (d = {D}); medians of "
            f"{res['repeats']} snapshots, the longest step the worst of them.",
        ),
        "",
        "*Taken by* `loop`: the state copied on the loop, packed and written by the writer's thread; "
        "`fork`: the loop forks and the child copies, packs and writes into a directory store; "
        "`fork-topic`: the same into the snapshot topic of an embedded broker on the same machine (bases "
        "only). *Loop pause*: the copy, or the fork. *Longest step*: the slowest decision-and-update of a "
        "loop that keeps running while the snapshot is written; *quiet*: the same loop with nothing in "
        "flight. *Worker memory*: the process's resident memory with the models built, before the first "
        "snapshot (each policy and way runs in a process of its own). How the worker chooses between them: "
        "docs/architecture.md.",
        "",
        "| policy | snapshot | models in it | taken by | loop pause, ms | writing, ms | bytes | bytes per model "
        "| longest step while writing, ms | longest step quiet, ms | worker memory, MB |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in res["cases"]:
        for r in p["rows"]:
            lines.append(
                f"| {p['policy']} | {r['snapshot']} | {r['models']:,} | {r['taken_by']} | "
                f"{r['loop_pause_ms']:,.1f} | {r['write_ms']:,.0f} | {r['bytes']:,.0f} | "
                f"{r['bytes'] / r['models']:,.0f} | {r['longest_step_while_writing_ms']:.1f} | "
                f"{p['longest_step_quiet_ms']:.1f} | {p['rss_mb']:,.0f} |"
            )
    lines.append("")
    restored = [p for p in res["cases"] if "restore" in p]
    if restored:
        lines += [
            "## Loading the partition elsewhere",
            "",
            "The chain the `fork` case left (its last base and the increments on it), and the last base "
            "the `fork-topic` case left in the topic, loaded in a fresh "
            "process: *load* reads the files or the topic, checks them and "
            "composes the chain (`usable_snapshots`), *restore* builds the engine "
            "(`PartitionEngine.restore`). The joined records written after the chain are re-applied after "
            "this (bench/results/recovery.md). Medians of as many loads as snapshots above.",
            "",
            "| policy | from | models | increments on the base | load, ms | restore, ms | total, ms | "
            "first update of a model, us | second, us |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p in restored:
            r = p["restore"]
            source = "topic" if p["taken_by"] == "fork-topic" else "directory"
            lines.append(
                f"| {p['policy']} | {source} | {r['models']:,.0f} | {r['increments']:.0f} | {r['load_ms']:,.0f} | "
                f"{r['restore_ms']:,.0f} | {r['total_ms']:,.0f} | {r.get('first_update_us', float('nan')):.1f} | "
                f"{r.get('second_update_us', float('nan')):.1f} |"
            )
        lines += [
            "",
            "*First update*: one update of each of a fifth of the models right after the restore; "
            "*second*: the same models again.",
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--restore"]:
        print(json.dumps(restore_case(*sys.argv[2:4])))
        raise SystemExit(0)
    if sys.argv[1:2] == ["--child"]:
        policy, how, n, repeats = sys.argv[2:6]
        print(json.dumps(one_case(policy, how, int(n), int(repeats))))
        raise SystemExit(0)
    raise SystemExit(harness.main("snapshots", __doc__, measure, render, _options))
