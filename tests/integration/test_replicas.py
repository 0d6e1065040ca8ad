"""Replicated serving on each broker: two replicas decide and log, one learn-only worker
learns, and the replicas follow what it learns.

- every decision a replica logged is joined once;
- the learner's models equal, to the bit, an engine fed the same log (the decisions and rewards
  topics) in the canonical merge order, and so do the replicas' copies once they caught up;
- a replica restarted mid-stream serves no model older than the last one it served, and a learner
  restarted mid-stream continues exactly;
- an export of the learner's log, replayed, reproduces the replicas' decisions.
"""

import heapq
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.partition import PartitionEngine
from streambandit.export import read_logged_decisions
from streambandit.replay.runner import replay
from streambandit.serving.replica import Replica
from streambandit.stream.snapshots import DirectoryStore, load_latest
from streambandit.wire import InputRef, ReplicaDecision, Reward, decode, encode

from .helpers import (
    committed_offsets,
    fresh_topics,
    outputs,
    read_all,
    same_state,
    serve_config,
    start_worker,
    wait_for,
)

pytestmark = pytest.mark.integration

D, K, N = 4, 5, 240
WINDOW = 60_000
MODELS = {
    "models": [
        {
            "match": "ads-*",
            "policy": "oful",
            "dim": D,
            "reward_window_ms": WINDOW,
            "default_reward": 0.0,
            "epsilon": 0.2,
            "seed": 3,
        },
    ]
}
KEYS = ["ads-0", "ads-1", "ads-2"]


@pytest.fixture
def learn_topics(broker):
    return fresh_topics(broker, learn_only=True)


def _replica(broker, topics, snaps, group):
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id=group,
        topics=topics,
        learn_only=True,
    )
    return Replica(cfg, DirectoryStore(snaps), poll_s=0.02, max_staleness_s=30.0).start(60)


def _oracle(broker, topics) -> dict:
    """The models an engine reaches from the decisions and rewards topics merged in the canonical
    order (event time, decisions before rewards, offset), per partition."""
    models = {}
    config = parse_models_config(MODELS)
    for p in (0, 1):
        engine = PartitionEngine(config)
        runs = []
        for src, topic in ((0, topics.decisions), (1, topics.rewards)):
            run = [
                (ev.timestamp_ms, src, m.offset(), ev)
                for m in read_all(broker, topic)
                if m.partition() == p
                for ev in [decode(m.value())]
            ]
            runs.append(run)
        for ts, src, off, ev in heapq.merge(*runs, key=lambda r: (r[0], r[1])):
            ref = InputRef(src, p, off, timestamp_ms=ts)
            engine.on_decision(ev, ref) if src == 0 else engine.on_reward(ev, ref)
        models |= {k: m.state_dict() for k, m in engine.models.items()}
    return models


def test_two_replicas_and_a_learn_only_worker(broker, learn_topics, tmp_path):
    topics, snaps, group = learn_topics, tmp_path / "snaps", "g-learn"
    # No wall-clock ticks: windows close by the log's event time alone, as the oracle closes them.
    w, t = start_worker(
        broker,
        topics,
        snaps,
        group,
        MODELS,
        learn_only=True,
        idle_tick_ms=10**9,
        snapshot_every_updates=40,
        merge_wait_ms=200,
    )
    replicas = [_replica(broker, topics, snaps, group), _replica(broker, topics, snaps, group)]
    rng = np.random.default_rng(5)
    theta = rng.standard_normal(D)
    base = time.time_ns() // 1_000_000
    ranked, served = {}, {}
    joined_before = 0  # joined by the learners stopped before the current one
    try:
        for i in range(N):
            if (
                i == N // 3
            ):  # the learner stops and a new one takes over from its snapshots and logs
                w.stop()
                t.join(30)
                joined_before = w.metrics["joined"]
                w, t = start_worker(
                    broker,
                    topics,
                    snaps,
                    group,
                    MODELS,
                    learn_only=True,
                    idle_tick_ms=10**9,
                    snapshot_every_updates=40,
                    merge_wait_ms=200,
                )
            if (
                i == N // 2
            ):  # replica 1 restarts: what it serves next is no older than what it served
                replicas[1].close()
                before = {k: served.get((1, k), 0) for k in KEYS}
                replicas[1] = _replica(broker, topics, snaps, group)
                assert all(replicas[1].version(k) >= v for k, v in before.items()), before
            r = replicas[i % 2]
            key = KEYS[i % 3]
            arms = rng.standard_normal((K, D)) / 2
            ts = base + 10 * i
            got = r.rank(f"e{i}", key, [f"ad{k}" for k in range(K)], arms, timestamp_ms=ts)
            ranked[got.event_id] = (got.arm_index, got.propensity, got.model_version)
            served[(i % 2, key)] = max(served.get((i % 2, key), 0), got.model_version)
            if i % 4:  # a reward through either replica, 1-5 ms later in event time
                click = float(rng.random() < 1 / (1 + np.exp(-arms[got.arm_index] @ theta)))
                replicas[(i + 1) % 2].reward(
                    f"e{i}", click, model_key=key, timestamp_ms=ts + 1 + i % 5
                )
            for rep in replicas:  # each record at the broker before the next is made: the live merge order is the log's
                assert rep.flush() == 0
            if i % 40 == 39:  # the learner's updates reach the replicas while the stream goes on
                assert wait_for(
                    lambda: w.metrics["joined"] + joined_before >= (3 * (i + 1)) // 4 - 3,
                    timeout_s=30,
                )
        # Decisions far ahead in event time close every window of the stream (with the default
        # reward where none came); they stay open themselves.
        for k, key in enumerate(KEYS):
            replicas[0].rank(
                f"closer-{key}",
                key,
                ["a"],
                np.zeros((1, D)),
                timestamp_ms=base + 10 * N + 2 * WINDOW + k,
            )
        replicas[0].flush()
        assert wait_for(lambda: w.metrics["joined"] + joined_before >= N, timeout_s=60), w.metrics[
            "joined"
        ]
    finally:
        w.stop()
        t.join(30)

    try:
        # Every logged decision joined once, and acted on as the replica decided it.
        live = outputs(broker, topics, group, first_input=topics.decisions)
        joined_ids = [j.event_id for j in live["joined"]]
        assert sorted(joined_ids) == sorted(ranked) and live["raw_counts"]["joined"] == N
        assert not live["dead_letter"]
        assert {
            a.event_id: (a.arm_index, a.propensity, a.model_version)
            for a in live["actions"]
            if a.event_id in ranked
        } == ranked
        assert committed_offsets(broker, group, topics.decisions)  # the learner committed its input

        # The learner's models equal the oracle's, to the bit; the replicas follow them to the bit.
        store = DirectoryStore(snaps).scoped(group)
        learned = {
            k: s
            for p in (0, 1)
            if (snap := load_latest(store, p))
            for k, s in snap["engine"]["models"].items()
        }
        oracle = _oracle(broker, topics)
        assert learned.keys() == oracle.keys() == set(KEYS)
        for key in KEYS:
            assert same_state(learned[key], oracle[key]), key
            assert learned[key]["n_updates"] > 0
        for rep in replicas:
            assert wait_for(
                lambda: all(rep.version(k) == oracle[k]["n_updates"] for k in KEYS), timeout_s=30
            )
            for key in KEYS:
                assert same_state(rep.models[key].state_dict(), oracle[key]), key
            assert rep.counters["reloads"] == 0
            assert (
                rep.staleness_s() < 5.0 and rep.is_ready()
            )  # it confirms it holds the log, second by second
        assert replicas[1].counters["loads"] == 2  # the restarted one read both partitions
        assert (
            replicas[1].counters["loads_from_snapshot"] >= 1
        )  # and started from the learner's snapshots

        # The learner's log, exported and replayed, makes every decision the replicas made.
        logged = list(
            read_logged_decisions(broker.bootstrap_servers, topics, group, learn_only=True)
        )
        assert len(logged) == N
        result = replay(logged, parse_models_config(MODELS))
        assert result.decisions == {e: v[0] for e, v in ranked.items()} and result.off_version == 0
    finally:
        for rep in replicas:
            rep.close()


def test_a_replica_refuses_what_a_worker_refuses(broker, learn_topics, tmp_path):
    from streambandit.serving.decider import DecisionError

    rep = _replica(broker, learn_topics, tmp_path / "snaps", "g-refuse")
    try:
        arms = np.eye(2, D)
        rep.rank("e1", "ads-0", ["a", "b"], arms)
        for args, reason in (
            (("e1", "ads-0", ["a", "b"], arms), "duplicate_event"),
            (("e2", "nope", ["a", "b"], arms), "unknown_model"),
            (("e2", "ads-0", ["a", "b"], np.eye(2, D + 1)), "bad_dimension"),
            (("e2", "ads-0", ["a", "a"], arms), "duplicate_arm_id"),
            (("e2", "ads-0", ["a", "b"], np.full((2, D), np.nan)), "non_finite_features"),
            (("e2", "ads-0", ["a", "b"], np.full((2, D), 1e9)), "feature_out_of_range"),
        ):
            with pytest.raises(DecisionError) as err:
                rep.rank(*args)
            assert err.value.reason == reason
        with pytest.raises(DecisionError) as err:
            rep.reward("never", 1.0)
        assert err.value.reason == "unknown_event"
        with pytest.raises(DecisionError) as err:
            rep.reward("e1", float("nan"))
        assert err.value.reason == "non_finite_reward"
        rep.reward("e1", 1.0)  # the decision's model key is known here
        rep.flush()
        logged = [decode(m.value()) for m in read_all(broker, learn_topics.decisions)]
        assert [(d.event_id, type(d)) for d in logged] == [("e1", ReplicaDecision)]
        assert [
            r.event_id
            for m in read_all(broker, learn_topics.rewards)
            if isinstance(r := decode(m.value()), Reward)
        ] == ["e1"]
    finally:
        rep.close()


def _http(url: str, body=None) -> tuple[int, object]:
    req = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode()
    except OSError:
        return 0, ""
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def test_streambandit_api_replica_of_a_learn_only_group_over_http(broker, learn_topics, tmp_path):
    """The command an operator runs: `streambandit api --replica-of CONFIG` against a learn-only
    `serve`; its decisions reach the learner, and a refused request is a 4xx."""
    cfg = tmp_path / "learn.toml"
    # A window longer than the test: the reward is joined when it comes, whatever the merge order.
    cfg.write_text(
        serve_config(
            "g-http", tmp_path / "snaps", learn_topics, worker="learn_only = true"
        ).replace("reward_window_ms = 100", "reward_window_ms = 600000")
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    learner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--processes",
            "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "learner.log", "w"),
    )
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "api",
            "--replica-of",
            str(cfg),
            "--port",
            str(port),
            "--bootstrap-servers",
            broker.bootstrap_servers,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: _http(url + "/ready")[0] == 200, timeout_s=60), api.stderr
        actions = [
            {"id": f"ad-{k}", "features": [1.0 if j == k else 0.0 for j in range(3)]}
            for k in range(3)
        ]
        status, got = _http(url + "/rank", {"eventId": "h1", "modelKey": "m-1", "actions": actions})
        assert (
            status == 200
            and got["modelVersion"] == 0
            and got["rewardActionId"] in {"ad-0", "ad-1", "ad-2"}
        )
        assert _http(url + "/events/h1/reward", {"value": 1.0})[0] == 204
        for body, code in (
            ({"eventId": "h1", "modelKey": "m-1", "actions": actions}, "duplicate_event"),
            ({"eventId": "h2", "modelKey": "zz", "actions": actions}, "unknown_model"),
            (
                {"eventId": "h3", "modelKey": "m-1", "actions": [{"id": "a", "features": [1.0]}]},
                "bad_dimension",
            ),
        ):
            status, err = _http(url + "/rank", body)
            assert 400 <= status < 500 and err["error"]["code"] == code

        # The learner joins the reward and the replica's model learns it: version 1.
        def learned() -> bool:
            status, got = _http(
                url + "/rank",
                {"eventId": f"probe-{time.monotonic_ns()}", "modelKey": "m-1", "actions": actions},
            )
            return status == 200 and got["modelVersion"] == 1

        assert wait_for(learned, timeout_s=60), (tmp_path / "learner.log").read_text()[-3000:]
    finally:
        for proc in (api, learner):
            proc.terminate()
        for proc in (api, learner):
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert api.returncode is not None


def test_a_replica_cut_off_from_its_broker_stops_deciding_once_stale(own_broker):
    """Its own broker, stopped under it: the replica cannot confirm it holds the log any more,
    and past max_staleness_s it refuses to rank and is not ready, rather than serve an ever older
    model."""
    from streambandit.serving.decider import DecisionError

    topics = Topics(decisions="dec", rewards="rew", joined="joi")
    own_broker.create_topics(["dec", "rew", "joi"], partitions=2)
    cfg = WorkerConfig(
        bootstrap_servers=own_broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        topics=topics,
        learn_only=True,
    )
    rep = Replica(cfg, max_staleness_s=1.0).start(60)
    try:
        rep.rank("e1", "ads-0", ["a", "b"], np.eye(2, D))
        assert rep.flush() == 0
        assert wait_for(lambda: rep.staleness_s() < 0.6, timeout_s=10) and rep.is_ready()
        own_broker.stop()
        assert wait_for(lambda: not rep.is_ready(), timeout_s=20)
        with pytest.raises(DecisionError) as err:
            rep.rank("e2", "ads-0", ["a", "b"], np.eye(2, D))
        assert err.value.reason == "stale_replica" and rep.staleness_s() > 1.0
    finally:
        rep.close()


def test_a_joined_log_that_does_not_fit_stops_the_replica_loudly(broker, learn_topics, tmp_path):
    """A record on joined that no learner wrote (here: an update to version 5 of a model that has
    none): the replica reads the partition again, finds the log does not fit, and stops deciding
    with the reason, rather than serve a copy that is not the learners'."""
    from streambandit.serving.decider import DecisionError
    from streambandit.wire import Joined, encode

    from .helpers import producer

    rep = _replica(broker, learn_topics, tmp_path / "snaps", "g-forged")
    try:
        rep.rank("e1", "ads-0", ["a", "b"], np.eye(2, D))
        prod = producer(broker)
        prod.produce(
            learn_topics.joined,
            key=b"ads-0",
            value=encode(Joined("x", "ads-0", np.ones(D), 1.0, True, 0.5, 1, 2, 5)),
        )
        prod.flush()
        assert wait_for(lambda: not rep.is_ready(), timeout_s=30)
        with pytest.raises(DecisionError) as err:
            rep.rank("e2", "ads-0", ["a", "b"], np.eye(2, D))
        assert err.value.reason == "not_ready" and "applied to version 5" in err.value.detail
    finally:
        rep.close()


def test_a_learn_only_worker_dead_letters_what_a_client_writes_on_decisions_and_goes_on(
    broker, learn_topics, tmp_path
):
    """decisions is a topic clients can write: impossible decisions, bytes that are not a record, a
    context where a decision belongs, a decision dated far ahead, a decision of an unknown model.
    Each is dead-lettered with its reason; the good decisions around them are joined and learned."""
    from confluent_kafka import Producer

    from streambandit import reasons
    from streambandit.wire import Context
    from streambandit.wire.codec import write

    topics = learn_topics
    w, t = start_worker(
        broker, topics, tmp_path / "snaps", "g-hostile", MODELS, learn_only=True, idle_tick_ms=10**9
    )
    prod = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random"}
    )
    now = int(time.time() * 1000)
    arms, x = ("a", "b"), np.eye(2, D)

    def decision(event_id: str, **change) -> bytes:
        fields = {
            "event_id": event_id,
            "model_key": "ads-0",
            "timestamp_ms": now,
            "arm_ids": list(arms),
            "features": x.astype("<f8").tobytes(),
            "arm_index": 1,
            "score": 0.5,
            "propensity": 0.6,
            "model_version": 0,
        } | change
        return write(8, fields)

    try:
        hostile = [  # (message key, value, the reason it is dead-lettered with)
            (b"ads-0", decision("h-index", arm_index=2), reasons.BAD_DECISION),
            (b"ads-0", decision("h-prop", propensity=0.0), reasons.BAD_DECISION),
            (
                b"ads-0",
                decision("h-ahead", timestamp_ms=now + 10 * 3_600_000),
                reasons.EVENT_TIME_AHEAD,
            ),
            (b"ads-0", decision("h-key", model_key="ads-1"), reasons.KEY_MISMATCH),
            (b"nobody", decision("h-model", model_key="nobody"), reasons.UNKNOWN_MODEL),
            (b"ads-0", b"\x5b\x08\x01not avro", reasons.MALFORMED),
            (b"ads-0", encode(Context("h-context", "ads-0", now, arms, x)), reasons.WRONG_TOPIC),
        ]
        for i in range(3):
            prod.produce(topics.decisions, key=b"ads-0", value=decision(f"g{i}"))
        for key, value, _ in hostile:
            prod.produce(topics.decisions, key=key, value=value)
        for i in range(3, 6):
            prod.produce(topics.decisions, key=b"ads-0", value=decision(f"g{i}"))
        for i in range(6):
            prod.produce(
                topics.rewards, key=b"ads-0", value=encode(Reward(f"g{i}", "ads-0", now + 1, 1.0))
            )
        prod.flush()
        assert wait_for(
            lambda: (
                w.metrics["joined"] >= 6
                and sum(v for k, v in w.metrics.items() if k.startswith("dead_letter."))
                >= len(hostile)
            ),
            timeout_s=60,
        ), w.metrics
    finally:
        w.stop()
        t.join(30)
    live = outputs(broker, topics, "g-hostile", first_input=topics.decisions)
    assert sorted(j.event_id for j in live["joined"]) == [f"g{i}" for i in range(6)]
    dead = sorted(d.reason for d in live["dead_letter"])
    assert dead == sorted(reason for _, _, reason in hostile), dead
    store = DirectoryStore(tmp_path / "snaps").scoped("g-hostile")
    models = {
        k: s
        for p in (0, 1)
        if (snap := load_latest(store, p))
        for k, s in snap["engine"]["models"].items()
    }
    assert list(models) == ["ads-0"] and models["ads-0"]["n_updates"] == 6
