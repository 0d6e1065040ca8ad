"""The worker serves every registered policy from its model configuration, on the real broker.

One worker runs a model family per policy (``<name>-*``, built from the class's own contract-suite
parameters), so a newly registered learner is covered here without a new test. Per policy: one
action per context, every reward joined, and the model the worker snapshots equals a fresh policy
fed the joined log in order, to the bit.
"""

import uuid

import numpy as np
import pytest

from streambandit import POLICIES, make_policy
from streambandit.config.worker import Topics
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import Context, Reward, encode

from .helpers import caught_up, outputs, producer, same_state, send_tracked, start_worker, wait_for

pytestmark = pytest.mark.integration

DIM, PER_POLICY, KEYS = 4, 30, 2


def spec(name):
    return {
        "match": f"{name}-*",
        "policy": name,
        "dim": DIM,
        "hyper": POLICIES[name]._test_params()[0],
        "reward_window_ms": 50,
        "default_reward": 0.0,
    }


@pytest.fixture(scope="module")
def run(broker, tmp_path_factory):
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        contexts=f"c-{tag}",
        rewards=f"r-{tag}",
        actions=f"a-{tag}",
        joined=f"j-{tag}",
        dead_letter=f"d-{tag}",
    )
    broker.create_topics(topics.all(), partitions=2)
    rng = np.random.default_rng(5)
    prod, sent = producer(broker), []
    for i in range(PER_POLICY):
        for name in sorted(POLICIES):
            key = f"{name}-{i % KEYS}"
            ctx = Context(
                f"{name}-e{i}",
                key,
                1000 + 10 * i,
                ("a", "b", "c"),
                rng.uniform(-0.5, 0.5, (3, DIM)),
            )
            sent.append(send_tracked(prod, topics.contexts, key.encode(), encode(ctx)))
            if i % 2 == 0:  # a reward in [0, 1] fits every link
                rew = Reward(ctx.event_id, key, ctx.timestamp_ms + 5, float(rng.integers(0, 2)))
                sent.append(send_tracked(prod, topics.rewards, key.encode(), encode(rew)))
    prod.flush()
    snaps = tmp_path_factory.mktemp("snaps")
    w, t = start_worker(
        broker,
        topics,
        snaps,
        f"g-{tag}",
        {"models": [spec(n) for n in sorted(POLICIES)]},
        idle_tick_ms=300,
        merge_wait_ms=1000,
    )
    try:
        assert wait_for(
            lambda: caught_up(broker, topics, f"g-{tag}", sent) and w.metrics["pending"] == 0,
            timeout_s=120,
        )
    finally:
        w.stop()
        t.join(30)
    store = DirectoryStore(snaps).scoped(f"g-{tag}")
    models = {
        k: s
        for p in (0, 1)
        if (snap := load_latest(store, p))
        for k, s in snap["engine"]["models"].items()
    }
    return outputs(broker, topics, f"g-{tag}"), models


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_the_worker_serves_the_policy(run, name):
    out, models = run
    actions = [a for a in out["actions"] if a.model_key.startswith(f"{name}-")]
    joined = [j for j in out["joined"] if j.model_key.startswith(f"{name}-")]
    assert sorted(a.event_id for a in actions) == sorted(f"{name}-e{i}" for i in range(PER_POLICY))
    assert len(joined) == PER_POLICY
    assert sum(j.reward_observed for j in joined) == (PER_POLICY + 1) // 2
    assert not [d for d in out["dead_letter"] if name in d.detail]
    for key in (f"{name}-{k}" for k in range(KEYS)):
        expected = make_policy(name, dim=DIM, **POLICIES[name]._test_params()[0])
        for j in sorted(
            (j for j in joined if j.model_key == key), key=lambda j: j.model_version_before
        ):
            expected.update(j.features, j.reward)
        assert same_state(models[key], expected.state_dict()), key
