"""A worker on a secured Apache Kafka (dev/kafka_security.py): over SASL_SSL with SCRAM-SHA-512 it
works with the minimal ACLs of docs/security.md, exactly once; without any one of them it stops
with exit code 3 and one line naming the ACL to grant; refused credentials (a wrong password, a
certificate the broker does not trust) are one line too."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from streambandit.config.worker import Topics
from streambandit.dev.kafka_security import Grant
from streambandit.wire import Context

from .helpers import (
    all_input_committed,
    fresh_topics,
    outputs,
    producer,
    send,
    serve_config,
    wait_for,
)

pytestmark = pytest.mark.integration

PRINCIPAL = "worker"
GROUP = "g-secure"
INSTANCE = "i1"
ACCESS_LOST = 3  # NOT_AUTHORIZED_EXIT


def minimal_grants(t: Topics, group: str, snapshot_topic: str | None = None) -> list[Grant]:
    """The worker's ACLs, as docs/security.md lists them (Read and Write imply Describe)."""
    snapshots = [Grant("topic", snapshot_topic, op) for op in ("read", "write")]
    return (snapshots if snapshot_topic else []) + [
        Grant("group", group, "read"),
        Grant("transactional_id", f"{group}-", "write", "prefixed"),
        Grant("group", "streambandit-reader", "describe"),
        Grant("topic", t.contexts, "read"),
        Grant("topic", t.rewards, "read"),
        Grant("topic", t.rewards, "write"),
        *(Grant("topic", name, op) for name in t.all()[2:] for op in ("write", "read")),
    ]


def kafka_toml(settings: dict[str, str]) -> str:
    return "\n[kafka]\n" + "".join(f'"{k}" = "{v}"\n' for k, v in settings.items())


def serve(broker, cfg, log, verbose: bool = False) -> subprocess.Popen:
    """``streambandit serve`` as one process; without ``verbose`` its stderr holds warnings and
    errors only."""
    return subprocess.Popen(
        [sys.executable, "-m", "streambandit", "serve", "--config", str(cfg), *(["-v"] * verbose),
         "--instance-id", INSTANCE, "--processes", "1",
         "--bootstrap-servers", broker.bootstrap_servers],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def refused(broker, cfg, log) -> str:
    """The one error line of a worker that stops for lack of access (exit code 3)."""
    proc = serve(broker, cfg, log)
    try:
        code = proc.wait(timeout=40)
    finally:
        proc.kill()
    text = log.read_text()
    errors = [ln for ln in text.splitlines() if ln.startswith("streambandit: error:")]
    assert code == ACCESS_LOST and len(errors) == 1 and "Traceback" not in text, (
        code,
        text[-3000:],
    )
    return errors[0]


def contexts(prod, topic: str, tag: str, n: int, t0_ms: int = 1_000) -> list[str]:
    """``n`` contexts from event time ``t0_ms`` and one record that is not one (a dead letter);
    their event ids."""
    rng = np.random.default_rng(len(tag))
    ids = [f"{tag}-{i}" for i in range(n)]
    for i, event_id in enumerate(ids):
        ctx = Context(event_id, f"m-{i % 4}", t0_ms + i, ("a", "b"), rng.standard_normal((2, 3)))
        send(prod, topic, ctx)
    send(prod, topic, None, key=b"m-0", raw=b"not a record")
    prod.flush()
    return ids


def test_a_worker_with_the_minimal_acls_works_and_stops_with_one_line_for_each_missing_one(
    kafka_sasl_ssl, tmp_path
):
    broker, security = kafka_sasl_ssl, kafka_sasl_ssl.security
    t = fresh_topics(broker)
    snapshot_topic = t.contexts.replace("contexts-", "snapshots-")
    broker.create_topics([snapshot_topic], partitions=2, config={"cleanup.policy": "compact"})
    security.add_user(PRINCIPAL)
    grants = minimal_grants(t, GROUP, snapshot_topic)
    security.grant(PRINCIPAL, grants)
    prod = producer(broker)  # the admin's
    snaps = tmp_path / "snaps"
    settings = kafka_toml(security.client_settings(PRINCIPAL))
    cfg = tmp_path / "worker.toml"  # snapshots in a directory
    cfg.write_text(serve_config(GROUP, snaps, t) + settings)
    in_topic = tmp_path / "in-topic.toml"  # snapshots in the snapshot topic
    in_topic.write_text(
        serve_config(GROUP, snaps, t).replace(
            f'snapshot_dir = "{snaps}"', f'snapshot_topic = "{snapshot_topic}"'
        )
        + settings
    )

    # With every ACL: contexts in, actions out, exactly once, snapshots in the topic.
    sent = contexts(prod, t.contexts, "full", 30)
    proc = serve(broker, in_topic, tmp_path / "full.log", verbose=True)
    try:
        assert wait_for(
            lambda: all_input_committed(broker, GROUP, [t.contexts]), timeout_s=60, interval_s=0.5
        ), (tmp_path / "full.log").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "full.log").read_text()[-3000:]
    out = outputs(broker, t, GROUP)
    assert sorted(a.event_id for a in out["actions"]) == sorted(sent)
    assert len(out["dead_letter"]) == 1
    check_export(broker, t, out)

    # Without each ACL in turn. The snapshots are removed first: recovery reads the output logs
    # back (their Read, and the reader's group), as after a crash; new input makes the worker
    # write to each output.
    # Write on rewards is for the watermark ticks an idle partition with open decisions gets:
    # its case's contexts are of the present, so their windows are open when the input stops
    # (those of 1970 are closed at once by the watermark the earlier runs' ticks moved).
    # The snapshot topic's grants with the snapshots in it: Read first (recovery reads the
    # snapshots the full run stored), then Write (the first snapshot after recovery).
    tick = Grant("topic", t.rewards, "write")
    for i, grant in enumerate(grants):
        security.revoke(PRINCIPAL, [grant])
        shutil.rmtree(snaps, ignore_errors=True)
        t0_ms = int(time.time() * 1000) if grant == tick else 1_000
        contexts(prod, t.contexts, f"without-{i}", 4, t0_ms)
        line = refused(
            broker, in_topic if grant.name == snapshot_topic else cfg, tmp_path / f"without-{i}.log"
        )
        security.grant(PRINCIPAL, [grant])
        op = grant.operation.capitalize()
        expected = {
            "group": f"cannot use group {grant.name} (GROUP_AUTHORIZATION_FAILED); grant it "
            f"{op} on Group {grant.name}",
            "transactional_id": f"cannot use transactional id {GROUP}-{INSTANCE} "
            "(TRANSACTIONAL_ID_AUTHORIZATION_FAILED); grant it Write on TransactionalId "
            f"{GROUP}- (--resource-pattern-type prefixed)",
            # A topic it may not Describe is hidden: found so at the start (Read and Write grant it).
            "topic": f"cannot {'Describe' if grant.name == t.contexts else op} topic {grant.name} "
            f"(TOPIC_AUTHORIZATION_FAILED); grant it {op} on Topic {grant.name}",
        }[grant.resource]
        who = f"streambandit: error: not authorized: User:{PRINCIPAL}"
        assert line == f"{who} {expected} (docs/security.md)", grant

    # A wrong password.
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(
        serve_config(GROUP, snaps, t)
        + kafka_toml(security.client_settings(PRINCIPAL, password="not-the-password"))
    )
    line = refused(broker, wrong, tmp_path / "wrong.log")
    rejected = (
        f"streambandit: error: authentication failed: the broker at {broker.bootstrap_servers} "
        f"refused User:{PRINCIPAL}: "
    )
    assert line.startswith(rejected) and "invalid credentials" in line, line
    # The admin commands check the broker the same way first.
    topics = subprocess.run(
        [sys.executable, "-m", "streambandit", "topics", "describe", "--config", str(wrong),
         "--bootstrap-servers", broker.bootstrap_servers],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert topics.returncode == ACCESS_LOST, topics.stderr
    assert topics.stderr.splitlines()[-1].startswith(rejected), topics.stderr

    # `topics create` as the worker, which may not create topics: one line naming the grant.
    unmade = Topics(
        **{k: f"{getattr(t, k)}-unmade" for k in ("contexts", "rewards", "actions", "joined")},
        dead_letter=f"{t.dead_letter}-unmade",
    )
    creating = tmp_path / "create.toml"
    creating.write_text(serve_config(GROUP, snaps, unmade) + settings)
    create = subprocess.run(
        [sys.executable, "-m", "streambandit", "topics", "create", "--config", str(creating),
         "--partitions", "2", "--bootstrap-servers", broker.bootstrap_servers],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert create.returncode == ACCESS_LOST, create.stderr
    line = create.stderr.splitlines()[-1]
    topic = re.search(r"cannot create topic (\S+) ", line)
    assert topic and topic[1] in unmade.all(), create.stderr
    assert line == (
        f"streambandit: error: not authorized: User:{PRINCIPAL} cannot create topic {topic[1]} "
        f"(TOPIC_AUTHORIZATION_FAILED); grant it Create on Cluster (or on Topic {topic[1]}) "
        "(docs/security.md)"
    ), create.stderr


def test_mutual_tls_knows_the_worker_by_its_certificate_and_refuses_an_unknown_one(
    kafka_mtls, tmp_path
):
    broker, security = kafka_mtls, kafka_mtls.security
    t = fresh_topics(broker)
    snaps = tmp_path / "snaps"

    # A certificate of the same name, from a CA the broker does not trust.
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(
        serve_config(GROUP, snaps, t) + kafka_toml(security.make_foreign_cert(PRINCIPAL))
    )
    line = refused(broker, unknown, tmp_path / "unknown.log")
    assert line.startswith(
        f"streambandit: error: authentication failed: the broker at {broker.bootstrap_servers} "
        f"refused the principal of the certificate ssl.certificate.location="
    ), line

    # Its own certificate (CN=worker: User:worker) and the same ACLs as over SASL.
    security.grant(PRINCIPAL, minimal_grants(t, GROUP))
    cfg = tmp_path / "worker.toml"
    cfg.write_text(serve_config(GROUP, snaps, t) + kafka_toml(security.client_settings(PRINCIPAL)))
    sent = contexts(producer(broker), t.contexts, "mtls", 20)
    proc = serve(broker, cfg, tmp_path / "worker.log")
    try:
        assert wait_for(
            lambda: all_input_committed(broker, GROUP, [t.contexts]), timeout_s=60, interval_s=0.5
        ), (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, (tmp_path / "worker.log").read_text()[-3000:]
    assert sorted(a.event_id for a in outputs(broker, t, GROUP)["actions"]) == sorted(sent)


def test_a_topic_refused_mid_transaction_is_named_when_a_later_produce_fails_first(kafka_sasl_ssl):
    """What a worker meets when the coordinator refuses a topic while the batch still produces:
    the refusal fails the transaction, the next produce raises ``_STATE`` (no cause named), and
    an abort then fails fatally (INVALID_TXN_STATE). The refusal is named from librdkafka's log
    line, as the worker does before it would abort."""
    import logging

    from confluent_kafka import KafkaError, Producer

    from streambandit.config.kafka import producer_settings
    from streambandit.stream.authorization import (
        denied_topic_in_log,
        refusal_code,
        topic_may_be_named_later,
        transaction_refusal,
    )
    from streambandit.stream.transaction import Transaction, TransactionFailed, TransactionFatal

    broker, security = kafka_sasl_ssl, kafka_sasl_ssl.security
    t = fresh_topics(broker)
    security.add_user("mid-txn")
    security.grant(
        "mid-txn",
        [
            Grant("transactional_id", "mid-", "write", "prefixed"),
            Grant("topic", t.actions, "read"),  # seen (Describe), not writable
            Grant("topic", t.joined, "write"),
        ],
    )
    denied: list[str] = []

    class Denied(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            topic = denied_topic_in_log(record.getMessage())
            if topic is not None:
                denied.append(topic)

    logger = logging.getLogger("test.mid-txn")
    logger.addHandler(Denied())
    settings = producer_settings(
        broker.bootstrap_servers, "mid-1", security.client_settings("mid-txn")
    )
    producer = Producer(settings | {"logger": logger})
    producer.init_transactions(30)
    txn = Transaction(producer, [], "mid-1")
    txn.emit([(t.actions, 0, None, b"refused")])
    later: list[TransactionFailed] = []

    def produce_fails() -> bool:  # once librdkafka has the coordinator's refusal
        producer.poll(0.05)
        try:
            txn.emit([(t.joined, 0, None, b"allowed")])
        except TransactionFailed as exc:
            later.append(exc)
        return bool(later)

    assert wait_for(produce_fails, timeout_s=30)
    assert wait_for(lambda: producer.poll(0.05) is not None and denied, timeout_s=10)
    assert refusal_code(later[0]) is None and topic_may_be_named_later(later[0])
    assert denied == [t.actions]
    refusal = transaction_refusal(later[0], denied)
    assert refusal_code(refusal) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Why it is named before the abort: the abort cannot end this transaction.
    with pytest.raises(TransactionFatal, match="INVALID_TXN_STATE"):
        txn.abort(later[0])
    producer.purge()


def test_a_replica_with_its_acls_decides_and_stops_deciding_when_its_writes_are_refused(
    kafka_sasl_ssl, tmp_path
):
    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import WorkerConfig
    from streambandit.engine.admission import DecisionError
    from streambandit.serving.replica import NOT_READY, Replica
    from streambandit.stream.errors import NotAuthorized
    from streambandit.stream.snapshots import DirectoryStore

    from .helpers import read_all

    broker, security = kafka_sasl_ssl, kafka_sasl_ssl.security
    t = fresh_topics(broker, learn_only=True)
    security.add_user("replica")
    grants = [
        Grant("topic", t.joined, "read"),
        Grant("group", "g-learn", "describe"),
        Grant("group", "streambandit-reader", "describe"),
        Grant("topic", t.decisions, "write"),
        Grant("topic", t.rewards, "write"),
    ]
    security.grant("replica", grants)
    models = {
        "models": [
            {
                "match": "m-*",
                "policy": "oful",
                "dim": 3,
                "reward_window_ms": 100,
                "default_reward": 0.0,
            }
        ]
    }
    config = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(models),
        group_id="g-learn",
        topics=t,
        learn_only=True,
        kafka=security.client_settings("replica"),
    )
    rng = np.random.default_rng(5)

    def rank(replica, event_id: str):
        return replica.rank(event_id, "m-1", ["a", "b"], rng.standard_normal((2, 3)))

    replica = Replica(config, DirectoryStore(tmp_path / "snaps"), poll_s=0.02).start(30)
    try:
        for i in range(5):
            rank(replica, f"d{i}")
            replica.reward(f"d{i}", 1.0)
        assert replica.flush() == 0
        assert len(read_all(broker, t.decisions)) == 5 and len(read_all(broker, t.rewards)) == 5
        # Write on decisions taken away: the next decision is refused at the broker, and the
        # replica stops deciding (not ready) with the line that names the grant.
        security.revoke("replica", [Grant("topic", t.decisions, "write")])
        rank(replica, "lost")
        replica.flush()
        expected = (
            f"not authorized: User:replica cannot Write topic {t.decisions} "
            f"(TOPIC_AUTHORIZATION_FAILED); grant it Write on Topic {t.decisions} (docs/security.md)"
        )
        assert not replica.is_ready()
        with pytest.raises(Exception, match=re.escape(expected)):
            rank(replica, "after")
    finally:
        replica.close()
    # Without Read on joined it never gets ready, and says why at once.
    security.revoke("replica", [Grant("topic", t.joined, "read")])
    started = time.monotonic()
    with pytest.raises(NotAuthorized, match=f"cannot Describe topic {t.joined} .* grant it Read"):
        Replica(config, DirectoryStore(tmp_path / "snaps")).start(30).close()
    assert time.monotonic() - started < 10
    security.grant("replica", [Grant("topic", t.joined, "read")])
    # Without Describe on the learners' group (their committed offsets) or on the reader's: the
    # same, where the offsets request would wait out its timeout; rank is refused with the line.
    for group in ("g-learn", "streambandit-reader"):
        security.revoke("replica", [Grant("group", group, "describe")])
        expected = (
            f"not authorized: User:replica cannot use group {group} (GROUP_AUTHORIZATION_FAILED); "
            f"grant it Describe on Group {group} (docs/security.md)"
        )
        replica = Replica(config, DirectoryStore(tmp_path / "snaps"))
        started = time.monotonic()
        try:
            with pytest.raises(NotAuthorized, match=re.escape(expected)):
                replica.start(30)
            assert time.monotonic() - started < 10
            assert not replica.is_ready()
            with pytest.raises(DecisionError, match=re.escape(f"{NOT_READY}: {expected}")):
                rank(replica, f"without-{group}")
        finally:
            replica.close()
        security.grant("replica", [Grant("group", group, "describe")])


def check_export(broker, t: Topics, out: dict) -> None:
    """``export`` (read_logged_decisions, in this process) of the worker's group with the ACLs
    docs/security.md lists, then without each: one line naming the grant, never an export that
    is silently empty."""
    from streambandit.export import read_logged_decisions
    from streambandit.stream.errors import NotAuthorized

    security = broker.security
    security.add_user("exporter")
    grants = [
        Grant("topic", t.contexts, "read"),
        Grant("topic", t.actions, "read"),
        Grant("topic", t.joined, "read"),
        Grant("topic", t.rewards, "describe"),
        Grant("group", GROUP, "describe"),
        Grant("group", "streambandit-reader", "describe"),
    ]
    security.grant("exporter", grants)
    settings = security.client_settings("exporter")

    def export() -> list:
        return list(read_logged_decisions(broker.bootstrap_servers, t, GROUP, kafka=settings))

    assert sorted(d.event_id for d in export()) == sorted(j.event_id for j in out["joined"])
    for grant in grants:
        security.revoke("exporter", [grant])
        op = grant.operation.capitalize()
        if grant.resource == "group":
            expected = f"cannot use group {grant.name} (GROUP_AUTHORIZATION_FAILED); grant it {op}"
        else:
            # Each topic is looked up first (Read grants Describe).
            expected = (
                f"cannot Describe topic {grant.name} (TOPIC_AUTHORIZATION_FAILED); grant it {op}"
            )
        with pytest.raises(NotAuthorized, match=re.escape(expected)):
            export()
        security.grant("exporter", [grant])
