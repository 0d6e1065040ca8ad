"""The snapshot writer (stream/snapshot_writer.py): a snapshot taken by a forked child is the
same bytes as one copied on the loop, is the state of the moment of the fork whatever the loop
does next, reports a failed write, and dies with its parent."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from streambandit.engine.partition import PartitionEngine
from streambandit.stream.snapshot_writer import (
    CAN_FORK,
    ChildFailed,
    SnapshotWriter,
    _wait_for_child,
)
from streambandit.stream.snapshots import DirectoryStore
from streambandit.wire import pack_snapshot
from tests.unit.engine.test_chains import CONFIG, KEYS, Stream

pytestmark = pytest.mark.skipif(not CAN_FORK, reason="snapshots are forked on Linux only")


def head(chain, seq, offset=5):
    return {
        "partition": 3,
        "created_ms": 1234,
        "contexts_offset": offset,
        "rewards_offset": offset,
        "actions_offset": offset,
        "joined_offset": offset,
        "dead_letter_offset": 0,
        "chain": chain,
        "seq": seq,
    }


def fed_engine(n=1500):
    engine, stream = PartitionEngine(CONFIG), Stream()
    stream.feed(engine, n, KEYS)
    engine.take_changed()
    return engine, stream


def stored(tmp_path, name, partition=3):
    return (tmp_path / name / f"p{partition}.snap").read_bytes()


def test_a_forked_base_and_increment_are_the_bytes_of_the_ones_copied_on_the_loop(tmp_path):
    engine, stream = fed_engine()
    counts = {}
    for how in ("thread", "fork"):
        store = DirectoryStore(tmp_path / how)
        counts[how] = metrics = {}
        writer = SnapshotWriter(store, metrics)
        writer.submit(
            3, head(7, 0) | {"engine": engine.snapshot()}
        ) if how == "thread" else writer.submit_forked(3, head(7, 0), engine, None)
        writer.close()
        assert writer.take_failures() == {}
    assert stored(tmp_path, "thread") == stored(tmp_path, "fork")
    assert counts["fork"]["snapshot_forks"] == 1 and counts["thread"]["snapshot_forks"] == 0
    assert counts["fork"]["snapshot_bases"] == 1 and counts["fork"]["snapshot_bytes"] == len(
        stored(tmp_path, "fork")
    )

    stream.feed(engine, 100, KEYS[:8])
    changed = sorted(engine.take_changed())
    for how in ("thread", "fork"):
        writer = SnapshotWriter(DirectoryStore(tmp_path / how), {})
        writer.submit(
            3, head(7, 1, 6) | {"engine": engine.snapshot(changed)}
        ) if how == "thread" else writer.submit_forked(3, head(7, 1, 6), engine, changed)
        writer.close()
        assert writer.take_failures() == {}
    assert (tmp_path / "thread/p3.inc/7-1").read_bytes() == (
        tmp_path / "fork/p3.inc/7-1"
    ).read_bytes()


def test_a_forked_snapshot_is_the_state_at_the_fork_while_the_loop_goes_on(tmp_path):
    engine, stream = fed_engine()
    expected = pack_snapshot(head(1, 0) | {"engine": engine.snapshot()})
    writer = SnapshotWriter(DirectoryStore(tmp_path / "s"), {})
    writer.submit_forked(3, head(1, 0), engine, None)
    stream.feed(engine, 500, KEYS)  # the parent changes models, opens and closes decisions
    assert engine.take_changed()
    writer.close()
    assert stored(tmp_path, "s") == expected
    assert stored(tmp_path, "s") != pack_snapshot(head(1, 0) | {"engine": engine.snapshot()})


class FailingStore(DirectoryStore):
    def save(self, partition, data):
        raise OSError(28, "No space left on device")


def test_a_child_that_cannot_store_is_a_failure_reported_to_the_loop(tmp_path):
    engine, _ = fed_engine(200)
    metrics = {}
    writer = SnapshotWriter(FailingStore(tmp_path / "s"), metrics)
    writer.submit_forked(3, head(1, 0), engine, None)
    writer.close()
    failures = writer.take_failures()
    assert list(failures) == [3] and "No space left on device" in failures[3]
    assert metrics["snapshot_failures"] == 1 and metrics["snapshots"] == 0
    assert not (tmp_path / "s/p3.snap").exists()


class TopicLike(DirectoryStore):
    """A store a child may not use (as the snapshot topic's producer): it records who saved."""

    fork_safe = False

    def __init__(self, path):
        super().__init__(path)
        self.savers = []

    def save(self, partition, data):
        self.savers.append(os.getpid())
        super().save(partition, data)


def test_into_a_store_a_child_may_not_use_the_child_sends_the_bytes_and_the_writer_stores_them(
    tmp_path,
):
    engine, stream = PartitionEngine(CONFIG), Stream()
    stream.feed(engine, 40_000, [f"{g}-{i}" for g in "go" for i in range(10_000)])
    expected = pack_snapshot(head(2, 0) | {"engine": engine.snapshot()})
    assert len(expected) > 4 << 20  # several times what a pipe holds: read in many pieces
    store, metrics = TopicLike(tmp_path / "t"), {}
    writer = SnapshotWriter(store, metrics)
    writer.submit_forked(3, head(2, 0), engine, None)
    stream.feed(engine, 300, KEYS)  # the loop goes on; the snapshot is the state at the fork
    writer.close()
    assert writer.take_failures() == {}
    assert store.savers == [os.getpid()] and stored(tmp_path, "t") == expected
    assert metrics["snapshot_forks"] == 1 and metrics["snapshot_bytes"] == len(expected)


def test_a_child_that_sends_fewer_bytes_than_it_announced_fails():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, b"ok 100 1 0\n" + bytes(40))
        os._exit(0)
    os.close(write_end)
    with pytest.raises(ChildFailed, match="sent 40 of its 100 bytes"):
        _wait_for_child(pid, read_end, limit_s=30.0, with_data=True)


def alive(pid):
    """Running (not gone, not a zombie waiting for a reaper that is not ours)."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_the_child_dies_with_its_parent_and_writes_nothing_after(tmp_path):
    """A worker killed while its child writes: the child must not store a snapshot later, over
    those of the partition's next owner."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {os.getcwd()!r})
        from streambandit.engine.partition import PartitionEngine
        from streambandit.stream.snapshot_writer import SnapshotWriter
        from streambandit.stream.snapshots import DirectoryStore
        from tests.unit.engine.test_chains import CONFIG

        class SlowStore(DirectoryStore):
            def save(self, partition, data):
                print("child saving", flush=True)
                time.sleep(5)
                super().save(partition, data)

        writer = SnapshotWriter(SlowStore({str(tmp_path / "s")!r}), {{}})
        head = {head(1, 0)!r}
        writer.submit_forked(3, head, PartitionEngine(CONFIG), None)
        time.sleep(60)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "child saving"
        children = [
            int(c) for c in open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split()
        ]
        assert len(children) == 1
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 5
        while alive(children[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(children[0]), "the child outlived its parent"
        time.sleep(0.5)
        assert not (tmp_path / "s/p3.snap").exists()
    finally:
        parent.kill()
        parent.wait()


def test_a_child_that_never_finishes_is_killed_and_failed_at_the_limit():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # stuck, as on a lock held at the fork, with the pipe still open
        time.sleep(60)
        os._exit(0)
    os.close(write_end)
    started = time.monotonic()
    with pytest.raises(ChildFailed, match="not done within 1 s"):
        _wait_for_child(pid, read_end, limit_s=1.0)
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)


def test_a_childs_report_is_read_to_its_end():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, b"ok 123 4 5")
        os._exit(0)
    os.close(write_end)
    assert _wait_for_child(pid, read_end, limit_s=30.0) == (123, 4, 5, None)
