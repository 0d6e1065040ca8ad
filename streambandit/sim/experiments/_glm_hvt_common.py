"""Shared helpers of the GLB-OMD and Hvt-UCB paper experiments (run loop, progress, summary tables)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from streambandit.sim.runner import run_policy

_PROGRESS_EVERY = 100


def run_curve(
    curve_cls,
    setting: str,
    learner: str,
    policy,
    env,
    rounds: int,
    seed: int,
    progress: Callable[[int], None],
):
    """One run through :func:`run_policy`, reporting progress in increments of completed rounds."""
    done = [0]

    def tick(n: int) -> None:
        if n - done[0] >= _PROGRESS_EVERY or n == rounds:
            progress(n - done[0])
            done[0] = n

    res = run_policy(policy, env, rounds, seed, progress=tick)
    return curve_cls(
        setting=setting, learner=learner, seed=seed, regret=res.regret, seconds=res.seconds
    )


def per_round_us(seconds: np.ndarray) -> tuple[float, float]:
    """Median microseconds per round over the first and the last 10% of rounds (medians, so that a
    few rounds slowed by other processes on the machine do not decide the comparison)."""
    per = np.diff(seconds, prepend=0.0)
    k = max(1, len(per) // 10)
    return 1e6 * float(np.median(per[:k])), 1e6 * float(np.median(per[-k:]))


def mean_sd(v: list[float]) -> str:
    a = np.asarray(v, dtype=float)
    sd = float(np.std(a, ddof=1)) if len(a) > 1 else 0.0
    return f"{a.mean():.1f} +- {sd:.1f}"


def table(curves, settings: list[str], learners: list[str]) -> tuple[str, dict]:
    """Markdown table (final regret mean +- sd, per-round time early/late, total seconds) and the
    numbers behind it: stats[(setting, learner)] = dict(final=[...], early=[...], late=[...], total=[...])."""
    stats: dict = {}
    for c in curves:
        s = stats.setdefault(
            (c.setting, c.learner), {"final": [], "early": [], "late": [], "total": []}
        )
        early, late = per_round_us(c.seconds)
        s["final"].append(float(c.regret[-1]))
        s["early"].append(early)
        s["late"].append(late)
        s["total"].append(float(c.seconds[-1]))
    lines = [
        "| setting | learner | final regret (mean +- sd) | median us/round, first 10% | median us/round, last 10% "
        "| late/early | total s/run |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for st in settings:
        for ln in learners:
            s = stats.get((st, ln))
            if s is None:
                continue
            early, late = float(np.mean(s["early"])), float(np.mean(s["late"]))
            lines.append(
                f"| {st} | {ln} | {mean_sd(s['final'])} | {early:.0f} | {late:.0f} | {late / early:.2f} "
                f"| {np.mean(s['total']):.2f} |"
            )
    return "\n".join(lines), stats


def mean_of(stats: dict, setting: str, learner: str, key: str) -> float:
    return float(np.mean(stats[(setting, learner)][key]))
