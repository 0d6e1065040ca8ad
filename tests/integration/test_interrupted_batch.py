"""A worker stopped by an error in the middle of a batch leaves nothing the next owner cannot use.

A fatal producer error (a fenced transactional id, say) is raised after the batch was processed
but before it committed. The worker's state is then ahead of the committed log; the worker must
not save it as a snapshot on its way out (it would not fit the committed offsets, and recovery
would have to pass over it), and a new worker must resume from the last good snapshot and the log
and produce every output exactly once.
"""

import gc
import threading

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.snapshots import DirectoryStore, usable_snapshots
from streambandit.stream.worker import Worker

from .helpers import (
    assert_numbered_once,
    committed_offsets,
    outputs,
    producer,
    run_in_thread,
    send_numbered,
    wait_for,
)

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {"match": "m-*", "policy": "oful", "dim": 3, "reward_window_ms": 200, "default_reward": 0.0}
    ]
}


class _FailingCommit:
    """The worker's producer, whose ``fail_at``-th commit aborts the transaction and then raises
    a fatal error, as librdkafka does for a fenced producer."""

    def __init__(self, producer, fail_at: int) -> None:
        self._producer, self._left = producer, fail_at

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def commit_transaction(self, *args):
        self._left -= 1
        if self._left == 0:
            self._producer.abort_transaction(30)  # leave no open transaction behind on the broker
            raise KafkaException(
                KafkaError(KafkaError._FENCED, "injected: producer fenced", fatal=True)
            )
        return self._producer.commit_transaction(*args)


def test_a_fatal_error_mid_batch_leaves_no_snapshot_ahead_of_the_log(broker, topics, tmp_path):
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id="g-interrupted",
        topics=topics,
        merge_wait_ms=1000,
        idle_tick_ms=300,
    )
    store = DirectoryStore(tmp_path / "snapshots")
    prod, rng = producer(broker), np.random.default_rng(0)

    # 1. A worker commits a first batch, then dies with a fatal error on a later commit.
    send_numbered(prod, topics, rng, 0, 100, t0_ms=1000)
    w = Worker(cfg, store)
    w.transaction.producer = _FailingCommit(w.transaction.producer, fail_at=10**9)
    t, errors = run_in_thread(w)
    assert wait_for(
        lambda: len(outputs(broker, topics, "g-interrupted")["joined"]) >= 100, timeout_s=60
    )
    ours = store.scoped("g-interrupted")
    before = {p: [s["created_ms"] for s in usable_snapshots(ours, p)] for p in (0, 1)}
    w.transaction.producer._left = 1  # the next commit fails
    # Far ahead in event time: the idle ticks in between moved the watermark on by the wall time.
    send_numbered(prod, topics, rng, 100, 100, t0_ms=10**9)
    t.join(60)
    assert not t.is_alive() and errors and "fatal producer error" in str(errors[0])
    # Nothing was snapshotted on the way out. Snapshots may have been taken between the two
    # batches (of committed state, so legitimate: scheduled ones, and an idle partition's at the
    # end of its input, which may replace those of ``before``); every snapshot there is, old or
    # new, lies at or behind the offsets the group committed, never ahead of them.
    after = {p: list(usable_snapshots(ours, p)) for p in (0, 1)}
    assert all(before[p] and after[p] for p in (0, 1))
    # The dead worker's Kafka clients go now, while the broker answers (the error's traceback
    # holds the worker; destroyed after the broker stopped, they would log lost connections).
    # Before that, the group's coordinator answers an offset fetch only at its timeout.
    errors.clear()
    del w, t
    gc.collect()
    committed = {
        name: committed_offsets(broker, "g-interrupted", getattr(topics, name))
        for name in ("contexts", "rewards")
    }
    for p in (0, 1):
        for snap in after[p]:
            assert snap["contexts_offset"] <= committed["contexts"][p]
            assert snap["rewards_offset"] <= committed["rewards"][p]
    # The failed batch's offsets were not committed: the first batch's are all there are.
    assert sum(committed["contexts"].values()) == 100

    # 2. A new worker recovers and finishes the job: every context decided and joined once.
    w2 = Worker(cfg, store)
    t2 = threading.Thread(target=w2.run, daemon=True)
    t2.start()
    try:
        assert wait_for(
            lambda: len(outputs(broker, topics, "g-interrupted")["joined"]) >= 200, timeout_s=60
        )
    finally:
        w2.stop()
        t2.join(30)
    assert_numbered_once(outputs(broker, topics, "g-interrupted"), 200)
