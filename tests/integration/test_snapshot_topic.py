"""Snapshots in a compacted topic (TopicStore) on each broker: chunking, the two
alternating slots, and the fallback to the previous snapshot when the latest is unusable."""

import logging
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

from streambandit.stream.snapshots import (
    SnapshotStoreError,
    TopicStore,
    chunk_key,
    create_snapshot_topic,
    load_latest,
)

from .helpers import packed_snapshot, read_all

pytestmark = pytest.mark.integration

CHUNK = 1024


def stored(store, partition):
    """The store's candidate snapshots of ``partition`` as bytes (it hands out mappings)."""
    return [bytes(d) for d in store.candidates(partition)]


@pytest.fixture
def snap_topic(broker):
    name = f"snapshots-{uuid.uuid4().hex[:8]}"
    assert create_snapshot_topic(broker.bootstrap_servers, name, partitions=2)
    return name


@pytest.fixture
def open_store(broker, snap_topic):
    """Opens TopicStores on the test's topic (each one a separate reader, like a separate worker)."""
    opened = []

    def open_(cls=TopicStore, **kw):
        s = cls(
            broker.bootstrap_servers,
            snap_topic,
            max_chunk_bytes=kw.pop("max_chunk_bytes", CHUNK),
            **kw,
        )
        opened.append(s)
        return s

    yield open_
    for s in opened:
        s.close()


def blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def snapshot(partition: int, mark: int, size: int = 8) -> bytes:
    return packed_snapshot(partition, mark, size)


def latest_values(broker, topic: str) -> dict[bytes, bytes | None]:
    """What compaction would keep: the last value of each key (None: a tombstone)."""
    return {m.key(): m.value() for m in read_all(broker, topic)}


def test_create_snapshot_topic_is_compacted_and_leaves_an_existing_one_alone(broker, snap_topic):
    assert not create_snapshot_topic(broker.bootstrap_servers, snap_topic, partitions=2)
    admin = broker.admin()
    res = ConfigResource(ConfigResource.Type.TOPIC, snap_topic)
    assert admin.describe_configs([res])[res].result(10)["cleanup.policy"].value == "compact"
    assert len(admin.list_topics(timeout=10).topics[snap_topic].partitions) == 2


def test_round_trip_newest_first_and_co_partitioned(broker, snap_topic, open_store):
    s = open_store()
    a, b, c = blob(100, 1), blob(3000, 2), b""
    assert stored(s, 0) == []
    s.save(0, a)
    assert stored(s, 0) == [a]
    s.save(0, b)
    assert stored(s, 0) == [b, a]
    s.save(0, c)
    assert stored(s, 0) == [c, b]  # the oldest slot was the one overwritten
    assert stored(open_store(), 0) == [c, b]  # another process sees the same
    # Snapshot p went to partition p of the topic, so its owner reads only its own.
    assert {m.partition() for m in read_all(broker, snap_topic)} == {0}


def test_a_snapshot_of_many_chunks_round_trips_byte_exact(broker, snap_topic, open_store):
    s = open_store()
    data = blob(5 * CHUNK + 123, 3)
    s.save(1, data)
    assert stored(open_store(), 1) == [data]
    chunks = [m for m in read_all(broker, snap_topic) if m.key().startswith(b"p1/s")]
    assert len(chunks) == 6 and all(len(m.value()) <= CHUNK + 64 for m in chunks)
    # A real snapshot through load_latest, with the default chunk size (2 MB: above Kafka's 1 MB
    # default message limit, so only chunking lets it through a stock cluster).
    big = snapshot(1, mark=7, size=250_000)
    assert len(big) > 1_900_000
    t = open_store(max_chunk_bytes=512 * 1024)
    t.save(1, big)
    got = load_latest(open_store(), 1)
    assert got["created_ms"] == 7
    assert (
        got["engine"]["models"]["m"]["theta"].tobytes()
        == np.random.default_rng(7).standard_normal(250_000).tobytes()
    )


class Killed(Exception):
    pass


class CrashingStore(TopicStore):
    """Dies (as a killed process would) after producing ``crash_after`` records of its next save."""

    crash_after = 2

    def _produce(self, tp, key, value, on_delivery):
        if self.crash_after == 0:
            self._producer.flush(10)
            raise Killed("killed mid-save")
        self.crash_after -= 1
        super()._produce(tp, key, value, on_delivery)


def test_a_save_that_died_halfway_falls_back_to_the_previous_snapshot(
    broker, snap_topic, open_store, caplog
):
    a, b = snapshot(0, mark=1, size=2000), snapshot(0, mark=2, size=2000)
    assert len(b) > 4 * CHUNK
    s = open_store()
    s.save(0, a)
    s.save(0, b)
    crashing = open_store(cls=CrashingStore)
    crashing.candidates(0)  # as at assignment
    with pytest.raises(Killed):
        crashing.save(0, snapshot(0, mark=3, size=2000))
    fresh = open_store()
    with caplog.at_level(logging.ERROR, logger="streambandit"):
        assert stored(fresh, 0) == [b]  # the torn save overwrote a's slot, never b's
        assert load_latest(fresh, 0)["created_ms"] == 2
    assert "incomplete" in caplog.text
    # The next save goes into the torn slot again: b survives until there is a newer good one.
    d = snapshot(0, mark=4)
    fresh.save(0, d)
    assert stored(open_store(), 0) == [d, b]


def test_a_corrupt_chunk_is_reported_and_the_previous_snapshot_used(
    broker, snap_topic, open_store, caplog
):
    a, b = snapshot(0, mark=1, size=2000), snapshot(0, mark=2, size=2000)
    s = open_store()
    s.save(0, a)
    s.save(0, b)  # slot 1
    key = chunk_key(0, 1, 2)
    value = bytearray(latest_values(broker, snap_topic)[key])
    value[-10] ^= 0x01  # one bit of the payload: the header stays valid
    prod = Producer({"bootstrap.servers": broker.bootstrap_servers})
    prod.produce(snap_topic, key=key, value=bytes(value), partition=0)
    assert prod.flush(10) == 0
    with caplog.at_level(logging.ERROR, logger="streambandit"):
        fresh = open_store()
        assert stored(fresh, 0) == [a]
        assert load_latest(fresh, 0)["created_ms"] == 1
    assert "checksum mismatch" in caplog.text


def test_a_snapshot_labelled_for_another_partition_is_skipped(
    broker, snap_topic, open_store, caplog
):
    s = open_store()
    s.save(0, snapshot(0, mark=1))
    s.save(0, snapshot(1, mark=2))  # intact, but not partition 0's
    with caplog.at_level(logging.ERROR, logger="streambandit"):
        assert load_latest(open_store(), 0)["created_ms"] == 1
    assert "labelled partition=1" in caplog.text


def test_a_smaller_snapshot_after_a_larger_one_in_the_same_slot(broker, snap_topic, open_store):
    s = open_store()
    large, mid, small = blob(4 * CHUNK + 1, 1), blob(10, 2), blob(20, 3)
    s.save(0, large)  # slot 0: 5 chunks
    s.save(0, mid)  # slot 1
    crashing = open_store(cls=CrashingStore)
    crashing.crash_after = 1
    with pytest.raises(Killed):  # slot 0 again: its 1 chunk written, killed before the tombstones
        crashing.save(0, small)
    # The larger save's chunks 1-4 are still there; the new chunk's count leaves them out.
    assert stored(open_store(), 0) == [small, mid]
    t = open_store()
    t.save(0, mid)  # slot 1
    t.save(0, large[:5])  # slot 0: now its stale chunks are tombstoned, so compaction drops them
    assert stored(open_store(), 0) == [large[:5], mid]
    last = latest_values(broker, snap_topic)
    assert [last[chunk_key(0, 0, i)] for i in range(1, 5)] == [None] * 4
    assert last[chunk_key(0, 0, 0)] is not None


def test_partitions_do_not_see_each_others_snapshots(broker, snap_topic, open_store):
    s = open_store()
    data = {p: blob(2 * CHUNK + p, 10 + p) for p in range(3)}
    for p in (0, 1, 2):  # partition 2 shares the topic's partition 0 (the topic has only 2)
        s.save(p, data[p])
    s.save(0, blob(5, 99))
    t = open_store()
    assert stored(t, 1) == [data[1]]
    assert stored(t, 2) == [data[2]]
    assert stored(t, 0) == [blob(5, 99), data[0]]
    by_partition = {}
    for m in read_all(broker, snap_topic):
        by_partition.setdefault(m.partition(), set()).add(m.key().split(b"/")[0])
    assert by_partition == {0: {b"p0", b"p2"}, 1: {b"p1"}}


def test_a_missing_snapshot_topic_is_a_clear_error(broker, tmp_path):
    with pytest.raises(SnapshotStoreError, match="snapshot topic 'no-such-topic' does not exist"):
        TopicStore(broker.bootstrap_servers, "no-such-topic")
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        '[worker]\nsnapshot_topic = "no-such-topic"\n\n'
        '[[models]]\nmatch = "*"\npolicy = "oful"\ndim = 2\nreward_window_ms = 100\ndefault_reward = 0.0\n'
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "--bootstrap-servers",
            broker.bootstrap_servers,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 2, out.stderr
    assert (
        "snapshot topic 'no-such-topic' does not exist" in out.stderr
        and "Traceback" not in out.stderr
    )
    assert (
        "no-such-topic" not in broker.admin().list_topics(timeout=10).topics
    )  # and it was not created


def test_a_store_takes_the_workers_kafka_table_with_its_sub_tables(open_store):
    """The worker's [kafka] table, [kafka.consumer] and [kafka.producer] included, configures the
    store's clients (each sub-table to its own client): serve with snapshot_topic failed to start
    with 'No such configuration property: "consumer"'."""
    store = open_store(
        kafka={
            "client.id": "sb-test",
            "consumer": {"fetch.wait.max.ms": 10},
            "producer": {"linger.ms": 1},
        }
    )
    data = snapshot(0, 7)
    store.save(0, data)
    assert load_latest(store, 0)["created_ms"] == 7
