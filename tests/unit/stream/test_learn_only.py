"""Learn-only: decisions a replica made and logged, opened and joined as a worker's own.

The oracle is the deciding engine itself: fed the same contexts and rewards, an engine that
decides and an engine that opens the first one's decisions as logged records produce the same
joined records and reach the same models, to the bit.
"""

import collections

import numpy as np
import pytest
from confluent_kafka import Message

from streambandit import reasons
from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.column_merge import ColumnMerger
from streambandit.engine.partition import PartitionEngine, Rejected
from streambandit.stream.batch import BatchProcessor, PartitionState
from streambandit.wire import (
    Action,
    Context,
    DecodeError,
    InputRef,
    Joined,
    ReplicaDecision,
    Reward,
    decode,
    encode,
)
from streambandit.wire.batch_decode import decode_batch
from streambandit.wire.codec import write

MODELS = {
    "models": [
        {
            "match": "ads-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 100,
            "default_reward": 0.0,
            "epsilon": 0.2,
        },
        {
            "match": "sum-*",
            "policy": "glb_omd",
            "dim": 3,
            "reward_window_ms": 100,
            "default_reward": 0.0,
            "aggregation": "sum",
            "hyper": {"link": "gaussian"},
        },
    ]
}
ARMS = ("a", "b", "c", "d")


def _decision(a: Action, ctx: Context) -> ReplicaDecision:
    return ReplicaDecision(
        ctx.event_id,
        ctx.model_key,
        ctx.timestamp_ms,
        ctx.arm_ids,
        ctx.features,
        a.arm_index,
        a.score,
        a.propensity,
        a.model_version,
    )


def test_an_engine_opening_logged_decisions_joins_and_learns_as_the_deciding_engine():
    config = parse_models_config(MODELS)
    deciding, learning = PartitionEngine(config), PartitionEngine(config)
    rng = np.random.default_rng(0)
    joined_d, joined_l = [], []
    for i in range(400):
        key = f"ads-{i % 2}" if i % 3 else "sum-0"
        ctx = Context(f"e{i}", key, 10 * i, ARMS, rng.standard_normal((4, 3)))
        ref = InputRef(0, 0, i)
        out = deciding.on_context(ctx, ref)
        action = next(o for o in out if isinstance(o, Action))
        joined_d += [o for o in out if isinstance(o, Joined)]
        # The record goes through its wire format, as it would on the decisions topic.
        logged = decode(encode(_decision(action, ctx)))
        out_l = learning.on_decision(logged, ref)
        assert [o for o in out_l if isinstance(o, Action)][0].arm_id == action.arm_id
        joined_l += [o for o in out_l if isinstance(o, Joined)]
        if i % 2 == 0:
            r = Reward(ctx.event_id, key, 10 * i + 5, float(rng.uniform()))
            joined_d += [
                o for o in deciding.on_reward(r, InputRef(1, 0, i)) if isinstance(o, Joined)
            ]
            joined_l += [
                o for o in learning.on_reward(r, InputRef(1, 0, i)) if isinstance(o, Joined)
            ]
    joined_d += deciding.advance_to(10_000)
    joined_l += learning.advance_to(10_000)
    assert len(joined_d) == 400 and len(joined_l) == 400
    for a, b in zip(joined_d, joined_l):
        assert (
            a.event_id,
            a.reward,
            a.reward_observed,
            a.propensity,
            a.model_version_before,
            a.join_timestamp_ms,
        ) == (
            b.event_id,
            b.reward,
            b.reward_observed,
            b.propensity,
            b.model_version_before,
            b.join_timestamp_ms,
        )
        assert np.array_equal(a.features, b.features)
    for key, model in deciding.models.items():
        mine, theirs = learning.models[key].state_dict(), model.state_dict()
        assert all(
            np.array_equal(mine[k], v) if isinstance(v, np.ndarray) else mine[k] == v
            for k, v in theirs.items()
        )


def test_a_logged_decision_keeps_the_replicas_model_version_and_choice():
    engine = PartitionEngine(parse_models_config(MODELS))
    d = ReplicaDecision("e1", "ads-1", 5, ARMS, np.eye(4, 3), 3, 0.25, 0.05, 17)
    out = engine.on_decision(d, InputRef(0, 0, 0))
    (action,) = out
    assert (
        action.arm_id,
        action.arm_index,
        action.score,
        action.propensity,
        action.model_version,
    ) == ("d", 3, 0.25, 0.05, 17)
    assert np.array_equal(action.features, np.eye(4, 3)[3]) and list(engine.pending) == ["e1"]
    (j,) = engine.on_reward(Reward("e1", "ads-1", 6, 1.0), InputRef(1, 0, 0))
    assert (
        j.model_version_before == 0
        and j.propensity == 0.05
        and engine.models["ads-1"].n_updates == 1
    )


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"arm_index": 4}, reasons.BAD_DECISION),
        ({"arm_index": -1}, reasons.BAD_DECISION),
        ({"propensity": 0.0}, reasons.BAD_DECISION),
        ({"propensity": 1.5}, reasons.BAD_DECISION),
        ({"propensity": float("nan")}, reasons.BAD_DECISION),
        ({"score": float("inf")}, reasons.BAD_DECISION),
        ({"model_version": -3}, reasons.BAD_DECISION),
        ({"features": np.full((4, 3), np.nan)}, reasons.NON_FINITE_FEATURES),
        ({"arm_ids": ()}, reasons.EMPTY_ARMS),
    ],
)
def test_an_impossible_decision_does_not_decode(change, reason):
    fields = {
        "event_id": "e1",
        "model_key": "ads-1",
        "timestamp_ms": 5,
        "arm_ids": ARMS,
        "features": np.eye(4, 3),
        "arm_index": 1,
        "score": 0.5,
        "propensity": 0.5,
        "model_version": 0,
    } | change
    value = write(
        8,
        fields
        | {
            "arm_ids": list(fields["arm_ids"]),
            "features": np.ascontiguousarray(fields["features"], "<f8").tobytes(),
        },
    )
    with pytest.raises(DecodeError) as err:
        decode(value)
    assert err.value.reason == reason
    (batch,) = decode_batch([value])  # the worker's batch decoder gives the same refusal
    assert isinstance(batch, DecodeError) and batch.reason == reason


@pytest.mark.parametrize(
    "decision, reason",
    [
        (
            ReplicaDecision("e1", "other", 5, ARMS, np.eye(4, 3), 0, 0.0, 1.0, 0),
            reasons.UNKNOWN_MODEL,
        ),
        (
            ReplicaDecision("e1", "ads-1", 5, ARMS, np.eye(4, 2), 0, 0.0, 1.0, 0),
            reasons.BAD_DIMENSION,
        ),
        (
            ReplicaDecision("e1", "ads-1", 5, ("a", "a", "b", "c"), np.eye(4, 3), 0, 0.0, 1.0, 0),
            reasons.DUPLICATE_ARM_ID,
        ),
        (
            ReplicaDecision("e1", "ads-1", 5, ARMS, np.full((4, 3), 1e7), 0, 0.0, 1.0, 0),
            reasons.FEATURE_OUT_OF_RANGE,
        ),
        (
            ReplicaDecision("e0", "ads-1", 5, ARMS, np.eye(4, 3), 0, 0.0, 1.0, 0),
            reasons.DUPLICATE_EVENT,
        ),
    ],
)
def test_a_hostile_logged_decision_is_refused_and_learns_nothing(decision, reason):
    engine = PartitionEngine(parse_models_config(MODELS))
    engine.on_decision(
        ReplicaDecision("e0", "ads-1", 1, ARMS, np.eye(4, 3), 0, 0.0, 1.0, 0), InputRef(0, 0, 0)
    )
    out = engine.on_decision(decision, InputRef(0, 0, 1))
    assert [o.reason for o in out if isinstance(o, Rejected)] == [reason]
    assert list(engine.pending) == ["e0"] and all(m.n_updates == 0 for m in engine.models.values())


def _processor(learn_only: bool) -> BatchProcessor:
    topics = Topics(
        contexts="c", decisions="dec", rewards="r", actions="a", joined="j", dead_letter="d"
    )
    cfg = WorkerConfig(
        bootstrap_servers="unused",
        models=parse_models_config(MODELS),
        topics=topics,
        merge_wait_ms=0,
        idle_tick_ms=10**9,
        learn_only=learn_only,
    )
    b = BatchProcessor(cfg, collections.Counter())
    b.partitions[0] = PartitionState(
        ArrayPartitionEngine(cfg.models), ColumnMerger(0), {0: 0, 1: 0}
    )
    return b


def test_a_learn_only_worker_reads_decisions_and_refuses_contexts_and_the_other_way_round():
    ctx = Context("e1", "ads-1", 1_000, ARMS, np.eye(4, 3))
    dec = ReplicaDecision("e2", "ads-1", 1_000, ARMS, np.eye(4, 3), 2, 0.0, 1.0, 0)
    for learn_only, first in ((True, "dec"), (False, "c")):
        b = _processor(learn_only)
        msgs = [
            Message(
                topic=first,
                partition=0,
                offset=i,
                key=b"ads-1",
                value=encode(ev),
                timestamp=(1, 1_000),
            )
            for i, ev in enumerate((ctx, dec))
        ]
        out: list = []
        b.process(msgs, 10**13, {0: (False, False)}, out.extend)
        got = [(topic, decode(value)) for topic, _, _, value in out]
        actions = [r.event_id for t, r in got if t == "a"]
        dead = [(r.reason, r.source_offset) for t, r in got if t == "d"]
        assert b.config.first_input == first
        if learn_only:
            assert actions == ["e2"] and dead == [(reasons.WRONG_TOPIC, 0)]
        else:
            assert actions == ["e1"] and dead == [(reasons.WRONG_TOPIC, 1)]


def test_the_topics_of_a_learn_only_worker():
    t = Topics()
    assert t.all(learn_only=True) == ["decisions", "rewards", "actions", "joined", "dead-letter"]
    assert t.all() == ["contexts", "rewards", "actions", "joined", "dead-letter"]
