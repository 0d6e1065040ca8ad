"""The worker end to end on each broker: decisions, joins, windows, exactly-once."""

import threading

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker
from streambandit.wire import Context, Reward

from .helpers import outputs, producer, send, wait_for

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {
            "match": "m-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 500,
            "default_reward": 0.0,
            "aggregation": "first",
        }
    ]
}


def start_worker(broker, topics, tmp_path, group, **overrides):
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id=group,
        topics=topics,
        **overrides,
    )
    w = Worker(cfg, DirectoryStore(tmp_path / "snapshots"))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def test_every_context_gets_exactly_one_action_and_rewards_are_joined(broker, topics, tmp_path):
    prod = producer(broker)
    rng = np.random.default_rng(0)
    n = 200
    for i in range(n):
        send(
            prod,
            topics.contexts,
            Context(
                f"e{i}", f"m-{i % 4}", 1000 + 10 * i, ("a", "b", "c"), rng.standard_normal((3, 3))
            ),
        )
        if i % 2 == 0:
            send(prod, topics.rewards, Reward(f"e{i}", f"m-{i % 4}", 1000 + 10 * i + 50, 1.0))
    prod.flush()
    # merge_wait_ms: rewards are 50 ms of event time behind their contexts; a rewards fetch that
    # lags the contexts fetch by more than the wait would make them late (a race, not the subject).
    w, t = start_worker(broker, topics, tmp_path, "g-e2e", idle_tick_ms=300, merge_wait_ms=1000)
    try:
        assert wait_for(lambda: len(outputs(broker, topics, "g-e2e")["joined"]) >= n, timeout_s=60)
    finally:
        w.stop()
        t.join(30)
    out = outputs(broker, topics, "g-e2e")
    ids = [a.event_id for a in out["actions"]]
    assert sorted(ids) == sorted(f"e{i}" for i in range(n)) and len(ids) == len(set(ids))
    joined = {j.event_id: j for j in out["joined"]}
    assert len(joined) == n
    assert all(joined[f"e{i}"].reward_observed == (i % 2 == 0) for i in range(n))
    assert out["dead_letter"] == []
    assert w.metrics["transactions"] > 0 and w.metrics["ticks"] > 0


def test_what_lives_as_long_as_the_worker_is_out_of_the_collectors_walks(broker, topics, tmp_path):
    """After start-up and each recovery the worker freezes what is alive (``freeze_long_lived``):
    a full collection then walks only what was allocated since, not the imported modules or a
    recovered partition's engine (a walk of those was a ~70 ms pause in the middle of a batch)."""
    import gc

    import streambandit.numerics.kernels

    def engines_frozen() -> bool:
        # A partition is held (in w.partitions) a moment before the freeze that follows its
        # recovery: wait for the freeze rather than look in between.
        walked = {id(o) for o in gc.get_objects()}
        return all(
            id(part.engine) not in walked and id(part.engine.models) not in walked
            for part in list(w.partitions.values())
        )

    w, t = start_worker(broker, topics, tmp_path, "g-freeze")
    try:
        assert wait_for(lambda: len(w.partitions) == 2, timeout_s=60)
        assert gc.get_freeze_count() > 0
        walked = {id(o) for o in gc.get_objects()}
        assert (
            id(streambandit.numerics.kernels.oful_update) not in walked
        )  # a module-level object, alive since import
        assert wait_for(engines_frozen, timeout_s=10)
    finally:
        w.stop()
        t.join(30)
        gc.unfreeze()  # the rest of the test session collects as usual


def test_a_static_member_joins_under_its_transactional_id_and_serves(broker, topics, tmp_path):
    """``static_membership``: the consumer is a static member (KIP-345) named by the worker's
    transactional id, and the worker decides as any other. (That a restart within the session
    timeout keeps the assignment is the broker's part; the embedded one rebalances anyway.)"""
    prod = producer(broker)
    rng = np.random.default_rng(1)
    for i in range(20):
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", f"m-{i % 4}", 1000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3))),
        )
    prod.flush()
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id="g-static",
        topics=topics,
        static_membership=True,
    )
    w = Worker(cfg, DirectoryStore(tmp_path / "snapshots"), instance_id="pod-0")
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert wait_for(
            lambda: len(outputs(broker, topics, "g-static")["actions"]) == 20, timeout_s=60
        )
        if w.protocol.incremental:
            # Apache Kafka: the consumer protocol (KIP-848), whose member ids are the client's
            # UUIDs; the group's description gives each member's instance id.
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            described = admin.describe_consumer_groups(["g-static"])["g-static"].result(10)
            assert [m.group_instance_id for m in described.members] == [w.transactional_id]
        else:
            # The classic protocol: librdkafka names a static member after its instance id
            # (read by the worker's thread: a call on the consumer from this one, while the
            # loop polls it, can block for good)
            assert "pod-0" in w.member_id
    finally:
        w.stop()
        t.join(30)
