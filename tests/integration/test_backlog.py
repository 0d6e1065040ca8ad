"""Catching up on a backlog (after an outage, or a new deployment on old topics) is exact.

Contexts are large (K arms of d floats) and rewards tiny, so a fetch brings thousands of rewards
for every few hundred contexts: the rewards input runs far ahead of the contexts. The merge must
wait for contexts that are on the broker but not yet fetched, instead of releasing the rewards
ahead of them (which moved the watermark past every window: the rewards were dead-lettered as
unknown and the decisions joined with the default reward). The worker's output must equal what
the pure engine computes on the canonical merge order.
"""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import Context, Reward, encode

from .helpers import caught_up, outputs, producer, send_tracked, start_worker, wait_for

pytestmark = pytest.mark.integration

N, D, K = 3000, 20, 10
MODELS = {
    "models": [
        {"match": "m-*", "policy": "oful", "dim": D, "reward_window_ms": 100, "default_reward": 0.0}
    ]
}


def test_a_backlog_is_joined_exactly_as_the_canonical_order_joins_it(broker, topics, tmp_path):
    rng = np.random.default_rng(11)
    prod, sent, events = producer(broker), [], []
    for i in range(N):
        ctx = Context(
            f"e{i}",
            f"m-{i % 4}",
            1000 + i,
            tuple(f"a{k}" for k in range(K)),
            rng.standard_normal((K, D)) / 5,
        )
        events.append((ctx.timestamp_ms, 0, ctx))
        sent.append(send_tracked(prod, topics.contexts, ctx.model_key.encode(), encode(ctx)))
        if i % 3 == 0:
            rew = Reward(ctx.event_id, ctx.model_key, ctx.timestamp_ms + 5, 1.0)
            events.append((rew.timestamp_ms, 1, rew))
            sent.append(send_tracked(prod, topics.rewards, rew.model_key.encode(), encode(rew)))
    prod.flush()

    w, t = start_worker(
        broker, topics, tmp_path / "snaps", "g-backlog", MODELS, idle_tick_ms=10**9
    )  # merge_wait_ms: default
    try:
        assert wait_for(lambda: caught_up(broker, topics, "g-backlog", sent), timeout_s=120)
    finally:
        w.stop()
        t.join(30)
    out = outputs(broker, topics, "g-backlog")

    # The pure engine on the canonical order (event time, contexts before rewards) is the reference.
    engine = PartitionEngine(parse_models_config(MODELS))
    expected = {}
    for _, _, ev in sorted(events, key=lambda e: (e[0], e[1])):
        for o in engine.on_context(ev) if isinstance(ev, Context) else engine.on_reward(ev):
            if hasattr(o, "reward_observed"):
                expected[o.event_id] = (o.reward, o.reward_observed)

    assert [d.reason for d in out["dead_letter"]] == []
    assert w.metrics["merge_out_of_order"] == 0
    got = {j.event_id: (j.reward, j.reward_observed) for j in out["joined"]}
    assert sum(observed for _, observed in got.values()) == N // 3 + (N % 3 > 0)
    assert {k: v for k, v in got.items() if k in expected} == {
        k: v for k, v in expected.items() if k in got
    }
