"""Online and offline agree: a live worker run on each broker, then a replay of its joined
log with the same configuration reproduces every decision and the final model states, to the bit.

Rewards arrive after a delay, so many decisions are made between updates and the replay must make
each one at the model version the live worker made it at (the action's ``model_version``).
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.export import read_logged_decisions
from streambandit.replay.files import read_avro
from streambandit.replay.runner import replay
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import Context, Reward, encode

from .helpers import (
    caught_up,
    outputs,
    producer,
    same_state,
    send_tracked,
    start_worker,
    topics_toml,
    wait_for,
)

pytestmark = pytest.mark.integration

N, D, K = 400, 5, 6
MODELS = {
    "models": [
        {
            "match": "explore-*",
            "policy": "oful",
            "dim": D,
            "reward_window_ms": 300,
            "default_reward": 0.0,
            "epsilon": 0.2,
            "seed": 7,
            "hyper": {"beta": 0.5},
        },
        {
            "match": "glm-*",
            "policy": "glb_omd",
            "dim": D,
            "reward_window_ms": 300,
            "default_reward": 0.0,
            "hyper": {"link": "logistic", "S": 3.0, "beta_scale": 0.1},
        },
    ]
}


TOML = """
[worker]
group_id = "{group}"

{topics}
[[models]]
match = "explore-*"
policy = "oful"
dim = 5
reward_window_ms = 300
default_reward = 0.0
epsilon = 0.2
seed = 7
[models.hyper]
beta = 0.5

[[models]]
match = "glm-*"
policy = "glb_omd"
dim = 5
reward_window_ms = 300
default_reward = 0.0
[models.hyper]
link = "logistic"
S = 3.0
beta_scale = 0.1
"""


def run_cli(*args) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_replay_of_the_joined_log_reproduces_decisions_and_models(broker, topics, tmp_path):
    rng = np.random.default_rng(21)
    theta = rng.standard_normal(D)
    prod, sent = producer(broker), []
    for i in range(N):
        key = ["explore-a", "explore-b", "glm-a", "glm-b"][i % 4]
        arms = rng.standard_normal((K, D)) / np.sqrt(D)
        ctx = Context(f"e{i}", key, 10_000 + 20 * i, tuple(f"ad{k}" for k in range(K)), arms)
        sent.append(send_tracked(prod, topics.contexts, key.encode(), encode(ctx)))
        # A reward for most events, 20-200 ms of event time later (after several later decisions);
        # click probability from a hidden logistic model of the arm with the best true value.
        if i % 5:
            p = 1.0 / (1.0 + np.exp(-(arms @ theta).max()))
            rew = Reward(
                ctx.event_id,
                key,
                ctx.timestamp_ms + int(rng.integers(20, 200)),
                float(rng.random() < p),
            )
            sent.append(send_tracked(prod, topics.rewards, key.encode(), encode(rew)))
    prod.flush()

    group = "g-replay"
    w, t = start_worker(
        broker, topics, tmp_path / "snaps", group, MODELS, idle_tick_ms=300, merge_wait_ms=1000
    )
    try:
        assert wait_for(
            lambda: caught_up(broker, topics, group, sent) and w.metrics["pending"] == 0,
            timeout_s=120,
        )
    finally:
        w.stop()
        t.join(30)
    live = outputs(broker, topics, group)
    assert len(live["joined"]) == N and not live["dead_letter"]
    store = DirectoryStore(tmp_path / "snaps").scoped(group)
    live_models = {
        k: s for p in (0, 1) for k, s in load_latest(store, p)["engine"]["models"].items()
    }

    # The worker's logs -> an Avro file (`streambandit export`) -> replay (the runner, and the command).
    assert len(list(read_logged_decisions(broker.bootstrap_servers, topics, group))) == N
    config = tmp_path / "worker.toml"
    config.write_text(TOML.format(group=group, topics=topics_toml(topics)))
    path = tmp_path / "log.avro"
    run_cli(
        "export", "--config", config, "--bootstrap-servers", broker.bootstrap_servers, "--out", path
    )
    result = replay(read_avro(path), parse_models_config(MODELS))
    report = json.loads(
        run_cli("replay", path, "--config", config, "--out", tmp_path / "report")
        and (tmp_path / "report" / "replay.json").read_text()
    )
    assert report["events"] == N and report["targets"][0]["matched"] == N

    live_choice = {a.event_id: a.arm_index for a in live["actions"]}
    assert result.decisions == live_choice  # every decision, exploration draws included
    assert result.matched == N and result.off_version == 0
    assert result.models.keys() == live_models.keys()
    for key, state in live_models.items():
        assert same_state(result.models[key], state), key
