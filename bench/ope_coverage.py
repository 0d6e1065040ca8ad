"""How often the off-policy intervals cover the truth, on logs whose propensities spread widely.

    python -m bench.ope_coverage            # 200 logs per setting (~10 min), writes
                                            # bench/results/ope_coverage.{md,json}
    python -m bench.ope_coverage --quick    # 30 logs per setting, printed only

Each log is N simulated requests (K = 10 arms, each arm a d = 5 feature vector per request). The
click probability is ``sigmoid(theta . x + b)``, ``b`` set so the mean click rate over all arms is
the setting's CTR (0.1 or 0.01). The logging policy is a sharp softmax of another linear score,
mixed with 1e-3 of uniform: logged propensities spread from 1e-3 to 0.99, as real ad logs have.
Targets, their true values computed on 200,000 fresh requests:

- ``uniform``: every arm 1/K;
- ``fixed``: the argmax of a fixed linear score (a deterministic policy);
- ``frozen``: a streambandit oful model trained online on 2,000 separate requests, then frozen,
  choosing epsilon-greedy (epsilon 0.05) with the worker's own rule
  (``engine.decision.choose_with_probabilities``).

Every log is evaluated as ``streambandit replay`` does it: the evaluator
(``replay.estimators.OffPolicyEvaluator``) with a ridge reward model on the arms' features that
predicts each row before learning it. A setting's coverage is the share of its logs whose 95%
interval holds the target's true value; with 200 logs its standard error is about 1.5 points.
"""

from __future__ import annotations

import math
import sys

import numpy as np

from bench import harness
from streambandit.engine.decision import choose_with_probabilities
from streambandit.policies.base import make_policy
from streambandit.replay.estimators import OffPolicyEvaluator, RidgeRewardModel

K, D = 10, 5
ROWS = 20_000
LOGS, QUICK_LOGS = 200, 30
CTRS = (0.1, 0.01)
TARGETS = ("uniform", "fixed", "frozen")
ESTIMATORS = ("ips", "snips", "dr")
FLOOR = 1e-3  # the uniform share of the logging policy: the least propensity
SHARPNESS = 4.0  # the logging softmax's inverse temperature
TRUTH_REQUESTS = 200_000


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class World:
    """One setting's click model, logging policy and targets."""

    def __init__(self, ctr: float, seed: int) -> None:
        rng = np.random.default_rng([seed, 36])
        self.theta = rng.normal(size=D) * 1.5
        self.log_theta = self.theta + rng.normal(size=D)  # a logger that knows something
        self.fixed_theta = self.theta + rng.normal(size=D) * 1.5
        x = self.requests(rng, 20_000)
        lo, hi = -15.0, 5.0
        for _ in range(60):  # b with mean click rate ctr
            b = (lo + hi) / 2
            lo, hi = (b, hi) if sigmoid(x @ self.theta + b).mean() < ctr else (lo, b)
        self.b = (lo + hi) / 2
        self.frozen = make_policy("oful", D)
        for xs in self.requests(rng, 2_000):
            a = int(self.frozen.scores(xs).argmax()) if rng.random() > 0.1 else int(rng.integers(K))
            self.frozen.update(xs[a], float(rng.random() < self.mu(xs)[a]))
        x = self.requests(rng, TRUTH_REQUESTS)
        mu = sigmoid(x @ self.theta + self.b)
        self.truth = {t: float((self.target_probs(t, x) * mu).sum(1).mean()) for t in TARGETS}

    @staticmethod
    def requests(rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(size=(n, K, D)) / math.sqrt(D)

    def mu(self, x: np.ndarray) -> np.ndarray:
        return sigmoid(x @ self.theta + self.b)

    def logging_probs(self, x: np.ndarray) -> np.ndarray:
        s = SHARPNESS * (x @ self.log_theta)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (1.0 - K * FLOOR) * e / e.sum(-1, keepdims=True) + FLOOR

    def target_probs(self, target: str, x: np.ndarray) -> np.ndarray:
        """(n, K) probabilities of a target over requests ``x`` (n, K, D)."""
        n = x.shape[0]
        if target == "uniform":
            return np.full((n, K), 1.0 / K)
        if target == "fixed":
            return np.eye(K)[(x @ self.fixed_theta).argmax(1)]
        out = np.empty((n, K))
        for i in range(n):
            _, out[i] = choose_with_probabilities(
                self.frozen.scores(x[i]), epsilon=0.05, model_key="m", event_id=str(i), seed=0
            )
        return out


def one_log(world: World, rng: np.random.Generator, rows: int) -> dict[str, OffPolicyEvaluator]:
    """A log of ``rows`` requests, evaluated for every target (one reward model, as a replay of
    several targets has)."""
    x = world.requests(rng, rows)
    p = world.logging_probs(x)
    arms = (p.cumsum(1) > rng.random((rows, 1))).argmax(1)
    idx = np.arange(rows)
    prop = p[idx, arms]
    clicks = (rng.random(rows) < world.mu(x)[idx, arms]).astype(np.float64)
    probs = {t: world.target_probs(t, x) for t in TARGETS}
    evs = {t: OffPolicyEvaluator(running_growth=math.inf) for t in TARGETS}
    model = RidgeRewardModel(D)
    for i in range(rows):
        q = model.predict_then_learn(x[i], int(arms[i]), float(clicks[i]))
        for t in TARGETS:
            evs[t].add_also_to(None, int(arms[i]), float(prop[i]), float(clicks[i]), probs[t][i], q)
    return evs, prop


def measure(args) -> dict:
    logs = QUICK_LOGS if args.quick else args.logs
    out = {"rows": args.rows, "logs": logs, "settings": []}
    for ctr in CTRS:
        world = World(ctr, seed=int(ctr * 1000))
        rng = np.random.default_rng([7, int(ctr * 1000)])
        cells = {
            t: {
                "covered": dict.fromkeys(ESTIMATORS, 0),
                "width": {e: [] for e in ESTIMATORS},
                "ess": [],
                "warned": 0,
                "covered_unwarned": dict.fromkeys(ESTIMATORS, 0),
            }
            for t in TARGETS
        }
        props: list[float] = []
        for i in range(logs):
            print(f"\rctr {ctr}: log {i + 1}/{logs}", end="", file=sys.stderr, flush=True)
            evs, prop = one_log(world, rng, args.rows)
            props.extend(np.quantile(prop, [0.01, 0.99]).tolist())
            for t, ev in evs.items():
                c, truth = cells[t], world.truth[t]
                est = {e.name: e for e in ev.estimates()}
                warned = any("effective sample size" in w or "carries" in w for w in ev.warnings())
                c["warned"] += warned
                c["ess"].append(est["snips"].ess)
                for name in ESTIMATORS:
                    e = est[name]
                    hit = e.ci_low <= truth <= e.ci_high
                    c["covered"][name] += hit
                    c["covered_unwarned"][name] += hit and not warned
                    c["width"][name].append(e.ci_high - e.ci_low)
        print(file=sys.stderr)
        for t in TARGETS:
            c = cells[t]
            out["settings"].append(
                {
                    "ctr": ctr,
                    "target": t,
                    "truth": world.truth[t],
                    "coverage": {e: c["covered"][e] / logs for e in ESTIMATORS},
                    "median_width": {e: float(np.median(c["width"][e])) for e in ESTIMATORS},
                    "median_ess": float(np.median(c["ess"])),
                    "warned": c["warned"],
                    "covered_unwarned": c["covered_unwarned"],
                }
            )
        out.setdefault("propensity_p01_p99", {})[str(ctr)] = [
            float(np.median(props[0::2])),
            float(np.median(props[1::2])),
        ]
    return out


def render(r: dict) -> str:
    lines = [
        "# Off-policy intervals: coverage on logs with widely spread propensities",
        "",
        harness.provenance(r),
        "",
        f"{r['logs']} logs per setting of {r['rows']:,} requests each (K = {K}, d = {D}); the "
        "logging policy is a sharp softmax mixed with 1e-3 of uniform (bench/ope_coverage.py). "
        "Median 1st and 99th percentiles of a log's logged propensities: "
        + ", ".join(
            f"CTR {ctr}: {a:.4f} and {b:.3f}" for ctr, (a, b) in r["propensity_p01_p99"].items()
        )
        + ". Coverage of the nominal 95% intervals; the standard error of a share over "
        f"{r['logs']} logs is about {100 * math.sqrt(0.95 * 0.05 / r['logs']):.1f} points.",
        "",
        "| CTR | target | true value | median ESS | ips | snips | dr | median width ips / snips / dr | logs warned |",
        "|---:|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for s in r["settings"]:
        cov, wid = s["coverage"], s["median_width"]
        lines.append(
            f"| {s['ctr']} | {s['target']} | {s['truth']:.4f} | {s['median_ess']:.0f} | "
            + " | ".join(f"{100 * cov[e]:.1f}%" for e in ESTIMATORS)
            + " | "
            + " / ".join(f"{wid[e]:.4f}" for e in ESTIMATORS)
            + f" | {s['warned']} |"
        )
    lines += [
        "",
        "*logs warned*: logs whose report carries a warning that the importance-weighted "
        "intervals rest on few effective events or on one heavy weight.",
        "",
    ]
    return "\n".join(lines)


def add_arguments(ap) -> None:
    ap.add_argument("--logs", type=int, default=LOGS, help="logs per setting")
    ap.add_argument("--rows", type=int, default=ROWS, help="requests per log")


if __name__ == "__main__":
    sys.exit(harness.main("ope_coverage", __doc__, measure, render, add_arguments))
