"""What an operator sees of a worker on each broker: the metrics endpoint scraped while it
works (every metric present, the counters moving), readiness false while a partition recovers
and true after, liveness false while the loop is wedged, and an unreachable broker or a
misspelled librdkafka key as one error line and a non-zero exit within a bound, and with
``--log-format json`` nothing but JSON lines on stderr."""

import json
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker
from streambandit.wire import Context, Reward

from .faults import make_topics
from .helpers import get, producer, scrape, send, topics_toml, wait_for

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {"match": "m-*", "policy": "oful", "dim": 3, "reward_window_ms": 500, "default_reward": 0.0}
    ]
}

# Every metric the issue lists, by its Prometheus family name.
FAMILIES = {
    "streambandit_decisions",
    "streambandit_joined",
    "streambandit_default_rewards",
    "streambandit_dead_letters",
    "streambandit_decision_latency_seconds",
    "streambandit_batch_seconds",
    "streambandit_reward_delay_seconds",
    "streambandit_open_decisions",
    "streambandit_models",
    "streambandit_snapshot_last_write_seconds",
    "streambandit_snapshot_last_bytes",
    "streambandit_snapshot_age_seconds",
    "streambandit_recovery_seconds",
    "streambandit_transactions",
    "streambandit_commit_seconds",
    "streambandit_merge_forced",
    "streambandit_merge_out_of_order",
    "streambandit_consumer_lag",
    "streambandit_assigned_partitions",
    "streambandit_rebalances",
    "streambandit_records",
}


def feed(prod, topics, start, n, rng):
    for i in range(start, start + n):
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", f"m-{i % 4}", 1000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3))),
        )
        if i % 2 == 0:
            send(prod, topics.rewards, Reward(f"e{i}", f"m-{i % 4}", 1000 + 10 * i + 20, 1.0))
    send(prod, topics.contexts, None, key=b"m-0", raw=b"not a record")
    prod.flush()


def start(broker, topics, tmp_path, group, store=None, **settings):
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id=group,
        topics=topics,
        metrics_port=0,
        metrics_host="127.0.0.1",
        idle_tick_ms=200,
        merge_wait_ms=500,
        **settings,
    )
    w = Worker(cfg, store or DirectoryStore(tmp_path / "snapshots"))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def test_the_metrics_endpoint_shows_every_metric_and_the_counters_move(broker, topics, tmp_path):
    prod, rng = producer(broker), np.random.default_rng(0)
    feed(prod, topics, 0, 100, rng)
    w, t = start(broker, topics, tmp_path, "g-metrics")
    port = w.telemetry.port
    try:
        assert wait_for(
            lambda: scrape(port)[1].get(("streambandit_decisions_total", ()), 0) >= 100,
            timeout_s=60,
        )
        families, first = scrape(port)
        assert FAMILIES <= families, FAMILIES - families
        assert get(port, "/healthz")[0] == 200 and get(port, "/ready") == (
            200,
            "serving 2 partition(s)\n",
        )
        feed(prod, topics, 100, 100, rng)
        assert wait_for(
            lambda: scrape(port)[1].get(("streambandit_decisions_total", ()), 0) >= 200,
            timeout_s=60,
        )
        assert wait_for(
            lambda: scrape(port)[1].get(("streambandit_joined_total", ()), 0) >= 200, timeout_s=60
        )
        _, second = scrape(port)
    finally:
        w.stop()
        t.join(30)
    moved = [
        "streambandit_decisions_total",
        "streambandit_joined_total",
        "streambandit_records_total",
        "streambandit_decision_latency_seconds_count",
        "streambandit_batch_seconds_count",
        "streambandit_commit_seconds_count",
        "streambandit_reward_delay_seconds_count",
    ]
    for name in moved:
        assert second[(name, ())] > first.get((name, ()), 0), name
    assert (
        second[("streambandit_transactions_total", (("outcome", "commit"),))]
        > first[("streambandit_transactions_total", (("outcome", "commit"),))]
    )
    assert (
        second[("streambandit_dead_letters_total", (("reason", "malformed"),))] == 2
    )  # one per feed
    # Every odd context has no reward; a reward that reached the worker after its window closed (the
    # merge forced past a lagging rewards partition on a loaded machine) is a default reward plus a
    # late_reward dead letter, never lost and never counted twice.
    late = second.get(("streambandit_dead_letters_total", (("reason", "late_reward"),)), 0)
    assert second[("streambandit_default_rewards_total", ())] == 100 + late
    assert second[("streambandit_models", ())] == 4
    assert (
        second[("streambandit_snapshots_total", (("kind", "base"),))] >= 2
    )  # one per partition, after recovery
    assert (
        second[("streambandit_snapshot_last_bytes", ())] > 0
        and second[("streambandit_snapshot_last_write_seconds", ())] > 0
    )
    assert second[("streambandit_assigned_partitions", ())] == 2
    assert second[("streambandit_recovery_seconds_count", ())] == 2
    assert second[("streambandit_rebalances_total", (("kind", "assign"),))] >= 1
    lags = [v for (n, _), v in second.items() if n == "streambandit_consumer_lag"]
    assert len(lags) == 4 and all(v >= 0 for v in lags)
    # A reason no record had is a series at 0 from the first scrape; readiness and the process's
    # own figures are there too.
    for scraped in (first, second):
        assert scraped[("streambandit_dead_letters_total", (("reason", "too_many_models"),))] == 0
    assert second[("streambandit_ready", ())] == 1
    assert second[("process_resident_memory_bytes", ())] > 0


class HeldStore:
    """A directory store whose reads wait for ``release``: a recovery that takes as long as the
    test needs to look at it."""

    def __init__(self, inner):
        self.inner, self.release = inner, threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def scoped(self, group):
        self.inner = self.inner.scoped(group)
        return self

    def candidates(self, partition):
        self.release.wait(60)
        return self.inner.candidates(partition)


def test_ready_is_false_while_partitions_recover_and_true_after(broker, topics, tmp_path):
    store = HeldStore(DirectoryStore(tmp_path / "snapshots"))
    w, t = start(broker, topics, tmp_path, "g-ready", store=store)
    port = w.telemetry.port
    try:
        assert wait_for(lambda: w.recovering, timeout_s=60)
        assert get(port, "/ready") == (503, "recovering partitions\n")
        assert get(port, "/healthz") == (200, "recovering\n")  # alive: recovering is progress
        store.release.set()
        assert wait_for(lambda: get(port, "/ready")[0] == 200, timeout_s=60)
    finally:
        store.release.set()
        w.stop()
        t.join(30)


def test_a_wedged_loop_fails_the_liveness_probe_and_a_moving_one_passes_again(
    broker, topics, tmp_path
):
    w, t = start(broker, topics, tmp_path, "g-wedged", health_timeout_s=2)
    port, unwedge = w.telemetry.port, threading.Event()
    try:
        assert wait_for(lambda: get(port, "/ready")[0] == 200, timeout_s=60)
        step = w.step
        w.step = lambda: (
            unwedge.wait(60),
            step(),
        )  # the loop's next step blocks, as on a hung call
        assert wait_for(lambda: get(port, "/healthz")[0] == 503, timeout_s=30)
        code, body = get(port, "/healthz")
        assert (
            code == 503
            and body.startswith("stuck: no progress for ")
            and "health_timeout_s 2" in body
        )
        unwedge.set()
        assert wait_for(lambda: get(port, "/healthz") == (200, "ok\n"), timeout_s=30)
    finally:
        unwedge.set()
        w.stop()
        t.join(30)


SERVE = [sys.executable, "-m", "streambandit", "serve", "--processes", "1"]


def config_file(tmp_path, topics, bootstrap, kafka="", worker=""):
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        f'[kafka]\n"bootstrap.servers" = "{bootstrap}"\n{kafka}\n[worker]\ngroup_id = "g-x"\n'
        f'snapshot_dir = "{tmp_path / "snaps"}"\n{worker}\n{topics_toml(topics)}\n'
        '[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\nreward_window_ms = 500\ndefault_reward = 0.0\n'
    )
    return cfg


def serve(tmp_path, topics, bootstrap, kafka="", worker="", args=()):
    cfg = config_file(tmp_path, topics, bootstrap, kafka, worker)
    started = time.monotonic()
    out = subprocess.run(
        [*SERVE, "--config", str(cfg), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out, time.monotonic() - started


def error_lines(stderr):
    return [line for line in stderr.splitlines() if "error" in line.lower()]


def test_an_unreachable_broker_is_one_error_line_and_an_exit_within_the_wait(tmp_path, topics):
    out, took = serve(tmp_path, topics, "127.0.0.1:1", worker="broker_wait_s = 3")
    assert out.returncode == 1 and took < 60
    assert len(error_lines(out.stderr)) == 1, out.stderr
    assert "no Kafka broker answered at 127.0.0.1:1" in out.stderr and "broker_wait_s" in out.stderr
    assert (
        "Traceback" not in out.stderr
        and "%3|" not in out.stderr
        and len(out.stderr.splitlines()) <= 2
    )


def test_a_misspelled_librdkafka_key_is_one_error_line_naming_it(broker, tmp_path, topics):
    out, took = serve(tmp_path, topics, broker.bootstrap_servers, kafka='"linger.mss" = 5')
    assert out.returncode == 2 and took < 60
    assert (
        out.stderr.count("\n") == 1 and "linger.mss" in out.stderr and "Traceback" not in out.stderr
    )


def test_with_json_logs_every_stderr_line_is_json_librdkafka_s_and_the_last_error_too(
    own_broker, tmp_path
):
    topics, _ = make_topics(own_broker, partitions=2)
    cfg = config_file(tmp_path, topics, own_broker.bootstrap_servers)
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [*SERVE, "--config", str(cfg), "--log-format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            # The broker goes away under the running worker: librdkafka's lines about it follow,
            # for a few seconds (its exit, a bounded wait for the broker, is not waited for here).
            assert wait_for(lambda: "partition assigned" in stderr.read_text(), timeout_s=60)
            own_broker.stop()
            assert wait_for(lambda: '"streambandit.kafka"' in stderr.read_text(), timeout_s=30)
            time.sleep(2)
        finally:
            proc.kill()
            proc.wait()
    lines = [json.loads(line) for line in stderr.read_text().splitlines()]  # each line parses
    assert any(
        "Connection refused" in d["message"] for d in lines if d["logger"] == "streambandit.kafka"
    )
    # No broker at all: the error the command ends with is a JSON line too, and the only line.
    out, _ = serve(
        tmp_path,
        topics,
        own_broker.bootstrap_servers,
        worker="broker_wait_s = 2",
        args=["--log-format", "json"],
    )
    assert out.returncode == 1
    [last] = [json.loads(line) for line in out.stderr.splitlines()]
    assert last["level"] == "ERROR" and "no Kafka broker answered at" in last["message"]


def test_topics_create_then_serve_starts_with_no_other_setup(broker, tmp_path):
    tag = uuid.uuid4().hex[:8]
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        f'[kafka]\n"bootstrap.servers" = "{broker.bootstrap_servers}"\n[worker]\ngroup_id = "g-{tag}"\n'
        f'snapshot_topic = "snaps-{tag}"\n[topics]\n'
        + "".join(
            f'{k} = "{k}-{tag}"\n'
            for k in ("contexts", "rewards", "actions", "joined", "dead_letter")
        )
        + '[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\nreward_window_ms = 500\ndefault_reward = 0.0\n'
    )

    def cli(*args, timeout=120):
        return subprocess.run(
            [sys.executable, "-m", "streambandit", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    before = cli("topics", "describe", "--config", str(cfg))
    assert before.returncode == 1 and f"contexts-{tag}: missing" in before.stdout
    made = cli("topics", "create", "--config", str(cfg), "--partitions", "2")
    assert made.returncode == 0, made.stderr
    assert (
        made.stdout.count(": created") == 6 and f"snaps-{tag}: created (compacted)" in made.stdout
    )
    again = cli("topics", "create", "--config", str(cfg), "--partitions", "2")
    assert again.returncode == 0 and again.stdout.count(": exists") == 6
    described = cli("topics", "describe", "--config", str(cfg))
    assert described.returncode == 0 and "co-partitioned: yes" in described.stdout
    assert described.stdout.count(": 2 partitions") == 6
    served = cli("serve", "--config", str(cfg), "--processes", "1", "--duration", "15")
    assert served.returncode == 0, served.stderr[-3000:]
    assert "worker started" in served.stderr and "partition assigned" in served.stderr
