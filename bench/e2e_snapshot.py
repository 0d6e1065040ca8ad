"""Part 6 of ``python -m bench.e2e`` (``--only snapshot``): a snapshot of one partition at a given
load, the engine's copy and the packing timed apart.

Both engines are timed: ``ArrayPartitionEngine``, the worker's, and ``PartitionEngine``, the
rules in Python (the Decider's, and what an older checkout, which has only that one, measures).
"""

from __future__ import annotations

import time

from bench import harness, traffic


def snapshot_pause(contexts_per_s: float, window_ms: int = 2000, repeats: int = 5) -> dict:
    """A snapshot of one partition at ``contexts_per_s`` (all partitions): an engine fed a window's
    worth of contexts and more (so it holds the open decisions and the recent ids a live one does),
    then copied (``engine.snapshot()``) and packed (``pack_snapshot``), each timed."""
    from streambandit.config.models import parse_models_config
    from streambandit.engine.partition import PartitionEngine
    from streambandit.wire import InputRef, pack_snapshot

    try:
        from streambandit.engine.array_partition import ArrayPartitionEngine
    except ImportError:  # an older checkout
        classes = [PartitionEngine]
    else:
        classes = [ArrayPartitionEngine, PartitionEngine]
    per_partition = contexts_per_s / traffic.PARTITIONS
    n = int(per_partition * 10)  # ten seconds of one partition's contexts
    models = parse_models_config(traffic.models("oful", window_ms))
    head = {
        "partition": 0,
        "created_ms": 0,
        "contexts_offset": n,
        "rewards_offset": 0,
        "actions_offset": 0,
        "joined_offset": 0,
        "dead_letter_offset": 0,
    }
    engines, packed = {}, set()
    for cls in classes:
        eng = cls(models)
        for i, (ctx, _) in enumerate(traffic.backlog(n)):
            ctx.timestamp_ms = traffic.T0_MS + int(i * 1000 / per_partition)
            eng.on_context(ctx, InputRef(0, 0, i))
        snap_ms, pack_ms = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            state = eng.snapshot()
            t1 = time.perf_counter()
            blob = pack_snapshot(head | {"engine": state})
            t2 = time.perf_counter()
            snap_ms.append((t1 - t0) * 1000)
            pack_ms.append((t2 - t1) * 1000)
        packed.add(blob)
        engines[cls.__name__] = {
            "snapshot_ms": harness.median(snap_ms),
            "pack_ms": harness.median(pack_ms),
        }
    if len(packed) != 1:
        raise RuntimeError("the two engines' snapshots of the same contexts differ")
    out = {
        "contexts_per_s": contexts_per_s,
        "window_ms": window_ms,
        "partitions": traffic.PARTITIONS,
        "pending": len(eng.pending),
        "recent": len(eng.recent),
        "engines": engines,
        # The worker's engine, first in classes (the rows before engines were timed apart).
        "snapshot_ms": engines[classes[0].__name__]["snapshot_ms"],
        "pack_ms": engines[classes[0].__name__]["pack_ms"],
        "bytes": len(blob),
        "repeats": repeats,
    }
    print(f"snapshot: {out}", flush=True)
    return out


def render(res: dict) -> list[str]:
    """Part 6 of the report."""
    partitions = res["partitions"]
    lines: list[str] = []
    sp = res["snapshot"]
    every_s = min(
        res["snapshot_every_updates"] / (sp["contexts_per_s"] / partitions),
        res["snapshot_interval_s"],
    )
    lines += [
        "## 6. A snapshot of one partition at the latency runs' load",
        "",
        f"One partition's engine fed half the live maximum ({sp['contexts_per_s']:,.0f} contexts/s over "
        f"{partitions} partitions, reward window {sp['window_ms']:,} ms, 4 models): {sp['pending']:,} open decisions "
        f"and {sp['recent']:,} recently joined ids. `engine.snapshot()` and `pack_snapshot` of it timed apart, "
        f"median of {sp['repeats']} runs",
    ]
    if "engines" in sp:
        lines[-1] += (
            ", for the worker's engine (`ArrayPartitionEngine`) and the rules in Python "
            "(`PartitionEngine`, the Decider's), fed the same contexts (their snapshots are the same "
            "bytes); where each runs in the worker: docs/architecture.md."
        )
        lines += [
            "",
            "| engine | engine.snapshot ms | pack_snapshot ms | bytes |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {name} | {e['snapshot_ms']:.1f} | {e['pack_ms']:.1f} | {sp['bytes']:,} |"
            for name, e in sp["engines"].items()
        ]
    else:  # a result from before both engines were timed
        lines[-1] += "; where each runs in the worker: docs/architecture.md."
        lines += [
            "",
            "| engine.snapshot ms | pack_snapshot ms | bytes |",
            "|---:|---:|---:|",
            f"| {sp['snapshot_ms']:.1f} | {sp['pack_ms']:.1f} | {sp['bytes']:,} |",
        ]
    lines += [
        "",
        f"At that rate the default triggers (`snapshot_every_updates` {res['snapshot_every_updates']:,}, "
        f"`snapshot_interval_s` {res['snapshot_interval_s']:g}) snapshot each partition every "
        f"{every_s:.0f} s.",
        "",
    ]
    return lines
