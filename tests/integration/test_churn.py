"""A consumer group whose membership churns while events flow, on each broker (the classic
eager protocol on the embedded one, the incremental consumer protocol of KIP-848 on Apache
Kafka): three worker processes on eight partitions; one joins, one leaves with SIGTERM, one is
frozen with SIGSTOP until the group gives its partitions away and then resumed (a zombie), one is
SIGKILLed and restarts with the same instance id. Afterwards every context has exactly one
committed action, the joined records (every reward in its window, applied once) and the dead
letters are those of one worker that ran uninterrupted over the same input, and so is every
partition's state, to the bit; and by the workers' logs no partition was served by two of them
at once."""

import re
import signal
import threading
import time

import numpy as np
import pytest

from streambandit.config.worker import Topics
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import Context, Reward, encode

from .faults import make_topics
from .helpers import (
    all_input_committed,
    assert_never_served_twice,
    caught_up,
    engine_states_equal,
    held_partitions,
    log_time,
    outputs,
    producer,
    send_tracked,
    serve_config,
    serve_process,
    serving_intervals,
    stop_processes,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 8
KEYS = [f"m-{i}" for i in range(64)]  # on every partition (murmur2)
PERIODS = 320
PACE_S = 0.125  # a period's records every PACE_S seconds: the flow lasts 40 s
PERIOD_MS = 100  # event time: contexts in the first half of a period, their rewards 50 ms later
WORKER = """
idle_tick_ms = 1000000000   # no wall-clock ticks: the two runs must see the same input
merge_wait_ms = 1500        # the reference drains a backlog: a fetch of the other input always arrives in time
snapshot_interval_s = 1
snapshot_every_updates = 100
snapshot_base_every = 4
snapshot_fork_models = 3    # bases forked, small increments copied on the loop
"""


def flow(prod, topics: Topics, sent: list, done: threading.Event, failures: list) -> None:
    """Contexts and rewards as a live application produces them. Each period's contexts are
    flushed before its rewards and those before the next period's contexts, and event time
    grows in that order, so the merge order of a worker reading live equals that of one reading
    the backlog afterwards: the runs may be compared to the bit."""
    try:
        rng = np.random.default_rng(11)
        n, started = 0, time.monotonic()
        for period in range(PERIODS):
            time.sleep(max(0.0, started + period * PACE_S - time.monotonic()))
            base = period * PERIOD_MS
            rewarded = []
            for j in range(24):
                key = KEYS[int(rng.integers(len(KEYS)))]
                ev = Context(
                    f"e{n}", key, base + 2 * j, ("a", "b", "c"), rng.standard_normal((3, 3)) / 2
                )
                sent.append(send_tracked(prod, topics.contexts, key.encode(), encode(ev)))
                if rng.random() < 0.7:
                    rewarded.append(Reward(f"e{n}", key, base + 2 * j + 50, float(rng.random())))
                n += 1
            if period % 40 == 7:
                sent.append(
                    send_tracked(prod, topics.contexts, b"m-0", b"\x00garbage")
                )  # dead-lettered
            prod.flush()
            for r in rewarded:
                sent.append(send_tracked(prod, topics.rewards, r.model_key.encode(), encode(r)))
            prod.flush()
    except BaseException as exc:  # noqa: BLE001 (reported by the test)
        failures.append(exc)
    finally:
        done.set()


def test_a_churning_group_ends_exactly_as_one_uninterrupted_worker(broker, tmp_path):
    topics, ref_topics = make_topics(broker, PARTITIONS)

    def serve(group, instance, out_topics):
        cfg = tmp_path / f"{group}.toml"
        cfg.write_text(serve_config(group, tmp_path / f"snaps-{group}", out_topics, worker=WORKER))
        return serve_process(broker, cfg, instance, tmp_path / f"{group}-{instance}.log")

    def log_of(instance):
        return tmp_path / f"churn-{instance}.log"

    def given(instance, since: float) -> set[int]:
        """The partitions the group assigned to ``instance`` after wall time ``since``."""
        out: set[int] = set()
        for line in log_of(instance).read_text().splitlines():
            m = re.search(r"rebalance: assigned partitions=\[([\d, ]*)\]", line)
            if m and log_time(line) > since:
                out |= {int(x) for x in m.group(1).split(",") if x.strip()}
        return out

    def held(*instances) -> set[int]:
        return set().union(*(held_partitions(log_of(i)) for i in instances))

    def everything_held(*instances) -> bool:
        return held(*instances) == set(range(PARTITIONS))

    def restarted_and_serving(instance) -> bool:
        log = tmp_path / f"churn-{instance}.log"
        return log.read_text().count("worker started") == 2 and bool(held_partitions(log))

    inputs = [topics.contexts, topics.rewards]
    cuts: dict[str, list[float]] = {"a": [], "b": [], "c": []}  # when a worker was frozen or killed
    sent, done, failures = [], threading.Event(), []
    procs: dict = {}
    exits: list[str] = []
    try:
        procs["a"], procs["b"] = serve("churn", "a", topics), serve("churn", "b", topics)
        assert wait_for(lambda: everything_held("a", "b"), timeout_s=60), "the group did not form"
        feeder = threading.Thread(
            target=flow, args=(producer(broker), topics, sent, done, failures), daemon=True
        )
        feeder.start()

        time.sleep(4)
        procs["c"] = serve("churn", "c", topics)  # joins
        assert wait_for(lambda: held("c") and everything_held("a", "b", "c"), timeout_s=60), (
            "c got nothing"
        )
        time.sleep(1)
        exits += stop_processes(procs.pop("a"))  # leaves cleanly
        assert wait_for(lambda: everything_held("b", "c"), timeout_s=60), (
            "a's partitions were not taken over"
        )
        time.sleep(1)
        # A zombie: c frozen (maybe inside a transaction) until the group has given its
        # partitions to b, then resumed. Its commits from before the freeze are fenced, and it
        # learns it lost its partitions and joins again. (Frozen inside a transaction, c holds
        # b's recovery of those partitions until it resumes and ends it, or the broker's
        # transaction timeout does: b is given them, and waits.)
        procs["c"].send_signal(signal.SIGSTOP)
        cuts["c"].append(time.time())
        try:
            assert wait_for(
                lambda: given("b", since=cuts["c"][0]) | held("b") == set(range(PARTITIONS)),
                timeout_s=60,
            ), "the group did not give the frozen worker's partitions to b"
        finally:
            procs["c"].send_signal(signal.SIGCONT)
        assert wait_for(lambda: everything_held("b", "c") and held("c"), timeout_s=60), (
            "the zombie did not rejoin"
        )
        time.sleep(1)
        procs["b"].send_signal(signal.SIGKILL)  # no snapshot, no leave, maybe a transaction open
        procs["b"].wait(10)
        cuts["b"].append(time.time())
        assert not done.is_set(), (
            "the flow ended before the kill: the churn did not happen while events flowed"
        )
        time.sleep(1)
        procs["b"] = serve("churn", "b", topics)  # the same instance id
        assert wait_for(
            lambda: restarted_and_serving("b") and everything_held("b", "c"), timeout_s=60
        ), "b did not come back"
        assert wait_for(done.is_set, timeout_s=120), "the producer did not finish"
        assert not failures, failures
        assert wait_for(
            lambda: (
                caught_up(broker, topics, "churn", sent, PARTITIONS) and everything_held("b", "c")
            ),
            timeout_s=120,
        ), "the group did not catch up"
        # Lag 0: every input partition committed to its end, records of no output included.
        assert wait_for(lambda: all_input_committed(broker, "churn", inputs, PARTITIONS), 30)
        for name, proc in procs.items():
            assert proc.poll() is None, (
                f"worker {name} exited: {(tmp_path / f'churn-{name}.log').read_text()[-3000:]}"
            )
        exits += stop_processes(*procs.values())
        procs.clear()
    finally:
        done.wait(120)
        stop_processes(*procs.values())

    assert_never_served_twice(
        [serving_intervals(log_of(i).read_text(), cuts[i]) for i in ("a", "b", "c")]
    )
    ref = serve("ref", "ref", ref_topics)
    try:
        assert wait_for(
            lambda: caught_up(broker, topics, "ref", sent, PARTITIONS), timeout_s=120
        ), "reference stuck"
        assert wait_for(lambda: all_input_committed(broker, "ref", inputs, PARTITIONS), 30)
    finally:
        exits += stop_processes(ref)
    for line in (
        exits
    ):  # the one way two runs may legitimately differ (docs/design.md, invariant 5): ruled out
        metrics = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        assert metrics.get("merge_out_of_order", "0") == "0", line

    n_contexts = PERIODS * 24
    got, want = (
        outputs(broker, topics, "churn", PARTITIONS),
        outputs(broker, ref_topics, "ref", PARTITIONS),
    )
    ids = [x.event_id for x in got["actions"]]
    assert len(ids) == len(set(ids)) == n_contexts
    key = lambda x: (x.event_id, x.arm_index, x.model_version, x.propensity)
    assert sorted(map(key, got["actions"])) == sorted(map(key, want["actions"]))
    jkey = lambda j: (j.event_id, j.reward, j.reward_observed, j.model_version_before)
    assert sorted(map(jkey, got["joined"])) == sorted(map(jkey, want["joined"]))
    assert len(want["joined"]) > n_contexts // 2
    assert sorted((d.reason, d.source_offset) for d in got["dead_letter"]) == sorted(
        (d.reason, d.source_offset) for d in want["dead_letter"]
    )
    assert len(want["dead_letter"]) == len(range(7, PERIODS, 40))
    for p in range(PARTITIONS):
        a = load_latest(DirectoryStore(tmp_path / "snaps-churn").scoped("churn"), p)
        b = load_latest(DirectoryStore(tmp_path / "snaps-ref").scoped("ref"), p)
        engine_states_equal(
            b["engine"], a["engine"]
        )  # models (every partition has some), open decisions, watermark
