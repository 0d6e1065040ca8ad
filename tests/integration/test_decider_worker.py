"""The in-process Decider and a Kafka worker, fed the same events, decide and learn the same, to the bit."""

import numpy as np
import pytest

from streambandit import Decider
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import Context, Reward

from .helpers import engine_states_equal, outputs, producer, send, start_worker, wait_for

pytestmark = pytest.mark.integration

MODELS = {
    "models": [
        {
            "match": "ads",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 60,
            "default_reward": 0.0,
            "epsilon": 0.2,
        },
    ]
}
N = 200


def test_the_decider_and_a_worker_make_the_same_decisions_and_models(broker, topics, tmp_path):
    rng = np.random.default_rng(8)
    events = []  # in event time: a context every 10 ms, two of three rewarded 5 ms later
    for i in range(N):
        events.append(
            Context(
                f"e{i}",
                "ads",
                1_000 + 10 * i,
                ("a", "b", "c", "d"),
                rng.standard_normal((4, 3)) / 2,
            )
        )
        if i % 3:
            events.append(Reward(f"e{i}", "ads", 1_000 + 10 * i + 5, float(rng.integers(2))))
    prod = producer(broker)
    for ev in events:  # the whole log first: the worker merges a backlog in event time
        send(prod, topics.contexts if isinstance(ev, Context) else topics.rewards, ev)
    prod.flush()

    decider = Decider(MODELS)
    ranked = {}
    for ev in events:
        if isinstance(ev, Context):
            r = decider.rank(
                ev.event_id, ev.model_key, ev.arm_ids, ev.features, timestamp_ms=ev.timestamp_ms
            )
            ranked[ev.event_id] = (r.arm_index, r.propensity, r.score, r.model_version)
        else:
            decider.reward(ev.event_id, ev.value, timestamp_ms=ev.timestamp_ms)

    snaps = tmp_path / "snaps"
    # No wall-clock ticks: the worker's event time is the log's, as the Decider's is.
    w, t = start_worker(broker, topics, snaps, "g-decider", MODELS, idle_tick_ms=10**9)
    try:
        assert wait_for(
            lambda: len(outputs(broker, topics, "g-decider")["actions"]) >= N, timeout_s=60
        )
    finally:
        w.stop()
        t.join(30)
    actions = outputs(broker, topics, "g-decider")["actions"]
    assert {
        a.event_id: (a.arm_index, a.propensity, a.score, a.model_version) for a in actions
    } == ranked
    store = DirectoryStore(snaps).scoped("g-decider")
    snap = next(
        s for p in (0, 1) if (s := load_latest(store, p)) and "ads" in s["engine"]["models"]
    )
    assert decider.models["ads"].n_updates > N // 2
    # The same model to the bit, the same decisions still open, the same event time.
    mine = decider.engine.snapshot()
    engine_states_equal(
        {**snap["engine"], "models": dict(snap["engine"]["models"].items())},
        {**mine, "models": {"ads": decider.models["ads"].state_dict()}},
    )
