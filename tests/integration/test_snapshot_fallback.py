"""A snapshot that cannot be used is reported and the worker falls back (the previous snapshot,
then the whole joined log), never to silently fresh models; on each broker."""

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.stream.worker import Worker, WorkerError
from streambandit.wire import Context, Reward

from .helpers import outputs, producer, run_in_thread, same_state, send, wait_for

pytestmark = pytest.mark.integration

N = 80


def models(**hyper):
    return parse_models_config(
        {
            "models": [
                {
                    "match": "m-*",
                    "policy": "oful",
                    "dim": hyper.pop("dim", 3),
                    "hyper": hyper,
                    "reward_window_ms": 50,
                    "default_reward": 0.0,
                }
            ]
        }
    )


def run(broker, topics, snap_dir, group, config, until):
    """A worker until ``until(worker)`` holds (or it fails); stopped cleanly. Returns it and its error."""
    w = Worker(
        WorkerConfig(
            bootstrap_servers=broker.bootstrap_servers,
            models=config,
            group_id=group,
            topics=topics,
            idle_tick_ms=200,
        ),
        DirectoryStore(snap_dir),
    )
    t, failure = run_in_thread(w)
    try:
        wait_for(lambda: failure or until(w), timeout_s=60)
    finally:
        w.stop()
        t.join(30)
    return w, (failure[0] if failure else None)


def model_states(snap_dir):
    store = DirectoryStore(snap_dir).scoped("g")
    return {
        key: state
        for p in (0, 1)
        if (s := load_latest(store, p))
        for key, state in s["engine"]["models"].items()
    }


@pytest.fixture
def learned(broker, topics, tmp_path):
    """One run to the end of a short stream: every context joined, snapshots on disk."""
    prod, rng = producer(broker), np.random.default_rng(3)
    for i in range(N):
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", f"m-{i % 4}", 1000 + 10 * i, ("a", "b"), rng.standard_normal((2, 3))),
        )
        if i % 3 == 0:
            send(
                prod,
                topics.rewards,
                Reward(f"e{i}", f"m-{i % 4}", 1000 + 10 * i + 5, float(rng.random())),
            )
    prod.flush()
    snaps = tmp_path / "snaps"
    w, err = run(broker, topics, snaps, "g", models(), until=lambda w: w.metrics["joined"] >= N)
    assert err is None and w.metrics["joined"] == N
    return snaps, model_states(snaps)


def test_a_corrupt_latest_snapshot_falls_back_to_the_previous_one(broker, topics, learned):
    snaps, before = learned
    for p in (0, 1):  # damage the latest snapshot of each partition (a flipped byte fails the CRC)
        f = snaps / "g" / f"p{p}.snap"
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    w, err = run(broker, topics, snaps, "g", models(), until=lambda w: len(w.partitions) == 2)
    assert err is None
    after = model_states(
        snaps
    )  # what the restarted worker rebuilt (from .prev + the logs) and saved
    assert before.keys() == after.keys() and len(before) == 4
    assert all(same_state(before[k], after[k]) for k in before)


def test_a_snapshot_of_another_configuration_is_refused_and_the_joined_log_rebuilds_the_models(
    broker, topics, learned
):
    snaps, before = learned
    w, err = run(
        broker, topics, snaps, "g", models(lam=2.0), until=lambda w: len(w.partitions) == 2
    )
    assert err is None
    # The latest snapshot of each partition holds lam = 1 models and is refused; the previous one
    # is the empty snapshot of the first assignment, which fits and replays the log from offset 0.
    assert w.metrics["snapshot_fallbacks"] == 2
    # Expected: fresh lam = 2 models fed the joined log in order.
    expected = {}
    for j in outputs(broker, topics, "g")["joined"]:
        p = expected.setdefault(j.model_key, make_policy("oful", dim=3, lam=2.0))
        p.update(j.features, j.reward)
    after = model_states(snaps)
    assert after.keys() == expected.keys() and len(after) == 4
    assert all(same_state(after[k], expected[k].state_dict()) for k in after)
    assert not any(
        same_state(after[k], before[k]) for k in after
    )  # really rebuilt, not the old state


def test_a_log_that_fits_no_configuration_stops_the_worker_with_a_clear_error(
    broker, topics, learned
):
    snaps, _ = learned
    _, err = run(broker, topics, snaps, "g", models(dim=4), until=lambda w: len(w.partitions) == 2)
    assert isinstance(err, WorkerError)
    assert "does not fit the model configuration" in str(err)
