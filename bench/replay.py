"""Rows per second of ``streambandit replay``: the runner in-process, and the command on an Avro log.

    python -m bench.replay            # full run (~2 min), writes bench/results/replay.{md,json}
    python -m bench.replay --quick    # a smoke run with small sizes (results not written)

The logs are simulated ad traffic (``streambandit.sim.ads``, d = 20, K = 10, 4 model keys) with
0/1 clicks:

- "own log": what the worker itself would log with the target configuration (epsilon 0.1, each
  update applied 1..200 events after its decision, ``decision_version`` recorded). Replaying it
  reproduces every decision, so every event updates the target: the replay's most expensive case.
- "uniform log": a uniformly random logging policy (propensity 1/K, no decision version): the
  target learns from ~1/K of the events (rejection sampling).

Per policy (oful, glb_omd with the demo's hyper-parameters) and log: the runner (``replay()`` over
decisions already in memory), the command (``python -m streambandit replay LOG.avro --config ...``
in a subprocess, wall time including interpreter start, reading the file and writing the report),
and the bare learner (the same decisions and updates, ``scores`` + ``update`` only, no evaluator).
Median of REPEATS runs, runs of the policies interleaved.
"""

from __future__ import annotations

import argparse
import heapq
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness, traffic
from streambandit.config.models import parse_models_config
from streambandit.engine.decision import decide
from streambandit.replay.files import write_avro
from streambandit.replay.logged import LoggedDecision
from streambandit.replay.runner import replay
from streambandit.sim.ads import AdTraffic

D, K, KEYS = traffic.D, traffic.K, traffic.MODEL_KEYS
EPSILON, MAX_DELAY = 0.1, 200
POLICIES = ("oful", "glb_omd")
DIMS = ((20, 20_000), (300, 3_000))  # (d, events): d = 300 is ~100x the work per event
TARGET_ROWS_PER_S = 50_000
ROOT = Path(__file__).resolve().parent.parent


def toml(policy: str) -> str:
    return traffic.models_toml(policy, epsilon=EPSILON, seed=0)


def config(policy: str, dim: int = D):
    return parse_models_config(traffic.models(policy, epsilon=EPSILON, seed=0, dim=dim))


def own_log(policy: str, n: int, seed: int = 0) -> list[LoggedDecision]:
    """The worker's joined log (update order) for the target configuration, delayed updates."""
    cfg = config(policy)
    traffic, rng = AdTraffic(dim=D, k=K, seed=seed), np.random.default_rng(seed)
    models: dict = {}
    due: list = []
    log: list[LoggedDecision] = []
    for t in range(n):
        while due and due[0][0] <= t:
            _, _, rec = heapq.heappop(due)
            models[rec.model_key].update(rec.features[rec.action], rec.reward)
            log.append(rec)
        key = KEYS[int(rng.integers(len(KEYS)))]
        spec = cfg.resolve(key)
        model = models.get(key) or models.setdefault(key, spec.build())
        req = traffic.request(rng)
        d = decide(
            model,
            req.features,
            epsilon=spec.epsilon,
            model_key=key,
            event_id=f"e{t}",
            seed=spec.seed,
        )
        reward = float(traffic.click(rng, float(req.click_rates[d.index])))
        rec = LoggedDecision(
            t,
            f"e{t}",
            key,
            req.ad_ids,
            req.features,
            d.index,
            d.propensity,
            reward,
            model.n_updates,
        )
        heapq.heappush(due, (t + int(rng.integers(1, MAX_DELAY)), t, rec))
    while due:
        _, _, rec = heapq.heappop(due)
        models[rec.model_key].update(rec.features[rec.action], rec.reward)
        log.append(rec)
    return log


def uniform_log(n: int, seed: int = 1, dim: int = D) -> list[LoggedDecision]:
    traffic, rng = AdTraffic(dim=dim, k=K, seed=seed), np.random.default_rng(seed)
    log = []
    for t in range(n):
        req = traffic.request(rng)
        a = int(rng.integers(K))
        log.append(
            LoggedDecision(
                t,
                f"e{t}",
                KEYS[int(rng.integers(len(KEYS)))],
                req.ad_ids,
                req.features,
                a,
                1.0 / K,
                float(traffic.click(rng, float(req.click_rates[a]))),
            )
        )
    return log


def run_runner(policy: str, log: list[LoggedDecision], dim: int = D) -> dict:
    t0 = time.perf_counter()
    r = replay(log, config(policy, dim))
    s = time.perf_counter() - t0
    return {
        "rows_per_s": len(log) / s,
        "seconds": s,
        "matched": r.matched,
        "off_version": r.off_version,
    }


def run_bare(
    policy: str, log: list[LoggedDecision], decisions: dict[str, int], dim: int = D
) -> float:
    """The target's own work: scores for every event, an update for every matched one."""
    cfg = config(policy, dim)
    models = {k: cfg.resolve(k).build() for k in {d.model_key for d in log}}
    t0 = time.perf_counter()
    for d in log:
        m = models[d.model_key]
        m.scores(d.features)
        if decisions[d.event_id] == d.action:
            m.update(d.features[d.action], d.reward)
    return len(log) / (time.perf_counter() - t0)


def run_cli(policy: str, avro: Path, work: Path, n: int) -> dict:
    cfg = work / f"{policy}.toml"
    cfg.write_text(toml(policy))
    cmd = [
        sys.executable,
        "-m",
        "streambandit",
        "replay",
        str(avro),
        "--config",
        str(cfg),
        "--out",
        str(work / "out"),
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    s = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr}")
    return {"rows_per_s": n / s, "seconds": s}


def measure(args: argparse.Namespace) -> dict:
    repeats, n = (1, 2000) if args.quick else (3, 20_000)
    res: dict = {
        "d": D,
        "K": K,
        "model_keys": len(KEYS),
        "epsilon": EPSILON,
        "max_delay_events": MAX_DELAY,
        "events": n,
        "repeats": repeats,
        "runs": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        logs: dict = {}
        for p in POLICIES:
            logs[(p, "own")] = own_log(p, n)
        logs["uniform"] = uniform_log(n)
        avros = {}
        for key, log in logs.items():
            name = "-".join(key) if isinstance(key, tuple) else key
            avros[key] = work / f"{name}.avro"
            write_avro(avros[key], log)
        tiny = work / "tiny.avro"
        write_avro(tiny, logs["uniform"][:10])
        runs: dict = {}
        startup: list[float] = []
        for r in range(repeats):
            startup.append(run_cli("oful", tiny, work, 10)["seconds"])
            for p in POLICIES:
                for kind in ("own", "uniform"):
                    log = logs[(p, "own")] if kind == "own" else logs["uniform"]
                    avro = avros[(p, "own")] if kind == "own" else avros["uniform"]
                    row = runs.setdefault(f"{p}/{kind}", {"runner": [], "cli": [], "bare": []})
                    rr = run_runner(p, log)
                    row["runner"].append(rr)
                    decisions = (
                        replay(log, config(p)).decisions
                        if r == 0 and "decisions" not in row
                        else None
                    )
                    if decisions is not None:
                        row["decisions"] = decisions
                    row["bare"].append(run_bare(p, log, row["decisions"]))
                    row["cli"].append(run_cli(p, avro, work, n))
                    print(
                        f"{p} {kind} run {r}: runner {rr['rows_per_s']:,.0f} rows/s (matched {rr['matched']}), "
                        f"cli {row['cli'][-1]['rows_per_s']:,.0f} rows/s, bare {row['bare'][-1]:,.0f}/s",
                        flush=True,
                    )
        for row in runs.values():
            row.pop("decisions", None)
        res["runs"] = runs
        # The target: oful at d = 20 and d = 300 on a uniform log, against the bare learner.
        by_dim: dict = {}
        for dim, rows in DIMS:
            rows = rows // 10 if args.quick else rows
            log = uniform_log(rows, dim=dim)
            decisions = replay(log, config("oful", dim)).decisions
            entry = by_dim.setdefault(str(dim), {"events": rows, "runner": [], "bare": []})
            for r in range(repeats):
                entry["runner"].append(run_runner("oful", log, dim)["rows_per_s"])
                entry["bare"].append(run_bare("oful", log, decisions, dim))
                print(
                    f"oful d={dim} run {r}: runner {entry['runner'][-1]:,.0f} rows/s, bare {entry['bare'][-1]:,.0f}/s",
                    flush=True,
                )
        res["by_dim"] = by_dim
        res["command_fixed_seconds"] = startup
    return res


def render(res: dict) -> str:
    med = harness.median
    n = res["events"]
    lines = [
        "# `streambandit replay`: rows per second",
        "",
        harness.provenance(res, "BLAS pinned to one thread."),
        "",
        f"Logs of {n:,} simulated ad requests (d = {res['d']}, K = {res['K']}, {res['model_keys']} model keys, 0/1 "
        f"clicks). *own*: the worker's own log for the target configuration (epsilon {res['epsilon']}, updates "
        f"1..{res['max_delay_events']} events after their decision, decision versions recorded): every decision is "
        "reproduced and every event updates the target. *uniform*: a uniformly random logging policy, the target "
        "learns from the ~1/K matched events. *runner*: `replay()` over decisions in memory (the five estimators, "
        "the reward model, rejection sampling, decision-version timing). *command*: `python -m streambandit replay "
        "LOG.avro --config FILE` in a subprocess, wall time including interpreter start-up, Avro reading and the "
        "report (PNG included). *bare learner*: the target's `scores` on every event and `update` on the matched "
        f"ones, nothing else. Median of {res['repeats']} runs.",
        "",
        "| policy | log | matched | runner rows / s | command rows / s | command s | command rows / s after start-up "
        "| bare learner rows / s | runner / bare |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    fixed = med(res["command_fixed_seconds"])
    for key, row in res["runs"].items():
        p, kind = key.split("/")
        runner = med([x["rows_per_s"] for x in row["runner"]])
        cli = med([x["rows_per_s"] for x in row["cli"]])
        cli_s = med([x["seconds"] for x in row["cli"]])
        bare = med(row["bare"])
        matched = row["runner"][0]["matched"]
        after = n / (cli_s - fixed) if cli_s > fixed else float("nan")
        lines.append(
            f"| {p} | {kind} | {matched:,} | {runner:,.0f} | {cli:,.0f} | {cli_s:.1f} | {after:,.0f} | "
            f"{bare:,.0f} | {runner / bare:.0%} |"
        )
    lines += [
        "",
        f"The command has a fixed cost of {fixed:.2f} s (median of the same command on a 10-row log: interpreter "
        "start-up, imports, the report and its figure); *after start-up* subtracts it.",
        "",
    ]
    if "by_dim" in res:
        lines += [
            f"## oful by dimension (uniform log, K = {res['K']}; the target is {TARGET_ROWS_PER_S:,} rows/s)",
            "",
            "| d | events | runner rows / s | bare learner rows / s | runner / bare | runner / target |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        verdicts = []
        for dim, e in res["by_dim"].items():
            runner, bare = med(e["runner"]), med(e["bare"])
            lines.append(
                f"| {dim} | {e['events']:,} | {runner:,.0f} | {bare:,.0f} | {runner / bare:.0%} | "
                f"{runner / TARGET_ROWS_PER_S:.2f} |"
            )
            verdict = (
                f"d = {dim}: the target is {'met' if runner >= TARGET_ROWS_PER_S else 'not met'}"
            )
            if bare < TARGET_ROWS_PER_S:
                verdict += f", and cannot be: the bare learner runs {bare:,.0f} rows/s"
            verdicts.append(verdict)
        lines += ["", "; ".join(verdicts) + ".", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("replay", __doc__, measure, render))
