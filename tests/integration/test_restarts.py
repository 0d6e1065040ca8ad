"""Restarts that always work, on the real embedded broker: a worker stopped while a batch's
progress has no output of its own (a reward summed into an open window) starts again, and the
reward is applied exactly once."""

import numpy as np
import pytest

from streambandit.models_config import parse_models_config
from streambandit.stream.snapshots import DirectoryStore
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
