"""Hvt-UCB paper (Wang et al.), Sec. 6: d = 2, 50 arms, Student-t (df 2.1) and Gaussian noise;
hvt_ucb vs oful vs a full-pass adaptive Huber regression (HEAVY-OFUL-style, ``huber_refit``)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from streambandit.policies import make_policy
from streambandit.sim.baselines import HuberRefit
from streambandit.sim.environments import GLMEnvironment
from streambandit.sim.experiments import _glm_hvt_common as common

NAME = "hvt-ucb"
NOISES = (("student-t df=2.1", "student_t", 0.99, 1.31), ("gaussian N(0,1)", "gaussian", 1.0, 1.0))
LEARNERS = ("hvt_ucb", "huber_refit", "oful")
DIM, N_ARMS = 2, 50
SIZES = {"tiny": (40, 1), "default": (8000, 5), "full": (18000, 10)}


def _size(size: str, seeds: int | None) -> tuple[int, int]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    rounds, n_seeds = SIZES[size]
    return rounds, (n_seeds if seeds is None else int(seeds))


def total_rounds(*, size: str, seeds: int | None) -> int:
    rounds, n_seeds = _size(size, seeds)
    return rounds * n_seeds * len(NOISES) * len(LEARNERS)


def _instance(noise: str, seed: int) -> GLMEnvironment:
    # Same arms and theta* for both noise models of a seed (as bench/regret_vs_oful.py).
    rng = np.random.default_rng([seed, 2])
    arms = rng.uniform(-1.0, 1.0, (N_ARMS, DIM))
    arms /= np.linalg.norm(arms, axis=1).max()
    theta = rng.uniform(-1.0, 1.0, DIM)
    theta /= np.linalg.norm(theta)
    return GLMEnvironment(theta=theta, link="linear", arms=arms, noise=noise, df=2.1)


def _learner(name: str, eps: float, nu: float, rounds: int):
    if name == "hvt_ucb":
        return make_policy("hvt_ucb", dim=DIM, epsilon=eps, nu=nu, horizon=rounds)
    if name == "huber_refit":
        return HuberRefit(DIM, epsilon=eps, nu=nu, horizon=rounds)
    return make_policy("oful", dim=DIM, noise_sd=1.0, S=1.0, beta_scale=1.0)  # theory radius


def run(*, size: str, seeds: int | None, progress: Callable[[int], None]):
    from streambandit.sim.experiments.base import Curve, ExperimentResult

    rounds, n_seeds = _size(size, seeds)
    curves = []
    for label, noise, eps, nu in NOISES:
        for seed in range(n_seeds):
            env = _instance(noise, seed)
            for ln in LEARNERS:
                curves.append(
                    common.run_curve(
                        Curve, label, ln, _learner(ln, eps, nu, rounds), env, rounds, seed, progress
                    )
                )
    settings = [n[0] for n in NOISES]
    tbl, stats = common.table(curves, settings, list(LEARNERS))
    full_rounds, full_seeds = SIZES["full"]
    choices = [
        "Arms: 50 fixed arms, coordinates uniform in [-1, 1], the whole set scaled so the largest norm is 1; theta* "
        "the same way with norm 1; redrawn per seed, shared by both noise models (paper ambiguous: fixed vs redrawn, "
        "per-arm vs set-wide scaling).",
        "Student-t noise is the standard t(2.1), unscaled; hvt_ucb is given epsilon = 0.99, nu = 1.31 (the paper's "
        "inputs). Gaussian N(0, 1): epsilon = 1, nu = 1 (paper does not state nu).",
        "hvt_ucb: the package defaults lambda = d, delta = 1/(8T), sigma_min = 1/sqrt(T), alpha = 4, projection on, "
        "beta_scale = 1e-3 on both the bonus and the sigma_t floor (the theory radius ~5e3 explores uniformly; the "
        "paper does not report its radius). T known up front (horizon = T of the run).",
        "huber_refit (stands in for HEAVY-OFUL): lambda/2 ||theta||^2 + sum_s Huber_{tau_s}((r_s - x_s'theta)/sigma_s) "
        "re-solved every round over all data by scipy L-BFGS-B (gtol 1e-9), warm-started, unconstrained; sigma_s, "
        "tau_s, V and beta (same beta_scale) taken from an internal Hvt-UCB so only the estimator differs. "
        "HEAVY-OFUL's own sigma_t lower bounds and solver budget are not reproduced.",
        "oful: noise_sd = 1, S = 1, lambda = 1, theory radius (the paper does not state OFUL's settings).",
        "Timing: select+update wall time per round from run_policy, single process; 'early'/'late' = median time "
        "per round over the first/last 10% of rounds.",
        f"Sizes: full = T {full_rounds}, {full_seeds} seeds (the paper's); this run T = {rounds}, {n_seeds} seed(s)"
        + (" (fewer than the paper)" if (rounds, n_seeds) != (full_rounds, full_seeds) else "")
        + ". "
        "CRTM / CRMM baselines of the paper are not run.",
    ]
    return ExperimentResult(
        name=NAME,
        curves=curves,
        summary=_summary(tbl, stats, settings, rounds, n_seeds),
        choices=choices,
    )


def _summary(tbl, stats, settings, rounds, n_seeds) -> str:
    m = lambda st, ln, k: common.mean_of(stats, st, ln, k)  # noqa: E731
    heavy, gauss = settings
    lines = [
        "**Paper's claim (Hvt-UCB, Sec. 6, Figs. 1-2):** under Student-t(2.1) noise OFUL's performance drops "
        "significantly while Hvt-UCB's regret is comparable to HEAVY-OFUL (full-pass adaptive Huber) at a >800x "
        "speed-up that grows with T; under Gaussian noise Hvt-UCB is competitive with OFUL.",
        "",
        f"**Our run:** T = {rounds}, {n_seeds} seed(s) per noise model; d = 2, 50 arms.",
        "",
        tbl,
        "",
        "**Statements from these numbers:**",
    ]
    for st in settings:
        h, f, o = m(st, "hvt_ucb", "final"), m(st, "huber_refit", "final"), m(st, "oful", "final")
        speed = m(st, "huber_refit", "total") / m(st, "hvt_ucb", "total")
        lines.append(
            f"- {st}: final regret hvt_ucb {h:.1f}, huber_refit {f:.1f}, oful {o:.1f}; hvt_ucb/oful = {h / o:.2f}, "
            f"hvt_ucb/huber_refit = {h / f:.2f}. Total time huber_refit/hvt_ucb = {speed:.0f}x; huber_refit "
            f"time/round late/early = {m(st, 'huber_refit', 'late') / m(st, 'huber_refit', 'early'):.2f}, hvt_ucb "
            f"{m(st, 'hvt_ucb', 'late') / m(st, 'hvt_ucb', 'early'):.2f}."
        )
    h, f, o = (
        m(heavy, "hvt_ucb", "final"),
        m(heavy, "huber_refit", "final"),
        m(heavy, "oful", "final"),
    )
    speed = m(heavy, "huber_refit", "total") / m(heavy, "hvt_ucb", "total")
    lines += [
        "",
        "**Agreement:** under heavy tails hvt_ucb's regret is "
        + (
            "LOWER than OFUL's (agrees)"
            if h < o
            else "NOT lower than OFUL's (disagrees with the paper)"
        )
        + "; it is "
        + (
            "within 1.5x of the full-pass Huber baseline (close, agrees)"
            if h <= 1.5 * f
            else "more than 1.5x the full-pass Huber baseline's (not close)"
        )
        + f"; the full-pass baseline costs {speed:.0f}x hvt_ucb's total time at T = {rounds} "
        + (
            "(hvt_ucb at a small fraction of its time, agrees in kind; "
            "the paper's >800x is at T = 18000 with its own solver)"
            if speed >= 5
            else "(the gap is small at this T)"
        )
        + ". bench/results/regret_vs_oful.md also finds OFUL ahead of hvt_ucb at default radii. "
        "Nothing was tuned to agree.",
    ]
    if n_seeds < 3:
        lines += [
            "",
            f"(Only {n_seeds} seed(s): these statements are smoke-test figures, not evidence.)",
        ]
    return "\n".join(lines)
