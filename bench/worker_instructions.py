"""The worker's instructions per event, by stage: bench.worker_path's levels, counted by callgrind.

    python -m bench.worker_instructions                  # ~20 min on 2 cores, writes results
    python -m bench.worker_instructions --base 9484de3   # also a checkout of that commit, same run
    python -m bench.worker_instructions --quick          # 300 contexts, printed only

CPU time on a shared 2-core machine moves by more than the changes worth measuring: two runs of
``bench.worker_path`` on the same code can differ by a third, and a stage (a difference of two
levels) can come out negative. Instructions executed do not depend on the machine's load, so a
change of a few per cent is seen, and two trees compare exactly. They are not time: a cache miss
or a mispredicted branch costs many instructions' time, and ``bench.worker_path`` stays the
measure of microseconds.

Each level of ``bench.worker_path`` (decode; + buffer; + engine; + encode; + produce) runs once
over the same backlog, in one process under ``valgrind --tool=callgrind``, each inside its own
``operator.call``: callgrind counts only inside that C function (``--toggle-collect``) and writes
one count per call (``--dump-after``). Before them the path runs once uncounted, to compile and
warm. A stage is the difference between its level and the one before. With ``--base REV`` the same
is counted on a checkout of REV (its numba cache filled first, outside valgrind), and the table
gives both and their ratio. Each count also says how much of it is numba's compiled code (the
learners' kernels, the decoder's and encoders' passes, the exploration draw): what is left when
the rest, the interpreter's share, is gone.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import harness

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("oful", "glb_omd")
_STAGES = ("decode", "buffer", "engine", "encode", "produce")


def _child(policy: str, n: int) -> None:
    """Run in the counted process: the warm-up, then each level inside one ``operator.call``.
    The tree's own bench.worker_path builds the backlog and the processor; the levels are its
    ``run``'s, here without the timing (a base tree's ``run`` times them inside)."""
    import operator

    from bench import worker_path as wp
    from streambandit.stream.worker import freeze_long_lived
    from streambandit.wire.batch_decode import decode_batch

    def through(b, batches, level, producer) -> None:
        for batch in batches:
            if level == 1:
                decode_batch([m.value() for m in batch])
                continue
            b.buffer(batch, now)
            if level == 3:
                wp._engine_only(b, now)
            elif level == 4:
                b.release(now, wp._NOT_BEHIND, wp._drop)
            elif level == 5:
                b.release(now, wp._NOT_BEHIND, wp._produce(producer))
                producer.purge(in_queue=True, in_flight=False)

    batches, now = wp.messages(n), 10**13
    wp.run(policy, wp.messages(300), 5)  # compile and warm, not counted
    for level in range(1, len(_STAGES) + 1):
        b, producer = wp.processor(policy), wp._producer() if level == 5 else None
        freeze_long_lived()
        operator.call(through, b, batches, level, producer)
    print("EVENTS", sum(map(len, batches)), flush=True)


def _count(tree: Path, policy: str, n: int) -> dict:
    """Instructions per event of each stage, counted on ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    # This file, run as a script: the tree's own bench and streambandit are imported.
    child = [sys.executable, str(Path(__file__).resolve()), "--child", policy, str(n)]
    # Outside valgrind first: numba's cache of this tree filled, so the counted run loads it.
    subprocess.run(child, cwd=tree, env=env, check=True, capture_output=True)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "cg.out"
        cmd = [
            "valgrind",
            "--tool=callgrind",
            "--toggle-collect=_operator_call",
            "--dump-after=_operator_call",
            f"--callgrind-out-file={out}",
            *child,
        ]
        done = subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True, text=True)
        events = int(re.search(r"^EVENTS (\d+)$", done.stdout, re.M).group(1))
        dumps = sorted(Path(d).glob("cg.out.*"), key=lambda p: int(p.suffix[1:]))
        levels = [_total(p) for p in dumps]
        compiled = [_compiled(p) for p in dumps]
    if len(levels) != len(_STAGES):
        raise RuntimeError(f"{len(levels)} counts for {len(_STAGES)} levels: {dumps}")
    stages, jit, prev, prev_jit = {}, {}, 0, 0
    for name, total, total_jit in zip(_STAGES, levels, compiled):
        stages[name] = (total - prev) / events
        jit[name] = (total_jit - prev_jit) / events
        prev, prev_jit = total, total_jit
    return {
        "events": events,
        "per_event": stages,
        "compiled_per_event": jit,
        "total": prev / events,
        "compiled_total": prev_jit / events,
    }


def _compiled(dump: Path) -> int:
    """The instructions of numba's compiled code in ``dump``: the self cost of functions in no
    object file (callgrind's ``ob=... ???``, named by address), the rest being Python, its C
    libraries and numpy's. Read from the dump itself: a cost line after ``calls=`` is the
    callee's inclusive cost, not the caller's own, and is skipped."""
    spec = re.compile(r"^(c?)(ob|fn)=\((\d+)\)(?: (.*))?$")
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    ob = fn = ""
    total, after_call = 0, False
    for line in dump.read_text().splitlines():
        if m := spec.match(line):
            callee, kind, idx, name = m.groups()
            if name is not None:
                names[kind][idx] = name
            if not callee:
                if kind == "ob":
                    ob = names["ob"].get(idx, "")
                else:
                    fn = names["fn"].get(idx, "")
        elif line.startswith("calls="):
            after_call = True
        elif line[:1].isdigit() or line[:1] in ("+", "-", "*"):
            if after_call:
                after_call = False
            elif ob == "???" and fn.startswith("0x"):
                total += int(line.split()[1])
    return total


def _total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def measure(args: argparse.Namespace) -> dict:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is needed: apt-get install valgrind")
    n = 300 if args.quick else 1000
    trees = {"current": ROOT}
    base_dir = None
    if args.base:
        base_dir = Path(tempfile.mkdtemp(prefix="sb-base-"))
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_dir), args.base],
            check=True,
            capture_output=True,
        )
        trees = {"base": base_dir, "current": ROOT}
    try:
        # Each count is a process of its own (one core): as many at once as there are cores.
        # Instructions counted do not depend on what runs beside them.
        jobs = [(name, tree, policy) for policy in POLICIES for name, tree in trees.items()]
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            counts = list(pool.map(lambda job: _count(job[1], job[2], n), jobs))
        runs = [
            {"tree": name, "policy": policy, **count}
            for (name, _, policy), count in zip(jobs, counts)
        ]
    finally:
        if base_dir is not None:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_dir)],
                check=False,
                capture_output=True,
            )
    return {"contexts": n, "base": args.base, "runs": runs}


def render(res: dict) -> str:
    lines = [
        "# The worker's instructions per event, by stage (callgrind)",
        "",
        harness.provenance(
            res,
            f"bench.worker_path's levels over {res['contexts']:,} contexts of the ad-traffic "
            "backlog and their rewards, each level once, counted by callgrind (instructions, "
            "not time: a change of a few per cent shows, whatever the machine's load).",
        ),
        "",
        "| policy | tree | " + " | ".join(_STAGES) + " | total per event |",
        "|---|---|" + "---:|" * (len(_STAGES) + 1),
    ]
    by = {(r["policy"], r["tree"]): r for r in res["runs"]}
    for r in res["runs"]:
        tree = r["tree"] if r["tree"] == "current" else f"base ({res['base']})"
        lines.append(
            f"| {r['policy']} | {tree} | "
            + " | ".join(f"{r['per_event'][s]:,.0f}" for s in _STAGES)
            + f" | {r['total']:,.0f} |"
        )
        if "compiled_per_event" in r:
            lines.append(
                f"| {r['policy']} | {tree}: of which compiled | "
                + " | ".join(f"{r['compiled_per_event'][s]:,.0f}" for s in _STAGES)
                + f" | {r['compiled_total']:,.0f} |"
            )
        base = by.get((r["policy"], "base"))
        if r["tree"] == "current" and base is not None:
            lines.append(
                f"| {r['policy']} | current / base | "
                + " | ".join(
                    f"{r['per_event'][s] / base['per_event'][s]:.3f}"
                    if base["per_event"][s] > 0
                    else "n/a"
                    for s in _STAGES
                )
                + f" | {r['total'] / base['total']:.3f} |"
            )
    current = [r for r in res["runs"] if r["tree"] == "current" and "compiled_total" in r]
    if current:
        lines += [
            "",
            "*of which compiled*: the instructions of numba's compiled code (the decoder's parse, "
            "the learners' kernels, the exploration draw, the encoders' passes: code no object "
            "file holds, which callgrind names `???:0x...`); the rest is the interpreter, its "
            "objects and numpy's and librdkafka's C calls. "
            + " ".join(
                f"{r['policy']}: {r['compiled_total'] / r['total']:.1%} of the total, "
                f"{r['compiled_per_event']['engine'] / r['per_event']['engine']:.1%} of the "
                "engine stage."
                for r in current
            ),
        ]
    return "\n".join(lines) + "\n"


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--base", help="also count a checkout of this commit, in the same run")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], int(sys.argv[3]))
        raise SystemExit(0)
    raise SystemExit(
        harness.main("worker_instructions", __doc__, measure, render, add_arguments=_options)
    )
