"""The expected-value interval of a learning target (replay/paths.py): the bootstrap replicates of
the log, checked against a brute-force count of their copies, and the interval against its closed
form."""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest
from scipy.stats import t as student_t

from streambandit.config.models import parse_models_config
from streambandit.replay.estimators import Estimate
from streambandit.replay.logged import LoggedDecision
from streambandit.replay.paths import (
    expected_values,
    interval_from_replicates,
    replicate_estimates,
    resample,
)
from streambandit.replay.runner import Target, replay_targets

from . import test_replay_runner
from .test_replay_runner import run_cli, write_csv

small_log = test_replay_runner.small_log  # a fixture: a 300-row log and a learning configuration

K, D = 4, 3


def config(epsilon=0.0):
    return parse_models_config(
        {
            "models": [
                {
                    "match": "k-*",
                    "policy": "oful",
                    "dim": D,
                    "hyper": {},
                    "reward_window_ms": 1000,
                    "default_reward": 0.0,
                    "epsilon": epsilon,
                }
            ]
        }
    )


def log(n, seed=0, same_arms=False, versions=False, slates=False):
    rng = np.random.default_rng(seed)
    seen: dict[str, int] = {}
    out = []
    for t in range(n):
        key = "k-a" if t % 3 else "k-b"
        x = np.ones((K, D)) if same_arms else rng.normal(size=(K, D))
        v = -1
        if versions:  # decided 0..2 updates of its key before this row's own
            u = seen.get(key, 0)
            v = max(0, u - int(rng.integers(3)))
            seen[key] = u + 1
        out.append(
            LoggedDecision(
                timestamp_ms=t,
                event_id=f"e{t}",
                model_key=key,
                arm_ids=tuple(f"a{i}" for i in range(K)),
                features=x,
                action=int(rng.integers(K)),
                propensity=1 / K,
                reward=float(rng.random() < 0.3),
                decision_version=v,
                position=t % 2 if slates else -1,
                slate_id=f"s{t // 2}" if slates else "",
            )
        )
    return out


def test_a_replicate_copies_each_row_in_place_with_the_first_poisson_draws():
    rows = log(50)
    out = list(resample(rows, np.random.default_rng(7), "r0"))
    copies = np.random.default_rng(7).poisson(1.0, 4096)[:50]
    expected = [(d.event_id, j) for d, c in zip(rows, copies) for j in range(c)]
    assert [(d.event_id.split("~")[0], int(d.event_id.split(".")[-1])) for d in out] == expected
    assert len({d.event_id for d in out}) == len(out) == copies.sum()


def test_a_replicate_moves_decision_versions_to_count_the_copies_before_them():
    rows = log(200, versions=True)
    out = list(resample(rows, np.random.default_rng(3), "r1"))
    by_id = {d.event_id: d for d in rows}
    for d in out:
        original = by_id[d.event_id.split("~")[0]]
        # Brute force: the copies, earlier in the replicate, of the key's rows before version v.
        key_rows = [r.event_id for r in rows if r.model_key == d.model_key]
        first = set(key_rows[: original.decision_version])
        count = sum(1 for e in out if e.event_id.split("~")[0] in first)
        assert d.decision_version == count
    # The runner takes it as a complete log: every decision at its (moved) version.
    (result,) = replay_targets(out, [Target("t", config())]).values()
    assert result.off_version == 0


def test_a_slate_is_copied_whole_under_new_slate_ids():
    rows = log(40, slates=True)
    out = list(resample(rows, np.random.default_rng(5), "r2"))
    slates: dict[str, list[int]] = {}
    for d in out:
        slates.setdefault(d.slate_id, []).append(d.position)
    assert all(p == [0, 1] for p in slates.values())
    assert len(slates) * 2 == len(out)


def test_the_interval_widens_the_path_interval_by_the_spread_between_paths():
    # The path interval [0.12, 0.30] around 0.22 at 90%: s_path = 0.18 / (2 z).
    path = Estimate("snips", 0.22, 0.12, 0.30, 100, 100.0, 0)
    xs = [0.02, 0.42, 0.12, 0.35, math.nan]
    low, high, s_b = interval_from_replicates(path, xs, 0.9)
    z = NormalDist().inv_cdf(0.95)
    between = np.var([0.02, 0.42, 0.12, 0.35], ddof=1) - (0.18 / (2 * z)) ** 2
    widen = student_t.ppf(0.95, 3) ** 2 * between
    assert s_b == pytest.approx(math.sqrt(between))
    assert low == pytest.approx(0.22 - math.sqrt(0.1**2 + widen))
    assert high == pytest.approx(0.22 + math.sqrt(0.08**2 + widen))
    # Replicates that vary less than the path interval says the log does: nothing to add.
    assert interval_from_replicates(path, [0.21, 0.22, 0.23], 0.9) == pytest.approx((0.12, 0.30, 0))
    assert interval_from_replicates(path, [0.1], 0.95)[:2] == (-math.inf, math.inf)


def test_the_replicates_of_a_target_that_always_takes_one_arm_are_bootstrap_means():
    # Every arm has the same features, so the learner's scores tie and it always takes arm 0:
    # its ips on a replicate is K * sum(c r [a == 0]) / sum(c), c the rows' copies.
    rows = log(300, same_arms=True)
    got = replicate_estimates(lambda: rows, [Target("t", config())], replicates=5, seed=11)
    rng = np.random.default_rng(11)
    a = np.array([d.action for d in rows])
    r = np.array([d.reward for d in rows])
    for value in got["t"]["ips"]:
        c = rng.poisson(1.0, 4096)[: len(rows)]
        assert value == pytest.approx(K * np.sum(c * r * (a == 0)) / c.sum())


def test_only_a_learning_target_gets_an_expected_value_interval():
    rows = log(200)
    targets = [
        Target("learns", config(epsilon=0.1)),
        Target("frozen", config(epsilon=0.1), learn=False),
        Target("ext", probs={d.event_id: np.full(K, 1 / K) for d in rows}),
    ]
    results = replay_targets(rows, targets)
    calls = []
    got = expected_values(
        lambda: rows,
        targets,
        results,
        replicates=4,
        progress=lambda done, total: calls.append((done, total)),
    )
    assert list(got) == ["learns"]
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    by_name = {e.name: e for e in got["learns"]}
    assert set(by_name) == {"replay", "ips", "snips", "dr"}
    own = {e.name: e.value for e in results["learns"].estimates}
    for name, e in by_name.items():
        assert e.value == own[name] and e.replicates == 4
        assert e.ci_low < e.value < e.ci_high


def test_fewer_than_two_replicates_are_refused():
    with pytest.raises(ValueError, match="at least 2 replicates"):
        replicate_estimates(lambda: log(5), [Target("t", config())], replicates=1)


def test_the_command_reports_the_expected_value_beside_the_path_interval(tmp_path, small_log):
    rows, cfg = small_log
    log = tmp_path / "log.csv"
    write_csv(log, rows)
    out = run_cli(log, "--config", cfg, "--out", tmp_path / "rep", "--expected-value", "3")
    assert out.returncode == 0, out.stderr
    assert "expected value: replicate 3 of 3 replayed" in out.stderr
    (target,) = json.loads((tmp_path / "rep" / "replay.json").read_text())["targets"]
    own = {e["name"]: e["value"] for e in target["estimates"]}
    expected = {e["name"]: e for e in target["expected_value"]}
    assert set(expected) == {"replay", "ips", "snips", "dr"}
    for name, e in expected.items():
        assert e["value"] == own[name] and e["replicates"] == 3
        assert e["ci_low"] < e["value"] < e["ci_high"] and e["between_paths_sd"] >= 0
    md = (tmp_path / "rep" / "replay.md").read_text()
    assert "Expected value over learning paths (3 replicate replays" in md
    assert "expected-value 95% interval" in out.stdout
    assert run_cli(log, "--config", cfg, "--out", tmp_path / "plain").returncode == 0
    (target,) = json.loads((tmp_path / "plain" / "replay.json").read_text())["targets"]
    assert target["expected_value"] is None
    assert any(
        w.endswith("(--expected-value gives an interval for that)") for w in target["warnings"]
    )


def test_the_command_gives_a_frozen_target_no_expected_value(tmp_path, small_log):
    rows, cfg = small_log
    log = tmp_path / "log.csv"
    write_csv(log, rows)
    out = run_cli(log, "--config", cfg, "--frozen", "--out", tmp_path / "rep", "--expected-value")
    assert out.returncode == 0, out.stderr
    assert "no learning target" in out.stderr
    (target,) = json.loads((tmp_path / "rep" / "replay.json").read_text())["targets"]
    assert target["expected_value"] is None
    bad = run_cli(log, "--config", cfg, "--out", tmp_path / "rep", "--expected-value", "1")
    assert bad.returncode != 0
    assert (
        bad.stderr.strip()
        .splitlines()[-1]
        .endswith("--expected-value needs at least 2 replicates, got 1")
    )
