"""GLB-OMD paper (Zhang et al. 2025), synthetic experiments: glb_omd vs a refitting GLM-UCB vs OFUL.

Shared by :mod:`glb_omd_logistic` and :mod:`glb_omd_poisson`.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from streambandit.policies import make_policy
from streambandit.sim.baselines import GLMUCBRefit
from streambandit.sim.environments import GLMEnvironment, random_unit_vector, unit_rows
from streambandit.sim.experiments import _glm_hvt_common as common

RADII = (3.0, 5.0, 7.0)
LEARNERS = ("glb_omd", "glm_ucb_refit", "oful")
DIM, N_ARMS = 5, 20
# size -> (rounds, seeds)
SIZES = {"tiny": (40, 1), "default": (3000, 6), "full": (3000, 10)}


def _size(size: str, seeds: int | None) -> tuple[int, int]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    rounds, n_seeds = SIZES[size]
    return rounds, (n_seeds if seeds is None else int(seeds))


def total_rounds(link: str, *, size: str, seeds: int | None) -> int:
    rounds, n_seeds = _size(size, seeds)
    return rounds * n_seeds * len(RADII) * len(LEARNERS)


def _setting(s: float) -> str:
    return f"S={s:g}"


def _instance(link: str, radius: float, seed: int) -> GLMEnvironment:
    # The same arms and direction of theta* for every S of a seed: only the scale changes.
    rng = np.random.default_rng([seed, 5])
    arms = unit_rows(rng.standard_normal((N_ARMS, DIM)))
    return GLMEnvironment(theta=radius * random_unit_vector(rng, DIM), link=link, arms=arms)


def _learner(name: str, link: str, radius: float):
    if name == "glb_omd":
        return make_policy("glb_omd", dim=DIM, link=link, S=radius)
    if name == "glm_ucb_refit":
        return GLMUCBRefit(DIM, link=link, S=radius)
    # OFUL at the theory's radius (beta_scale = 1), as the papers' comparisons state it.
    if link == "logistic":
        return make_policy("oful", dim=DIM, noise_sd=0.5, S=radius, beta_scale=1.0)
    return make_policy(
        "oful", dim=DIM, noise_sd=math.exp(radius / 2.0), S=math.exp(radius), beta_scale=1.0
    )


CHOICES_COMMON = [
    "Arms: K = 20 fixed unit-norm arms in d = 5 (Gaussian directions), redrawn per seed; theta* = S times a "
    "uniform unit direction; the same arms and direction for every S of a seed (paper silent on d, K, arm "
    "generation; this project's default).",
    "glb_omd: lambda = d (the paper's experiments), eta = 1 + S, delta = 0.05, eq. (5) radius unscaled "
    "(beta_scale = 1), A-norm projection as implemented in streambandit.policies.glb_omd.",
    "glm_ucb_refit: ridge-regularised MLE (lambda = d) refit every round over all data with scipy "
    "trust-exact (exact gradient and Hessian, gtol 1e-8), warm-started; confidence matrix "
    "H = lambda I + sum mu'(x'theta_hat) x x' recomputed over all data; radius = glb_omd's eq. (5), so only "
    "the estimator differs. Not Filippi et al.'s kappa-inflated radius and not OFUGLB (the paper's slow "
    "baseline), whose radii we did not implement.",
    "Regret is pseudo-regret in the mean reward mu(x'theta*), computed from theta*.",
    "Timing: wall time of select+update per round as measured by run_policy, single process; "
    "'early'/'late' = median time per round over the first/last 10% of rounds.",
]


def run(link: str, name: str, *, size: str, seeds: int | None, progress: Callable[[int], None]):
    from streambandit.sim.experiments.base import Curve, ExperimentResult

    rounds, n_seeds = _size(size, seeds)
    curves = []
    for radius in RADII:
        for seed in range(n_seeds):
            env = _instance(link, radius, seed)
            for ln in LEARNERS:
                curves.append(
                    common.run_curve(
                        Curve,
                        _setting(radius),
                        ln,
                        _learner(ln, link, radius),
                        env,
                        rounds,
                        seed,
                        progress,
                    )
                )
    settings = [_setting(s) for s in RADII]
    tbl, stats = common.table(curves, settings, list(LEARNERS))
    summary = _summary(link, tbl, stats, settings, rounds, n_seeds)
    choices = list(CHOICES_COMMON)
    if link == "logistic":
        choices.append(
            "oful: noise_sd = 0.5 (Bernoulli rewards are 1/2-sub-Gaussian), S = the true radius, theory radius."
        )
    else:
        choices.append(
            "oful: noise_sd = e^(S/2) (square root of the largest Poisson variance e^S; Poisson rewards are "
            "not sub-Gaussian), S = e^S (a bound on the mean reward, the linear fit's scale), theory radius."
        )
    full_rounds, full_seeds = SIZES["full"]
    choices.append(
        f"Sizes: full = T {full_rounds}, {full_seeds} seeds (the paper's runtime sweep uses T = 3000; the "
        f"paper gives no T for the regret runs); this run: T = {rounds}, {n_seeds} seed(s)"
        + (" (fewer than the paper)" if (rounds, n_seeds) != (full_rounds, full_seeds) else "")
        + "."
    )
    return ExperimentResult(name=name, curves=curves, summary=summary, choices=choices)


def _summary(link, tbl, stats, settings, rounds, n_seeds) -> str:
    m = lambda st, ln, k: common.mean_of(stats, st, ln, k)  # noqa: E731
    lines = [
        f"**Paper's claim (GLB-OMD, Sec. 5 / Fig. 3, {link}):** GLB-OMD's regret is comparable to the MLE-based "
        "methods (OFUGLB lowest) while its time per round is constant in t (< 1 s for T = 3000), whereas "
        "MLE refitting costs grow with t (OFUGLB: thousands of seconds).",
        "",
        f"**Our run:** T = {rounds}, {n_seeds} seed(s) per S; d = 5, K = 20.",
        "",
        tbl,
        "",
        "**Statements from these numbers:**",
    ]
    for st in settings:
        o_e, o_l = m(st, "glb_omd", "early"), m(st, "glb_omd", "late")
        g_e, g_l = m(st, "glm_ucb_refit", "early"), m(st, "glm_ucb_refit", "late")
        ro, rg, rf = (
            m(st, "glb_omd", "final"),
            m(st, "glm_ucb_refit", "final"),
            m(st, "oful", "final"),
        )
        lines.append(
            f"- {st}: glb_omd time/round late/early = {o_l / o_e:.2f} ({o_l:.0f} us late); refit "
            f"late/early = {g_l / g_e:.2f} ({g_l:.0f} us late, {g_l / o_l:.0f}x glb_omd). Final regret glb_omd "
            f"{ro:.1f}, refit {rg:.1f} (ratio {ro / rg:.2f}), oful {rf:.1f}."
        )
    ratios_time = [
        m(st, "glm_ucb_refit", "late") / m(st, "glm_ucb_refit", "early") for st in settings
    ]
    flat = all(m(st, "glb_omd", "late") / m(st, "glb_omd", "early") < 1.5 for st in settings)
    grows = all(r > 1.2 for r in ratios_time)
    comparable = all(
        m(st, "glb_omd", "final") <= 1.5 * m(st, "glm_ucb_refit", "final") + 1e-9 for st in settings
    )
    beats_oful = [st for st in settings if m(st, "glb_omd", "final") < m(st, "oful", "final")]
    lines += [
        "",
        "**Agreement:** "
        + (
            "glb_omd's time per round is flat in t"
            if flat
            else "glb_omd's time per round is NOT flat in t (late/early >= 1.5 somewhere)"
        )
        + "; the refitting baseline's time per round "
        + (
            "grows with t (late/early > 1.2 at every S)"
            if grows
            else "grows only mildly or not at all at this T (late/early <= 1.2 somewhere): "
            "scipy's fixed per-call overhead "
            "dominates the O(t) work at these t, so the growth the paper describes only shows at longer horizons"
        )
        + ". glb_omd's final regret is "
        + (
            "within 1.5x of the refit baseline's at every S (comparable)"
            if comparable
            else "more than 1.5x the refit baseline's at some S (NOT comparable)"
        )
        + f". glb_omd beats OFUL at {len(beats_oful)} of {len(settings)} radii"
        + (f" ({', '.join(beats_oful)})" if beats_oful else "")
        + ". The paper does not claim anything about OFUL; bench/results/regret_vs_oful.md finds "
        "OFUL ahead of glb_omd at default radii for logistic S = 3, 5. Nothing was tuned to agree; all learners "
        "use their theory radii.",
    ]
    if n_seeds < 3:
        lines.append("")
        lines.append(
            f"(Only {n_seeds} seed(s): these statements are smoke-test figures, not evidence.)"
        )
    return "\n".join(lines)
