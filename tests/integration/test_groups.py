"""The consumer group protocol a worker joins with, on each broker: the consumer protocol
(KIP-848, incremental) where the broker offers it, the classic one elsewhere or when the
configuration says so; and static membership on Apache Kafka, where a member restarted within
the session gets its partitions back and the others see no rebalance."""

import logging
import re
import signal
import threading
import time

import numpy as np
import pytest
from confluent_kafka import Consumer

from streambandit.config.kafka import consumer_settings
from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.kafka_checks import choose_group_protocol
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker
from streambandit.wire import Context, encode

from .faults import make_topics
from .helpers import (
    held_partitions,
    is_tansu,
    log_time,
    outputs,
    producer,
    send_tracked,
    serve_config,
    serve_process,
    stop_processes,
    wait_for,
)

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {"match": "m-*", "policy": "oful", "dim": 3, "reward_window_ms": 500, "default_reward": 0.0}
    ]
}


def _config(broker, **worker) -> WorkerConfig:
    return WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        **worker,
    )


def test_the_protocol_is_the_consumer_one_where_the_broker_offers_it(broker):
    chosen = choose_group_protocol(_config(broker))
    if not is_tansu(broker):
        assert chosen.name == "consumer" and chosen.incremental
        assert "group.coordinator.rebalance.protocols=" in chosen.reason
        # the broker's session, as the dev broker sets it (streambandit/dev/kafka.py)
        assert chosen.session_s == 6.0
    else:
        # The embedded broker describes no configuration: the classic protocol, which every
        # broker has, and the reason says so.
        assert chosen.name == "classic" and not chosen.incremental
        assert "does not say it offers the consumer protocol" in chosen.reason
    forced = choose_group_protocol(_config(broker, group_protocol="classic"))
    assert (forced.name, forced.reason) == ("classic", "[worker] group_protocol = classic")


def _lines_after(text: str, since: float, pattern: str) -> list[str]:
    """The lines of a worker's log matching ``pattern`` logged after wall time ``since``."""
    return [
        line for line in text.splitlines() if re.search(pattern, line) and log_time(line) > since
    ]


# The embedded broker rebalances on every restart, static or not (docs/notes/tansu.md).
@pytest.mark.brokers("kafka")
@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_static_member_restarted_within_the_session_keeps_every_assignment(
    broker, tmp_path, protocol
):
    """Classic protocol (KIP-345): a member SIGKILLed and restarted under its instance id takes
    its place back at once. Consumer protocol (KIP-848): a member stopped with SIGTERM (a leave
    that keeps its assignment for the session) and restarted does; one SIGKILLed is refused its
    instance id until the broker ends the old member's session, and the worker waits that out
    (joining again each second) instead of exiting."""
    topics, _ = make_topics(broker, partitions=8)
    cfg = tmp_path / "static.toml"
    cfg.write_text(
        serve_config(
            "static",
            tmp_path / "snaps",
            topics,
            worker=f'static_membership = true\ngroup_protocol = "{protocol}"',
        )
    )
    names = ("w1", "w2", "w3")
    logs = {n: tmp_path / f"{n}.log" for n in names}
    procs = {n: serve_process(broker, cfg, n, logs[n]) for n in names}

    def settled() -> bool:
        # Every member holds some: under the consumer protocol the assignment moves a member's
        # partitions to a later joiner in steps (revoked first), so all eight held can still be
        # a moment with the third member holding none and about to take some.
        held = {n: held_partitions(logs[n]) for n in names}
        return all(held.values()) and sorted(p for h in held.values() for p in h) == list(range(8))

    def restart_w2(sig: int) -> float:
        procs["w2"].send_signal(sig)
        assert procs["w2"].wait(30) == (0 if sig == signal.SIGTERM else -sig)
        at = time.time()
        procs["w2"] = serve_process(broker, cfg, "w2", logs["w2"])  # the same instance id
        return at

    try:
        assert wait_for(settled, timeout_s=90), "the group did not settle"
        time.sleep(2)  # no rebalance under way: the last assignment is some heartbeats old
        before = {n: held_partitions(logs[n]) for n in names}
        assert all(before.values()), before
        stopped = restart_w2(signal.SIGKILL if protocol == "classic" else signal.SIGTERM)
        assert wait_for(
            lambda: (
                logs["w2"].read_text().count("worker started") == 2
                and held_partitions(logs["w2"]) == before["w2"]
            ),
            timeout_s=60,
        ), f"w2 did not get its partitions back: {logs['w2'].read_text()[-2000:]}"
        # Well past the group's next heartbeats: a rebalance of the others would show by now.
        time.sleep(3)
        for n in ("w1", "w3"):
            moved = _lines_after(
                logs[n].read_text(), stopped, r"rebalance: (assigned|revoked|lost)"
            )
            assert moved == [], f"{n} saw a rebalance: {moved}"
            assert held_partitions(logs[n]) == before[n]
        if protocol == "consumer":
            restart_w2(signal.SIGKILL)
            assert wait_for(
                lambda: (
                    "still counts instance id static-w2 as a live member" in logs["w2"].read_text()
                ),
                timeout_s=30,
            ), logs["w2"].read_text()[-2000:]
            assert wait_for(
                lambda: "released after" in logs["w2"].read_text() and settled(), timeout_s=60
            ), f"w2 did not join again: {logs['w2'].read_text()[-2000:]}"
            assert held_partitions(logs["w2"]), "w2 joined and holds nothing"
        assert all(p.poll() is None for p in procs.values()), "a worker exited"
    finally:
        stop_processes(*procs.values())


def test_a_partition_whose_inputs_are_split_between_members_is_served_by_neither(
    broker, topics, tmp_path
):
    """A client in the worker's group that subscribes to the rewards only (a misconfigured
    application) takes some rewards partitions: the worker then holds the contexts of a
    partition without its rewards. It serves that partition not at all (both inputs paused, a
    WARNING) rather than decide without the partition's state, and serves it, from where its
    recovery starts, once the other member has gone and both inputs are its own."""
    prod = producer(broker)
    rng = np.random.default_rng(3)
    sent = []
    for i in range(40):
        ev = Context(f"e{i}", f"m-{i % 8}", 1000 + i, ("a", "b"), rng.standard_normal((2, 3)))
        sent.append(send_tracked(prod, topics.contexts, ev.model_key.encode(), encode(ev)))
    prod.flush()
    partition_of = {f"e{i}": s.partition for i, s in enumerate(sent)}
    assert set(partition_of.values()) == {0, 1}
    cfg = _config(broker, group_id="g-split", topics=topics)
    protocol = choose_group_protocol(cfg).name
    other = Consumer(consumer_settings(broker.bootstrap_servers, "g-split", protocol=protocol))
    other_holds: list = []  # by its own thread's callback: no call into a consumer another polls
    other.subscribe([topics.rewards], on_assign=lambda c, tps: other_holds.extend(tps))
    stop_other = threading.Event()

    def poll_other() -> None:
        while not stop_other.is_set():
            other.poll(0.1)
        other.close()  # leaves the group: its rewards partitions go to the worker

    poller = threading.Thread(target=poll_other, daemon=True)
    poller.start()
    assert wait_for(lambda: other_holds, timeout_s=30), "the other member got nothing"
    warned: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: warned.append(r.getMessage())
    logging.getLogger("streambandit").addHandler(handler)
    w = Worker(cfg, DirectoryStore(tmp_path / "snapshots"), instance_id="split")
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert wait_for(lambda: any("only one input" in m for m in warned), timeout_s=60), (
            "no partition was split"
        )
        whole = set(w.partitions)  # served: recovered, both inputs assigned
        assert whole and whole != {0, 1}, whole
        expected = sorted(e for e, p in partition_of.items() if p in whole)

        def decided() -> list[str]:
            return sorted(a.event_id for a in outputs(broker, topics, "g-split")["actions"])

        assert wait_for(lambda: decided() == expected, timeout_s=30), decided()
        time.sleep(1)  # and, a while later, still none of the split partition's contexts
        assert decided() == expected
        stop_other.set()
        poller.join(30)
        assert wait_for(
            lambda: len(outputs(broker, topics, "g-split")["actions"]) == 40, timeout_s=60
        ), "the partition was not served once whole"
        assert decided() == sorted(partition_of)  # each once
    finally:
        logging.getLogger("streambandit").removeHandler(handler)
        stop_other.set()
        w.stop()
        t.join(30)


def test_a_member_that_gives_partitions_up_wakes_the_fetchers_of_those_it_keeps(
    broker, topics, tmp_path
):
    """Under the consumer protocol a member keeps what it does not give up, but librdkafka pauses
    its whole assignment while the revoke callback runs, and a fetcher that saw the pause sleeps
    up to a second before it fetches the kept partitions again (``Worker._wake_fetchers``). A
    worker that gives a partition up to a joining one sends one request to the leader of what it
    keeps (one broker here), and goes on deciding the kept partition's contexts. Under the eager
    protocol (the embedded broker) it keeps nothing through the rebalance and sends none."""
    prod = producer(broker)
    rng = np.random.default_rng(5)

    def send_contexts(tag: str, n: int) -> dict[str, int]:
        sent = {}
        for i in range(n):
            ev = Context(
                f"{tag}{i}", f"m-{i % 8}", 1000 + i, ("a", "b"), rng.standard_normal((2, 3))
            )
            sent[ev.event_id] = send_tracked(
                prod, topics.contexts, ev.model_key.encode(), encode(ev)
            )
        prod.flush()
        return {e: s.partition for e, s in sent.items()}

    def decided() -> set[str]:
        return {a.event_id for a in outputs(broker, topics, "g-wake")["actions"]}

    first = send_contexts("e", 20)
    assert set(first.values()) == {0, 1}

    def start(instance: str) -> tuple[Worker, threading.Thread]:
        w = Worker(
            _config(broker, group_id="g-wake", topics=topics),
            DirectoryStore(tmp_path / "s"),
            instance_id=instance,
        )
        t = threading.Thread(target=w.run, daemon=True)
        t.start()
        return w, t

    a, ta = start("a")
    b = tb = None
    try:
        assert wait_for(lambda: decided() == set(first), timeout_s=60), "A did not serve both"
        assert a.metrics["fetcher_wakes"] == 0  # no rebalance has taken anything from A yet
        b, tb = start("b")
        assert wait_for(lambda: len(a.partitions) == 1 and len(b.partitions) == 1, timeout_s=60), (
            a.partitions.keys(),
        )
        later = send_contexts("f", 20)
        assert wait_for(lambda: set(later) <= decided(), timeout_s=60), "not every context decided"
        if is_tansu(broker):
            assert a.metrics["fetcher_wakes"] == 0  # eager: every partition was revoked
        else:
            assert a.metrics["revokes"] >= 1
            assert a.metrics["fetcher_wakes"] >= 1  # the one broker leading what A kept
    finally:
        for w, t in ((b, tb), (a, ta)):
            if w is not None:
                w.stop()
                t.join(30)
