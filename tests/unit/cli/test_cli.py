"""The command line runs the in-process simulation and reports bad input as an error, not a trace."""

import subprocess
import sys


def run(*args):
    return subprocess.run(
        [sys.executable, "-m", "streambandit", *args], capture_output=True, text=True, timeout=120
    )


def test_simulate_ads_runs_and_learns_something():
    out = run("simulate-ads", "--requests", "3000", "--seed", "1")
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    requests, learner, best, random = int(last[0]), float(last[2]), float(last[3]), float(last[4])
    assert requests == 3000
    assert random < learner <= best


def test_unknown_policy_is_a_clear_error():
    out = run("simulate-ads", "--policy", "nope", "--requests", "10")
    assert out.returncode == 2
    assert "unknown policy 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_bench_passes_its_options_to_the_benchmark():
    out = run("bench", "--quick", "--only", "oful_play,naive_oful")
    assert out.returncode == 0, out.stderr
    assert "Command: `streambandit bench peers --quick --only oful_play,naive_oful`" in out.stdout
    rows = [
        line
        for line in out.stdout.splitlines()
        if line.startswith("| streambandit oful, play()") or line.startswith("| naive numpy OFUL")
    ]
    assert len(rows) >= 2 and "2,000" in rows[0]


def test_bench_with_a_bad_option_is_a_clear_error():
    out = run("bench", "peers", "--n", "0")
    assert out.returncode == 2
    assert "--n must be >= 1" in out.stderr and "Traceback" not in out.stderr


def test_bench_runs_the_checkout_benchmarks_by_name():
    out = run("bench", "memory", "--help")
    assert out.returncode == 0, out.stderr
    assert "python -m bench.memory" in out.stdout and "--quick" in out.stdout


def test_every_subcommand_and_option_says_what_it_is_for():
    import argparse

    from streambandit.cli.commands import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {
        "serve",
        "topics",
        "broker",
        "demo",
        "replay",
        "export",
        "simulate",
        "simulate-ads",
        "bench",
    } <= set(sub.choices)
    for name, command in sub.choices.items():
        assert command.description, name
        for action in command._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"{name} {action.option_strings or action.dest}"


def test_version():
    from streambandit import __version__

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"streambandit {__version__}"


def test_check_config_validates_and_exits(tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        '[kafka]\n"bootstrap.servers" = "127.0.0.1:1"\n[worker]\nsnapshot_dir = "s"\n'
        '[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\nreward_window_ms = 500\ndefault_reward = 0.0\n'
    )
    out = run("serve", "--config", str(cfg), "--check-config")
    assert out.returncode == 0 and "valid" in out.stdout and "m-* (oful, d=3)" in out.stdout, (
        out.stderr
    )
    cfg.write_text(cfg.read_text() + '[kafka.producer]\n"linger.ms" = "soon"\n')
    out = run("serve", "--config", str(cfg), "--check-config")
    assert out.returncode == 2 and "linger.ms" in out.stderr and out.stderr.count("\n") == 1


def test_a_wrong_type_is_one_line_and_exit_2_at_the_check_and_at_the_start(tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        '[kafka]\n"bootstrap.servers" = "127.0.0.1:1"\n[worker]\nsnapshot_dir = "s"\n'
        'snapshot_interval_s = "30s"\n[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\n'
        "reward_window_ms = 500\ndefault_reward = 0.0\n"
    )
    for check in (["--check-config"], ["--processes", "1", "--duration", "1"]):
        out = run("serve", "--config", str(cfg), *check)
        assert out.returncode == 2 and out.stderr == (
            f"streambandit: error: {cfg}: [worker] snapshot_interval_s must be a number > 0, "
            "got '30s'\n"
        )


def test_print_config_shows_the_settings_in_effect_with_credentials_masked(tmp_path):
    import os
    import tomllib

    cfg = tmp_path / "w.toml"
    cfg.write_text(
        '[kafka]\n"bootstrap.servers" = "127.0.0.1:1"\n"sasl.password" = "in-the-file"\n'
        '[worker]\nsnapshot_dir = "s"\n[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\n'
        "reward_window_ms = 500\ndefault_reward = 0.0\n"
    )
    env = os.environ | {
        "STREAMBANDIT_WORKER__MERGE_WAIT_MS": "7",
        "STREAMBANDIT_KAFKA__PRODUCER__SSL_KEY_PASSWORD": "from-a-secret",
    }
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", "serve", "--config", str(cfg), "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "in-the-file" not in out.stdout and "from-a-secret" not in out.stdout
    printed = tomllib.loads(out.stdout)
    assert printed["kafka"]["producer"]["ssl.key.password"] == "********"
    assert printed["worker"]["merge_wait_ms"] == 7 and printed["worker"]["idle_tick_ms"] == 1000
    assert printed["topics"]["dead_letter"] == "dead-letter" and printed["models"][0]["dim"] == 3


def test_api_bounds_its_own_models_and_leaves_a_replicas_to_the_learners(monkeypatch):
    import streambandit.serving.api
    from streambandit.cli import commands as cli

    seen = {}
    monkeypatch.setattr(streambandit.serving.api, "serve_api", lambda models, **kw: seen.update(kw))
    assert cli.main(["api", "--models", "m.toml"]) == 0
    assert "max_models" not in seen  # serve_api's own default, 10,000: clients name the keys
    assert (
        cli.main(["api", "--models", "m.toml", "--max-models", "7"]) == 0
        and seen["max_models"] == 7
    )
    args = cli.build_parser().parse_args(["api", "--replica-of", "learner.toml"])
    assert (
        args.max_models is None
    )  # a replica holds the learners' models, bounded by their max_models


def test_api_without_keys_listens_only_on_loopback_unless_insecure(monkeypatch, capsys, tmp_path):
    import streambandit.serving.api
    from streambandit.cli import commands as cli

    seen = []
    monkeypatch.setattr(streambandit.serving.api, "serve_api", lambda models, **kw: seen.append(kw))
    # The command's log handler would write to this test's captured stderr after it ends.
    monkeypatch.setattr("streambandit.log_format.configure_logging", lambda *a, **kw: None)
    monkeypatch.delenv("STREAMBANDIT_API_KEYS", raising=False)
    monkeypatch.delenv("STREAMBANDIT_API_KEYS_FILE", raising=False)
    for host in ("0.0.0.0", "::", "192.168.1.20"):
        assert cli.main(["api", "--models", "m.toml", "--host", host]) == 2
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith(f"streambandit: error: --host {host}: not a loopback address")
    assert seen == []
    assert cli.main(["api", "--models", "m.toml", "--host", "0.0.0.0", "--insecure"]) == 0
    assert cli.main(["api", "--models", "m.toml"]) == 0  # 127.0.0.1
    assert [kw["gate"] for kw in seen] == [None, None]
    # With keys, any address; from the option, the file's variable or inline.
    keys = tmp_path / "keys"
    keys.write_text("app rank,reward " + "k" * 24 + "\n")
    assert (
        cli.main(["api", "--models", "m.toml", "--host", "0.0.0.0", "--api-keys", str(keys)]) == 0
    )
    monkeypatch.setenv("STREAMBANDIT_API_KEYS", "prom metrics " + "p" * 24)
    assert cli.main(["api", "--models", "m.toml", "--host", "::", "--rate-limit", "5"]) == 0
    gate = seen[-1]["gate"]
    assert [k.name for k in seen[-2]["gate"].keys] == ["app"] and gate.keys[0].name == "prom"
    assert (gate.rate_per_s, gate.burst, sorted(gate.open_paths)) == (5, 2000, ["healthz", "ready"])
    # A bad key file: one line per bad entry, no secret, exit 2.
    keys.write_text("app rank,nope " + "s" * 24 + "\n")
    monkeypatch.delenv("STREAMBANDIT_API_KEYS")
    assert cli.main(["api", "--models", "m.toml", "--api-keys", str(keys)]) == 2
    err = capsys.readouterr().err
    assert f"{keys}:1: unknown scope 'nope'" in err and "s" * 24 not in err
    # Budgets and open paths without keys are a mistake, not a silent no-op.
    assert cli.main(["api", "--models", "m.toml", "--open-paths", "metrics"]) == 2
    assert "--open-paths applies to API keys" in capsys.readouterr().err


def test_api_with_json_logs_writes_only_json_lines_on_stderr(tmp_path):
    import json
    import signal
    import time

    models = tmp_path / "models.toml"
    models.write_text(
        '[[models]]\nmatch = "ads"\npolicy = "oful"\ndim = 3\nreward_window_ms = 1000\n'
        "default_reward = 0.0\n"
    )
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streambandit", "api", "--models", str(models), "--port", "0"]
            + ["--log-format", "json", "--snapshot", str(tmp_path / "api.snap")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        deadline = time.monotonic() + 60
        while "api: serving" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    lines = [json.loads(line) for line in err.read_text().splitlines()]  # each line parses
    assert [d["message"].split(" ")[1] for d in lines] == ["serving", "state", "stopped"], lines
    # The error a command ends with is a JSON line too.
    out = run("api", "--log-format", "json")
    assert out.returncode == 2
    [line] = [json.loads(line) for line in out.stderr.splitlines()]
    assert line["level"] == "ERROR" and "give --models" in line["message"]


def test_replay_progress_shows_a_bar_with_the_share_done_and_the_time_left():
    from streambandit.cli.commands import _progress_line, _rows_wanted

    line = _progress_line("replay", 50_000, 2.0, 0.25)
    assert line == (
        "replay: [#######.......................]  25% 50000 events, 25000 events/s, 6 s left"
    )
    assert _progress_line("replay", 10, 2.0, None) == "replay: 10 events, 5 events/s"
    assert _rows_wanted(":5000") == 5000 and _rows_wanted("100:300") == 200
    assert _rows_wanted("5000:") is None and _rows_wanted(None) is None
