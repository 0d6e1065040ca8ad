"""The consumer group protocol a worker joins with, on each broker: the consumer protocol
(KIP-848, incremental) where the broker offers it, the classic one elsewhere or when the
configuration says so; and static membership on Apache Kafka, where a member restarted within
the session gets its partitions back and the others see no rebalance."""

import re
import signal
import time
import uuid

import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.stream.kafka_checks import choose_group_protocol

from .helpers import (
    held_partitions,
    is_tansu,
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
    import datetime

    return [
        line
        for line in text.splitlines()
        if re.search(pattern, line)
        and datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp() > since
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
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        contexts=f"c-{tag}",
        rewards=f"r-{tag}",
        actions=f"a-{tag}",
        joined=f"j-{tag}",
        dead_letter=f"d-{tag}",
    )
    broker.create_topics(topics.all(), partitions=8)
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
        return sorted(p for n in names for p in held_partitions(logs[n])) == list(range(8))

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
