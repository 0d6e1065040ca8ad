"""A batch's transaction is visible before its offsets join it, and a frozen batch is not committed.

A worker frozen inside a batch (SIGSTOP, a paused VM) may have lost its partitions to another
member by the time it runs again, and librdkafka learns of that only after a heartbeat. Two things
keep such a zombie's batch out of the logs (stream/transaction.py, step 3): every record of the
batch is delivered before the offsets join the transaction, so a next owner's recovery sees the
transaction open on its output logs and waits for it; and a batch during which the process stood
still for more than half the group session is aborted and read again instead of committed.

The freeze itself is stood in for: the worker's freeze watch reports one long gap inside one
batch's commit. Everything else is the real worker on the real broker.
"""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker

from .faults import TransactionProbe
from .helpers import assert_numbered_once, outputs, producer, run_in_thread, send_numbered, wait_for

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {"match": "m-*", "policy": "oful", "dim": 3, "reward_window_ms": 200, "default_reward": 0.0}
    ]
}


class _Probed:
    """The worker's producer, which notes the output partitions of the open transaction and, when
    its offsets join it, where the broker shows a transaction open."""

    def __init__(self, producer, probe: TransactionProbe) -> None:
        self._producer, self._probe = producer, probe
        self._probed = {tp.topic for tp in probe.tps}
        self.written: set[tuple[str, int]] = set()
        self.seen: list[tuple[set, set]] = []  # (partitions written, partitions shown open)

    def __getattr__(self, name):
        return getattr(self._producer, name)

    def produce(self, topic, value, key, partition):
        if topic in self._probed:  # not the ticks a worker writes to its own rewards topic
            self.written.add((topic, partition))
        return self._producer.produce(topic, value, key, partition)

    def send_offsets_to_transaction(self, *args):
        shown = {(tp.topic, tp.partition) for tp in self._probe.held()}
        self.seen.append((set(self.written), shown))
        return self._producer.send_offsets_to_transaction(*args)

    def commit_transaction(self, *args):
        self.written.clear()
        return self._producer.commit_transaction(*args)

    def abort_transaction(self, *args):
        self.written.clear()
        return self._producer.abort_transaction(*args)


class _FreezesOnce:
    """The worker's freeze watch; once armed, the next batch commit that asks it (a transaction
    open) hears that the process stood still for a whole group session."""

    def __init__(self, worker: Worker) -> None:
        self._worker, self._watch = worker, worker._freeze
        self.armed = self.fired = False

    def reset(self) -> None:
        self._watch.reset()

    def close(self) -> None:
        self._watch.close()

    def longest_gap_s(self) -> float:
        if self.armed and self._worker.transaction.open:
            self.armed, self.fired = False, True
            return self._worker._session_s
        return self._watch.longest_gap_s()


def test_a_batch_frozen_for_half_a_session_is_aborted_and_read_again(broker, topics, tmp_path):
    group = "g-frozen"
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id=group,
        topics=topics,
        merge_wait_ms=1000,
        idle_tick_ms=300,
    )
    prod, rng = producer(broker), np.random.default_rng(0)
    probe = TransactionProbe(broker, topics)
    w = Worker(cfg, DirectoryStore(tmp_path / "snapshots"))
    w.transaction.producer = probed = _Probed(w.transaction.producer, probe)
    w._freeze = freeze = _FreezesOnce(w)
    t, errors = run_in_thread(w)
    try:
        send_numbered(prod, topics, rng, 0, 100, t0_ms=1000)
        assert wait_for(lambda: len(outputs(broker, topics, group)["actions"]) >= 100, 60)
        aborts = w.metrics["transaction_aborts"]
        freeze.armed = True
        send_numbered(prod, topics, rng, 100, 100, t0_ms=10**9)
        assert wait_for(lambda: len(outputs(broker, topics, group)["joined"]) >= 200, 60)
    finally:
        w.stop()
        t.join(30)
        probe.close()
    assert not errors, errors
    # The frozen batch was aborted once, and read again: it committed on the next try.
    assert freeze.fired and w.metrics["transaction_aborts"] == aborts + 1
    # Every transaction showed open on every partition it wrote before its offsets joined it.
    assert probed.seen and all(written <= shown for written, shown in probed.seen), [
        (sorted(written - shown)) for written, shown in probed.seen if not written <= shown
    ]
    assert_numbered_once(outputs(broker, topics, group), 200)
