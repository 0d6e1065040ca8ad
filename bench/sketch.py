"""Microseconds per select + update and bytes per model of the sketched learners against OFUL.

    python -m bench.sketch            # full run (~3 min), writes bench/results/sketch.{md,json}
    python -m bench.sketch --quick    # a smoke run with small sizes (printed, not written)

The stream is paper 002's synthetic one (Sec. 5): K = 20 arms drawn from N(0, I_d) and normalised,
theta* a random unit vector, rewards x'theta* + N(0, 0.1^2). Every learner uses its defaults (the
paper's practical settings: l = 50 for soful/cbscfd, l0 = 50 and epsilon = 8 for dbs_linucb) with
a constant beta = 0.1 (the paper's experiments tune a constant), so the timings are of the
sketches, not of a radius formula.

Per d the learners see the same pre-generated rounds, in blocks interleaved learner by learner so
machine noise hits all of them alike; the figure is the median block. On this full-rank stream
dbs_linucb sketches until its block cap (Invariant 2) and then switches to exact OFUL updates, after
about (Bmax - 1) * epsilon * l0 rounds; its blocks before and after the switch are reported apart.
Bytes per model are ``state_nbytes()`` (the arrays each model holds), at the end and at the peak.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench import harness
from streambandit import make_policy
from streambandit.sketch.dyadic_block import max_blocks

K = 20
BETA = 0.1
POLICIES = ("oful", "soful", "cbscfd", "dbs_linucb")


def stream(dim: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arms (n, K, dim) with unit rows and linear rewards (n, K)."""
    rng = np.random.default_rng(seed)
    arms = rng.standard_normal((n, K, dim))
    arms /= np.linalg.norm(arms, axis=2, keepdims=True)
    theta = rng.standard_normal(dim)
    theta /= np.linalg.norm(theta)
    return arms, arms @ theta + 0.1 * rng.standard_normal((n, K))


def in_exact_mode(policy) -> bool:
    return bool(getattr(getattr(policy, "sketch", None), "fallback", False))


def time_block(policy, arms, rewards) -> tuple[float, int, int]:
    """Seconds per select + update over one block, and the peak ``state_nbytes`` seen overall and
    while sketching (read outside the timed calls)."""
    elapsed, peak, peak_sketching = 0.0, 0, 0
    for a, r in zip(arms, rewards):
        start = time.perf_counter()
        i = policy.select(a)
        policy.update(a[i], r[i])
        elapsed += time.perf_counter() - start
        nbytes = policy.state_nbytes()
        peak = max(peak, nbytes)
        if not in_exact_mode(policy):
            peak_sketching = max(peak_sketching, nbytes)
    return elapsed / len(arms), peak, peak_sketching


def bench_dim(d: int, block: int, repeats: int) -> list[dict]:
    arms, rewards = stream(d, block * (repeats + 1), seed=d)
    learners = {name: make_policy(name, dim=d, beta=BETA) for name in POLICIES}
    times = {name: [] for name in POLICIES}
    peaks = {name: 0 for name in POLICIES}
    peaks_sketching = {name: 0 for name in POLICIES}
    phase = {
        name: [] for name in POLICIES
    }  # per timed block: "sketching", "exact" or "switch" (both)
    for i in range(repeats + 1):  # block 0 warms caches and the sketches; it is not timed
        sl = slice(i * block, (i + 1) * block)
        for name, p in learners.items():
            before = in_exact_mode(p)
            t, peak, peak_sketching = time_block(p, arms[sl], rewards[sl])
            after = in_exact_mode(p)
            peaks[name] = max(peaks[name], peak)
            peaks_sketching[name] = max(peaks_sketching[name], peak_sketching)
            if i > 0:
                times[name].append(t)
                phase[name].append("exact" if before else "switch" if after else "sketching")
    rows = []
    oful_us = harness.median(times["oful"]) * 1e6
    oful_bytes = learners["oful"].state_nbytes()
    for name, p in learners.items():
        sk = getattr(p, "sketch", None)
        sketching = [t for t, ph in zip(times[name], phase[name]) if ph == "sketching"]
        exact = [t for t, ph in zip(times[name], phase[name]) if ph == "exact"]
        row = {
            "policy": name,
            "d": d,
            "K": K,
            "rounds": block * (repeats + 1),
            "block": block,
            "us_per_round": harness.median(times[name]) * 1e6,
            "us_sketching": harness.median(sketching) * 1e6 if sketching else None,
            "us_exact": harness.median(exact) * 1e6 if exact else None,
            "bytes_end": p.state_nbytes(),
            "bytes_peak": peaks[name],
            "bytes_peak_sketching": None if name == "oful" else peaks_sketching[name] or None,
            "runs_us": [t * 1e6 for t in times[name]],
            "phases": phase[name],
        }
        row["oful_over_ours"] = oful_us / (row["us_sketching"] or row["us_per_round"])
        row["oful_bytes_over_peak"] = oful_bytes / row["bytes_peak"]
        row["oful_bytes_over_peak_sketching"] = (
            oful_bytes / row["bytes_peak_sketching"] if row["bytes_peak_sketching"] else None
        )
        if name == "dbs_linucb":
            row.update(
                bmax=max_blocks(d, p.config()["l0"]),
                blocks_closed=sk.n_closed,
                exact_at_end=sk.fallback,
                shrink_total=sk.shrink_total,
            )
        elif sk is not None:
            row.update(shrink_total=sk.shrink_total)
        rows.append(row)
    return rows


def fmt_us(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def fmt_int(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def fmt_ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def measure(args: argparse.Namespace) -> dict:
    dims, block, repeats = ((100, 200), 50, 3) if args.quick else ((100, 500, 1000), 200, 9)
    return {
        "rows": [r for d in dims for r in bench_dim(d, block, repeats)],
        "beta": BETA,
        "K": K,
        "block": block,
        "repeats": repeats,
    }


def render(res: dict) -> str:
    lines = [
        "# Sketched learners: select + update cost and memory per model",
        "",
        harness.provenance(res, f"scipy {res['machine']['scipy']}; BLAS pinned to one thread."),
        "",
        f"Paper 002's synthetic stream: K = {res['K']} unit-norm N(0, I) arms per round, defaults of every learner"
        f" (soful/cbscfd l = 50; dbs_linucb l0 = 50, epsilon = 8, robust FD), constant beta = {res['beta']}.",
        f"Per d: {res['repeats']} timed blocks of {res['block']} rounds after one warm-up block, "
        "interleaved learner by",
        "learner; the figure is the median block. dbs_linucb's blocks are split into those spent sketching",
        "and those after its switch to exact updates (the block with the switch is in neither).",
        "",
        "| policy | d | us / round (sketching) | us / round (exact) | OFUL time / ours | bytes / "
        "model at end | peak bytes while sketching | OFUL bytes / that peak | peak bytes | dbs state at end |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in res["rows"]:
        sketching, exact = r["us_sketching"], r["us_exact"]
        if r["policy"] == "oful":
            sketching, exact = None, r["us_per_round"]
        elif r["policy"] != "dbs_linucb":
            sketching, exact = r["us_per_round"], None
        state = ""
        if r["policy"] == "dbs_linucb":
            state = f"Bmax = {r['bmax']}, {r['blocks_closed']} blocks, " + (
                "exact (OFUL) mode" if r["exact_at_end"] else "sketching"
            )
        lines.append(
            f"| {r['policy']} | {r['d']} | {fmt_us(sketching)} | {fmt_us(exact)} | {r['oful_over_ours']:.2f}x "
            f"| {r['bytes_end']:,} | {fmt_int(r['bytes_peak_sketching'])} "
            f"| {fmt_ratio(r['oful_bytes_over_peak_sketching'])} "
            f"| {r['bytes_peak']:,} | {state} |"
        )
    lines += [
        "",
        '"OFUL time / ours" compares with dbs_linucb\'s sketching blocks when it has any, else with all '
        "its blocks.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("sketch", __doc__, measure, render))
