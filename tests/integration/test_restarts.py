"""Restarts that always work, on the real embedded broker: a worker stopped while a batch's
progress has no output of its own (a reward summed into an open window) starts again, and the
reward is applied exactly once; a recovery while a dead producer's transaction is open on the
logs waits for it instead of reading too little."""

import threading
import time

import numpy as np
import pytest
from confluent_kafka import Producer

from streambandit.models_config import parse_models_config
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.stream.worker import Worker, WorkerConfig
from streambandit.wire import Context, Reward

from .helpers import outputs, producer, run_in_thread, send, wait_for

pytestmark = pytest.mark.integration

WINDOW_MS = 10_000


def config(broker, topics, group):
    models = parse_models_config({"models": [{"match": "m", "policy": "hvt_ucb", "dim": 3, "reward_window_ms": WINDOW_MS,
                                              "default_reward": 0.0, "aggregation": "sum"}]})
    # No idle ticks: a tick is an output, and would commit the reward's offset along with it.
    return WorkerConfig(bootstrap_servers=broker.bootstrap_servers, models=models, group_id=group, topics=topics,
                        idle_tick_ms=10**9)


def start(broker, topics, group, snaps):
    w = Worker(config(broker, topics, group), DirectoryStore(snaps))
    t, failure = run_in_thread(w)
    assert wait_for(lambda: failure or len(w.partitions) == 2, timeout_s=60), "no assignment"
    assert not failure, failure
    return w, t, failure


def stop(w, t):
    w.stop()
    t.join(30)
    assert not t.is_alive()


def test_a_reward_held_in_an_open_window_survives_a_clean_restart(broker, topics, tmp_path):
    snaps, prod = tmp_path / "snaps", producer(broker)
    feats = np.random.default_rng(0).standard_normal((2, 3)) / 2
    w, t, _ = start(broker, topics, "g", snaps)
    send(prod, topics.contexts, Context("e1", "m", 1_000, ("a", "b"), feats))
    prod.flush()
    assert wait_for(lambda: w.metrics["actions"] == 1, timeout_s=30)
    # Summed into e1's open window: a batch whose only effect is its input offset.
    send(prod, topics.rewards, Reward("e1", "m", 1_500, 0.25))
    prod.flush()
    assert wait_for(lambda: w.metrics["records_in"] == 2, timeout_s=30)
    stop(w, t)

    for restart in range(3):  # and again: no restart may fail because of an earlier one
        w, t, failure = start(broker, topics, "g", snaps)
        send(prod, topics.rewards, Reward("e1", "m", 1_600 + restart, 0.25))  # summed too
        prod.flush()
        assert wait_for(lambda: w.metrics["records_in"] >= 1, timeout_s=30)
        stop(w, t)
        assert not failure, failure

    # A later context closes e1's window: one joined record with every reward summed, once each.
    w, t, failure = start(broker, topics, "g", snaps)
    send(prod, topics.contexts, Context("e2", "m", 1_000 + 2 * WINDOW_MS, ("a", "b"), feats))
    prod.flush()
    assert wait_for(lambda: w.metrics["joined"] >= 1, timeout_s=30)
    stop(w, t)
    assert not failure, failure
    joined = [j for j in outputs(broker, topics, "g")["joined"] if j.event_id == "e1"]
    assert len(joined) == 1 and joined[0].reward_observed and joined[0].reward == 1.0


def test_recovery_waits_for_a_dead_producers_open_transaction(broker, topics, tmp_path):
    """A producer killed inside a transaction on the joined and actions logs (as a worker killed
    mid-batch leaves them): while it is open, the embedded broker reports those logs' committed
    end as 0. A recovery that read "to the end" then would read nothing and continue from fresh
    models. It must wait until the transaction ends (here: the dead producer's restart with its
    transactional id aborts it) and then recover every update."""
    snaps, prod = tmp_path / "snaps", producer(broker)
    rng = np.random.default_rng(1)
    w, t, _ = start(broker, topics, "g2", snaps)
    for i in range(40):
        send(prod, topics.contexts, Context(f"e{i}", "m", 1_000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3)) / 2))
        send(prod, topics.rewards, Reward(f"e{i}", "m", 1_000 + 10 * i + 5, 0.5))
    send(prod, topics.contexts, Context("late", "m", 1_000 + 2 * WINDOW_MS, ("a", "b"), np.zeros((2, 3))))
    prod.flush()
    assert wait_for(lambda: w.metrics["joined"] == 40, timeout_s=60)
    stop(w, t)
    p = next(q for q in (0, 1) if (s := load_latest(DirectoryStore(snaps), q)) and s["engine"]["models"])
    want = load_latest(DirectoryStore(snaps), p)["engine"]
    # Only the logs hold the updates: the snapshots are gone.
    for f in snaps.rglob("*"):
        if f.is_file():
            f.unlink()

    dead = {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": "dead-worker"}
    zombie = Producer(dead)
    zombie.init_transactions(10)
    zombie.begin_transaction()
    for topic in (topics.joined, topics.actions):
        zombie.produce(topic, b"never committed", partition=p)
    zombie.flush(10)

    def restart_the_dead_one():
        time.sleep(8)  # after the new worker joined the group and began recovering
        Producer(dead).init_transactions(10)  # fences the open transaction: the broker aborts it

    threading.Thread(target=restart_the_dead_one, daemon=True).start()
    w = Worker(config(broker, topics, "g2"), DirectoryStore(snaps))
    t, failure = run_in_thread(w)
    assert wait_for(lambda: failure or len(w.partitions) == 2, timeout_s=60)
    assert not failure, failure
    got = w.partitions[p].engine.snapshot()
    stop(w, t)
    assert w.metrics["recovered_joined"] == 40
    assert got["models"].keys() == want["models"].keys()
    for key in want["models"]:
        assert got["models"][key]["n_updates"] == 40
        np.testing.assert_array_equal(got["models"][key]["theta"], want["models"][key]["theta"])
