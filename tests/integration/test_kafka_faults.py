"""Worker faults on Apache Kafka (one node): a worker frozen (SIGSTOP) until the group has moved
its partitions, then resumed, inside a transaction or idle; and the open transactions of dead
producers in front of a killed worker's log, which its restart waits out (fenced, timed out)."""

import datetime
import os
import re
import shutil
import signal
import time

import numpy as np
import pytest

from .faults import (
    Group,
    TransactionProbe,
    assert_same_as_reference,
    backlog,
    make_topics,
    run_reference,
    stop_inside_a_transaction,
)
from .helpers import caught_up, committed_offsets, producer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def snapshots_taken_after(log_text: str, partition: int, wall_s: float) -> list[str]:
    """The log's snapshot lines of ``partition`` whose state was taken after ``wall_s``: logged
    when stored, less their ``age_ms``."""
    found = []
    for m in re.finditer(
        rf"^(\S+ \S+) INFO streambandit snapshot partition={partition} .*age_ms=(\d+).*$",
        log_text,
        re.M,
    ):
        stored = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stored - int(m[2]) / 1000 > wall_s:
            found.append(m[0])
    return found


def test_a_frozen_worker_is_fenced_and_the_group_ends_as_one_undisturbed_worker(
    kafka_broker, tmp_path
):
    """Two workers drain a backlog; one is frozen (SIGSTOP) inside a transaction until its session
    times out and the other is assigned its partition, and resumed before its transaction times
    out. The survivor's recovery of that partition waits for that transaction, the partition
    paused while the survivor's own serves; the zombie's commit is refused (its group generation
    is stale: KIP-447) and it aborts, or the commit had got past that check and completes; it
    stores no snapshot of the lost partition, and rejoins or stops. Afterwards every context has
    exactly one committed action and the state is, to the bit, that of one worker never
    disturbed."""
    n, parts = 30_000, 2
    topics, ref_topics = make_topics(kafka_broker, parts)
    sent = backlog(producer(kafka_broker), topics, n, seed=3)
    # Batches of 100 records: a transaction is open most of the time, and the backlog lasts
    # seconds, on a fast machine too (with 5,000 one drained its partition in about a second).
    # The zombie's transaction must outlive the freeze, the survivor's wait for it too.
    g = Group(
        kafka_broker,
        tmp_path,
        "zombie",
        topics,
        worker={"batch_max_records": 100},
        txn_timeout_ms=60_000,
    )
    # One probe per partition, connected before the workers start: a fast worker drains its
    # partition in about a second, hardly more than a new client takes to make its first look.
    probes = {p: TransactionProbe(kafka_broker, topics, [p]) for p in range(parts)}
    try:
        for probe in probes.values():
            probe.open()
        a = g.start("a")
        g.start("b")
        assert wait_for(
            lambda: len(g.held("a")) == len(g.held("b")) == 1, timeout_s=60, interval_s=0.01
        ), (g.text("a")[-2000:], g.text("b")[-2000:])
        (pa,) = g.held("a")
        probe = probes[pa]
        try:
            held = stop_inside_a_transaction(a.pid, probe, timeout_s=60)
            assert held, "never stopped inside a transaction"
            frozen = time.monotonic()
            # Not the stable offsets: those wait for the frozen transaction if it holds some.
            before = committed_offsets(kafka_broker, "zombie", topics.contexts, stable=False)[pa]

            def given_pa() -> int:
                """How many assignments the survivor logged that gave it the zombie's partition
                (the whole assignment under the classic protocol, the gain under KIP-848)."""
                lists = re.findall(r"rebalance: assigned partitions=\[([\d, ]*)\]", g.text("b"))
                return sum(str(pa) in [x.strip() for x in found.split(",")] for found in lists)

            both = given_pa()
            # The zombie's session (6 s) times out; the survivor is assigned its partition and
            # recovers it only once that transaction has ended.
            assert wait_for(lambda: given_pa() > both, timeout_s=30), g.text("b")[-3000:]
            time.sleep(3)
            assert pa not in g.held("b"), "recovered while a transaction was open on its logs"
            assert not probe.ended(held)
            assert (
                committed_offsets(kafka_broker, "zombie", topics.contexts, stable=False)[pa]
                == before
            )
            lines_before = len(g.text("a").splitlines())
            os.kill(a.pid, signal.SIGCONT)
            resumed, resumed_wall = time.monotonic(), time.time()
            assert resumed - frozen < 50, "the transaction may have timed out (60 s) instead"
            # The zombie's transaction ends (the survivor's own may be open there now), and the
            # survivor's partition that waited for it is recovered, or handed to the zombie when
            # it rejoins: the wait blocks no rebalance, so which comes first is not fixed.
            assert wait_for(lambda: probe.ended(held), timeout_s=30), g.text("b")[-3000:]
        finally:
            for probe in probes.values():
                probe.close()

        def after() -> str:  # the zombie's log since it was resumed
            return "\n".join(g.text("a").splitlines()[lines_before:])

        # Its commit names a generation of the group it is no longer a member of (KIP-447), or
        # no member at all once librdkafka has seen its session run out, which the worker
        # refuses itself. Or, stopped after the coordinator had accepted its offsets, the commit
        # completes on resuming (the survivor waited for it): then that long step holds back its
        # snapshots until the group has answered.
        assert wait_for(
            lambda: "transaction failed" in after() or "partition lost" in after(), timeout_s=30
        ), after()[-3000:]
        if "transaction failed" in after():
            failed = after()[after().index("transaction failed") :].splitlines()[0]
            assert re.search("UNKNOWN_MEMBER_ID|ILLEGAL_GENERATION|FENCED", failed), failed
        else:
            assert "more than half the group session" in after(), after()[-3000:]
        # Then it hears that its partition was lost, stores no snapshot of it, and rejoins (or,
        # had librdkafka judged the error fatal, stops with a line saying why).
        assert wait_for(
            lambda: "rebalance: assigned" in after() or a.poll() is not None, timeout_s=60
        ), after()[-3000:]
        if a.poll() is not None:
            assert "fatal producer error" in after(), after()[-3000:]
        until = after().find("rebalance: assigned")
        assert f"partition lost partition={pa}" in after()[:until], after()[-3000:]
        # A snapshot taken before the freeze may be logged only now; none may be taken since.
        assert not snapshots_taken_after(after()[:until], pa, resumed_wall), after()[-3000:]
        assert wait_for(
            lambda: caught_up(kafka_broker, topics, "zombie", sent, parts), timeout_s=120
        ), "the group did not catch up"
        g.stop(*[i for i in ("a", "b") if g.procs[i].poll() is None])
    finally:
        g.kill_all()
    ref = run_reference(kafka_broker, tmp_path, ref_topics, sent, parts)
    assert_same_as_reference(kafka_broker, g, ref, parts, n, n_dead=len(range(17, n, 5_000)))


def test_a_frozen_idle_worker_resumed_after_its_partitions_moved_writes_no_snapshot_of_them(
    kafka_broker, tmp_path
):
    """A worker frozen while idle, every change of its partitions stored: the group gives them to
    another worker, which learns a little on a few models and stores that as an increment of the
    same snapshot chain. When the frozen worker resumes, librdkafka tells it its partitions were
    lost. A snapshot taken then would pair its old state and input offsets with the new owner's
    log ends, under the chain position the new owner has used: the increment holding the new
    owner's updates is replaced, and every later recovery misses them. Nothing of the zombie's may
    reach the snapshots either, and the group ends, to the bit, as one undisturbed worker."""
    from streambandit.wire import Context, Reward, encode

    from .helpers import send_tracked

    parts = 2
    topics, ref_topics = make_topics(kafka_broker, parts)
    prod = producer(kafka_broker)
    # Increments, not bases, for the few models the new owner changes: 64 models, 32 to a chain.
    g = Group(kafka_broker, tmp_path, "idle", topics, worker={"snapshot_base_every": 32})
    sent = backlog(prod, topics, 1_500, seed=5, keys=64)
    try:
        g.start("a")
        assert wait_for(lambda: caught_up(kafka_broker, topics, "idle", sent, parts), 60)
        g.stop("a")  # every change stored; started again, it recovers them and changes none
        a = g.start("a")
        assert wait_for(lambda: g.starts("a") == 2 and g.held("a") == {0, 1}, timeout_s=60), g.text(
            "a"
        )[-3000:]
        os.kill(a.pid, signal.SIGSTOP)
        frozen = time.monotonic()
        g.start("b")
        assert wait_for(lambda: g.held("b") == {0, 1}, timeout_s=60), g.text("b")[-3000:]

        # A few models of each partition learn: contexts, their rewards, and later contexts of
        # the same keys that move the watermark past their windows.
        more, keys = [], [f"m-{i}" for i in range(8)]
        rng = np.random.default_rng(9)
        t0 = 1_000 + 2 * 1_500 + 1_000
        for j in range(40):
            key, ts = keys[j % len(keys)], t0 + 10 * j
            ctx = Context(f"late{j}", key, ts, ("a", "b", "c"), rng.standard_normal((3, 3)) / 2)
            more.append(send_tracked(prod, topics.contexts, key.encode(), encode(ctx)))
        prod.flush(30)
        for j in range(40):
            key, ts = keys[j % len(keys)], t0 + 10 * j + 50
            r = Reward(f"late{j}", key, ts, float(rng.random()))
            more.append(send_tracked(prod, topics.rewards, key.encode(), encode(r)))
        prod.flush(30)
        for k, key in enumerate(keys):
            ctx = Context(f"closer{k}", key, t0 + 5_000, ("a",), np.zeros((1, 3)))
            more.append(send_tracked(prod, topics.contexts, key.encode(), encode(ctx)))
        prod.flush(30)
        assert {s.partition for s in more} == {0, 1}
        sent += more
        assert wait_for(lambda: caught_up(kafka_broker, topics, "idle", sent, parts), 60)
        # The new owner stores what it learnt as increments of the chain it recovered.
        assert wait_for(
            lambda: all(
                re.search(
                    rf"snapshot partition={p} increment", g.text("b").split("worker started")[-1]
                )
                for p in range(parts)
            ),
            timeout_s=30,
        ), g.text("b")[-3000:]
        assert time.monotonic() - frozen < 25  # its transaction timeout is never the question

        lines_before = len(g.text("a").splitlines())
        os.kill(a.pid, signal.SIGCONT)
        resumed_wall = time.time()

        # It learns that its partitions were lost, rejoins, and the group shares them again.
        def after() -> str:
            return "\n".join(g.text("a").splitlines()[lines_before:])

        assert wait_for(
            lambda: "partition assigned" in after() and g.held("a") | g.held("b") == {0, 1},
            timeout_s=60,
        ), (after()[-3000:], g.text("b")[-3000:])
        first_assign = after().find("rebalance: assigned")
        written = [
            line
            for p in range(parts)
            for line in snapshots_taken_after(after()[:first_assign], p, resumed_wall)
        ]
        assert not written, f"the zombie stored snapshots of partitions it had lost: {written}"
        g.stop()
    finally:
        g.kill_all()
    ref = run_reference(kafka_broker, tmp_path, ref_topics, sent, parts)
    assert_same_as_reference(kafka_broker, g, ref, parts, 1_500 + 40 + len(keys), n_dead=1)


def _logged_at(text: str, line: str) -> float | None:
    """The wall time of the first log line containing ``line``."""
    for ln in text.splitlines():
        if line in ln:
            stamp = datetime.datetime.strptime(ln[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def test_recovery_reads_the_log_behind_a_dead_producers_transaction_once_fenced_or_timed_out(
    kafka_broker, tmp_path
):
    """Producers killed inside transactions on both partitions' output logs (as a worker killed
    mid-batch leaves them), and then a worker commits its whole run behind them and is killed
    with nothing of it in a snapshot. On Apache Kafka a read_committed reader sees a partition
    only up to the first open transaction: a recovery that read "to the end" now would find none
    of those updates. The restarted worker waits instead: on partition 0 until the dead
    producer's transactional id is taken over (fenced, its transaction aborted at once), on
    partition 1 until the broker aborts the transaction at its transaction.timeout.ms. Then it
    re-applies every joined record behind them, and ends as one undisturbed worker, to the bit."""
    from confluent_kafka import Producer

    parts, n, dead_timeout_s = 2, 3_000, 20
    topics, ref_topics = make_topics(kafka_broker, parts)
    # A static member: the restart takes the partitions back at once, not after the session
    # timeout, so the transactions' fates, not the group, decide when recovery goes on. No
    # snapshot but the first: the run's every update is in the joined log alone.
    g = Group(
        kafka_broker,
        tmp_path,
        "open",
        topics,
        worker={
            "static_membership": True,
            "snapshot_interval_s": 10**9,
            "snapshot_every_updates": 10**9,
        },
    )
    dead = {}
    try:
        g.start("w")
        assert wait_for(lambda: g.held("w") == {0, 1}, timeout_s=60), g.text("w")[-3000:]
        for p, name, timeout_ms in ((0, "fence", 60_000), (1, "timeout", dead_timeout_s * 1000)):
            d = Producer(
                {
                    "bootstrap.servers": kafka_broker.bootstrap_servers,
                    "transactional.id": f"dead-{name}-{topics.actions}",
                    "transaction.timeout.ms": timeout_ms,
                }
            )
            d.init_transactions(30)
            d.begin_transaction()
            for topic in (topics.joined, topics.actions):
                d.produce(topic, b"never committed", partition=p)
            d.flush(30)
            dead[name] = (d, time.time())
        sent = backlog(producer(kafka_broker), topics, n, seed=4)
        assert wait_for(lambda: caught_up(kafka_broker, topics, "open", sent, parts), 60)
        g.procs["w"].kill()  # no snapshot, no leave: the updates are on the logs only
        g.procs["w"].wait()
        # A partition whose input had ended may have been snapshotted as idle before the kill (a
        # slow machine's wait for the catch-up lets it): removed, the first snapshots were empty.
        shutil.rmtree(g.snaps, ignore_errors=True)
        begun = g.starts("w")
        restarted = time.time()
        g.start("w")
        assert wait_for(
            lambda: (
                g.starts("w") > begun
                and "rebalance: assigned partitions=[0, 1]"
                in g.text("w").split("worker started")[-1]
            ),
            timeout_s=60,
        ), g.text("w")[-3000:]
        time.sleep(2)
        run = lambda: g.text("w").split("worker started")[-1]  # noqa: E731
        # Partition 1's transaction may have timed out by now on a slow machine (its recovery
        # is checked against that moment below); partition 0's lasts until it is fenced.
        assert "partition assigned partition=0" not in run(), "recovered while it was open"
        fenced_at = time.time()
        Producer(
            {
                "bootstrap.servers": kafka_broker.bootstrap_servers,
                "transactional.id": f"dead-fence-{topics.actions}",
            }
        ).init_transactions(30)  # the same transactional id: the open transaction is aborted
        assert wait_for(lambda: g.held("w") == {0, 1}, timeout_s=60), run()[-3000:]
        p0 = _logged_at(run(), "partition assigned partition=0")
        p1 = _logged_at(run(), "partition assigned partition=1")
        assert fenced_at - 0.1 <= p0 < fenced_at + 10, (p0 - fenced_at, "by the fencing")
        timed_out = dead["timeout"][1] + dead_timeout_s
        assert timed_out - 0.5 <= p1 < max(timed_out, restarted) + 12, (
            p1 - timed_out,
            "by the timeout",
        )
        assert wait_for(lambda: caught_up(kafka_broker, topics, "open", sent, parts), 60)
        g.stop()
    finally:
        g.kill_all()
    metrics = dict(kv.split("=", 1) for kv in g.exits[-1].split() if "=" in kv)
    ref = run_reference(kafka_broker, tmp_path, ref_topics, sent, parts)
    got = assert_same_as_reference(kafka_broker, g, ref, parts, n, n_dead=len(range(17, n, 5_000)))
    # Every update came from the log behind the open transactions (the one snapshot was empty).
    assert int(metrics["recovered_joined"]) == len(got["joined"]), metrics
    # The broker says why the second one ended.
    broker_log = kafka_broker.log_path.read_text(errors="replace")
    assert f"dead-timeout-{topics.actions} due to timeout" in broker_log
