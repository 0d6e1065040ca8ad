"""Microseconds per select + update of each learner, and per-update time against t.

    python -m bench.policies            # full run (~3 min), writes bench/results/policies.{md,json}
    python -m bench.policies --quick    # a smoke run with small sizes

Three tables:
1. select (K = 20 arms) + update, per policy at d = 10, 50, 200, median of REPEATS timed blocks,
   with a naive numpy OFUL (re-inverts V every round) timed in the same run, as a ratio.
2. per-update time at t ~ 1k, 10k, 100k (d = 20): a one-pass learner must be flat in t.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from bench import harness
from streambandit import make_policy

POLICY_PARAMS = {
    "oful": {},
    "glb_omd": {"link": "logistic"},
    "hvt_ucb": {},
}
K = 20


class NaiveOFUL:
    """What a user writes first: keep V, invert it every round, score every arm."""

    def __init__(self, dim: int, lam: float = 1.0, beta: float = 1.0):
        self.v = lam * np.eye(dim)
        self.b = np.zeros(dim)
        self.beta = beta

    def select(self, arms: np.ndarray) -> int:
        vinv = np.linalg.inv(self.v)
        theta = vinv @ self.b
        return int(
            np.argmax(
                arms @ theta + self.beta * np.sqrt(np.einsum("kd,de,ke->k", arms, vinv, arms))
            )
        )

    def update(self, x: np.ndarray, r: float) -> None:
        self.v += np.outer(x, x)
        self.b += r * x


# Rewards follow each learner's own model with ||theta*|| = 0.5 (inside every default ball), so
# the timings are of the learners on data they fit: a stream no theta in the ball explains makes
# the O(d^3) projection fire every round, which is a different (and misconfigured) workload.
LOGISTIC_POLICIES = {"glb_omd"}


def stream(dim: int, n: int, seed: int):
    """Arms (n, K, dim), linear-model rewards and Bernoulli-logistic rewards (n, K)."""
    rng = np.random.default_rng(seed)
    arms = rng.standard_normal((n, K, dim))
    arms /= np.linalg.norm(arms, axis=2, keepdims=True)
    theta = rng.standard_normal(dim)
    theta *= 0.5 / np.linalg.norm(theta)
    z = arms @ theta
    linear = z + 0.1 * rng.standard_normal((n, K))
    bernoulli = (rng.random((n, K)) < 1.0 / (1.0 + np.exp(-z))).astype(float)
    return arms, linear, bernoulli


def time_block(policy, arms, rewards) -> float:
    """Seconds per select + update over one block of pre-generated rounds."""
    start = time.perf_counter()
    for a, r in zip(arms, rewards):
        i = policy.select(a)
        policy.update(a[i], r[i])
    return (time.perf_counter() - start) / len(arms)


def per_round_table(dims, rounds, repeats):
    rows = []
    for d in dims:
        arms, linear, bernoulli = stream(d, rounds * (repeats + 1), seed=d)
        learners = {name: make_policy(name, dim=d, **kw) for name, kw in POLICY_PARAMS.items()}
        learners["naive_oful"] = NaiveOFUL(d)
        times = {name: [] for name in learners}
        time_block(learners["oful"], arms[:rounds], linear[:rounds])  # warm caches once
        for i in range(1, repeats + 1):
            block = slice(i * rounds, (i + 1) * rounds)
            # Interleave the learners block by block so that machine noise hits all of them alike.
            for name, p in learners.items():
                rewards = bernoulli if name in LOGISTIC_POLICIES else linear
                times[name].append(time_block(p, arms[block], rewards[block]))
        med = {name: harness.median(ts) * 1e6 for name, ts in times.items()}
        for name in POLICY_PARAMS:
            rows.append(
                {
                    "policy": name,
                    "d": d,
                    "K": K,
                    "us_per_round": med[name],
                    "naive_oful_us": med["naive_oful"],
                    "speedup_vs_naive": med["naive_oful"] / med[name],
                    "runs": [t * 1e6 for t in times[name]],
                }
            )
    return rows


def flat_in_t_table(checkpoints, block, d=20):
    rows = []
    total = max(checkpoints) + block
    arms, linear, bernoulli = stream(d, total, seed=7)
    for name, kw in POLICY_PARAMS.items():
        p = make_policy(name, dim=d, **kw)
        rewards = bernoulli if name in LOGISTIC_POLICIES else linear
        at = {}
        t = 0
        for c in sorted(checkpoints):
            time_block(p, arms[t:c], rewards[t:c])  # advance to t = c
            at[c] = time_block(p, arms[c : c + block], rewards[c : c + block]) * 1e6
            t = c + block
        rows.append(
            {
                "policy": name,
                "d": d,
                "us_at_t": at,
                "ratio_last_first": at[max(checkpoints)] / at[min(checkpoints)],
            }
        )
    return rows


def measure(args: argparse.Namespace) -> dict:
    dims, rounds, repeats = ((10, 50), 200, 3) if args.quick else ((10, 50, 200), 1000, 7)
    checkpoints, block = ((1_000, 5_000), 200) if args.quick else ((1_000, 10_000, 100_000), 1000)
    return {
        "K": K,
        "rounds": rounds,
        "repeats": repeats,
        "block": block,
        "checkpoints": list(checkpoints),
        "per_round": per_round_table(dims, rounds, repeats),
        "flat_in_t": flat_in_t_table(checkpoints, block),
    }


def render(res: dict) -> str:
    k, repeats, rounds, block, checkpoints = (
        res["K"],
        res["repeats"],
        res["rounds"],
        res["block"],
        res["checkpoints"],
    )
    lines = [
        "# Learners: select + update cost",
        "",
        harness.provenance(res, "BLAS pinned to one thread."),
        "",
        f"## Microseconds per select (K = {k}) + update, median of {repeats} blocks of {rounds} rounds",
        "",
        "The naive OFUL keeps V and calls `np.linalg.inv` every round; it is timed in the same run,",
        "interleaved block by block with the learners, and the last column is its time over ours.",
        "",
        "| policy | d | us / round | naive OFUL us / round | naive / ours |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in res["per_round"]:
        lines.append(
            f"| {r['policy']} | {r['d']} | {r['us_per_round']:.1f} | {r['naive_oful_us']:.1f} "
            f"| {r['speedup_vs_naive']:.1f}x |"
        )
    lines += [
        "",
        f"## Per-round time against t (d = 20, K = {k}, blocks of {block} rounds starting at t)",
        "",
        "| policy | " + " | ".join(f"t = {c:,}" for c in checkpoints) + " | last / first |",
        "|---|" + "---:|" * (len(checkpoints) + 1),
    ]
    for r in res["flat_in_t"]:
        cells = " | ".join(f"{r['us_at_t'][str(c)]:.1f} us" for c in checkpoints)
        lines.append(f"| {r['policy']} | {cells} | {r['ratio_last_first']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(harness.main("policies", __doc__, measure, render))
