"""The Open Bandit Dataset sample's report against obp's estimators on the same rows.

    python -m bench.obd_vs_obp --obp-python /tmp/obpvenv/bin/python   # ~1 min, writes bench/results/obd_vs_obp.*
    python -m bench.obd_vs_obp --obd DIR --quick                       # streambandit alone, printed

The data: OBD's small sample (``random/all``: 10,000 impressions logged by a uniformly random
policy over 80 items in 3 slots, and ``bts/all``, logged by Bernoulli Thompson sampling), as obp
0.5.7 ships it in its package data (``obp/dataset/obd``, the files of github st-tech/zr-obp's
``obd/``). ``--obd DIR`` names that directory; without it it is found from ``--obp-python``
(env ``OBP_PYTHON``): the Python of an environment with obp installed, kept apart from
streambandit's (obp 0.5.7 pins Python < 3.11 and torch 1.12; it is not in streambandit's lock).

``streambandit replay`` (the command, in a subprocess) evaluates on rows 5000..9999 of
``random/all`` three targets in one pass:

- ``frozen``: oful (``obd.toml`` below, epsilon 0), trained on rows 0..4999 by a first replay
  (``--save-state``), then frozen (``--frozen --state``): a deterministic ranking per slot;
- ``uniform``: the same configuration with epsilon 1 (kind ``uniform``): the logging policy itself,
  whose value is the log's own click rate;
- ``bts``: external, the BTS campaign's share of each item at each slot
  (``docs/examples/obd_marginal_policy.py``), given by a side file.

It runs twice, with the default intervals and with ``--bootstrap 1000``. Then, with an obp Python,
``bench/obp_estimates.py`` gives obp's IPS, SNIPS and DR (obp's logistic-regression reward model
with 3-fold cross fitting, and once more with streambandit's reward predictions) with obp's
bootstrap intervals, on the same rows with the same probabilities: each target's probabilities
per row (one-hot at the frozen model's choice, 1/80, BTS's shares) and streambandit's reward
predictions come from an in-process replay of the same rows, checked equal to the command's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench import harness

ROOT = Path(__file__).resolve().parent.parent
SPLIT = 5000  # rows 0..SPLIT-1 train the frozen target, SPLIT.. are evaluated
USER_DIM = 4
BOOTSTRAP = 1000
ESTIMATORS = ("ips", "snips", "dr")
TARGETS = ("frozen", "uniform", "bts")

OBD_TOML = """[[models]]
match = "obd"
policy = "oful"
dim = 205               # 80 items with 41 item features; user features hashed into 4; outer: (4 + 1) * 41
reward_window_ms = 60000
default_reward = 0.0
epsilon = {epsilon}
"""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--obd",
        default=None,
        metavar="DIR",
        help="the OBD sample: a directory holding random/all and bts/all (default: obp's package "
        "data, found with --obp-python)",
    )
    ap.add_argument(
        "--obp-python",
        default=os.environ.get("OBP_PYTHON"),
        metavar="PYTHON",
        help="the Python of an environment with obp 0.5.7, for obp's side (env OBP_PYTHON); "
        "without it only streambandit's side is measured",
    )


def _obd_dir(args: argparse.Namespace) -> Path:
    if args.obd:
        return Path(args.obd)
    if not args.obp_python:
        raise SystemExit("python -m bench.obd_vs_obp: give --obd DIR or --obp-python PYTHON")
    out = subprocess.run(
        [
            args.obp_python,
            "-c",
            "import os, importlib.util as u; "
            "print(os.path.join(os.path.dirname(u.find_spec('obp').origin), 'dataset', 'obd'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _run(argv: list[str]) -> None:
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{out.stderr[-3000:]}")


def _commands(obd: Path, work: Path) -> list[list[str]]:
    """streambandit's side, as commands (the report quotes them with $OBD and $WORK)."""
    log = str(obd / "random" / "all")
    replay = [sys.executable, "-m", "streambandit", "replay", log, "--user-dim", str(USER_DIM)]
    evaluate = [
        *replay,
        "--rows",
        f"{SPLIT}:",
        "--config",
        f"frozen={work / 'obd.toml'}",
        "--config",
        f"uniform={work / 'uniform.toml'}",
        "--frozen",
        "--state",
        str(work / "trained.avro"),
        "--external",
        f"bts={work / 'bts.csv'}",
    ]
    return [
        [
            *replay,
            "--rows",
            f":{SPLIT}",
            "--config",
            str(work / "obd.toml"),
            "--save-state",
            str(work / "trained.avro"),
            "--out",
            str(work / "train"),
        ],
        [
            sys.executable,
            "docs/examples/obd_marginal_policy.py",
            str(obd / "bts" / "all"),
            log,
            str(work / "bts.csv"),
        ],
        [*evaluate, "--out", str(work / "eval")],
        [*evaluate, "--bootstrap", str(BOOTSTRAP), "--out", str(work / "eval_boot")],
    ]


def _shown(argv: list[str], obd: Path, work: Path) -> str:
    text = " ".join(["python" if a == sys.executable else a for a in argv])
    return text.replace(str(obd), "$OBD").replace(str(work), "$WORK")


def _estimates(report: Path) -> dict[str, dict]:
    doc = json.loads(report.read_text())
    return {
        t["name"]: {
            "kind": t["kind"],
            "matched": t["matched"],
            "events": t["events"],
            **{e["name"]: e for e in t["estimates"] if e["name"] in ESTIMATORS},
            "logging": t["logging"],
        }
        for t in doc["targets"]
    }


def _rows_and_probabilities(obd: Path, work: Path, sb: dict[str, dict]) -> dict[str, np.ndarray]:
    """Every evaluated row's index, each target's probabilities at its slot and the reward
    model's predictions, from an in-process replay of the rows the command evaluated (its
    estimates must be the command's: the same rows, choices and predictions)."""
    import itertools

    from streambandit.config.models import load_models_config
    from streambandit.replay.estimators import RidgeRewardModel
    from streambandit.replay.files import read_target_probs
    from streambandit.replay.obd import read_obd
    from streambandit.replay.runner import Target, replay_targets
    from streambandit.replay.states import read_model_states

    rows = list(itertools.islice(read_obd(obd / "random" / "all", user_dim=USER_DIM), SPLIT, None))
    cfg = load_models_config(work / "obd.toml")
    frozen = Target("frozen", cfg, learn=False, states=read_model_states(work / "trained.avro"))
    bts = read_target_probs(work / "bts.csv")
    result = replay_targets(rows, [frozen, Target("bts", probs=bts)])
    for name, r in result.items():
        for e in r.estimates:
            if e.name in ESTIMATORS:
                assert e.value == sb[name][e.name]["value"], (name, e.name)
    k = len(rows[0].arm_ids)
    model = RidgeRewardModel(rows[0].features.shape[1])
    predicted = np.array([model.predict_then_learn(d.features, d.action, d.reward) for d in rows])
    chosen = np.array([result["frozen"].decisions[d.event_id] for d in rows])
    return {
        "ids": np.array([int(d.event_id) for d in rows]),
        "predicted": predicted,
        "probs_frozen": np.eye(k)[chosen],  # epsilon 0: probability 1 on its choice
        "probs_uniform": np.full((len(rows), k), 1.0 / k),
        "probs_bts": np.array([bts[d.event_id] for d in rows]),
    }


def measure(args: argparse.Namespace) -> dict:
    obd = _obd_dir(args).resolve()
    sample = obd / "random" / "all" / "all.csv"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "obd.toml").write_text(OBD_TOML.format(epsilon="0.0"))
        (work / "uniform.toml").write_text(OBD_TOML.format(epsilon="1.0"))
        commands = _commands(obd, work)
        for argv in commands:
            _run(argv)
        sb = _estimates(work / "eval" / "replay.json")
        boot = _estimates(work / "eval_boot" / "replay.json")
        given = _rows_and_probabilities(obd, work, sb)
        obp = None
        if args.obp_python:
            np.savez(work / "rows.npz", **given)
            side = [
                args.obp_python,
                str(ROOT / "bench" / "obp_estimates.py"),
                str(obd),
                str(work / "rows.npz"),
                str(work / "obp.json"),
            ]
            _run(side)
            obp = json.loads((work / "obp.json").read_text())
            commands.append(side[:2] + ["$OBD", "$WORK/rows.npz", "$WORK/obp.json"])
        shown = [_shown(argv, obd, work) for argv in commands]
    if args.obp_python:
        shown[-1] = shown[-1].replace(args.obp_python, "$OBP_PYTHON").replace(str(ROOT) + "/", "")
    return {
        "data": {
            "file": "random/all/all.csv",
            "sha256": hashlib.sha256(sample.read_bytes()).hexdigest(),
            "evaluated_rows": f"{SPLIT}..{SPLIT + len(given['ids']) - 1}",
        },
        "config": OBD_TOML,
        "commands": shown,
        "streambandit": sb,
        "streambandit_bootstrap": boot,
        "obp": obp,
    }


def _interval(e: dict | None) -> str:
    if e is None:
        return "n/a"
    if e.get("ci_low") is None or e.get("ci_high") is None:
        return "none"
    return f"[{e['ci_low']:.4f}, {e['ci_high']:.4f}]"


def _value(e: dict | None) -> str:
    return "n/a" if e is None or e.get("value") is None else f"{e['value']:.4f}"


def render(result: dict) -> str:
    sb, boot, obp = result["streambandit"], result["streambandit_bootstrap"], result["obp"]
    first = next(iter(sb.values()))
    lines = [
        "# The Open Bandit Dataset sample: streambandit replay against obp",
        "",
        harness.provenance(
            result,
            f"Data: OBD's `{result['data']['file']}` (sha256 {result['data']['sha256'][:16]}...), "
            f"rows {result['data']['evaluated_rows']} ({first['events']} impressions) evaluated; "
            f"obp {obp['obp'] if obp else '(not run)'}.",
        ),
        "",
        "Targets: `frozen` is oful trained on rows 0..4999 and then frozen (a deterministic "
        "ranking per slot); `uniform` is the same configuration with epsilon 1 (the logging "
        "policy itself: its value is the log's click rate); `bts` is external, the BTS campaign's "
        "share of each item per slot. streambandit's intervals: its default (`wilson` or `score` "
        f"for 0/1 clicks) and `--bootstrap {BOOTSTRAP}`; obp's: `estimate_interval` "
        "(1,000 bootstrap samples, 95%). obp's `dr` uses obp's reward model (logistic regression, "
        "3-fold cross fitting); `dr, our rewards` gives obp streambandit's reward predictions.",
        "",
        "| target | kind | matched | estimator | streambandit | interval (kind) | bootstrap interval "
        "| obp | obp interval |",
        "|---|---|---:|---|---:|---|---|---:|---|",
    ]
    for name in TARGETS:
        t = sb[name]
        ours = obp["targets"][name] if obp else {}
        for est in ESTIMATORS:
            e = t[est]
            lines.append(
                f"| {name} | {t['kind']} | {t['matched']} | {est} | {_value(e)} | "
                f"{_interval(e)} ({e['interval']}) | {_interval(boot[name][est])} | "
                f"{_value(ours.get(est))} | {_interval(ours.get(est))} |"
            )
        if obp:
            e = ours["dr_our_rewards"]
            lines.append(
                f"| {name} | {t['kind']} | {t['matched']} | dr, our rewards | | | | "
                f"{_value(e)} | {_interval(e)} |"
            )
    log = first["logging"]
    if obp:
        # ips and snips from the same probabilities, dr from the same reward predictions: obp's
        # arithmetic and ours must agree to rounding.
        diff = max(
            abs(sb[name][est]["value"] - obp["targets"][name][theirs]["value"])
            for name in TARGETS
            for est, theirs in (("ips", "ips"), ("snips", "snips"), ("dr", "dr_our_rewards"))
        )
        lines += [
            "",
            f"Same probabilities and reward predictions, same value: the largest difference between "
            f"streambandit's ips, snips and dr and obp's ips, snips and `dr, our rewards` is {diff:.1e}.",
        ]
    lines += [
        "",
        f"The log's own click rate on these rows (the logging policy's value): {_value(log)} "
        f"{_interval(log)} ({log['interval']}).",
        "",
        "Commands (`$OBD`: the sample's directory; `$WORK`: a scratch directory holding "
        "`obd.toml`, the configuration above with epsilon 0, and `uniform.toml`, the same with "
        "epsilon 1):",
        "",
        "```toml",
        result["config"].format(epsilon="0.0").rstrip(),
        "```",
        "",
        "```sh",
        *result["commands"],
        "```",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(harness.main("obd_vs_obp", __doc__, measure, render, add_arguments))
