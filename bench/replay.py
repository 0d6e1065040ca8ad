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

The targets of issue 36 are measured on their own logs: a 200,000-row uniform log (oful, d = 20,
K = 10), the command against 50,000 rows/s, and the Open Bandit Dataset sample (``--obd DIR``,
obp's ``obd/random/all``: ``pip download obp==0.5.7 --no-deps --no-binary :all:
--ignore-requires-python`` and unpack; without it that part is skipped) against 20,000 rows/s.
Each with its parts: the reader alone, the runner alone over decisions in memory, and references
measured in the same run (fastavro's record dicts alone for the reader, the bare learner for the
runner), and for the large log 1 against 3 targets in one pass.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness, traffic
from streambandit.config.models import parse_models_config
from streambandit.engine.decision import decide
from streambandit.replay.files import read_avro, write_avro
from streambandit.replay.logged import LoggedDecision
from streambandit.replay.runner import Target, replay, replay_targets
from streambandit.sim.ads import AdTraffic

D, K, KEYS = traffic.D, traffic.K, traffic.MODEL_KEYS
EPSILON, MAX_DELAY = 0.1, 200
POLICIES = ("oful", "glb_omd")
DIMS = ((20, 20_000), (300, 3_000))  # (d, events): d = 300 is ~100x the work per event
TARGET_ROWS_PER_S = 50_000
OBD_TARGET_ROWS_PER_S = 20_000
LARGE_ROWS = 200_000
OBD_USER_DIM = 4  # docs/replay_formats.md's evaluation: d = (4 + 1) * 41 = 205, K = 80
OBD_TOML = """[[models]]
match = "obd"
policy = "oful"
dim = 205
reward_window_ms = 60000
default_reward = 0.0
epsilon = 0.0
"""
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


def run_cli(policy: str, avro: Path, work: Path, n: int, extra: list[str] | None = None) -> dict:
    cfg = work / f"{policy}.toml"
    if not policy.startswith("obd"):  # the OBD models' files are written by measure_obd
        cfg.write_text(toml(policy))
    cmd = [
        sys.executable,
        "-m",
        "streambandit",
        "replay",
        str(avro),
        "--config",
        str(cfg),
        *(extra or []),
        "--out",
        str(work / "out"),
    ]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    s = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr}")
    return {"rows_per_s": n / s, "seconds": s}


def rate(n: int, fn) -> float:
    """Rows per second of ``fn()`` over ``n`` rows."""
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def count(rows) -> int:
    return sum(1 for _ in rows)


def fastavro_dicts(path: Path) -> int:
    """The records of an Avro file as fastavro's dicts, nothing else: the reference for the reader."""
    import fastavro

    with open(path, "rb") as f:
        return count(fastavro.reader(f))


def measure_large(work: Path, repeats: int, quick: bool) -> dict:
    """The 200,000-row uniform log: the command, the reader, the runner (1 and 3 targets) and
    their references."""
    n = LARGE_ROWS // 10 if quick else LARGE_ROWS
    log = uniform_log(n, seed=2)
    path = work / "large.avro"
    write_avro(path, log)
    cfg = config("oful")
    decisions = replay(log, cfg).decisions
    out: dict = {"events": n, "policy": "oful", "log": "uniform"}
    three = [Target(f"t{i}", cfg) for i in range(3)]
    for r in range(repeats):
        cli = run_cli("oful", path, work, n)
        row = {
            "command": cli["rows_per_s"],
            "command_seconds": cli["seconds"],
            "pass": rate(n, lambda: replay(read_avro(path), cfg)),
            "reader": rate(n, lambda: count(read_avro(path))),
            "fastavro_dicts": rate(n, lambda: fastavro_dicts(path)),
            "runner": rate(n, lambda: replay(log, cfg)),
            "runner_3_targets": rate(n, lambda: replay_targets(log, three)),
            "bare": run_bare("oful", log, decisions),
        }
        for k, v in row.items():
            out.setdefault(k, []).append(v)
        print(
            f"large log run {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()), flush=True
        )
    return out


def obd_toml(combine: str, dim: int) -> str:
    return OBD_TOML.replace("dim = 205", f"dim = {dim}") if combine == "concat" else OBD_TOML


def measure_obd(obd: Path, work: Path, repeats: int, quick: bool) -> dict:
    """The OBD sample with docs/replay_formats.md's model (oful, d = 205 from ``--combine
    outer``, K = 80), and the same with ``--combine concat`` (d = 45)."""
    import tomllib

    from streambandit.replay.obd import obd_dim, read_obd

    out: dict = {}
    for combine in ("outer", "concat"):
        dim = obd_dim(obd, user_dim=OBD_USER_DIM, combine=combine)
        text = obd_toml(combine, dim)
        (work / f"obd-{combine}.toml").write_text(text)
        cfg = parse_models_config(tomllib.loads(text))
        opts = {"user_dim": OBD_USER_DIM, "combine": combine}
        log = list(read_obd(obd, **opts))[: 1000 if quick else None]
        n = len(log)
        decisions = replay(log, cfg).decisions
        entry: dict = {"events": n, "dim": dim}
        args = ["--user-dim", str(OBD_USER_DIM), "--combine", combine, "--rows", f":{n}"]
        for r in range(repeats):
            cli = run_cli(f"obd-{combine}", obd, work, n, args)
            row = {
                "command": cli["rows_per_s"],
                "command_seconds": cli["seconds"],
                "pass": rate(n, lambda: replay(_first(n, read_obd(obd, **opts)), cfg)),
                "reader": rate(n, lambda: count(_first(n, read_obd(obd, **opts)))),
                "runner": rate(n, lambda: replay(log, cfg)),
                "bare": _bare_with(log, decisions, cfg),
            }
            for k, v in row.items():
                entry.setdefault(k, []).append(v)
            print(
                f"obd {combine} run {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()),
                flush=True,
            )
        out[combine] = entry
    return out


def _first(n: int, rows):
    return itertools.islice(rows, n)


def _bare_with(log: list, decisions: dict, cfg) -> float:
    """run_bare for a configuration given as an object."""
    fresh = {k: cfg.resolve(k).build() for k in {d.model_key for d in log}}
    t0 = time.perf_counter()
    for d in log:
        m = fresh[d.model_key]
        m.scores(d.features)
        if decisions[d.event_id] == d.action:
            m.update(d.features[d.action], d.reward)
    return len(log) / (time.perf_counter() - t0)


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
        res["large"] = measure_large(work, repeats, args.quick)
        if args.obd:
            res["obd"] = measure_obd(Path(args.obd).resolve(), work, repeats, args.quick)
            res["obd"]["dir"] = args.obd
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
    lines += render_targets(res)
    return "\n".join(lines)


def render_targets(res: dict) -> list[str]:
    """Issue 36's targets: the large log and the OBD sample, each part against its reference."""
    med = harness.median
    fixed = med(res["command_fixed_seconds"])
    lines: list[str] = []

    def after(entry: dict) -> str:
        # Within half a second of the fixed cost the difference is mostly noise.
        s = med(entry["command_seconds"]) - fixed
        return f"{entry['events'] / s:,.0f}" if s >= 0.5 else "(within the fixed cost)"

    big = res.get("large")
    if big:
        m = {k: med(v) for k, v in big.items() if isinstance(v, list)}
        # Each extra target must still score every row and learn its matched ones: the bare
        # learner's work. One pass over 3 targets cannot beat 1 runner + 2 bare learners.
        floor = 1.0 / (1.0 / m["runner"] + 2.0 / m["bare"])
        lines += [
            f"## The command on a {big['events']:,}-row Avro log (oful, d = {res['d']}, K = {res['K']}, "
            f"uniform logging policy; the target is {TARGET_ROWS_PER_S:,} rows/s)",
            "",
            "| part | rows / s | against | ratio |",
            "|---|---:|---|---:|",
            f"| command (`python -m streambandit replay LOG.avro --config oful.toml`, wall time) "
            f"| {m['command']:,.0f} | the target | {m['command'] / TARGET_ROWS_PER_S:.2f} |",
            f"| the command after its fixed cost ({fixed:.2f} s, the 10-row command above) | "
            f"{after(big)} | | |",
            f"| one pass in process (`replay(read_avro(LOG), config)`) | {m['pass']:,.0f} | the target "
            f"| {m['pass'] / TARGET_ROWS_PER_S:.2f} |",
            f"| reader alone (`read_avro`, decisions) | {m['reader']:,.0f} | fastavro's record "
            f"dicts alone, {m['fastavro_dicts']:,.0f} | {m['reader'] / m['fastavro_dicts']:.2f} |",
            f"| runner alone (`replay()`, decisions in memory) | {m['runner']:,.0f} | bare learner, "
            f"{m['bare']:,.0f} | {m['runner'] / m['bare']:.2f} |",
            f"| runner, 3 targets in one pass (`replay_targets`) | {m['runner_3_targets']:,.0f} | "
            f"the runner with 1 | {m['runner_3_targets'] / m['runner']:.2f} |",
            f"| runner, 3 targets in one pass | {m['runner_3_targets']:,.0f} | the floor: the "
            f"runner with 1 plus 2 bare learners' time per row, {floor:,.0f} | "
            f"{m['runner_3_targets'] / floor:.2f} |",
            "",
            f"Median of {len(big['command'])} runs. The command "
            f"{'meets' if m['command'] >= TARGET_ROWS_PER_S else 'does not meet'} the target. "
            "The bare learner's time per row is the target's own decision and learning, which "
            "every extra target adds whatever the pass shares.",
            "",
        ]
    obd = res.get("obd")
    if obd:
        lines += [
            f"## The Open Bandit Dataset sample (`random/all`, K = 80, user features hashed into "
            f"{OBD_USER_DIM}; oful learning with epsilon 0; the target is {OBD_TARGET_ROWS_PER_S:,} "
            "rows/s)",
            "",
            "*outer*: docs/replay_formats.md's model (`--combine outer`); *concat*: `--combine "
            "concat`. *command*: `python -m streambandit replay DIR --user-dim 4 --combine RULE "
            "--config obd.toml`, wall time. *pass*: `replay(read_obd(DIR), config)` in process, "
            "the rate of a long log such as the full dataset, where the fixed cost vanishes.",
            "",
            "| model | d | rows | command rows / s | after the fixed cost | pass rows / s | pass / "
            "target | reader rows / s | runner rows / s | bare learner rows / s | runner / bare |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for combine, e in obd.items():
            if not isinstance(e, dict):
                continue
            m = {k: med(v) for k, v in e.items() if isinstance(v, list)}
            lines.append(
                f"| {combine} | {e['dim']} | {e['events']:,} | {m['command']:,.0f} | {after(e)} | "
                f"{m['pass']:,.0f} | {m['pass'] / OBD_TARGET_ROWS_PER_S:.2f} | {m['reader']:,.0f} | "
                f"{m['runner']:,.0f} | {m['bare']:,.0f} | {m['runner'] / m['bare']:.2f} |"
            )
        lines.append("")
    elif "large" in res:
        lines += ["The OBD part was not run (`--obd DIR` not given).", ""]
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--obd", help="obp's obd/random/all directory: also measure the OBD sample")


if __name__ == "__main__":
    raise SystemExit(harness.main("replay", __doc__, measure, render, add_arguments))
