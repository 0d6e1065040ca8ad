"""The admin commands as an operator runs them, as subprocesses: `status` on a group with one
worker process, `topics create --dry-run`, every command that talks to a broker against an
address nothing answers at, and `broker` on a port in use or losing its broker."""

import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from streambandit.config.app import load_worker_config
from streambandit.config.worker import Topics
from streambandit.stream.group_status import read_group_status
from streambandit.stream.snapshots import DirectoryStore
from streambandit.wire import Context

from .helpers import (
    is_tansu,
    producer,
    send,
    serve_config,
    serve_process,
    stop_processes,
    wait_for,
)

pytestmark = pytest.mark.integration


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "streambandit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_status_shows_each_partitions_owner_lag_and_snapshot(broker, topics, tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        serve_config(
            f"g-status-{uuid.uuid4().hex[:8]}",
            tmp_path / "snaps",
            topics,
            "snapshot_interval_s = 1",
        )
    )
    at = ["--config", cfg, "--bootstrap-servers", broker.bootstrap_servers]
    prod, rng = producer(broker), np.random.default_rng(0)
    for i in range(12):
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", f"m-{i % 4}", 1000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3))),
        )
        prod.flush()  # a batch per record: the embedded broker's end offset is right after each

    before = cli("status", *at, "--json")
    assert before.returncode == 0, before.stderr
    rows = json.loads(before.stdout)["rows"]
    assert len(rows) == 4 and all(r["owner"] is None and r["committed"] is None for r in rows)
    assert all(r["snapshot_offset"] is None and r["models"] is None for r in rows)
    assert sum(r["lag"] for r in rows if r["topic"] == topics.contexts) == 12
    assert sum(r["lag"] for r in rows if r["topic"] == topics.rewards) == 0

    config, _ = load_worker_config(cfg, bootstrap_servers=broker.bootstrap_servers)
    store = DirectoryStore(tmp_path / "snaps")

    def settled():
        s = read_group_status(config, store, "")
        ctx = [r for r in s.rows if r.topic == topics.contexts]
        return all(r.lag == 0 and r.committed and r.snapshot_offset == r.committed for r in ctx)

    proc = serve_process(broker, cfg, "w-status", tmp_path / "w.log")
    try:
        assert wait_for(settled, timeout_s=90), (tmp_path / "w.log").read_text()[-3000:]
        out = cli("status", *at, "--json")
        table = cli("status", *at)
    finally:
        stop_processes(proc)
    assert out.returncode == 0 and table.returncode == 0, out.stderr + table.stderr
    status = json.loads(out.stdout)
    rows = status["rows"]
    assert status["store"] == f"directory {tmp_path / 'snaps'}"
    ctx = [r for r in rows if r["topic"] == topics.contexts]
    assert sum(r["end"] for r in ctx) >= 12 and all(r["lag"] == 0 for r in ctx)
    assert sum(r["models"] for r in ctx) == 4  # m-0 .. m-3, each in its partition's snapshot
    assert all(0 <= r["snapshot_age_s"] < 60 for r in rows)
    assert table.stdout.splitlines()[1].split()[:6] == [
        "topic",
        "partition",
        "owner",
        "committed",
        "end",
        "lag",
    ]
    if is_tansu(broker):
        # The embedded broker describes a group with no members (docs/notes/tansu.md).
        assert all(r["owner"] is None for r in rows)
    else:
        assert status["state"] == "Stable" and status["members"] == 1
        assert all(r["owner"]["client_id"] == "w-status" for r in rows)
        assert table.stdout.count("w-status (") == 4


def test_topics_create_dry_run_says_what_it_would_do_and_creates_nothing(broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        **{n: f"{n}-{tag}" for n in ("contexts", "rewards", "actions", "joined", "dead_letter")}
    )
    broker.create_topics([topics.contexts], partitions=1)  # made by hand: too few partitions
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        serve_config("g-dry", tmp_path / "snaps", topics)
        .replace("[worker]", f'[worker]\nsnapshot_topic = "snaps-{tag}"')
        .replace(f'snapshot_dir = "{tmp_path / "snaps"}"\n', "")
    )
    out = cli(
        "topics",
        "create",
        "--config",
        cfg,
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--partitions",
        2,
        "--dry-run",
    )
    assert out.returncode == 1, out.stderr  # a partition count differs
    lines = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    assert lines[topics.contexts].startswith("exists, differs: 1 partitions (asked 2)")
    assert lines[topics.joined] == (
        "missing, would create: 2 partitions, replication 1, retention.ms=-1"
    )
    assert lines[topics.rewards] == (
        "missing, would create: 2 partitions, replication 1, message.timestamp.type=LogAppendTime"
    )
    assert "cleanup.policy=compact" in lines[f"snaps-{tag}"]
    assert "dry run: nothing created or changed" in out.stdout
    md = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    assert [t for t in md.topics if t.endswith(tag)] == [topics.contexts]
    assert len(md.topics[topics.contexts].partitions) == 1


# No broker: nothing answers at either address, whichever tier runs.
@pytest.mark.parametrize("address", ["127.0.0.1:1", "nosuchhost.invalid:9092"])
def test_every_command_that_talks_to_a_broker_is_one_line_when_none_answers(tmp_path, address):
    cfg, learner = tmp_path / "w.toml", tmp_path / "learner.toml"
    cfg.write_text(serve_config("g", tmp_path / "snaps", Topics(), "broker_wait_s = 1"))
    learner.write_text(
        serve_config("g", tmp_path / "snaps", Topics(), "broker_wait_s = 1\nlearn_only = true")
    )
    at = ["--bootstrap-servers", address]
    commands = {
        "topics create": ["topics", "create", "--config", cfg, *at],
        "topics create --dry-run": ["topics", "create", "--config", cfg, "--dry-run", *at],
        "topics describe": ["topics", "describe", "--config", cfg, *at],
        "status": ["status", "--config", cfg, *at],
        "status --log-format json": ["status", "--config", cfg, "--log-format", "json", *at],
        "topics create --log-format json": [
            "topics",
            "create",
            "--config",
            cfg,
            "--log-format",
            "json",
            *at,
        ],
        "export": ["export", "--config", cfg, "--out", tmp_path / "x.avro", *at],
        "api --replica-of": ["api", "--replica-of", learner, "--port", 0, *at],
        "serve --log-format json": [
            "serve",
            "--config",
            cfg,
            "--processes",
            1,
            "--log-format",
            "json",
            *at,
        ],
    }
    # All at once: each waits its second for a broker, and most of the rest is Python's start.
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "streambandit", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in commands.items()
    }
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        lines = err.splitlines()
        assert proc.returncode == 1 and len(lines) == 1, (name, err)
        if name.endswith("--log-format json"):  # a JSON log line: the level says it is the error
            record = json.loads(lines[0])
            assert record["level"] == "ERROR", name
            line = f"streambandit: error: {record['message']}"
        else:
            line = lines[0]
        assert line.startswith(f"streambandit: error: no Kafka broker answered at {address}"), name
        assert "broker_wait_s" in line and not out, name


# The command under test starts the embedded broker itself.
@pytest.mark.brokers("tansu")
def test_broker_on_a_port_in_use_is_one_line_and_a_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = cli("broker", "--port", port, timeout=60)
    assert out.returncode == 1 and not out.stdout, out.stdout
    assert out.stderr.splitlines() == [
        f"streambandit: error: port {port} on 127.0.0.1 is in use (another broker?): choose another --port"
    ]


@pytest.mark.brokers("tansu")
def test_broker_whose_broker_process_dies_fails_with_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streambandit", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert "listening" in proc.stdout.readline()
        children = open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split()
        assert len(children) == 1
        os.kill(int(children[0]), signal.SIGKILL)  # the broker itself, not the command
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert len(err.splitlines()) == 1 and "the broker stopped by itself with exit code -9" in err
