"""The operator's view without a broker: histogram buckets against a brute-force count, the
Prometheus text a Status renders to (read back with prometheus_client's own parser), the
filter that holds back librdkafka's repeated lines, and the configuration checked up front."""

import dataclasses
import logging

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streambandit import reasons
from streambandit.config.app import parse_worker_config
from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.log_format import RepeatFilter
from streambandit.stream.kafka_checks import check_client_settings
from streambandit.stream.telemetry import BUCKETS, Histogram, Status, render_metrics

MODELS = {
    "models": [
        {
            "match": "m-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 1000,
            "default_reward": 0.0,
        }
    ]
}


def test_histogram_buckets_are_the_brute_force_cumulative_counts():
    rng = np.random.default_rng(0)
    bounds = BUCKETS["decision_latency"]
    h = Histogram(bounds)
    values = np.concatenate(
        [rng.exponential(0.2, 500), np.array(bounds[:4]), [1e9, 0.0]]
    )  # on the bounds too
    for chunk in np.array_split(values, 7):
        h.observe(chunk)
    buckets, total = h.frozen()
    expected = [int(np.sum(values <= b)) for b in bounds] + [len(values)]
    assert [n for _, n in buckets] == expected
    assert [le for le, _ in buckets][-1] == "+Inf"
    assert total == pytest.approx(values.sum())


def status(**counters):
    hist = {k: Histogram(b) for k, b in BUCKETS.items()}
    hist["decision_latency"].observe([0.003, 0.02, 0.02, 7.0])
    return Status(
        counters=counters,
        histograms={k: h.frozen() for k, h in hist.items()},
        assigned=(0, 3),
        models=12,
        open_decisions=5,
        lag=(("contexts", 0, 7), ("rewards", 3, 0)),
        snapshot_age_s=((0, 1.5), (3, 2.5)),
        recovery_wait_s=((1, 12.5),),
        info={"version": "0.1.0", "group": "g", "instance": "i"},
    )


def samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_a_status_renders_as_prometheus_text_with_conventional_names():
    text = render_metrics(
        status(
            actions=10,
            joined=4,
            default_rewards=1,
            transactions=3,
            transaction_aborts=1,
            **{"dead_letter.not_a_record": 2, "dead_letter.late_reward": 1},
        )
    ).decode()
    got = samples(text)
    assert got[("streambandit_decisions_total", ())] == 10
    assert got[("streambandit_joined_total", ())] == 4
    assert got[("streambandit_default_rewards_total", ())] == 1
    assert got[("streambandit_dead_letters_total", (("reason", "not_a_record"),))] == 2
    assert got[("streambandit_dead_letters_total", (("reason", "late_reward"),))] == 1
    assert got[("streambandit_transactions_total", (("outcome", "abort"),))] == 1
    assert got[("streambandit_assigned_partitions", ())] == 2
    assert got[("streambandit_models", ())] == 12
    assert got[("streambandit_open_decisions", ())] == 5
    assert got[("streambandit_consumer_lag", (("partition", "0"), ("topic", "contexts")))] == 7
    assert got[("streambandit_snapshot_age_seconds", (("partition", "3"),))] == 2.5
    assert got[("streambandit_partitions_waiting", ())] == 1
    assert got[("streambandit_recovery_wait_seconds", (("partition", "1"),))] == 12.5
    assert got[("streambandit_decision_latency_seconds_bucket", (("le", "0.005"),))] == 1
    assert got[("streambandit_decision_latency_seconds_bucket", (("le", "0.025"),))] == 3
    assert got[("streambandit_decision_latency_seconds_bucket", (("le", "+Inf"),))] == 4
    assert got[("streambandit_decision_latency_seconds_count", ())] == 4
    for name, _ in got:  # every name is ours or the process's
        assert name.startswith(("streambandit_", "process_", "python_")), name
    assert "# TYPE streambandit_decisions_total counter" in text


def test_every_dead_letter_reason_is_a_series_at_zero_from_the_start():
    got = samples(render_metrics(status()).decode())
    dead = {
        dict(labels)["reason"]: v
        for (name, labels), v in got.items()
        if name == "streambandit_dead_letters_total"
    }
    assert dead == {r: 0 for r in reasons.ALL}
    for name, labels in (
        ("streambandit_transactions_total", ("commit", "abort")),
        ("streambandit_rebalances_total", ("assign", "revoke", "lost", "join_refused")),
        ("streambandit_snapshots_total", ("base", "increment")),
    ):
        assert sorted(v for (n, lv), v in got.items() if n == name) == [0] * len(labels), name


def test_the_process_metrics_are_served_with_the_workers():
    got = samples(render_metrics(status()).decode())
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert got[(name, ())] > 0, name
    assert any(name == "python_info" for name, _ in got)


def test_readiness_is_a_gauge_of_what_ready_answers():
    for ready in (True, False):
        got = samples(render_metrics(status(), ready=ready).decode())
        assert got[("streambandit_ready", ())] == int(ready)
    assert ("streambandit_ready", ()) not in samples(render_metrics(status()).decode())


def test_no_status_yet_renders_only_the_process_metrics():
    names = {name for name, _ in samples(render_metrics(None).decode())}
    assert "process_resident_memory_bytes" in names
    assert not any(n.startswith("streambandit_") for n in names)


def test_the_broker_gauges_say_whether_and_how_long_the_loop_waits_for_the_broker():
    fine = samples(render_metrics(status()).decode())
    assert fine[("streambandit_broker_unavailable", ())] == 0
    assert fine[("streambandit_broker_unavailable_seconds", ())] == 0
    s = status(broker_outages=1)
    away = dataclasses.replace(s, broker_unavailable_s=12.5)
    got = samples(render_metrics(away).decode())
    assert got[("streambandit_broker_unavailable", ())] == 1
    assert got[("streambandit_broker_unavailable_seconds", ())] == 12.5
    assert got[("streambandit_broker_outages_total", ())] == 1


def test_repeated_lines_pass_once_a_minute_with_a_count_of_those_held_back():
    now = [0.0]
    f = RepeatFilter(every_s=60, clock=lambda: now[0])

    def rec(msg):
        return logging.LogRecord("streambandit.kafka", logging.ERROR, "", 0, msg, (), None)

    assert f.filter(
        rec("FAIL [rdkafka#consumer-1] 127.0.0.1:1: Connect failed (after 0ms in state CONNECT)")
    )
    for i in range(50):
        now[0] += 1
        assert not f.filter(
            rec(
                f"FAIL [rdkafka#producer-2] 127.0.0.1:1: Connect failed (after {i}ms in state CONNECT)"
            )
        )
    assert f.filter(rec("another kind of line"))
    now[0] += 20
    last = rec("FAIL [rdkafka#consumer-1] 127.0.0.1:1: Connect failed (after 3ms in state CONNECT)")
    assert f.filter(last) and last.getMessage().endswith("(50 like it held back)")


def test_unknown_tables_and_librdkafka_keys_are_errors_naming_them():
    with pytest.raises(ValueError, match="top level: workr"):
        parse_worker_config({"kafka": {"bootstrap.servers": "x:1"}, "workr": {}, **MODELS})
    with pytest.raises(
        ValueError, match=r"\[worker\] has unknown setting\(s\) metrics_prot; known: .*metrics_port"
    ):
        parse_worker_config(
            {"kafka": {"bootstrap.servers": "x:1"}, "worker": {"metrics_prot": 1}, **MODELS}
        )
    with pytest.raises(
        ValueError, match=r"\[topics\] has unknown key\(s\) context; known: actions, contexts"
    ):
        parse_worker_config(
            {"kafka": {"bootstrap.servers": "x:1"}, "topics": {"context": "c"}, **MODELS}
        )
    for kafka, named in (
        ({"bootstrap.servrs": "x"}, "bootstrap.servrs"),
        ({"acks": "maybe"}, "acks"),
        ({"consumer": {"session.timeout.ms": "soon"}}, "session.timeout.ms"),
    ):
        config = WorkerConfig(
            bootstrap_servers="127.0.0.1:1", models=parse_models_config(MODELS), kafka=kafka
        )
        with pytest.raises(ValueError, match=named):
            check_client_settings(config)
    check_client_settings(
        WorkerConfig(
            bootstrap_servers="127.0.0.1:1",
            models=parse_models_config(MODELS),
            kafka={"linger.ms": 10, "consumer": {"fetch.wait.max.ms": 10}},
        )
    )


@pytest.mark.parametrize(
    "bad",
    [{"metrics_port": 70000}, {"health_timeout_s": 0}, {"log_summary_s": -1}, {"broker_wait_s": 0}],
)
def test_operator_settings_are_bounded(bad):
    with pytest.raises(ValueError):
        WorkerConfig(bootstrap_servers="x:1", models=parse_models_config(MODELS), **bad)


def test_dead_letters_are_warnings_held_back_to_one_per_reason_and_interval(caplog):
    from streambandit.wire import Context, encode

    from .test_ticks import processor, run

    b, now = processor("g"), [0.0]
    b._dead_letter_lines = RepeatFilter(10, clock=lambda: now[0])
    bad = [("c", b"m1", b"not a record", 1_000 + i) for i in range(500)]
    wrong_dim = encode(Context("e1", "m1", 1_000, ("a",), np.ones((1, 3))))
    with caplog.at_level(logging.WARNING, logger="streambandit"):
        out = run(b, bad + [("c", b"m1", wrong_dim, 2_000)])
    assert sum(t == "d" for t, _ in out) == 501  # every one dead-lettered, whatever was logged
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dead letter")]
    assert len(lines) == 2, lines  # the first of each reason within the interval
    assert lines[0].startswith("dead letter reason=malformed partition=0 offset=0 ")
    assert "reason=bad_dimension" in lines[1], lines[1]
    now[0] += 10
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streambandit"):
        run(b, [("c", b"m1", b"still not a record", 3_000)])
    assert [
        r.getMessage().endswith("(499 more with this reason held back)") for r in caplog.records
    ] == [True]
