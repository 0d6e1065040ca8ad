"""Where oful's play() time goes at d = 20, K = 10, and the floor this core puts under it.

    python -m bench.play_bound          # full run (~1 min), writes results/play_bound.{md,json}
    python -m bench.play_bound --quick    # a smoke run on a short stream, printed

The stream is ``python -m bench.peers``'s (streambandit/benchmarks/stream.py, seed 0). Timed, in
one process, each repeat running every row once in turn (BLAS and numba pinned to one thread):

- play: ``oful.play()`` over the stream (the compiled ``kernels.oful_play``);
- decide: the decision kernel alone (``_ucb_row`` + argmax) on every context, against the state
  play ends in; update: the update alone, replaying play's choices from the initial state;
- the same three for the index-order formulation the kernels had before the current one (a copy
  below, compiled the same way): the same sums in the same order, so the same bits;
- the same copy compiled with fastmath (reassociation and fused multiply-add allowed): what the
  fixed summation order costs. Its bits differ, which the project's determinism rule forbids.

The floor: the additions and multiplications one decide + update needs, against the rate this
core sustains on the kernels' own inner loop (four rows of a matrix per pass, in L1, no FMA), and
the chain of dependent additions one event must wait for, against the measured latency of one
add. Both rates are measured here, not taken from a data sheet.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # before numba is imported: per-core figures

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from bench import harness  # noqa: E402
from streambandit import make_policy  # noqa: E402
from streambandit.benchmarks.stream import make_stream  # noqa: E402
from streambandit.numerics import kernels  # noqa: E402

D, K = 20, 10
OFUL = {"noise_sd": 0.1, "S": 1.0, "delta": 0.05}  # bench.peers' oful row
TARGET = 1_000_000  # decide + update per second, one core (issue 37)


# -- the index-order formulation before the current kernels, for the same-run ratio -------------


def _reference(fastmath: bool):
    """The kernels' play loop as it was before the current formulation: the feature check exits
    at the first bad value, ``inv @ x`` one row of inv per pass, each arm's two dots one chain
    after the other, and the update computes ``V^-1 x`` again. Returns (play, decide, update)."""
    jit = njit(nogil=True, fastmath=fastmath)

    @jit
    def row_ok(x):
        for i in range(x.shape[0]):
            if not abs(x[i]) <= kernels.MAX_ABS_FEATURE:
                return False
        return True

    @jit
    def dot(a, b):
        s = 0.0
        for i in range(a.shape[0]):
            s += a[i] * b[i]
        return s

    @jit
    def sym_matvec(m, x, out):
        d = x.shape[0]
        for i in range(d):
            out[i] = 0.0
        for j in range(d):
            xj = x[j]
            for i in range(d):
                out[i] += xj * m[j, i]

    @jit
    def ucb_row(arms, theta, inv, beta, scores, work):
        k_arms, d = arms.shape
        for k in range(k_arms):
            if not row_ok(arms[k]):
                return False
        work[:, :] = 0.0
        for j in range(d):
            row = inv[j]
            for k in range(k_arms):
                akj = arms[k, j]
                wk = work[k]
                for i in range(d):
                    wk[i] += akj * row[i]
        for k in range(k_arms):
            x = arms[k]
            q = dot(x, work[k])
            scores[k] = dot(x, theta) + beta * math.sqrt(q if q > 0.0 else 0.0)
        return True

    @jit
    def argmax_first(scores):
        best = 0
        for k in range(1, scores.shape[0]):
            if scores[k] > scores[best]:
                best = k
        return best

    @jit
    def oful_update(vinv, b, theta, x, reward, work):
        sym_matvec(vinv, x, work)
        q = dot(x, work)
        c = 1.0 / (1.0 + 1.0 * q)  # sherman_morrison with weight 1
        d = x.shape[0]
        for i in range(d):
            vi = work[i]
            for j in range(d):
                vinv[i, j] -= (vi * work[j]) * c
        for i in range(d):
            b[i] += reward * x[i]
        sym_matvec(vinv, b, theta)
        return math.log1p(q)

    @jit
    def play(arms, rewards, theta, vinv, b, params, chosen):
        n, k_arms, d = arms.shape
        logdet = 0.0
        work = np.empty(d)
        arm_work = np.empty((k_arms, d))
        scores = np.empty(k_arms)
        for t in range(n):
            beta = kernels.oful_beta(params[0], params[1], params[2], params[3], params[4], logdet)
            if not ucb_row(arms[t], theta, vinv, beta, scores, arm_work):
                return logdet
            k = argmax_first(scores)
            chosen[t] = k
            logdet += oful_update(vinv, b, theta, arms[t, k], rewards[t, k], work)
        return logdet

    @jit
    def decide(arms, theta, vinv, beta, chosen):
        n, k_arms, d = arms.shape
        arm_work = np.empty((k_arms, d))
        scores = np.empty(k_arms)
        for t in range(n):
            ucb_row(arms[t], theta, vinv, beta, scores, arm_work)
            chosen[t] = argmax_first(scores)

    @jit
    def update(xs, rs, vs, vinv, b, theta):
        work = np.empty(xs.shape[1])
        logdet = 0.0
        for t in range(xs.shape[0]):
            logdet += oful_update(vinv, b, theta, xs[t], rs[t], work)
        return logdet

    return play, decide, update


# -- the current kernels' parts, timed alone ------------------------------------------------------


@njit(nogil=True)
def _decide(arms, theta, vinv, beta, chosen):
    n, k_arms, d = arms.shape
    arm_work = np.empty((k_arms, d))
    scores = np.empty(k_arms)
    for t in range(n):
        kernels._ucb_row(arms[t], theta, vinv, beta, scores, arm_work)
        chosen[t] = kernels._argmax_first(scores)


@njit(nogil=True)
def _update(xs, rs, vs, vinv, b, theta):
    # play's update: V^-1 x is the decision's work row for the chosen arm (recorded in vs).
    logdet = 0.0
    for t in range(xs.shape[0]):
        logdet += kernels._oful_step(vinv, b, theta, xs[t], rs[t], vs[t])
    return logdet


@njit(nogil=True)
def _record_v(arms, chosen, vinv0, rs):
    """V_t^-1 x_t of every chosen arm along play's trajectory: the update's input from the
    decision, recorded so the update can be timed alone."""
    n, _, d = arms.shape
    vinv = vinv0.copy()
    b = np.zeros(d)
    theta = np.zeros(d)
    vs = np.empty((n, d))
    for t in range(n):
        x = arms[t, chosen[t]]
        kernels.sym_matvec(vinv, x, vs[t])
        kernels._oful_step(vinv, b, theta, x, rs[t], vs[t])
    return vs


# -- what this core sustains ----------------------------------------------------------------------


@njit(nogil=True)
def _add_chain(x, n):
    # n dependent additions: each waits for the one before (x is in L1, its loads do not).
    s = 0.0
    for t in range(n):
        s += x[t & 255]
    return s


@njit(nogil=True)
def _four_rows(out, m, x, reps):
    # The kernels' inner loop (sym_matvec, _ucb_row) on a 4 x 256 block in L1: 8 flops per element.
    for _ in range(reps):
        x0, x1, x2, x3 = x[0], x[1], x[2], x[3]
        m0, m1, m2, m3 = m[0], m[1], m[2], m[3]
        for i in range(out.shape[0]):
            out[i] = (((out[i] + x0 * m0[i]) + x1 * m1[i]) + x2 * m2[i]) + x3 * m3[i]


def flops(d: int, k: int) -> dict:
    """Floating-point additions and multiplications of one decide + update (the current kernels:
    the update reuses the decision's ``V^-1 x``), and what the other formulation adds."""
    decide = 2 * k * d * d + 4 * k * d + 2 * k  # inv x_k; x'theta and x'inv x; theta + beta sqrt
    update = 3 * d * d + 2 * d + 2 + 2 * d + 2 * d * d  # Sherman-Morrison; b += r x; V^-1 b
    return {
        "decide": decide,
        "update": update,
        "total": decide + update,
        "reference_extra": 2 * d * d,  # the reference computes V^-1 x again in the update
        "sqrt": k,
        "div": 1,
        "log1p": 1,
    }


def critical_adds(d: int) -> int:
    """Dependent additions one event waits for from the state it reads to the state it leaves:
    an element of inv x (d), the chosen arm's x'inv x (d), then an element of theta (d)."""
    return 3 * d


def _cpu() -> dict:
    text = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    flags = set(re.search(r"^flags\s*:\s*(.*)$", text, re.M).group(1).split()) if text else set()
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return {
        "mhz": float(mhz.group(1)) if mhz else None,
        "flags": {f: f in flags for f in ("avx2", "fma", "avx512f")},
    }


def _vector_registers() -> dict:
    """Register operands in the machine code of the decision and update timed here (compiled in
    this process; numba does not show the code of a kernel loaded from its cache): ymm holds 4
    doubles, zmm 8; and how many fused multiply-adds the compiler emitted (none without
    fastmath)."""
    asm = "\n".join(text for fn in (_decide, _update) for text in fn.inspect_asm().values())
    return {r: len(re.findall(rf"%{r}\d+", asm)) for r in ("xmm", "ymm", "zmm")} | {
        "fma": len(re.findall(r"\bvfn?m(?:add|sub)\w*", asm))
    }


# -- the run --------------------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> dict:
    n, repeats = (2_000, 3) if args.quick else (20_000, 15)
    stream = make_stream(n, D, K, noise_sd=OFUL["noise_sd"], seed=0)
    arms, rewards = stream.arms, stream.rewards

    def fresh():
        return make_policy("oful", dim=D, **OFUL)

    p = fresh()
    chosen = p.play(arms, rewards)
    state = p.state_dict()
    params = p._store.params
    rs = rewards[np.arange(n), chosen].copy()
    xs = np.ascontiguousarray(arms[np.arange(n), chosen])
    vs = _record_v(arms, chosen, np.eye(D), rs)
    beta = kernels.oful_beta(*params[:5], state["logdet"])
    theta_end, vinv_end = state["theta"], state["vinv"]

    ref = {"reference": _reference(False), "fastmath": _reference(True)}
    # Same bits: the reference copy chooses what play chose and ends in play's state.
    checks = {}
    for name, (rplay, _, _) in ref.items():
        rc = np.full(n, -1, np.int64)
        theta, vinv, b = np.zeros(D), np.eye(D), np.zeros(D)
        logdet = rplay(arms, rewards, theta, vinv, b, params, rc)
        checks[name] = {
            "same_choices": int(np.sum(rc == chosen)),
            "same_bits": bool(
                np.array_equal(rc, chosen)
                and theta.tobytes() == theta_end.tobytes()
                and vinv.tobytes() == vinv_end.tobytes()
                and logdet == state["logdet"]
            ),
            "max_abs_theta_diff": float(np.max(np.abs(theta - theta_end))),
        }

    out = np.empty(n, np.int64)

    def timed(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) / n * 1e6

    rows = {
        "play": lambda: fresh().play(arms, rewards),
        "decide": lambda: _decide(arms, theta_end, vinv_end, beta, out),
        "update": lambda: _update(xs, rs, vs, np.eye(D), np.zeros(D), np.zeros(D)),
    }
    for name, (rplay, rdecide, rupdate) in ref.items():
        rows[f"{name} play"] = lambda rplay=rplay: rplay(
            arms, rewards, np.zeros(D), np.eye(D), np.zeros(D), params, out
        )
        rows[f"{name} decide"] = lambda rdecide=rdecide: rdecide(
            arms, theta_end, vinv_end, beta, out
        )
        rows[f"{name} update"] = lambda rupdate=rupdate: rupdate(
            xs, rs, vs, np.eye(D), np.zeros(D), np.zeros(D)
        )
    for fn in rows.values():
        fn()  # compile and warm
    times = {name: [] for name in rows}
    for _ in range(repeats):
        for name, fn in rows.items():
            times[name].append(timed(fn))

    # The core's rates: the latency of one add, and the kernels' inner loop in L1.
    chain_n = 10_000_000 if not args.quick else 1_000_000
    x = np.full(256, 1e-300)
    _add_chain(x, 1000)
    add_ns = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        _add_chain(x, chain_n)
        add_ns.append((time.perf_counter() - t0) / chain_n * 1e9)
    # The same loop 256 and d elements long: what a pass's set-up costs at the kernels' length.
    gflops = {}
    for length, reps in ((256, 20_000), (D, 250_000)):
        reps = reps // 10 if args.quick else reps
        blk, m4, x4 = np.zeros(length), np.full((4, length), 1e-3), np.full(4, 1e-3)
        _four_rows(blk, m4, x4, 10)
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            _four_rows(blk, m4, x4, reps)
            rates.append(8 * length * reps / (time.perf_counter() - t0) / 1e9)
        gflops[str(length)] = rates

    return {
        "n": n,
        "d": D,
        "k": K,
        "repeats": repeats,
        "us": times,
        "checks": checks,
        "add_ns": add_ns,
        "gflops": gflops,
        "flops": flops(D, K),
        "critical_adds": critical_adds(D),
        "cpu": _cpu(),
        "registers": _vector_registers(),
        "load": os.getloadavg()[0],
    }


def render(res: dict) -> str:
    med = {name: harness.median(ts) for name, ts in res["us"].items()}
    best = {name: min(ts) for name, ts in res["us"].items()}
    ref = med["reference play"]
    fl, n, d, k = res["flops"], res["n"], res["d"], res["k"]
    add_ns = harness.median(res["add_ns"])
    gflops = harness.median(res["gflops"]["256"])
    gflops_d = harness.median(res["gflops"][str(res["d"])])
    floor_flops_us = fl["total"] / gflops / 1e3
    floor_chain_us = res["critical_adds"] * add_ns / 1e3
    cpu, regs = res["cpu"], res["registers"]
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in cpu["flags"].items())
    lines = [
        "# oful play(): where a decide + update goes, and the floor under it",
        "",
        harness.provenance(
            res,
            f"BLAS and numba pinned to one thread; 1-minute load average {res['load']:.2f} at the "
            "end, on 2 shared cores.",
        ),
        "",
        f"Stream: `python -m bench.peers`'s (d = {d}, K = {k}, seed 0), n = {n:,} events. Each "
        f"row is the median of {res['repeats']} repeats, every repeat running each row once in "
        "turn; a speed-up is the same part (play, decide or update) of the formulation before "
        "over this row's, in the same run.",
        "",
        "| row | us / event | events/s | fastest repeat, us | speed-up over the same part before |",
        "|---|---:|---:|---:|---:|",
    ]
    labels = {
        "play": "play(), current kernels",
        "decide": "decide alone (current `_ucb_row` + argmax)",
        "update": "update alone (current, V^-1 x from the decision)",
        "reference play": "play, index-order formulation before the current one",
        "reference decide": "decide alone, before",
        "reference update": "update alone, before (computes V^-1 x again)",
        "fastmath play": "play, the formulation before, fastmath (different bits)",
        "fastmath decide": "decide alone, before, fastmath",
        "fastmath update": "update alone, before, fastmath",
    }
    for name, label in labels.items():
        us = med[name]
        before = med["reference " + name.split()[-1]]  # the same part, formulation before
        lines.append(
            f"| {label} | {us:.3f} | {1e6 / us:,.0f} | {best[name]:.3f} | {before / us:.2f}x |"
        )
    checks = res["checks"]
    lines += [
        "",
        "Bits: the reference copy "
        + (
            "ends in play's state to the bit (choices, theta, V^-1, log det)"
            if checks["reference"]["same_bits"]
            else "does NOT end in play's state to the bit"
        )
        + f"; the fastmath copy chooses as play did on {checks['fastmath']['same_choices']:,} of "
        f"{n:,} events and ends with theta off by up to "
        f"{checks['fastmath']['max_abs_theta_diff']:.1e}.",
        "",
        "## The floor on this core",
        "",
        f"- /proc/cpuinfo: {flags}; cpu MHz {cpu['mhz']}. The compiled decision and update "
        f"use {regs['ymm']} ymm (4 doubles) and {regs['zmm']} zmm (8 doubles) register operands "
        f"and {regs['fma']} fused multiply-adds: without fastmath the compiler may not fuse a "
        "multiply and an add (one rounding instead of two would change the bits).",
        f"- Arithmetic of one decide + update at d = {d}, K = {k}: {fl['decide']:,} adds and "
        f"multiplies to decide (inv x for each arm: 2 K d^2 = {2 * k * d * d:,}), {fl['update']:,} "
        f"to update, {fl['total']:,} in all, plus {fl['sqrt']} square roots, a division and a "
        f"log1p (the formulation before computes V^-1 x again: {fl['reference_extra']:,} more).",
        f"- This core sustains {gflops:.2f} GFLOP/s on the kernels' own inner loop (four matrix "
        f"rows per pass, 256 elements, in L1; median of {res['repeats']}), so the arithmetic "
        f"alone takes {floor_flops_us:.3f} us per event: at most {1e3 / floor_flops_us * 1e3:,.0f} "
        "events/s with these sums in this order.",
        f"- One add waits {add_ns:.2f} ns for the add before it (a chain of dependent adds). One "
        f"event waits for at least {res['critical_adds']} of them in a row (an element of inv x, "
        f"the chosen arm's x'inv x, an element of theta: d each): {floor_chain_us:.3f} us, below "
        "the arithmetic floor, so with the chains interleaved the bound is throughput, not "
        "latency.",
        f"- Each dot product is a chain of d = {d} dependent adds: summed in index order it cannot "
        f"be split across vector lanes. The formulation before wrote each arm's two chains one "
        f"after another, 2 K = {2 * k} chains of {d} adds: up to {2 * k * d * add_ns / 1e3:.3f} us "
        "of waiting per event where the core does not overlap them; the current one runs four "
        "arms' eight chains side by side in one loop.",
        "",
        "## Against 1,000,000 decide + update per second",
        "",
        f"play() at {1e6 / med['play']:,.0f} events/s is "
        + ("at or above" if 1e6 / med["play"] >= TARGET else "below")
        + f" the target ({med['play']:.3f} us per event, target 1.000 us; fastest repeat "
        f"{best['play']:.3f} us). The bit-exact floor is {floor_flops_us:.3f} us (the arithmetic "
        f"at the measured rate), the chain floor {floor_chain_us:.3f} us. Above the floor: "
        f"decide {med['decide']:.3f} us for {fl['decide']:,} flops "
        f"({fl['decide'] / med['decide'] / 1e3:.1f} GFLOP/s), update {med['update']:.3f} us for "
        f"{fl['update']:,} ({fl['update'] / med['update'] / 1e3:.1f} GFLOP/s). The kernels' passes "
        f"are d = {d} long, and the same four-row loop {d} long sustains {gflops_d:.2f} GFLOP/s "
        f"against {gflops:.2f} at 256: each pass's set-up (the coefficients, the loop control, "
        "the compiler's checks that the rows do not overlap) is paid for little arithmetic. "
        f"The fastmath copy of the formulation before takes {med['fastmath play']:.3f} us against "
        f"{ref:.3f} us for the same code in index order: that is what dropping the fixed "
        "summation order buys there, and its bits differ from play's, so it cannot be used.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("play_bound", __doc__, measure, render))
