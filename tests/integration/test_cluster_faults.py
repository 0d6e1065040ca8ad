"""Broker faults on a three-node Apache Kafka cluster (replication 3, min.insync.replicas 2) while
events flow: the leader of an input partition and then the transaction coordinator's node killed
and restarted; every node killed at once and restarted on its log directories. Each run ends,
exactly once and to the bit, as one worker that no fault touched."""

import re
import time

import pytest
from confluent_kafka import KafkaException

from streambandit.dev.tansu import BrokerError

from .faults import Flow, Group, assert_same_as_reference, make_topics, run_reference
from .helpers import producer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTS = 2
# A failover stalls one input for seconds (a dead node is fenced after 4 s): records of the other
# input wait for it this long rather than be merged ahead of it (docs/design.md, invariant 5).
WORKER = {"merge_wait_ms": 8000}
PACE_S = 0.2  # a period of 12 contexts and their rewards


def _asked(where):
    """What the cluster answers, or None while it cannot (a metadata request timed out)."""
    try:
        return where()
    except (KafkaException, BrokerError):
        return None


def test_killed_partition_leader_and_transaction_coordinator(kafka_cluster, tmp_path):
    """A worker serves both partitions while events flow. The node leading contexts[0] is
    SIGKILLed: the input, the outputs and the group's offsets it led move to the other nodes while
    the worker fetches, produces and commits; it is started again and caught up. Then the node
    now coordinating the worker's transactions is SIGKILLed, in the middle of a transaction or
    between two, and started again. The worker rides both out (a wait for the broker, a new
    producer: docs/operations.md, *A broker failure*), or exits with one line saying why and is
    started again, as its supervisor would; the outcome is the undisturbed worker's, to the
    bit."""
    topics, ref_topics = make_topics(kafka_cluster, PARTS)
    g = Group(kafka_cluster, tmp_path, "leaders", topics, worker=WORKER)
    tid = "leaders-w"  # the worker's transactional id: <group>-<instance id>
    flow = Flow(producer(kafka_cluster), topics, pace_s=PACE_S, per_period=12)
    try:
        g.start("w")
        assert wait_for(lambda: g.held("w") == {0, 1}, timeout_s=60), g.text("w")[-3000:]
        flow.start()
        time.sleep(2)
        for where in (
            lambda: kafka_cluster.leader(topics.contexts, 0),
            lambda: kafka_cluster.transaction_coordinator(tid),
        ):
            victim, before = where(), flow.periods
            assert not flow.done.is_set()
            kafka_cluster.kill(victim)
            # Events flow while the node is down: its leaderships, the coordinator's among them,
            # move once the controller has fenced it (4 s).
            assert wait_for(lambda: _asked(where) not in (victim, -1, None), timeout_s=30)
            assert wait_for(lambda: flow.periods > before + 5, timeout_s=30), "the flow stalled"
            kafka_cluster.start_node(victim)
            kafka_cluster.wait_in_sync()
        time.sleep(2)
        flow.finish()
        assert g.caught_up_reviving(flow.sent, PARTS), g.text("w")[-3000:]
        g.stop()
    finally:
        g.kill_all()
        flow.finish()
    ref = run_reference(kafka_cluster, tmp_path, ref_topics, flow.sent, PARTS, worker=WORKER)
    assert_same_as_reference(kafka_cluster, g, ref, PARTS, flow.contexts, n_dead=flow.malformed)


def test_every_node_restarted_on_its_log_directories(kafka_cluster, tmp_path):
    """Two workers share the partitions while events flow; one stops cleanly, and every node of
    the cluster is killed at once and started again on its log directories while the other
    worker runs. That one rides the outage out (a wait for the broker, a new producer), or exits
    with one line saying why (the wait for a log's end during a recovery) and is started again,
    as its supervisor would. The stopped worker starts again too: both
    resume from their group's snapshots and the committed offsets the restarted cluster kept,
    and the group ends as one undisturbed worker."""
    topics, ref_topics = make_topics(kafka_cluster, PARTS)
    g = Group(kafka_cluster, tmp_path, "restart", topics, worker=WORKER)
    flow = Flow(producer(kafka_cluster), topics, pace_s=PACE_S, per_period=12)
    try:
        g.start("a")
        g.start("b")
        assert wait_for(lambda: len(g.held("a")) == len(g.held("b")) == 1, timeout_s=60), (
            g.text("a")[-3000:],
            g.text("b")[-3000:],
        )
        flow.start()
        time.sleep(2)
        g.stop("a")
        assert wait_for(lambda: g.held("b") == {0, 1}, timeout_s=60), g.text("b")[-3000:]
        time.sleep(1)
        kafka_cluster.restart(kill=True)
        at_restart = flow.periods
        g.start("a")

        def whole() -> bool:
            g.revive()
            return g.starts("a") >= 2 and bool(g.held("a")) and g.held("a") | g.held("b") == {0, 1}

        assert wait_for(whole, timeout_s=120, interval_s=1), (
            g.text("a")[-3000:],
            g.text("b")[-3000:],
        )
        time.sleep(2)
        flow.finish()
        assert flow.periods > at_restart, "the flow ended before the cluster was back"
        assert g.caught_up_reviving(flow.sent, PARTS), (g.text("a")[-3000:], g.text("b")[-3000:])
        g.stop()
    finally:
        g.kill_all()
        flow.finish()
    # The restarted worker took its partition from a stored snapshot (models), not the whole log.
    second = g.text("a").split("worker started")[-1]
    resumed = re.findall(
        r"partition assigned partition=\d+ recovered_in_ms=\d+ models=(\d+)", second
    )
    assert resumed and all(int(m) > 0 for m in resumed), second[-3000:]
    ref = run_reference(kafka_cluster, tmp_path, ref_topics, flow.sent, PARTS, worker=WORKER)
    assert_same_as_reference(kafka_cluster, g, ref, PARTS, flow.contexts, n_dead=flow.malformed)
