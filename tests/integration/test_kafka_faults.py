"""Worker faults on Apache Kafka (one node): a worker frozen (SIGSTOP) until the group has moved
its partitions, then resumed."""

import os
import re
import signal
import time

import numpy as np
import pytest

from .faults import (
    Group,
    assert_same_as_reference,
    backlog,
    make_topics,
    run_reference,
)
from .helpers import caught_up, producer, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]


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

        # It learns that its partitions were lost, rejoins, and the group shares them again.
        def after() -> str:
            return "\n".join(g.text("a").splitlines()[lines_before:])

        assert wait_for(
            lambda: "partition assigned" in after() and g.held("a") | g.held("b") == {0, 1},
            timeout_s=60,
        ), (after()[-3000:], g.text("b")[-3000:])
        first_assign = after().find("rebalance: assigned")
        written = re.findall(r"snapshot partition=(\d+) ", after()[:first_assign])
        assert not written, f"the zombie stored snapshots of partitions {written} it had lost"
        g.stop()
    finally:
        g.kill_all()
    ref = run_reference(kafka_broker, tmp_path, ref_topics, sent, parts)
    assert_same_as_reference(kafka_broker, g, ref, parts, 1_500 + 40 + len(keys), n_dead=1)
