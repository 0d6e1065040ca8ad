"""Crash and exact recovery with a real worker process: SIGKILL at random moments, restart,
and compare with a run that was never interrupted (same configuration, same input). The workers
snapshot often, mostly increments over a base, so recovery composes chains cut at any moment."""

import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from streambandit.config.worker import Topics
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import Context, Reward, encode

from .helpers import (
    all_input_committed,
    caught_up,
    engine_states_equal,
    is_tansu,
    outputs,
    producer,
    read_all,
    send_tracked,
    topics_toml,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CONFIG = """
[worker]
group_id = "{group}"
merge_wait_ms = 1500        # long enough that a fetch of the other input always arrives in time
idle_tick_ms = 1000000000   # no wall-clock ticks: both runs must see the same input
snapshot_interval_s = 0.5
snapshot_every_updates = 4  # few models change between snapshots: most are increments (engine/chains.py)
snapshot_base_every = 8
snapshot_max_share = 1.0
batch_max_records = 10  # a snapshot after nearly every small transaction
snapshot_fork_models = 8  # bases and the larger increments taken by a forked child, the rest on the loop

{topics}
[[models]]
match = "sum-*"
policy = "glb_omd"
dim = 4
reward_window_ms = 400
default_reward = 0.0
aggregation = "sum"
epsilon = 0.1
[models.hyper]
link = "poisson"
S = 2.0

[[models]]
match = "first-*"
policy = "hvt_ucb"
dim = 4
reward_window_ms = 300
default_reward = 0.5
aggregation = "first"
"""


def make_topics(broker):
    tag = uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"c-{tag}",
        rewards=f"r-{tag}",
        actions=f"a-{tag}",
        joined=f"j-{tag}",
        dead_letter=f"d-{tag}",
    )
    broker.create_topics(t.all(), partitions=2)
    return t


def produce_input(broker, t, n=1500, seed=0):
    rng = np.random.default_rng(seed)
    prod = producer(broker)
    events = []
    for i in range(n):
        key = f"{('sum', 'first')[i % 2]}-{i % 40}"  # 20 models of each kind
        ts = 10_000 + 10 * i
        arms = rng.standard_normal((3, 4)) / 3
        events.append((ts, 0, Context(f"e{i}", key, ts, ("x", "y", "z"), arms), None))
        for _ in range(int(rng.integers(0, 3))):
            d = int(rng.integers(-20, 600))
            events.append(
                (ts + d, 1, Reward(f"e{i}", key, ts + d, float(rng.integers(0, 3)) / 2), None)
            )
        if i % 97 == 0:
            events.append((ts, 0, None, b"\x00garbage"))  # dead-lettered as malformed
    # Produced in event-time order per topic, as a well-behaved application would.
    sent = []
    for _, _, ev, raw in sorted(events, key=lambda e: (e[0], e[1])):
        if raw is not None:
            sent.append(send_tracked(prod, t.contexts, b"sum-a", raw))
        else:
            topic = t.contexts if isinstance(ev, Context) else t.rewards
            sent.append(send_tracked(prod, topic, ev.model_key.encode(), encode(ev)))
    prod.flush()
    return sent


def start(broker, cfg_path, snap_dir, instance, log_path):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg_path),
            "-v",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--snapshot-dir",
            str(snap_dir),
            "--instance-id",
            instance,
            "--processes",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=open(log_path, "w"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def run_to_end(broker, t, tmp, group, kills, sent):
    cfg = tmp / f"{group}.toml"
    cfg.write_text(CONFIG.format(group=group, topics=topics_toml(t)))
    snaps = tmp / f"snap-{group}"
    logs = [tmp / f"{group}-0.log"]
    proc = start(broker, cfg, snaps, "w1", logs[-1])
    for after_s in kills:
        time.sleep(after_s)
        proc.send_signal(signal.SIGKILL)  # no chance to flush, snapshot or leave the group
        proc.wait()
        logs.append(tmp / f"{group}-{len(logs)}.log")
        proc = start(broker, cfg, snaps, "w1", logs[-1])

    def owns_all_partitions():  # both recovered by the last process started
        text = logs[-1].read_text()
        return all(f"partition assigned partition={p} " in text for p in (0, 1))

    deadline = time.monotonic() + 240
    # Done when the committed input offsets pass every record produced (known from the delivery
    # reports: the embedded broker's reported high watermark of a batched topic is too low).
    while not (owns_all_partitions() and caught_up(broker, t, group, sent)):
        assert time.monotonic() < deadline, "the worker did not catch up"
        assert proc.poll() is None, logs[-1].read_text()[-3000:]
        time.sleep(1)
    # Lag 0: every input partition committed to its end, records of no output included.
    assert wait_for(lambda: all_input_committed(broker, group, [t.contexts, t.rewards]), 30)
    proc.send_signal(signal.SIGTERM)  # clean stop: final snapshot of every partition
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (
        proc.returncode,
        out.decode()[-2000:],
        logs[-1].read_text()[-3000:],
    )
    # The one legitimate way two runs can differ is the merge's wait running out before the other
    # input's record arrived (docs/design.md, invariant 5): rule it out, so a mismatch below means a recovery bug.
    metrics = dict(kv.split("=", 1) for kv in out.decode().split() if "=" in kv)
    assert metrics.get("merge_out_of_order", "0") == "0", (
        "a record was merged out of order: the wait was too short"
    )
    if not is_tansu(broker):
        # The last recovery's committed-view filter (a workaround for Tansu showing aborted
        # records) found nothing to skip: the killed worker's open transaction stayed hidden.
        assert metrics["recovery_uncommitted_skipped"] == "0", metrics
    text = "".join(log.read_text() for log in logs)
    assert " base " in text and " increment " in text and " forked" in text, (
        "both kinds, forked and not"
    )
    assert "not stored" not in text, "every snapshot write succeeded"
    store = DirectoryStore(snaps).scoped(group)
    return {p: load_latest(store, p) for p in (0, 1)}


def test_killed_worker_recovers_to_the_uninterrupted_state(broker, tmp_path):
    ref_topics, crash_topics = make_topics(broker), make_topics(broker)
    ref_sent = produce_input(broker, ref_topics)
    crash_sent = produce_input(broker, crash_topics)
    for a, b in (
        (ref_topics.contexts, crash_topics.contexts),
        (ref_topics.rewards, crash_topics.rewards),
    ):
        same_input = [(m.partition(), m.key(), m.value()) for m in read_all(broker, a)] == [
            (m.partition(), m.key(), m.value()) for m in read_all(broker, b)
        ]
        assert same_input, "the two runs must see the same input"
    reference = run_to_end(broker, ref_topics, tmp_path, "ref", kills=[], sent=ref_sent)
    crashed = run_to_end(
        broker, crash_topics, tmp_path, "crash", kills=[4.0, 3.5, 5.0], sent=crash_sent
    )

    for p in (0, 1):
        a, b = reference[p]["engine"], crashed[p]["engine"]
        engine_states_equal(a, b)

    ref_out, crash_out = outputs(broker, ref_topics, "ref"), outputs(broker, crash_topics, "crash")
    # Exactly one committed action per context, the same decision as the uninterrupted run.
    n_contexts = 1500
    for out in (ref_out, crash_out):
        ids = [a.event_id for a in out["actions"]]
        assert len(ids) == len(set(ids)) == n_contexts
    key = lambda a: (a.event_id, a.arm_index, a.model_version, a.propensity)
    assert sorted(map(key, ref_out["actions"])) == sorted(map(key, crash_out["actions"]))
    # Every reward inside its window applied exactly once: the same joined records, same rewards.
    jkey = lambda j: (j.event_id, j.reward, j.reward_observed, j.model_version_before)
    assert sorted(map(jkey, ref_out["joined"])) == sorted(map(jkey, crash_out["joined"]))
    assert sorted((d.reason, d.source_offset) for d in ref_out["dead_letter"]) == sorted(
        (d.reason, d.source_offset) for d in crash_out["dead_letter"]
    )
