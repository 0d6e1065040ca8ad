"""The reward window on the real broker (docs/design.md, invariants 2 and 4): event time closes a decision's
window; a decision with no reward is joined once with the default reward; a reward after that is
dead-lettered as late and not applied; an idle partition's window is closed by a watermark tick
that the worker writes into the rewards topic."""

from __future__ import annotations

import time
import uuid
from types import SimpleNamespace

import numpy as np
import pytest

from streambandit import reasons
from streambandit.config.worker import Topics
from streambandit.wire import Context, Reward, Tick, decode, encode

from .helpers import (
    Tail,
    caught_up,
    outputs,
    producer,
    read_all,
    send_tracked,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.integration

WINDOW_MS = 1000
DEFAULT = -0.25  # distinctive: an observed reward is never this
MODELS = {
    "models": [
        {
            "match": "w-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": WINDOW_MS,
            "default_reward": DEFAULT,
            "aggregation": "first",
        }
    ]
}
KEY = "w-1"


def ctx(event_id: str, ts: int, seed: int) -> Context:
    return Context(
        event_id, KEY, ts, ("a", "b", "c"), np.random.default_rng(seed).standard_normal((3, 3)) / 3
    )


@pytest.fixture(scope="module")
def run(broker, tmp_path_factory):
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        contexts=f"contexts-{tag}",
        rewards=f"rewards-{tag}",
        actions=f"actions-{tag}",
        joined=f"joined-{tag}",
        dead_letter=f"dead-letter-{tag}",
    )
    broker.create_topics(topics.all(), partitions=2)
    prod = producer(broker)
    # Event time a minute in the past: the worker's idle ticks (stamped with the wall clock) are past
    # every window here, and nothing but the records below moves event time until the stream ends.
    T = int(time.time() * 1000) - 60_000
    C, R = topics.contexts, topics.rewards
    sent = {}

    def send(name, topic, event):
        sent[name] = send_tracked(prod, topic, KEY.encode(), encode(event))

    send("A", C, ctx("A", T, 1))  # never gets a reward in its window
    send("B", C, ctx("B", T + 100, 2))
    send("rB", R, Reward("B", KEY, T + 200, 0.7))  # inside B's window: joined at once
    send("C", C, ctx("C", T + 1500, 3))  # event time passes A's deadline (T + 1000)
    send("lateA", R, Reward("A", KEY, T + 1600, 1.0))  # after A was joined with the default
    send("D", C, ctx("D", T + 1700, 4))  # processed normally after the late reward
    send("rD", R, Reward("D", KEY, T + 1750, 0.3))
    send("E", C, ctx("E", T + 1800, 5))  # the last record: only an idle tick closes it
    prod.flush(30)
    group = "g-window"
    # A long merge wait: the merge order is the event-time order however the fetches interleave.
    w, t = start_worker(
        broker,
        topics,
        tmp_path_factory.mktemp("window"),
        group,
        MODELS,
        idle_tick_ms=500,
        merge_wait_ms=1000,
    )
    try:
        assert wait_for(
            lambda: caught_up(broker, topics, group, list(sent.values())),
            timeout_s=60,
            interval_s=0.3,
        )
        # E's window (and C's) closes by a tick only: wait for E's joined record.
        tail = Tail(broker, topics.joined)
        seen: list = []
        try:
            assert wait_for(
                lambda: seen.extend(tail.read()) or any(j.event_id == "E" for j in seen),
                timeout_s=30,
            )
        finally:
            tail.close()
        # A reward for E now is late too: the tick closed its window for good.
        send("lateE", R, Reward("E", KEY, T + 1900, 1.0))
        prod.flush(30)
        assert wait_for(
            lambda: caught_up(broker, topics, group, [sent["lateE"]]), timeout_s=30, interval_s=0.3
        )
        out = outputs(broker, topics, group)
        metrics = dict(w.metrics)
        alive = t.is_alive()
    finally:
        w.stop()
        t.join(30)
    yield SimpleNamespace(
        T=T,
        topics=topics,
        sent=sent,
        out=out,
        metrics=metrics,
        alive=alive,
        joined={j.event_id: j for j in out["joined"]},
        actions={a.event_id: a for a in out["actions"]},
    )


def test_every_context_is_decided_once(run):
    assert sorted(a.event_id for a in run.out["actions"]) == ["A", "B", "C", "D", "E"]
    assert run.alive


def test_a_decision_without_reward_is_joined_once_with_the_default_at_its_event_time_deadline(
    run, broker
):
    a = run.joined["A"]
    assert not a.reward_observed and a.reward == DEFAULT
    assert a.decision_timestamp_ms == run.T and a.join_timestamp_ms == run.T + WINDOW_MS
    # Closed by event time: the record that carried it past the deadline (C) triggered the join.
    assert (a.trigger_source, a.trigger_offset) == (0, run.sent["C"].offset)
    assert a.features.tobytes() == run.actions["A"].features.tobytes()
    # ... exactly once on the raw log too (the committed view would hide a second with the same id).
    raw = [decode(m.value()) for m in read_all(broker, run.topics.joined)]
    assert [j.event_id for j in raw].count("A") == 1


def test_rewards_inside_the_window_are_joined_when_they_come(run):
    b, d = run.joined["B"], run.joined["D"]
    assert b.reward_observed and b.reward == 0.7 and b.join_timestamp_ms == run.T + 200
    assert d.reward_observed and d.reward == 0.3 and d.join_timestamp_ms == run.T + 1750


def test_a_reward_after_the_window_is_dead_lettered_as_late_and_not_applied(run):
    R = run.topics.rewards
    late = {(d.source_topic, d.source_offset): d for d in run.out["dead_letter"]}
    assert len(run.out["dead_letter"]) == 2
    for name in ("lateA", "lateE"):
        d = late[(R, run.sent[name].offset)]
        assert d.reason == reasons.LATE_REWARD and d.value == run.sent[name].value
        assert d.source_partition == run.sent[name].partition
    assert run.metrics["dead_letter.late_reward"] == 2
    # Not applied: the model's update sequence is exactly the joined records, versions 0..n-1, in
    # event-time order: B (its reward at T+200), A (closed by C at T+1500), D, then C and E, whose
    # windows only the tick closed, in deadline order.
    assert [j.event_id for j in run.out["joined"]] == ["B", "A", "D", "C", "E"]
    assert [j.model_version_before for j in run.out["joined"]] == [0, 1, 2, 3, 4]
    assert run.joined["A"].reward == DEFAULT and run.joined["E"].reward == DEFAULT
    # D was decided after the late reward for A, by the model that had applied B and A only.
    assert run.actions["D"].model_version == 2


def test_an_idle_partition_is_closed_by_a_tick_written_into_the_rewards_log(run, broker):
    T, R = run.T, run.topics.rewards
    c, e = run.joined["C"], run.joined["E"]
    assert (
        not c.reward_observed
        and c.reward == DEFAULT
        and c.join_timestamp_ms == T + 1500 + WINDOW_MS
    )
    assert (
        not e.reward_observed
        and e.reward == DEFAULT
        and e.join_timestamp_ms == T + 1800 + WINDOW_MS
    )
    assert e.trigger_source == 1 and (c.trigger_source, c.trigger_offset) == (1, e.trigger_offset)
    assert e.trigger_offset not in {s.offset for s in run.sent.values() if s.topic == R}
    log = {
        m.offset(): decode(m.value())
        for m in read_all(broker, R)
        if m.partition() == run.sent["E"].partition
    }
    tick = log[e.trigger_offset]
    assert isinstance(tick, Tick) and tick.timestamp_ms >= T + 1800 + WINDOW_MS
    # The tick moved event time on by the idle wall time, from the partition's own watermark; it
    # did not jump to the wall clock (the stream's event time is a minute behind it), which would
    # close every open window at the first quiet moment.
    assert tick.timestamp_ms < T + 30_000
    assert run.metrics["ticks"] >= 1
