"""The replay runner: a replay of the worker's own log with the worker's configuration decides and
learns exactly as live did; against a uniform logging policy it estimates a target's value; and the
``streambandit replay`` command writes its report and reports bad rows as one-line errors."""

from __future__ import annotations

import csv
import heapq
import json
import subprocess
import sys

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.decision import decide
from streambandit.replay.logged import LogError, LoggedDecision
from streambandit.replay.runner import replay

K, D = 5, 4


def models_config(policy="oful", epsilon=0.2, seed=3, match="m-*", **hyper):
    return parse_models_config(
        {
            "models": [
                {
                    "match": match,
                    "policy": policy,
                    "dim": D,
                    "hyper": hyper,
                    "reward_window_ms": 1000,
                    "default_reward": 0.0,
                    "epsilon": epsilon,
                    "seed": seed,
                }
            ]
        }
    )


def worker_log(config, n, keys=("m-a", "m-b"), seed=0, max_delay=30):
    """What the worker would log: each event decided by decide() on the model's current version,
    its update applied some events later (a random delay), the log in update order."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=D)
    models = {k: config.resolve(k).build() for k in keys}
    due: list[tuple[int, int, LoggedDecision]] = []  # (due step, seq, record)
    log, live = [], {}
    seq = 0

    def close(until):
        while due and due[0][0] <= until:
            _, _, rec = heapq.heappop(due)
            models[rec.model_key].update(rec.features[rec.action], rec.reward)
            log.append(rec)

    for t in range(n):
        close(t)
        key = keys[int(rng.integers(len(keys)))]
        spec = config.resolve(key)
        feats = rng.normal(size=(K, D))
        eid = f"e{t}"
        d = decide(
            models[key], feats, epsilon=spec.epsilon, model_key=key, event_id=eid, seed=spec.seed
        )
        reward = float(feats[d.index] @ theta + 0.1 * rng.normal())
        rec = LoggedDecision(
            t,
            eid,
            key,
            tuple(f"a{i}" for i in range(K)),
            feats,
            d.index,
            d.propensity,
            reward,
            models[key].n_updates,
        )
        live[eid] = d.index
        heapq.heappush(due, (t + int(rng.integers(1, max_delay)), seq, rec))
        seq += 1
    close(10**9)
    return log, live, {k: m.state_dict() for k, m in models.items()}


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("policy", ["oful", "glb_omd"])
def test_replaying_the_workers_own_log_reproduces_it_bit_for_bit(policy):
    hyper = {"link": "gaussian", "S": 4.0} if policy == "glb_omd" else {}
    config = models_config(policy, **hyper)
    log, live, states = worker_log(config, 1500)
    # Delays really reorder: many records were decided at a version below their update index.
    assert (
        sum(r.decision_version < i for i, r in enumerate(r for r in log if r.model_key == "m-a"))
        > 100
    )
    result = replay(log, config)
    assert result.decisions == live
    assert result.matched == result.events == 1500 and result.off_version == 0
    assert result.models.keys() == states.keys()
    for key in states:
        assert_same_state(result.models[key], states[key])
    # The target is the logging policy: every estimator that uses propensities sees weight 1.
    assert result.estimate("ips").value == pytest.approx(result.logging_value.value)
    assert result.estimate("replay").n == 1500


def test_a_short_lag_makes_decisions_off_version_and_says_so():
    config = models_config()
    log, live, _ = worker_log(config, 400, max_delay=30)
    result = replay(log, config, max_lag=2)
    assert result.off_version > 0
    assert len(result.decisions) == 400
    # Deciding on the wrong version changes decisions: the timing rule is what makes replay exact.
    assert sum(result.decisions[k] != live[k] for k in live) > 0


def test_uniform_logging_and_a_deterministic_target():
    rng = np.random.default_rng(7)
    means = np.array([0.1, 0.2, 0.3, 0.4, 0.9])
    feats = np.ones((K, D))  # every arm has the same features: the target picks arm 0
    n = 20_000
    log = []
    for t in range(n):
        a = int(rng.integers(K))
        r = float(rng.random() < means[a])
        log.append(
            LoggedDecision(t, f"e{t}", "m-x", tuple(map(str, range(K))), feats, a, 1.0 / K, r)
        )
    # oful with identical arms: equal scores, the argmax is arm 0 whatever it learns; epsilon 0.
    result = replay(log, models_config(epsilon=0.0))
    assert set(result.decisions.values()) == {0}
    assert abs(result.matched - n / K) < 4 * np.sqrt(n * (1 / K) * (1 - 1 / K))
    for name in ("replay", "ips", "snips", "dr"):
        e = result.estimate(name)
        assert e.ci_low <= means[0] + 0.02 and e.ci_high >= means[0] - 0.02, e
        assert abs(e.value - means[0]) < 0.05, e
    assert abs(result.logging_value.value - means.mean()) < 0.02


def test_external_log_learns_only_from_matched_events():
    rng = np.random.default_rng(1)
    log = [
        LoggedDecision(
            t,
            f"e{t}",
            "m-x",
            tuple(map(str, range(K))),
            rng.normal(size=(K, D)),
            int(rng.integers(K)),
            1.0 / K,
            float(rng.normal()),
        )
        for t in range(500)
    ]
    result = replay(log, models_config(epsilon=0.1))
    assert result.models["m-x"]["n_updates"] == result.matched
    assert 0 < result.matched < 500
    assert sum(result.decisions[d.event_id] == d.action for d in log) == result.matched


def test_unknown_model_key_names_the_event():
    d = LoggedDecision(0, "ev-17", "other", ("a",), np.zeros((1, D)), 0, 1.0, 0.0)
    with pytest.raises(LogError, match="ev-17.*'other'"):
        replay([d], models_config())


def test_progress_is_reported():
    rng = np.random.default_rng(2)
    log = [
        LoggedDecision(t, f"e{t}", "m-x", ("a", "b"), rng.normal(size=(2, D)), 0, 0.5, 0.0)
        for t in range(2500)
    ]
    seen = []
    replay(log, models_config(), progress=seen.append)
    assert seen == [1000, 2000, 2500]


# -- the command line ---------------------------------------------------------------------------

CONFIG = """
[kafka]
"bootstrap.servers" = "localhost:9092"

[[models]]
match = "m-*"
policy = "oful"
dim = 4
reward_window_ms = 1000
default_reward = 0.0
epsilon = 0.1
"""


def write_csv(path, rows):
    """A CSV log as streambandit/replay/files.py reads it: arm ids and inline features separated by
    '|', the action as an arm id."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
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
        for d in rows:
            w.writerow(
                [
                    d.timestamp_ms,
                    d.event_id,
                    d.model_key,
                    "|".join(d.arm_ids),
                    d.arm_ids[d.action],
                    d.propensity,
                    d.reward,
                    "|".join(" ".join(repr(float(v)) for v in row) for row in d.features),
                ]
            )


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "streambandit", "replay", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def small_log(tmp_path):
    rng = np.random.default_rng(5)
    rows = [
        LoggedDecision(
            1000 + t,
            f"e{t}",
            "m-a",
            tuple(f"a{i}" for i in range(K)),
            np.round(rng.normal(size=(K, D)), 3),
            int(rng.integers(K)),
            1.0 / K,
            float(rng.random() < 0.3),
        )
        for t in range(300)
    ]
    cfg = tmp_path / "worker.toml"
    cfg.write_text(CONFIG)
    return rows, cfg


def test_cli_writes_the_report(tmp_path, small_log):
    rows, cfg = small_log
    log = tmp_path / "log.csv"
    write_csv(log, rows)
    out = run_cli(log, "--config", cfg, "--out", tmp_path / "rep", "--clip", "20")
    assert out.returncode == 0, out.stderr
    rep = tmp_path / "rep"
    data = json.loads((rep / "replay.json").read_text())
    (target,) = data["targets"]
    assert (target["name"], target["kind"]) == ("worker", "learning")  # named by the file's stem
    names = [e["name"] for e in target["estimates"]]
    assert names == ["replay", "ips", "snips", "dm", "dr"]
    for e in target["estimates"]:
        assert {"value", "ci_low", "ci_high", "n", "ess", "clipped"} <= e.keys()
    assert data["events"] == 300 and 0 < target["matched"] < 300 and data["skipped"] == 0
    assert "value" in target["logging"]
    md = (rep / "replay.md").read_text()
    assert "| dr " in md or "| dr |" in md
    assert "dr" in out.stdout and "ips" in out.stdout
    if (rep / "replay.png").exists():
        assert (rep / "replay.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bad_row_is_a_one_line_error(tmp_path, small_log):
    rows, cfg = small_log
    log = tmp_path / "bad.csv"
    write_csv(log, rows[:20])
    lines = log.read_text().splitlines()
    # Row 8 (the 8th data row, line 9 of the file): propensity 0.
    fields = next(csv.reader([lines[8]]))
    header = next(csv.reader([lines[0]]))
    fields[header.index("propensity")] = "0"
    import io

    buf = io.StringIO()
    csv.writer(buf).writerow(fields)
    lines[8] = buf.getvalue().rstrip("\r\n")
    log.write_text("\n".join(lines) + "\n")
    out = run_cli(log, "--config", cfg, "--out", tmp_path / "rep")
    assert out.returncode == 2, out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr
    assert "propensity" in err[0] and "row 8" in err[0], err[0]
    ok = run_cli(log, "--config", cfg, "--out", tmp_path / "rep2", "--skip-bad")
    assert ok.returncode == 0, ok.stderr
    data = json.loads((tmp_path / "rep2" / "replay.json").read_text())
    assert data["skipped"] == 1 and data["events"] == 19


def test_replay_of_a_learning_target_matches_its_online_value():
    """Li et al. 2011: on a uniform log, the replayed value of a learning policy is its online
    value over the ~n/K events it learns from."""
    theta = np.array([1.0, -0.5, 0.8, 0.3])

    def context(rng):
        return rng.normal(size=(K, D)) * 0.5

    def online(seed, steps):
        rng = np.random.default_rng(seed)
        policy = models_config(epsilon=0.0).resolve("m-x").build()
        total = 0.0
        for _ in range(steps):
            x = context(rng)
            i = policy.select(x)
            total += float(x[i] @ theta)
            policy.update(x[i], float(x[i] @ theta + 0.5 * rng.normal()))
        return total / steps

    rng = np.random.default_rng(11)
    n = 15_000
    log = []
    for t in range(n):
        x = context(rng)
        a = int(rng.integers(K))
        log.append(
            LoggedDecision(
                t,
                f"e{t}",
                "m-x",
                tuple(map(str, range(K))),
                x,
                a,
                1.0 / K,
                float(x[a] @ theta + 0.5 * rng.normal()),
            )
        )
    result = replay(log, models_config(epsilon=0.0))
    simulated = np.mean([online(s, result.matched) for s in range(5)])
    uniform = 0.0  # E[x] = 0: a random arm's expected reward
    assert simulated > uniform + 0.3  # the target really learns: the comparison is not trivial
    for name in ("replay", "ips", "snips", "dr"):
        e = result.estimate(name)
        assert abs(e.value - simulated) < 0.08, (name, e.value, simulated)
        assert e.ci_low - 0.03 <= simulated <= e.ci_high + 0.03, (name, e, simulated)


def test_cli_reads_avro(tmp_path, small_log):
    from streambandit.replay.files import write_avro

    rows, cfg = small_log
    log = tmp_path / "log.avro"
    write_avro(log, rows)
    out = run_cli(log, "--config", cfg, "--out", tmp_path / "rep")
    assert out.returncode == 0, out.stderr
    assert json.loads((tmp_path / "rep" / "replay.json").read_text())["events"] == 300
    bad = run_cli(tmp_path / "log.txt", "--config", cfg)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
