"""Real-shaped logs end to end through the documented import paths (the ``streambandit replay`` and
``tune`` commands): an Open-Bandit-Dataset-shaped campaign with positions and user features
evaluated with a frozen and an external target, a DSJSON log evaluated with a target, and tune
recovering the better of two settings. Every fixture is made here with a known truth."""

from __future__ import annotations

import csv
import hashlib
import json
import subprocess
import sys
import tomllib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.replay.dsjson import read_dsjson
from streambandit.replay.runner import replay

K, SLOTS, USER_FEATURES = 6, 3, 2
ITEM_QUALITY = np.array([1.2, 0.6, 0.0, -0.4, -0.8, -1.2])  # the click logit of each item
EXAMINATION = np.array([1.0, 0.7, 0.5])  # P(a user looks at slot k): the position effect
USER_SHIFT = {"a": 0.5, "b": -0.5}  # user_feature_0's effect on every logit


def cli(*args, timeout=180):
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def ctr(item, user, slot):
    return EXAMINATION[slot] / (1.0 + np.exp(-(ITEM_QUALITY[item] + USER_SHIFT[user])))


def obd_campaign(directory, n_impressions, seed):
    """An OBD campaign directory (obp's layout and columns): a uniformly random logging policy
    filling three slots, clicks from ctr(). Returns the rows (user, slot, item, click, index)."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    hexed = {v: hashlib.md5(v.encode()).hexdigest() for v in ("a", "b", "x", "y", "z")}
    with open(directory / "item_context.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["", "item_id", "item_feature_0", "item_feature_1"])
        for i in range(K):
            w.writerow([i, i, repr(float(ITEM_QUALITY[i])), hexed["xyz"[i % 3]]])
    rows = []
    epoch = datetime(2019, 11, 24, tzinfo=UTC)
    with open(directory / f"{directory.name}.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "",
                "timestamp",
                "item_id",
                "position",
                "click",
                "propensity_score",
                *[f"user_feature_{j}" for j in range(USER_FEATURES)],
                *[f"user-item_affinity_{i}" for i in range(K)],
            ]
        )
        for m in range(n_impressions):
            user = "ab"[int(rng.integers(2))]
            stamp = str(epoch + timedelta(seconds=m))
            for slot, item in enumerate(rng.permutation(K)[:SLOTS]):
                click = int(rng.random() < ctr(item, user, slot))
                index = len(rows)
                w.writerow(
                    [
                        index,
                        stamp,
                        item,
                        slot + 1,
                        click,
                        repr(1.0 / K),
                        hexed[user],
                        hexed["z"],
                        *["0.0"] * K,
                    ]
                )
                rows.append((user, slot, int(item), click, str(index)))
    return rows


MODELS = """
[[models]]
match = "obd"
policy = "oful"
dim = {dim}
reward_window_ms = 1000
default_reward = 0.0
epsilon = 0.0
"""


def test_an_obd_shaped_campaign_with_a_frozen_and_an_external_target(tmp_path):
    # Items: item_feature_0 (a number) and item_feature_1 one-hot over 3 values = 4 features;
    # users hashed into 4; outer: (4 + 1) * 4 = 20.
    config = tmp_path / "obd.toml"
    config.write_text(MODELS.format(dim=20))
    train, test = tmp_path / "random" / "train", tmp_path / "random" / "test"
    obd_campaign(train, 600, seed=1)
    rows = obd_campaign(test, 900, seed=2)
    state = tmp_path / "models.avro"
    cli(
        "replay",
        train,
        "--config",
        config,
        "--user-dim",
        "4",
        "--save-state",
        state,
        "--out",
        tmp_path / "r1",
    )

    # The external target ("bts", as OBD's Bernoulli TS would be given): per slot, a fixed
    # distribution over the items, from a side file keyed by the row's index.
    policy = np.exp(2.0 * ITEM_QUALITY) / np.exp(2.0 * ITEM_QUALITY).sum()
    probs = tmp_path / "bts.csv"
    with open(probs, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["event_id", "probs"])
        for *_, index in rows:
            w.writerow([index, "|".join(repr(float(p)) for p in policy)])
    cli(
        "replay",
        test,
        "--config",
        f"frozen={config}",
        "--frozen",
        "--state",
        state,
        "--external",
        f"bts={probs}",
        "--user-dim",
        "4",
        "--out",
        tmp_path / "r2",
    )
    report = json.loads((tmp_path / "r2" / "replay.json").read_text())
    frozen, bts = report["targets"]
    assert (frozen["name"], frozen["kind"], bts["name"], bts["kind"]) == (
        "frozen",
        "frozen",
        "bts",
        "external",
    )
    assert report["events"] == len(rows) == 2700

    # The frozen target did not learn: its models are the saved ones.
    saved = json.loads((tmp_path / "r1" / "replay.json").read_text())["targets"][0]["models"]
    assert frozen["models"]["obd"]["n_updates"] == saved["obd"]["n_updates"] > 0

    # bts's ips is the per-slot IPS computed by hand, and its interval covers the truth: the
    # expected clicks per slot of that policy on these users and slots.
    est = {e["name"]: e for e in bts["estimates"]}
    by_hand = np.mean([policy[item] / (1.0 / K) * click for _, _, item, click, _ in rows])
    assert est["ips"]["value"] == pytest.approx(by_hand, rel=1e-9)
    truth = np.mean(
        [sum(policy[a] * ctr(a, user, slot) for a in range(K)) for user, slot, *_ in rows]
    )
    for name in ("ips", "snips", "dr"):
        assert est[name]["ci_low"] <= truth <= est[name]["ci_high"], (name, est[name], truth)
    # The report compares the two targets.
    md = (tmp_path / "r2" / "replay.md").read_text()
    assert "| frozen | frozen |" in md and "| bts | external |" in md


def dsjson_line(event_id, ts, user, actions, chosen, p, cost):
    return json.dumps(
        {
            "_label_cost": cost,
            "_label_probability": p,
            "_label_Action": chosen + 1,
            "_labelIndex": chosen,
            "o": [{"v": -cost, "EventId": event_id, "ActionTaken": False}],
            "Timestamp": ts,
            "Version": "1",
            "EventId": event_id,
            "a": [chosen + 1] + [i + 1 for i in range(len(actions)) if i != chosen],
            "c": {
                "User": {"segment": user, "tenure": 0.5},
                "_multi": [{"Action": {"id": a, "price": 1.0}} for a in actions],
            },
            "p": [p] * len(actions),
            "VWState": {"m": "0/0"},
        }
    )


def test_a_dsjson_log_is_evaluated_with_a_target(tmp_path):
    rng = np.random.default_rng(4)
    actions = ["news", "sports", "music"]
    best = {"young": 1, "old": 0}  # each segment's better action
    lines, rewards = [], []
    for t in range(1500):
        user = ["young", "old"][int(rng.integers(2))]
        chosen = int(rng.integers(3))
        reward = float(rng.random() < (0.7 if chosen == best[user] else 0.2))
        rewards.append(reward)
        stamp = f"2024-01-01T00:{t // 60 % 60:02d}:{t % 60:02d}.0000000Z"
        lines.append(dsjson_line(f"ev{t}", stamp, user, actions, chosen, 1 / 3, -reward))
    log = tmp_path / "personalizer.json"
    log.write_text("\n".join(lines) + "\n")
    config = tmp_path / "cb.toml"
    config.write_text(MODELS.format(dim=64).replace('"obd"', '"dsjson"'))

    cli("replay", log, "--config", config, "--out", tmp_path / "rep")
    report = json.loads((tmp_path / "rep" / "replay.json").read_text())
    target = report["targets"][0]
    est = {e["name"]: e for e in target["estimates"]}
    assert report["events"] == 1500 and target["logging"]["value"] == pytest.approx(
        np.mean(rewards)
    )

    # ips by hand from the target's own choices (epsilon 0: it puts probability 1 on its choice).
    decisions = list(read_dsjson(log, dim=64))
    result = replay(decisions, parse_models_config(tomllib.loads(config.read_text())))
    by_hand = np.mean(
        [(result.decisions[d.event_id] == d.action) * 3.0 * d.reward for d in decisions]
    )
    assert est["ips"]["value"] == pytest.approx(by_hand, rel=1e-9)
    # With the segment crossed with the actions the target learns the better action per segment.
    assert est["snips"]["ci_low"] > target["logging"]["value"]


def uniform_log_csv(path, n, seed):
    """Contexts of K arms, a uniform logging policy, 0/1 rewards from a logistic model."""
    rng = np.random.default_rng(seed)
    theta = np.array([1.5, -1.0, 0.5, 1.0])
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(
            [
                "timestamp_ms",
                "event_id",
                "model_key",
                "arm_ids",
                "action",
                "propensity",
                "reward",
                "features",
            ]
        )
        for t in range(n):
            x = rng.normal(size=(K, 4))
            a = int(rng.integers(K))
            r = int(rng.random() < 1 / (1 + np.exp(-x[a] @ theta)))
            w.writerow(
                [
                    t,
                    f"e{t}",
                    "m",
                    "|".join(f"a{i}" for i in range(K)),
                    f"a{a}",
                    1 / K,
                    r,
                    "|".join(" ".join(repr(float(v)) for v in row) for row in x),
                ]
            )
    return theta


TUNE_BASE = """
[[models]]
match = "m"
policy = "oful"
dim = 4
reward_window_ms = 1000
default_reward = 0.0
"""


def test_tune_recovers_the_better_of_two_settings(tmp_path):
    log = tmp_path / "log.csv"
    theta = uniform_log_csv(log, 3000, seed=9)
    base = tmp_path / "base.toml"
    base.write_text(TUNE_BASE)
    # epsilon 0 learns and exploits; epsilon 1 is uniformly random: its true value is the
    # uniform policy's, and the learner's (simulated online below) is clearly higher.
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(4000, K, 4))
    p = 1 / (1 + np.exp(-xs @ theta))
    uniform_truth = p.mean()
    assert p.max(axis=1).mean() > uniform_truth + 0.2  # what a learner can reach: clearly apart

    cli("tune", log, "--config", base, "--grid", "epsilon=1.0,0.0", "--out", tmp_path / "t")
    result = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert result["best"] == "epsilon=0.0" and result["separated"]
    worst = result["candidates"][1]
    assert (
        worst["candidate"] == "epsilon=1.0" and worst["ci_low"] <= uniform_truth <= worst["ci_high"]
    )
    recommended = parse_models_config(
        tomllib.loads((tmp_path / "t" / "recommended.toml").read_text())
    )
    assert recommended.specs[0].epsilon == 0.0 and recommended.specs[0].policy == "oful"


def test_tune_says_when_the_log_cannot_separate_the_candidates(tmp_path):
    log = tmp_path / "log.csv"
    uniform_log_csv(log, 300, seed=3)
    base = tmp_path / "base.toml"
    base.write_text(TUNE_BASE)
    out = cli("tune", log, "--config", base, "--grid", "lam=1.0,1.01", "--out", tmp_path / "t")
    result = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert not result["separated"] and result["tied_with_best"]
    assert "cannot separate" in out.stdout
    assert "cannot separate" in (tmp_path / "t" / "recommended.toml").read_text()


def test_a_bad_grid_is_one_line_naming_the_candidate(tmp_path):
    log = tmp_path / "log.csv"
    uniform_log_csv(log, 10, seed=3)
    base = tmp_path / "base.toml"
    base.write_text(TUNE_BASE)
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", "tune", log, "--config", base, "--grid", "lam=-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        out.returncode == 2
        and "candidate lam=-1" in out.stderr
        and len(out.stderr.strip().splitlines()) == 1
    )


def test_a_dsjson_log_with_external_targets_only_needs_no_hash_dim(tmp_path):
    rng = np.random.default_rng(6)
    actions = ["news", "sports", "music"]
    lines, side = [], ["event_id,probs"]
    for t in range(300):
        chosen = int(rng.integers(3))
        reward = float(rng.random() < 0.2 + 0.2 * chosen)
        stamp = f"2024-01-01T00:{t // 60 % 60:02d}:{t % 60:02d}.0000000Z"
        lines.append(dsjson_line(f"ev{t}", stamp, "young", actions, chosen, 1 / 3, -reward))
        side.append(f"ev{t},0|0|1")  # always music
    log = tmp_path / "personalizer.json"
    log.write_text("\n".join(lines) + "\n")
    (tmp_path / "music.csv").write_text("\n".join(side) + "\n")

    cli("replay", log, "--external", f"music={tmp_path / 'music.csv'}", "--out", tmp_path / "r")
    target = json.loads((tmp_path / "r" / "replay.json").read_text())["targets"][0]
    est = {e["name"]: e for e in target["estimates"]}
    decisions = list(read_dsjson(log, dim=32))
    by_hand = np.mean([(d.action == 2) * 3.0 * d.reward for d in decisions])
    assert target["kind"] == "external" and est["ips"]["value"] == pytest.approx(by_hand)

    # A configured target reads the features: without a dimension it is still refused.
    config = tmp_path / "two.toml"
    config.write_text(
        MODELS.format(dim=64).replace('"obd"', '"dsjson"')
        + MODELS.format(dim=32).replace('"obd"', '"other"')
    )
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", "replay", str(log), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "a DSJSON log needs --hash-dim" in out.stderr and "Traceback" not in out.stderr


def test_tune_holdout_replays_the_best_on_the_rows_it_was_not_chosen_on(tmp_path):
    from streambandit.replay import tune
    from streambandit.replay.files import read_csv
    from streambandit.replay.runner import replay_targets

    log = tmp_path / "log.csv"
    uniform_log_csv(log, 1000, seed=5)
    base = tmp_path / "base.toml"
    base.write_text(TUNE_BASE)
    grid = ["lam=0.5,4", "beta_scale=0.1,1"]
    args = [a for g in grid for a in ("--grid", g)]
    out = cli("tune", log, "--config", base, *args, "--holdout", "0.3", "--out", tmp_path / "t")
    result = json.loads((tmp_path / "t" / "tune.json").read_text())
    held = result["holdout"]
    assert (held["ranked_rows"], held["events"]) == (700, 300)

    # The oracle, in process: rank on rows 0..699, replay the best from its models on 700..999.
    cands = tune.candidates(parse_models_config(tomllib.loads(TUNE_BASE)), tune.parse_grid(grid))
    rows = list(read_csv(log))
    ranked = replay_targets(rows[:700], tune.targets(cands))
    ranking = tune.rank(cands, ranked)
    assert result["best"] == ranking.best.name
    target = tune.holdout_target(ranking.best, ranking.order[0][1])
    assert target.states == ranking.order[0][1].models  # continues from what it learned
    again = replay_targets(rows[700:], [target])[target.name].estimate("snips")
    assert (held["value"], held["ci_low"], held["ci_high"]) == pytest.approx(
        (again.value, again.ci_low, again.ci_high), rel=1e-12
    )
    assert "Held out (--holdout 0.3)" in out.stdout and "winner's curse" in out.stdout
    assert "# Held out" in (tmp_path / "t" / "recommended.toml").read_text()
    no_holdout = cli("tune", log, "--config", base, *args, "--out", tmp_path / "u")
    assert json.loads((tmp_path / "u" / "tune.json").read_text())["holdout"] is None
    assert "winner's curse" in no_holdout.stdout


def test_holdout_start_splits_off_the_last_fraction_and_refuses_an_empty_part():
    from streambandit.replay.tune import holdout_start

    assert holdout_start(1000, 0.3) == 700 and holdout_start(10, 0.25) == 8
    for rows, fraction, why in ((10, 0.01, "no row held out"), (1, 0.5, "no row held out")):
        with pytest.raises(ValueError, match=why):
            holdout_start(rows, fraction)
    for bad in (0.0, 1.0, -0.2, True):
        with pytest.raises(ValueError, match="--holdout must be a fraction in"):
            holdout_start(100, bad)


def test_the_best_of_many_candidates_is_biased_upward_and_its_holdout_estimate_is_not():
    from streambandit.replay import tune
    from streambandit.replay.logged import LoggedDecision
    from streambandit.replay.runner import replay_targets

    # Rewards do not depend on the arm: every candidate's true value is 0.3, and any spread
    # between their estimates is noise, which the choice of the highest picks up.
    base = parse_models_config(tomllib.loads(TUNE_BASE))
    cands = tune.candidates(base, tune.parse_grid(["lam=0.5,1,2,4", "beta_scale=0.1,1"]))
    best, held = [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        log = [
            LoggedDecision(
                t,
                f"e{t}",
                "m",
                tuple(f"a{i}" for i in range(K)),
                rng.normal(size=(K, 4)),
                int(rng.integers(K)),
                1 / K,
                float(rng.random() < 0.3),
            )
            for t in range(500)
        ]
        split = tune.holdout_start(len(log), 0.5)
        ranking = tune.rank(cands, replay_targets(log[:split], tune.targets(cands)))
        best.append(ranking.order[0][1].estimate("snips").value - 0.3)
        target = tune.holdout_target(ranking.best, ranking.order[0][1])
        held.append(
            replay_targets(log[split:], [target])[target.name].estimate("snips").value - 0.3
        )
    # Measured: +0.047 for the best, -0.001 (standard error 0.014) held out.
    assert np.mean(best) > 0.03 and np.mean(best) - np.mean(held) > 0.03
    assert abs(np.mean(held)) < 0.03
