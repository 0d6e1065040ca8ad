"""The commands a new user runs first, as subprocesses: `streambandit demo` (the README's first
command) and `streambandit broker`."""

import csv
import os
import signal
import socket
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

pytestmark = pytest.mark.integration

ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


# The demo starts its own embedded broker: that is the command under test (the worker's Kafka
# behaviour is the other tests', on both brokers).
@pytest.mark.brokers("tansu")
@pytest.mark.parametrize("edge", [False, True], ids=["kafka", "edge"])
def test_demo_runs_learns_and_writes_its_figures(tmp_path, edge):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "streambandit",
            "demo",
            "--duration",
            "15",
            "--rate",
            "300",
            "--out",
            str(tmp_path),
            *(["--edge"] if edge else []),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert any(line.startswith("time/s") for line in lines)
    summary = next(line for line in lines if line.startswith("answered "))
    answered, requests = (int(w) for w in summary.split()[1:4:2])
    assert answered >= 0.9 * requests > 0  # nearly every request answered within the run
    with open(tmp_path / "demo.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) >= 10
    last = rows[-1]
    # A short run still learns: its last seconds choose better ads than random choice does.
    assert float(last["ctr_learner"]) > float(last["ctr_random"])
    assert (
        float(last["latency_p50_ms"]) > 0 and int(last["snapshots"]) > 0 and int(last["joined"]) > 0
    )
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert "Traceback" not in out.stderr
    if (
        edge
    ):  # decided in process, a thousandth of the Kafka round trip the same requests' actions took
        assert 0 < float(last["edge_p50_us"]) / 1e3 < float(last["latency_p50_ms"])
    else:
        assert last["edge_p50_us"] == "nan"


# `streambandit broker` without --kafka runs the embedded broker (with --kafka:
# tests/integration/test_apache_kafka.py).
@pytest.mark.brokers("tansu")
def test_broker_command_serves_until_interrupted():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streambandit", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        line = proc.stdout.readline()
        assert f"bootstrap.servers=127.0.0.1:{port}" in line, (
            line,
            proc.stderr.read() if proc.poll() else "",
        )
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}"}).list_topics(timeout=10)
        assert metadata.brokers  # a Kafka client talks to it
    finally:
        proc.send_signal(signal.SIGINT)
        try:  # communicate, not wait: the pipes are drained, so a chatty exit cannot block on them
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            pytest.fail(
                f"the broker command did not exit within 30 s of SIGINT; its stderr:\n{err[-3000:]}"
            )
    assert proc.returncode == 0, err[-3000:]
    with socket.socket() as s:  # the broker process is gone: nothing listens on the port any more
        assert s.connect_ex(("127.0.0.1", port)) != 0
