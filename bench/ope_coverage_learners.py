"""How often a learning target's replay intervals cover the value the learner has online.

    python -m bench.ope_coverage_learners          # full run (20-40 min, 1 process), writes results/
    python -m bench.ope_coverage_learners --quick  # a smoke run (20 logs per setting), writes nothing

Simulator (context-linear clicks): each event has K = 10 arms with features ``x = [1, z]``,
``z`` uniform in [-1, 1]^4, and click probability ``ctr (1 + s'z)`` with ``s = (0.3, 0.2, 0.2,
0.1)`` (between 0.2 and 1.8 times ``ctr``). Logging: uniform (``1/K``), or spread: per event a
Dirichlet(0.08) over the arms, clipped at 1e-3 and renormalised (propensities from 1e-3 to 0.99),
drawn independently of the features. ``LOGS`` logs per setting of ``SETTINGS``: CTR 0.1 and
0.01, each logging, ``N_EVENTS`` events per log; and uniform logging at CTR 0.1 with 10,000
events per log, where the learners have five times the updates and learn more.

Targets, both learning during the replay (rejection sampling), as ``[[models]]`` entries make them:
``oful`` (the theory's radius, ``beta_scale = 1``, otherwise the policy's defaults; epsilon 0)
and ``egreedy`` (oful with ``beta = 0``, a greedy ridge regression, and epsilon 0.1), one replay
of both per log.

Truth. At event i of a replay the learner has had ``N_i`` updates, its matched events before i.
The logging policy's choice does not depend on the features, so whatever the learner chooses,
an event matches with probability 1/K: ``N_i ~ Binomial(i - 1, 1/K)`` and the matched events
are an online run. Online, let ``v_t`` be the learner's expected reward at its step t (after t
updates, its action probabilities times the click probabilities, over fresh contexts). The
estimand is ``V = (1/n) sum_i E[v_{N_i}]``: the learner's expected value online over the horizon
the replay gives it, averaged over the replay's events. ``v_t`` is the mean of ``TRUTH_RUNS``
online runs of the learner on the simulator (each step on a fresh context, learning from its own
choice's click).

Intervals, per log and estimator (snips, ips, dr): the path-conditional interval of the replay
(``estimators.py``), and the expected-value interval of ``streambandit.replay.paths`` with
``REPLICATES`` replicates (the path interval widened by the spread between learning paths).
Coverage: the share of logs whose interval holds V. Beside them, *bootstrap only*: the replicates'
spread alone, ``value +- t s`` (what the interval would be without the path interval's bounds).
``--raw`` keeps every log's numbers in the
JSON: (value, path low, path high, expected low, expected high, s_b, replicates' sd).
"""

from __future__ import annotations

import sys
import time

import numpy as np
from scipy.stats import binom
from scipy.stats import t as student_t

from bench import harness
from streambandit.config.models import parse_models_config
from streambandit.engine.decision import choose_with_probabilities
from streambandit.replay.logged import LoggedDecision
from streambandit.replay.paths import (
    DEFAULT_REPLICATES,
    interval_from_replicates,
    replicate_estimates,
)
from streambandit.replay.runner import Target, replay_targets

K, D = 10, 5
SLOPES = np.array([0.3, 0.2, 0.2, 0.1])
N_EVENTS = 2000
LOGS = 200
REPLICATES = DEFAULT_REPLICATES
TRUTH_RUNS = 2000
# (CTR, logging, events per log); the last: a learner with 5 times the updates, learning more.
SETTINGS = (
    (0.1, "uniform", N_EVENTS),
    (0.1, "spread", N_EVENTS),
    (0.01, "uniform", N_EVENTS),
    (0.01, "spread", N_EVENTS),
    (0.1, "uniform", 10_000),
)
ESTIMATORS = ("snips", "ips", "dr")
LEARNERS = {
    "oful": {"policy": "oful", "epsilon": 0.0, "hyper": {"beta_scale": 1.0}},
    "egreedy": {"policy": "oful", "epsilon": 0.1, "hyper": {"beta": 0.0}},
}
Z = 1.959964


def config(learner: str):
    entry = LEARNERS[learner]
    return parse_models_config(
        {
            "models": [
                {
                    "match": "m",
                    "policy": entry["policy"],
                    "dim": D,
                    "hyper": dict(entry["hyper"]),
                    "reward_window_ms": 1000,
                    "default_reward": 0.0,
                    "epsilon": entry["epsilon"],
                }
            ]
        }
    )


def contexts(rng: np.random.Generator, n: int, ctr: float) -> tuple[np.ndarray, np.ndarray]:
    """(n, K, D) arm features and (n, K) click probabilities."""
    z = rng.uniform(-1.0, 1.0, (n, K, D - 1))
    x = np.concatenate([np.ones((n, K, 1)), z], axis=2)
    return x, ctr * (1.0 + z @ SLOPES)


def log(rng: np.random.Generator, n: int, ctr: float, logging: str, tag: str) -> list:
    x, mu = contexts(rng, n, ctr)
    if logging == "uniform":
        p = np.full((n, K), 1.0 / K)
    else:
        p = np.clip(rng.dirichlet(np.full(K, 0.08), n), 1e-3, None)
        p /= p.sum(axis=1, keepdims=True)
    a = (p.cumsum(axis=1) > rng.random((n, 1))).argmax(axis=1)
    r = (rng.random(n) < mu[np.arange(n), a]).astype(float)
    arms = tuple(f"a{j}" for j in range(K))
    return [
        LoggedDecision(
            timestamp_ms=i,
            event_id=f"{tag}-{i}",
            model_key="m",
            arm_ids=arms,
            features=x[i],
            action=int(a[i]),
            propensity=float(p[i, a[i]]),
            reward=float(r[i]),
        )
        for i in range(n)
    ]


def online_values(learner: str, ctr: float, steps: int, runs: int, seed: int) -> np.ndarray:
    """v_t for t = 0..steps-1: the learner's mean expected reward at its step t over ``runs``."""
    spec = config(learner).resolve("m")
    rng = np.random.default_rng(seed)
    total = np.zeros(steps)
    for run in range(runs):
        policy = spec.build()
        x, mu = contexts(rng, steps, ctr)
        clicks = rng.random(steps)
        for t in range(steps):
            dec, probs = choose_with_probabilities(
                policy.scores(x[t]),
                epsilon=spec.epsilon,
                model_key="m",
                event_id=f"o{run}-{t}",
                seed=spec.seed,
            )
            total[t] += probs @ mu[t]
            policy.update(x[t, dec.index], float(clicks[t] < mu[t, dec.index]))
    return total / runs


def estimand(v: np.ndarray, n: int) -> float:
    """V = (1/n) sum_i E[v_{N_i}], N_i ~ Binomial(i - 1, 1/K) (module docstring)."""
    t = np.arange(len(v))
    return float(np.mean([binom.pmf(t, i, 1.0 / K) @ v for i in range(n)]))


def measure(args) -> dict:
    logs = args.logs or (20 if args.quick else LOGS)
    truth_runs = 100 if args.quick else TRUTH_RUNS
    targets = [Target(name, config(name)) for name in LEARNERS]
    settings = []
    start = time.perf_counter()
    total = len(SETTINGS) * logs
    done = 0
    truths: dict[tuple[float, int], dict[str, float]] = {}
    for ctr, logging, n in SETTINGS:
        truth = truths.get((ctr, n))
        if truth is None:
            steps = int(n / K * 1.6)  # N_n exceeds it with probability < 1e-9
            truth = truths[(ctr, n)] = {
                name: estimand(online_values(name, ctr, steps, truth_runs, seed=1000 + i), n)
                for i, name in enumerate(LEARNERS)
            }
        seed = [int(ctr * 1000), len(logging)] + ([] if n == N_EVENTS else [n])
        rng = np.random.default_rng(seed)
        rows = {name: {e: [] for e in ESTIMATORS} for name in LEARNERS}
        for j in range(logs):
            decisions = log(rng, n, ctr, logging, f"l{j}")
            results = replay_targets(decisions, targets)
            reps = replicate_estimates(lambda: decisions, targets, replicates=REPLICATES, seed=j)
            for name in LEARNERS:
                own = {e.name: e for e in results[name].estimates}
                for e in ESTIMATORS:
                    lo, hi, s_b = interval_from_replicates(own[e], reps[name][e], 0.95)
                    s = float(np.std(reps[name][e], ddof=1))
                    rows[name][e].append(
                        (own[e].value, own[e].ci_low, own[e].ci_high, lo, hi, s_b, s)
                    )
            done += 1
            if done % 10 == 0 or done == total:
                el = time.perf_counter() - start
                print(
                    f"{done}/{total} logs, {el:.0f} s, about {el / done * (total - done):.0f} s "
                    "to go",
                    file=sys.stderr,
                    flush=True,
                )
        for name in LEARNERS:
            for e in ESTIMATORS:
                a = np.array(rows[name][e])
                V = truth[name]
                cond = (a[:, 1] <= V) & (V <= a[:, 2])
                exp = (a[:, 3] <= V) & (V <= a[:, 4])
                half = student_t.ppf(0.975, REPLICATES - 1) * a[:, 6]
                boot = (a[:, 0] - half <= V) & (V <= a[:, 0] + half)
                settings.append(
                    {
                        "ctr": ctr,
                        "events": n,
                        "logging": logging,
                        "learner": name,
                        "estimator": e,
                        "truth": V,
                        "mean_estimate": float(np.nanmean(a[:, 0])),
                        "path_coverage": float(cond.mean()),
                        "expected_coverage": float(exp.mean()),
                        "bootstrap_only_coverage": float(boot.mean()),
                        "path_width": float(np.nanmedian(a[:, 2] - a[:, 1])),
                        "expected_width": float(np.nanmedian(a[:, 4] - a[:, 3])),
                        "logs": len(a),
                        "raw": a.tolist() if args.raw else None,
                    }
                )
    return {
        "logs": logs,
        "replicates": REPLICATES,
        "truth_runs": truth_runs,
        "seconds": time.perf_counter() - start,
        "settings": settings,
    }


def render(result: dict) -> str:
    lines = [
        "# Learning targets: do the replay's intervals cover the learner's expected online value?",
        "",
        harness.provenance(result),
        "",
        f"{result['logs']} simulated logs per setting (context-linear "
        "clicks, K = 10, d = 5); the truth is the learner's expected value online over the horizon "
        f"the replay gives it, by Monte Carlo over {result['truth_runs']:,} online runs "
        "(`bench/ope_coverage_learners.py` defines it). *path*: the replay's interval (the value "
        "of its one learning path); *expected*: `streambandit.replay.paths` with "
        f"{result['replicates']} replicates (the path interval widened by the spread between "
        "learning paths). Coverage: the share of logs whose 95% interval holds "
        f"the truth (binomial standard error about 1.5 points at 200 logs). {result['seconds']:.0f} s.",
        "",
        "| events | CTR | logging | learner | estimator | truth | mean estimate | path coverage | "
        "expected coverage | bootstrap only | path width | expected width |",
        "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in result["settings"]:
        lines.append(
            f"| {s['events']:,} | {s['ctr']:g} | {s['logging']} | {s['learner']} | {s['estimator']} | "
            f"{s['truth']:.4f} | {s['mean_estimate']:.4f} | {100 * s['path_coverage']:.1f}% | "
            f"{100 * s['expected_coverage']:.1f}% | {100 * s['bootstrap_only_coverage']:.1f}% | "
            f"{s['path_width']:.4f} | "
            f"{s['expected_width']:.4f} |"
        )
    return "\n".join(lines) + "\n"


def add_arguments(ap) -> None:
    ap.add_argument("--logs", type=int, default=None, help=f"logs per setting (default {LOGS})")
    ap.add_argument("--raw", action="store_true", help="keep every log's intervals in the JSON")


if __name__ == "__main__":
    sys.exit(harness.main("ope_coverage_learners", __doc__, measure, render, add_arguments))
