"""BKB against exact GP-UCB on a fixed catalog: per-round time against t, dictionary size, regret.

    python -m bench.bkb            # full run (A = 1,000 arms, t up to 5,000, 3 problems; ~3 min)
    python -m bench.bkb --quick    # a smoke run with small sizes

Calandriello et al., COLT 2019. The paper has no experiments section;
this project's setup: A arms uniform in [0,1]^2, an RBF kernel with
bandwidth 0.2, f a sum of 10 kernel bumps (so f is in the RKHS), Gaussian noise xi = 0.1,
lam = xi^2, the practical beta rule for both learners, the same noise draw for both in each round.

Three learners, all timed in the same run, BLAS pinned to one thread:
- ``bkb`` (default qbar) through the policy interface: ``select(arms)`` + ``update(x, y)``.
- exact GP-UCB with counters (streambandit/sim/gp_ucb.py): the same exact posterior kept over the
  u distinct pulled points, refactored every round, O(u^3 + A u^2); run alongside for regret.
- textbook GP-UCB, eq. (1)-(2) over the t x t kernel matrix of the pulls with repetition (the
  paper's Omega(A t^2) baseline): too slow to run for 5,000 rounds, so one round (append a row
  to the Cholesky factor of K_t + lam I, then score the A arms) is timed at each checkpoint on
  the exact learner's pull history.
Per-round times are medians over the WINDOW rounds before each checkpoint.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from bench import harness
from streambandit import make_policy
from streambandit.sim.gp_ucb import ExactGPUCB, kernel_diag, kernel_matrix

BW, XI, BUMPS = 0.2, 0.1, 10
SEEDS = (0, 1, 2)
LAM = XI**2


def problem(n_arms: int, rounds: int, seed: int):
    rng = np.random.default_rng(seed)
    arms = rng.uniform(0.0, 1.0, (n_arms, 2))
    f = kernel_matrix("rbf", BW, arms, rng.uniform(0.0, 1.0, (BUMPS, 2))) @ rng.standard_normal(
        BUMPS
    )
    return arms, f, XI * rng.standard_normal(rounds)


def effective_dimension(points: np.ndarray, counts: np.ndarray) -> float:
    """eq. (5), Tr(K_t (K_t + lam I)^-1) over the pulls with repetition, from distinct points and
    counts: the nonzero spectrum of K_t is that of N^1/2 K_u N^1/2."""
    sq = np.sqrt(counts.astype(float))
    k = sq[:, None] * kernel_matrix("rbf", BW, points, points) * sq[None, :]
    ev = np.linalg.eigvalsh(k)
    return float((ev / (ev + LAM)).sum())


def textbook_round_seconds(
    history: np.ndarray, arms: np.ndarray, x_new: np.ndarray, repeats: int
) -> float:
    """One textbook GP-UCB round at t = len(history): extend the Cholesky factor of K_t + lam I
    by the new pull (O(t^2)), then mu and sigma^2 of every arm (O(A t^2)). The mean's weights are
    omitted (one more O(t^2) solve), so this is a lower bound on the round."""
    t = len(history)
    chol = cholesky(kernel_matrix("rbf", BW, history, history) + LAM * np.eye(t), lower=True)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        c = solve_triangular(
            chol, kernel_matrix("rbf", BW, history, x_new[None, :])[:, 0], lower=True
        )
        d = np.sqrt(1.0 + LAM - c @ c)
        g = solve_triangular(
            chol, kernel_matrix("rbf", BW, history, arms), lower=True
        )  # L^-1 k_t(arms)
        g_new = (kernel_matrix("rbf", BW, x_new[None, :], arms)[0] - c @ g) / d
        var = kernel_diag("rbf", arms) - np.einsum("ij,ij->j", g, g) - g_new**2
        times.append(time.perf_counter() - start)
        assert np.isfinite(var).all()
    return harness.median(times)


def run(
    n_arms: int, rounds: int, checkpoints: list[int], window: int, seed: int, textbook_repeats: int
) -> dict:
    """One seed; ``textbook_repeats = 0`` skips the textbook timings."""
    arms, f, noise = problem(n_arms, rounds, seed)
    best = float(f.max())
    bkb = make_policy("bkb", dim=2, bandwidth=BW, lam=LAM, noise_sd=XI, seed=seed)
    exact = ExactGPUCB(bandwidth=BW, lam=LAM, noise_sd=XI)
    learners = {"bkb": bkb, "exact": exact}
    regret = {k: 0.0 for k in learners}
    secs = {k: np.zeros(rounds) for k in learners}
    pulls_exact = np.zeros((rounds, 2))
    rows = []
    for t in range(1, rounds + 1):
        # Both learners in the same round, so machine noise hits them alike.
        for name, learner in learners.items():
            start = time.perf_counter()
            i = learner.select(arms)
            learner.update(arms[i], float(f[i] + noise[t - 1]))
            secs[name][t - 1] = time.perf_counter() - start
            regret[name] += best - float(f[i])
            if name == "exact":
                pulls_exact[t - 1] = arms[i]
        if t in checkpoints:
            lo = max(0, t - window)
            row = {
                "t": t,
                "bkb_ms": float(np.median(secs["bkb"][lo:t]) * 1e3),
                "exact_ms": float(np.median(secs["exact"][lo:t]) * 1e3),
                "dictionary_size": bkb.dictionary_size,
                "bkb_distinct_pulled": bkb.n_points,
                "exact_distinct_pulled": exact.n_points,
                "d_eff_bkb_pulls": effective_dimension(bkb.points, bkb.counts),
                "bkb_sum_s2": bkb.pulled_variance_sum,
                "bkb_beta": bkb.beta(),
                "exact_beta": exact.beta(),
                "regret_bkb": regret["bkb"],
                "regret_exact": regret["exact"],
                "bkb_state_bytes": bkb.state_nbytes(),
                "bkb_cache_bytes": bkb.cache_nbytes(),
            }
            rows.append(row)
            print(f"t={t} {row}", flush=True)
    # The paper's baseline, on the exact learner's own history, after the run (its memory is t^2).
    for row in rows if textbook_repeats else []:
        t = row["t"]
        row["textbook_ms"] = (
            textbook_round_seconds(pulls_exact[: t - 1], arms, pulls_exact[t - 1], textbook_repeats)
            * 1e3
        )
        print(f"t={t} textbook {row['textbook_ms']:.1f} ms", flush=True)
    return {
        "seed": seed,
        "f_range": float(f.max() - f.min()),
        "rows": rows,
        "total_s": {k: float(v.sum()) for k, v in secs.items()},
    }


def measure(args: argparse.Namespace) -> dict:
    if args.quick:
        n_arms, rounds, checkpoints, window, repeats = 300, 600, [100, 300, 600], 30, 2
    else:
        n_arms, rounds, checkpoints, window, repeats = (
            1000,
            5000,
            [100, 500, 1000, 2000, 5000],
            50,
            3,
        )
    result = run(n_arms, rounds, checkpoints, window, seed=0, textbook_repeats=repeats)
    # Regret on more problems (different arms, f and noise), without the textbook timings.
    others = [run(n_arms, rounds, [rounds], window, seed=s, textbook_repeats=0) for s in SEEDS[1:]]
    bkb_defaults = make_policy("bkb", dim=2).config()
    return {
        "setup": {
            "arms": n_arms,
            "rounds": rounds,
            "bandwidth": BW,
            "noise_sd": XI,
            "lam": LAM,
            "bumps": BUMPS,
            "qbar": bkb_defaults["qbar"],
            "beta_rule": bkb_defaults["beta_rule"],
            "window": window,
        },
        **result,
        "other_seeds": others,
    }


def render(result: dict) -> str:
    setup, others = result["setup"], result["other_seeds"]
    n_arms, rounds, window = setup["arms"], setup["rounds"], setup["window"]
    lines = [
        "# BKB against exact GP-UCB",
        "",
        harness.provenance(
            result, f"scipy {result['machine']['scipy']}; BLAS pinned to one thread."
        ),
        "",
        f"Problem: A = {n_arms:,} fixed arms uniform in [0,1]^2, RBF bandwidth {setup['bandwidth']}, "
        f"f = {setup['bumps']} kernel bumps, noise sd {setup['noise_sd']}, lam = {setup['lam']:g}; "
        f"bkb with qbar = {setup['qbar']:g} and the {setup['beta_rule']} beta "
        f"(both learners), the same noise for both. Seed {result['seed']} (max f - min f = {result['f_range']:.2f}).",
        "",
        f"## Milliseconds per round (select over A arms + update), median of the {window} rounds before t",
        "",
        "`exact` keeps the exact posterior over the u distinct pulled points (counters); `textbook` is eq. (1)-(2)",
        "over all t pulls (one round timed on the exact learner's history). m = bkb's dictionary, d_eff = eq. (5)",
        "on bkb's pulls, regret = cumulative pseudo-regret.",
        "",
        "| t | bkb ms | exact ms | textbook ms | m | u bkb | u exact | d_eff | regret bkb | regret exact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['t']:,} | {r['bkb_ms']:.2f} | {r['exact_ms']:.2f} | {r['textbook_ms']:.1f} | {r['dictionary_size']} "
            f"| {r['bkb_distinct_pulled']} | {r['exact_distinct_pulled']} | {r['d_eff_bkb_pulls']:.1f} "
            f"| {r['regret_bkb']:.1f} | {r['regret_exact']:.1f} |"
        )
    first, last = result["rows"][0], result["rows"][-1]
    lines += [
        "",
        f"Per-round time from t = {first['t']:,} to t = {last['t']:,}: bkb x{last['bkb_ms'] / first['bkb_ms']:.2f}, "
        f"exact (counters) x{last['exact_ms'] / first['exact_ms']:.2f}, textbook "
        f"x{last['textbook_ms'] / first['textbook_ms']:.1f}. "
        f"Total for {rounds:,} rounds: bkb {result['total_s']['bkb']:.1f} s, exact (counters) "
        f"{result['total_s']['exact']:.1f} s.",
        f"bkb state at t = {last['t']:,}: {last['bkb_state_bytes']:,} bytes (8 u d + 17 u + 8), derived cache "
        f"{last['bkb_cache_bytes']:,} bytes.",
        "",
        f"## Regret at t = {rounds:,} on {1 + len(others)} problems (seed = arms, f and noise)",
        "",
        f"Times are medians of the {window} rounds before t = {rounds:,}.",
        "",
        "| seed | max f - min f | regret bkb | regret exact | bkb / exact | m | u bkb | u exact "
        "| d_eff | bkb ms | exact ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in [result, *others]:
        r = res["rows"][-1]
        lines.append(
            f"| {res['seed']} | {res['f_range']:.2f} | {r['regret_bkb']:.1f} | {r['regret_exact']:.1f} "
            f"| {r['regret_bkb'] / r['regret_exact']:.2f} | {r['dictionary_size']} | {r['bkb_distinct_pulled']} "
            f"| {r['exact_distinct_pulled']} | {r['d_eff_bkb_pulls']:.1f} | {r['bkb_ms']:.2f} | {r['exact_ms']:.2f} |"
        )
    lines += ["", "What these figures say about the paper's claim: docs/experiments.md, BKB.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("bkb", __doc__, measure, render))
