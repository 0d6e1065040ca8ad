"""The model learns, end to end on the real broker: the test plays the application on the
simulated ad traffic (streambandit.sim.ads, hidden logistic click model). It produces a wave of ad
requests, reads the committed actions, draws each click from the hidden model for the chosen ad,
produces the clicks (event time after the decision, inside the window), waits for the joins, and
goes on with the next wave. After a few hundred rounds the worker's choices must be far better than
choosing an ad at random on the same requests."""

from __future__ import annotations

import numpy as np
import pytest

from streambandit.sim.ads import AdTraffic
from streambandit.wire import Context, Reward, encode

from .helpers import Tail, producer, start_worker, wait_for

pytestmark = pytest.mark.integration

DIM, K = 5, 8
WAVES, WAVE = 8, 25
KEY = "ads-e2e"
WINDOW_MS = 20_000
MODELS = {
    "models": [
        {
            "match": KEY,
            "policy": "glb_omd",
            "dim": DIM,
            "reward_window_ms": WINDOW_MS,
            "default_reward": 0.0,
            "aggregation": "first",
            # The theory radius explores for thousands of rounds (tests/unit/policies/test_learning.py);
            # the documented beta_scale makes a few hundred enough.
            "hyper": {"link": "logistic", "S": 6.0, "beta_scale": 0.1},
        }
    ]
}


def test_the_worker_learns_to_beat_random_choice_on_simulated_ad_traffic(broker, topics, tmp_path):
    traffic = AdTraffic(dim=DIM, n_ads=100, k=K, base_ctr=0.2, spread=4.0, seed=0)
    rng = np.random.default_rng(1)
    prod = producer(broker)
    # No idle ticks: between waves the worker waits for the test's clicks with open decisions, and
    # only the records' event time may close windows here (a tick would join them with no click).
    w, t = start_worker(
        broker, topics, tmp_path / "snapshots", "g-learn", MODELS, idle_tick_ms=3_600_000
    )
    actions_tail, joined_tail = Tail(broker, topics.actions), Tail(broker, topics.joined)
    actions: dict = {}
    joined: dict = {}

    def collect(tail, into, ids):
        for ev in tail.read():
            into[ev.event_id] = ev  # a redo after an aborted batch writes the same record again
        return ids <= into.keys()

    chosen, uniform, best = [], [], []
    try:
        t0 = 1_700_000_000_000
        for wave in range(WAVES):
            base = t0 + wave * 2 * WINDOW_MS
            requests = {}
            for j in range(WAVE):
                event_id = f"w{wave}-{j}"
                req = traffic.request(rng)
                requests[event_id] = req
                prod.produce(
                    topics.contexts,
                    key=KEY.encode(),
                    value=encode(Context(event_id, KEY, base + j, req.ad_ids, req.features)),
                )
            prod.flush(30)
            ids = set(requests)
            assert wait_for(
                lambda: collect(actions_tail, actions, ids), timeout_s=60, interval_s=0.05
            ), f"wave {wave}: actions missing for {sorted(ids - actions.keys())[:5]}"
            clicks = {}
            for j, (event_id, req) in enumerate(requests.items()):
                a = actions[event_id]
                assert a.arm_id == req.ad_ids[a.arm_index]
                assert a.features.tobytes() == req.features[a.arm_index].tobytes()
                # Decided by the model that applied every earlier wave and none of this one.
                assert a.model_version == wave * WAVE
                clicks[event_id] = float(traffic.click(rng, req.click_rates[a.arm_index]))
                prod.produce(
                    topics.rewards,
                    key=KEY.encode(),
                    value=encode(
                        Reward(event_id, KEY, base + WINDOW_MS // 2 + j, clicks[event_id])
                    ),
                )
                chosen.append(req.click_rates[a.arm_index])
                uniform.append(req.click_rates.mean())
                best.append(req.click_rates.max())
            prod.flush(30)
            assert wait_for(
                lambda: collect(joined_tail, joined, ids), timeout_s=60, interval_s=0.05
            ), f"wave {wave}: joins missing for {sorted(ids - joined.keys())[:5]}"
            for event_id in ids:
                assert (
                    joined[event_id].reward_observed and joined[event_id].reward == clicks[event_id]
                )
        assert t.is_alive()
    finally:
        actions_tail.close()
        joined_tail.close()
        w.stop()
        t.join(30)

    assert w.metrics["joined"] == WAVES * WAVE and not any(
        k.startswith("dead_letter.") for k in w.metrics
    )
    # The expected click rate of the chosen ads over the second half of the stream, against choosing
    # uniformly among the same candidates and against the best candidate of each request.
    half = WAVES * WAVE // 2
    got, rand, top = np.mean(chosen[half:]), np.mean(uniform[half:]), np.mean(best[half:])
    # Uniform choice scores ~0.32 here and the best ad ~0.73. Offline, over 30 traffic seeds, this
    # protocol closes 84-99% of that gap; the same learner fed coin-flip clicks instead of the
    # real ones (it updates, but learns nothing) closes -55% to +48%, and one that never updates ~0%.
    assert got - rand > 0.65 * (top - rand), (got, rand, top)
