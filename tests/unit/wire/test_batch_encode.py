"""encode_actions / encode_joined_records are encode_action / encode_joined record by record:
the same bytes for every record, and the same error for one that cannot be written."""

import numpy as np
import pytest

from streambandit.wire import Action, Joined, batch_encode, codec, encode_action, encode_joined
from streambandit.wire.batch_encode import encode_actions, encode_joined_records

# Longs at every varint length edge and both signs, as the one-at-a-time encoder sees them.
EDGES = [
    0,
    1,
    -1,
    63,
    -64,
    64,
    -65,
    4095,
    4096,
    8191,
    8192,
    2**20,
    -(2**20),
    1_700_000_000_123,
    2**62,
    -(2**62),
    2**63 - 1,
    -(2**63),
]


def random_action(rng, i):
    d = int(rng.integers(1, 6))
    pick = lambda: (
        int(EDGES[rng.integers(len(EDGES))])
        if rng.random() < 0.5
        else int(rng.integers(-(10**6), 10**12))
    )
    return Action(
        event_id=rng.choice(["e", "", "événement-", "ключ", "e\x00x"]) + str(i),
        model_key=rng.choice(["m-0", "placement-1", "ü"]),
        arm_id=rng.choice(["a", "", "ad-17"]),
        arm_index=int(rng.integers(0, 2**31 - 1))
        if rng.random() < 0.3
        else int(rng.integers(0, 50)),
        score=float(rng.choice([rng.normal(), -0.0, np.inf, -np.inf, np.nan, 1e308])),
        propensity=float(rng.random()),
        model_version=abs(pick()) % 2**63,
        decision_timestamp_ms=pick(),
        features=rng.normal(size=d),
        trigger_source=int(rng.choice([-1, 0, 1])),
        trigger_offset=pick(),
    )


def random_joined(rng, i):
    a = random_action(rng, i)
    return Joined(
        event_id=a.event_id,
        model_key=a.model_key,
        features=a.features,
        reward=float(rng.normal() * 10),
        reward_observed=bool(rng.random() < 0.5),
        propensity=a.propensity,
        decision_timestamp_ms=a.decision_timestamp_ms,
        join_timestamp_ms=a.trigger_offset,
        model_version_before=a.model_version,
        trigger_source=a.trigger_source,
        trigger_offset=a.trigger_offset,
    )


def compiled_only(monkeypatch):
    """Make the one-at-a-time fallback fail, so a test sees the compiled pass's own bytes."""

    def no_fallback(_):
        raise AssertionError("fell back to the one-at-a-time encoder")

    monkeypatch.setattr(batch_encode, "encode_action", no_fallback)
    monkeypatch.setattr(batch_encode, "encode_joined", no_fallback)


@pytest.mark.parametrize("seed", range(5))
def test_actions_are_the_one_at_a_time_bytes(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    actions = [random_action(rng, i) for i in range(300)]
    want = [encode_action(a) for a in actions]
    compiled_only(monkeypatch)
    assert encode_actions(actions) == want


@pytest.mark.parametrize("seed", range(5))
def test_joined_records_are_the_one_at_a_time_bytes(seed, monkeypatch):
    rng = np.random.default_rng(100 + seed)
    joined = [random_joined(rng, i) for i in range(300)]
    want = [encode_joined(j) for j in joined]
    compiled_only(monkeypatch)
    assert encode_joined_records(joined) == want


def test_each_record_decodes_back_to_its_fields():
    rng = np.random.default_rng(7)
    actions = [random_action(rng, i) for i in range(20)]
    for a, b in zip(actions, encode_actions(actions)):
        back = codec.decode(b)
        assert (back.event_id, back.arm_index, back.model_version, back.trigger_offset) == (
            a.event_id,
            a.arm_index,
            a.model_version,
            a.trigger_offset,
        )
        np.testing.assert_array_equal(back.features, a.features)


def test_empty_batch():
    assert encode_actions([]) == [] and encode_joined_records([]) == []


@pytest.mark.parametrize(
    "features",
    [
        np.arange(3, dtype=np.float32),  # converted to float64 by features_to_bytes
        np.arange(6.0).reshape(2, 3),  # 2-D: its C-order bytes
        np.arange(4, dtype=np.int64),
        np.arange(3.0).astype(">f8"),  # big-endian: written little-endian
        np.arange(8.0)[::2],  # not contiguous
    ],
)
def test_features_that_are_not_plain_float_vectors_give_the_same_bytes(features):
    rng = np.random.default_rng(1)
    actions = [random_action(rng, 0), random_action(rng, 1)]
    actions[1].features = features
    assert encode_actions(actions) == [encode_action(a) for a in actions]


@pytest.mark.parametrize(
    "field,value",
    [
        ("model_version", 2**63),
        ("trigger_offset", -(2**63) - 1),
        ("decision_timestamp_ms", 1.5),
        ("event_id", "bad \ud800 surrogate"),
        ("event_id", 17),
        ("score", "x"),
    ],
)
def test_a_record_that_cannot_be_written_fails_as_the_one_at_a_time_encoder_does(field, value):
    rng = np.random.default_rng(2)
    actions = [random_action(rng, i) for i in range(3)]
    setattr(actions[1], field, value)
    with pytest.raises(Exception) as want:
        [encode_action(a) for a in actions]
    with pytest.raises(want.type, match=None) as got:
        encode_actions(actions)
    assert str(got.value) == str(want.value)


def test_joined_observed_flag_is_truthiness():
    rng = np.random.default_rng(3)
    joined = [random_joined(rng, i) for i in range(4)]
    for j, flag in zip(joined, [0, 1, np.bool_(True), 2]):
        j.reward_observed = flag
    assert encode_joined_records(joined) == [encode_joined(j) for j in joined]


@pytest.mark.parametrize("fits", [True, False])
def test_the_timed_encoders_give_each_decision_time_and_each_observed_reward_delay(fits):
    """The worker's latency histograms read these: the same whether the batch is encoded in the
    compiled pass or (a field that does not fit a column) one record at a time."""
    rng = np.random.default_rng(4)
    actions = [random_action(rng, i) for i in range(50)]
    joined = [random_joined(rng, i) for i in range(50)]
    if not fits:
        actions[7].decision_timestamp_ms = float(2**40)  # written as its int, not a column
        joined[7].features = np.arange(3, dtype=np.int64)
    values, decided = batch_encode.encode_actions_timed(actions)
    assert values == [encode_action(a) for a in actions]
    assert decided == [a.decision_timestamp_ms for a in actions]
    values, delays = batch_encode.encode_joined_timed(joined)
    assert values == [encode_joined(j) for j in joined]
    assert delays == [
        j.join_timestamp_ms - j.decision_timestamp_ms for j in joined if j.reward_observed
    ]
