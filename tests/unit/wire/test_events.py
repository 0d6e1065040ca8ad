"""The wire format: exact round trips, forward compatibility, every refusal with its reason code,
and snapshot integrity."""

import copy
import dataclasses
import json
import math

import numpy as np
import pytest

from streambandit import reasons
from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import (
    Action,
    Context,
    DeadLetter,
    DecodeError,
    InputRef,
    Joined,
    Reward,
    SnapshotError,
    Tick,
    avro,
    codec,
    decode,
    encode,
    pack_snapshot,
    schemas,
    snapshot,
    unpack_snapshot,
)

AWKWARD = np.array(
    [[0.0, -0.0, 5e-324, 1.7976931348623157e308], [1 / 3, -2.5, 1e-300, 123456789.123456789]]
)


def same(a, b):
    assert type(a) is type(b)
    for f in a.__dataclass_fields__:
        x, y = getattr(a, f), getattr(b, f)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), f
        else:
            assert x == y, f


@pytest.mark.parametrize(
    "event",
    [
        Context("e1", "m", 123, ("a", "b"), AWKWARD),
        Reward("e1", "m", 456, -0.5),
        Tick(789),
        Action("e1", "m", "b", 1, 2.5, 0.9, 7, 123, AWKWARD[1], 0, 42),
        Joined("e1", "m", AWKWARD[0], 1.0, True, 0.9, 123, 456, 7, 1, 43),
        DeadLetter("malformed", "bad", "contexts", 3, 99, b"k", b"\x00\xff", 5, 0, 99),
        DeadLetter("malformed", "bad", "contexts", 3, 99, None, None, 5),
    ],
)
def test_round_trip_is_bit_exact(event):
    same(decode(encode(event)), event)


def ctx_bytes(arms):
    """A context in the version 1 layout (one record per arm): still read."""
    return codec.write(
        1, {"event_id": "e", "model_key": "m", "timestamp_ms": 1, "arms": arms}, version=1
    )


def ctx2_bytes(arm_ids, block):
    """A context in the current layout (version 2): arm ids, then one packed block of features."""
    return codec.write(
        1,
        {
            "event_id": "e",
            "model_key": "m",
            "timestamp_ms": 1,
            "arm_ids": arm_ids,
            "features": block,
        },
    )


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", reasons.MALFORMED),
        (b"\x5b\x01", reasons.MALFORMED),
        (b'{"json": true}', reasons.MALFORMED),
        (bytes((0x5B, 99, 1)) + b"xx", reasons.UNKNOWN_SCHEMA),
        (bytes((0x5B, 1, 9)) + b"xx", reasons.UNKNOWN_SCHEMA),
        (bytes((0x5B, 1, 1)) + b"\x02", reasons.MALFORMED),  # truncated Avro body
        (ctx_bytes([]), reasons.EMPTY_ARMS),
        (ctx_bytes([{"arm_id": "a", "features": b"\x00" * 12}]), reasons.BAD_DIMENSION),
        (
            ctx_bytes(
                [
                    {"arm_id": "a", "features": b"\x00" * 16},
                    {"arm_id": "b", "features": b"\x00" * 24},
                ]
            ),
            reasons.BAD_DIMENSION,
        ),
        (
            ctx_bytes([{"arm_id": "a", "features": np.array([1.0, math.nan]).tobytes()}]),
            reasons.NON_FINITE_FEATURES,
        ),
        (
            ctx_bytes([{"arm_id": "a", "features": np.array([math.inf, 0.0]).tobytes()}]),
            reasons.NON_FINITE_FEATURES,
        ),
        (ctx2_bytes([], b""), reasons.EMPTY_ARMS),
        (ctx2_bytes(["a"], b""), reasons.BAD_DIMENSION),
        (ctx2_bytes(["a"], b"\x00" * 12), reasons.BAD_DIMENSION),
        (
            ctx2_bytes(["a", "b"], b"\x00" * 24),
            reasons.BAD_DIMENSION,
        ),  # 3 values cannot be 2 arms of one dimension
        (ctx2_bytes(["a"], np.array([1.0, math.nan]).tobytes()), reasons.NON_FINITE_FEATURES),
        (
            ctx2_bytes(["a", "b"], np.array([0.0, 1.0, -math.inf, 0.0]).tobytes()),
            reasons.NON_FINITE_FEATURES,
        ),
        (encode(Reward("e", "m", 1, math.nan)), reasons.NON_FINITE_REWARD),
        (encode(Reward("e", "m", 1, -math.inf)), reasons.NON_FINITE_REWARD),
    ],
)
def test_bad_bytes_are_refused_with_a_reason(data, reason):
    with pytest.raises(DecodeError) as info:
        decode(data)
    assert info.value.reason == reason


def test_a_context_in_the_version_1_layout_is_read_the_same():
    ctx = Context("e1", "m", 123, ("a", "b"), AWKWARD)
    v1 = codec.encode_context_v1(ctx)
    assert v1[:3] == bytes((0x5B, 1, 1)) and encode(ctx)[:3] == bytes((0x5B, 1, 2))
    same(decode(v1), ctx)
    same(decode(encode(ctx)), ctx)


@pytest.mark.parametrize(
    "event",
    [
        Action("e1", "m", "b", 1, 2.5, 0.9, 7, 123, AWKWARD[1], 0, 42),
        Action(
            "\u00e9v\u00e9nement-\u2603",
            "m" * 300,
            "",
            2**31 - 1,
            -0.0,
            math.nan,
            2**63 - 1,
            -(2**63),
            AWKWARD[0],
            -1,
            -1,
        ),
        Action("e", "m", "a", 63, math.inf, 1.0, 64, 4095, AWKWARD[0], 1, 4096),
        Joined("e1", "m", AWKWARD[0], 1.0, True, 0.9, 123, 456, 7, 1, 43),
        Joined(
            "e" * 5000,
            "\u2603",
            AWKWARD[1],
            -1e300,
            False,
            1.0,
            1_795_381_677_451,
            -65,
            300,
            -1,
            -64,
        ),
    ],
)
def test_hand_written_action_and_joined_bytes_equal_fastavro(event):
    """The worker's encoders for actions and joined records are hand-written Avro: byte for byte
    what fastavro writes with the schema."""
    datum = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    datum["features"] = codec.features_to_bytes(event.features)
    assert encode(event) == codec.write(3 if isinstance(event, Action) else 4, datum)


def test_memoised_longs_are_the_plain_varint_for_every_magnitude_and_sign():
    """``_long`` writes a large long as its low 7-bit group plus a memoised varint of the rest;
    the oracle is the plain loop, over every byte-length boundary, runs of neighbours (which share
    the memo), random values, and enough distinct highs to clear the memo."""
    rng = np.random.default_rng(3)
    edges = [s * (2 ** (7 * k) + d) for k in range(10) for d in (-1, 0, 1) for s in (1, -1)]
    runs = [base + i for base in (1_795_381_677_451, -(2**40), 2**62) for i in range(300)]
    many = [int(x) for x in rng.integers(-(2**63), 2**63 - 1, size=20_000, dtype=np.int64)]
    for n in [2**63 - 1, -(2**63), *edges, *runs, *many]:
        if -(2**63) <= n < 2**63:
            assert avro.long(n) == avro.varint(n), n
            assert avro.long(np.int64(n)) == avro.varint(n), n
    for n in (2**63, -(2**63) - 1):
        with pytest.raises(ValueError):
            avro.long(n)


def test_a_record_from_a_newer_writer_with_an_added_field_is_read():
    schema = json.loads((schemas.SCHEMA_DIR / "reward.avsc").read_text())
    v2 = copy.deepcopy(schema)
    v2["fields"].append(
        {"name": "currency", "type": "string", "default": "EUR", "doc": "new in v2"}
    )
    schemas.register_writer_schema("reward", 2, v2)
    import io

    import fastavro

    buf = io.BytesIO()
    buf.write(bytes((0x5B, 2, 2)))
    fastavro.schemaless_writer(
        buf,
        fastavro.parse_schema(v2),
        {"event_id": "e", "model_key": "m", "timestamp_ms": 3, "value": 1.5, "currency": "USD"},
    )
    assert decode(buf.getvalue()) == Reward("e", "m", 3, 1.5)


def test_a_writer_lacking_a_required_field_is_missing_field():
    schema = json.loads((schemas.SCHEMA_DIR / "reward.avsc").read_text())
    v3 = copy.deepcopy(schema)
    v3["fields"] = [f for f in v3["fields"] if f["name"] != "value"]
    schemas.register_writer_schema("reward", 3, v3)
    import io

    import fastavro

    buf = io.BytesIO()
    buf.write(bytes((0x5B, 2, 3)))
    fastavro.schemaless_writer(
        buf, fastavro.parse_schema(v3), {"event_id": "e", "model_key": "m", "timestamp_ms": 3}
    )
    with pytest.raises(DecodeError) as info:
        decode(buf.getvalue())
    assert info.value.reason == reasons.MISSING_FIELD


def engine_with_state(n=300):
    cfg = parse_models_config(
        {
            "models": [
                {
                    "match": "*",
                    "policy": "glb_omd",
                    "dim": 4,
                    "reward_window_ms": 50,
                    "default_reward": 0.0,
                    "aggregation": "sum",
                    "hyper": {"link": "poisson"},
                }
            ]
        }
    )
    e = PartitionEngine(cfg)
    rng = np.random.default_rng(0)
    for i in range(n):
        feats = rng.standard_normal((3, 4)) / 3
        e.on_context(
            Context(f"e{i}", f"m{i % 3}", 10 * i, ("a", "b", "c"), feats), InputRef(0, 2, i)
        )
        e.on_reward(Reward(f"e{i}", f"m{i % 3}", 10 * i + 3, 2.0), InputRef(1, 2, 2 * i))
    e.on_reward(Reward("ghost", "m1", 10 * n, 1.0), InputRef(1, 2, 10_000, b"k", b"raw", 77))
    return cfg, e


@pytest.mark.parametrize("n", [2, 2000])  # small: stored plain; large: compressed
def test_snapshot_round_trip_restores_the_engine_exactly(n):
    cfg, e = engine_with_state(n)
    snap = {
        "partition": 2,
        "created_ms": 1,
        "contexts_offset": n,
        "rewards_offset": 2 * n,
        "actions_offset": 5,
        "joined_offset": 6,
        "dead_letter_offset": 7,
        "chain": 12_345,
        "seq": 3,
        "engine": e.snapshot(),
    }
    data = pack_snapshot(snap)
    assert (data[3] & 1) == (1 if n == 2000 else 0)
    back = unpack_snapshot(data)
    assert {k: v for k, v in back.items() if k != "engine"} == {
        k: v for k, v in snap.items() if k != "engine"
    }
    r = PartitionEngine.restore(cfg, back["engine"])
    for key, m in e.models.items():
        a, b = m.state_dict(), r.models[key].state_dict()
        assert all(
            (a[k].tobytes() == b[k].tobytes()) if isinstance(a[k], np.ndarray) else a[k] == b[k]
            for k in a
        )
    assert list(r.pending) == list(e.pending) and r.watermark_ms == e.watermark_ms
    [(reward, src)] = r.early["ghost"]
    assert (
        src == InputRef(1, 2, 10_000)
        and src.value == b"raw"
        and src.key == b"k"
        and src.timestamp_ms == 77
    )
    assert (
        r.snapshot()["pending"][0]["features"].tobytes()
        == e.snapshot()["pending"][0]["features"].tobytes()
    )


def test_a_corrupt_snapshot_is_detected():
    _, e = engine_with_state(20)
    data = bytearray(
        pack_snapshot(
            {
                "partition": 0,
                "created_ms": 1,
                "contexts_offset": 0,
                "rewards_offset": 0,
                "actions_offset": 0,
                "joined_offset": 0,
                "dead_letter_offset": 0,
                "engine": e.snapshot(),
            }
        )
    )
    for i in (len(data) // 2, len(data) - 1, 9):
        broken = bytearray(data)
        broken[i] ^= 0x01
        with pytest.raises(SnapshotError, match="checksum"):
            unpack_snapshot(bytes(broken))
    with pytest.raises(SnapshotError, match="header"):
        unpack_snapshot(b"\x00" * 20)
    with pytest.raises(SnapshotError):
        unpack_snapshot(bytes(data[:3]) + b"\x00")


def _snapshot_bytes(e, record=None, models=None):
    """``e``'s snapshot as the worker packs it; with ``record``, that record (uncompressed) in
    place of the packed one, with the packed buffers and a valid length and checksum."""
    import struct
    import zlib

    state = e.snapshot()
    if models is not None:
        state["models"] = models
    data = pack_snapshot(
        {
            "partition": 0,
            "created_ms": 1,
            "contexts_offset": 0,
            "rewards_offset": 0,
            "actions_offset": 0,
            "joined_offset": 0,
            "dead_letter_offset": 0,
            "engine": state,
        }
    )
    if record is None:
        return data
    length = struct.unpack("<Q", data[8:16])[0]
    buffers = data[-(-(16 + length) // 8) * 8 :]
    after = (
        struct.pack("<Q", len(record))
        + record
        + bytes(-(-(16 + len(record)) // 8) * 8 - 16 - len(record))
        + buffers
    )
    return data[:3] + b"\x00" + struct.pack("<I", zlib.crc32(after)) + after


def _record(data):
    """The Avro record of a packed snapshot, decompressed."""
    import struct
    import zlib

    length = struct.unpack("<Q", data[8:16])[0]
    record = data[16 : 16 + length]
    return zlib.decompress(record) if data[3] & 1 else record


def test_snapshot_models_decode_one_at_a_time_and_equal_the_full_decode():
    import io

    import fastavro

    _, e = engine_with_state(60)
    # One record per model (a learner's state_dict each), as for the learners without blocks.
    data = _snapshot_bytes(e, models={k: m.state_dict() for k, m in e.models.items()})
    models = unpack_snapshot(data)["engine"]["models"]
    assert not models.blocks and len(models) == 3 and list(models) == list(e.models)
    # the oracle: fastavro decoding the whole record with the whole schema
    full = fastavro.schemaless_reader(
        io.BytesIO(_record(data)), schemas.READERS[6], schemas.READERS[6]
    )
    for m in full["models"]:
        want = snapshot.state_from_avro(m["arrays"], m["scalars"])
        got = models[m["model_key"]]
        assert got.keys() == want.keys()
        for k in want:
            assert (
                (got[k].tobytes() == want[k].tobytes())
                if isinstance(want[k], np.ndarray)
                else got[k] == want[k]
            )


def test_a_snapshot_body_that_passes_its_checksum_but_does_not_parse_is_refused_at_unpack():
    _, e = engine_with_state(20)
    records = {k: m.state_dict() for k, m in e.models.items()}
    body = _record(_snapshot_bytes(e, models=records))
    for cut in (len(body) // 2, len(body) - 1):  # truncated inside a model record, and in the tail
        with pytest.raises(SnapshotError, match="does not decode"):
            unpack_snapshot(_snapshot_bytes(e, body[:cut], models=records))
    with pytest.raises(SnapshotError, match="does not decode"):
        unpack_snapshot(_snapshot_bytes(e, body + b"\x00", models=records))
    body = _record(_snapshot_bytes(e))  # the models in a block
    for cut in (len(body) // 2, len(body) - 1):
        with pytest.raises(SnapshotError, match="does not decode"):
            unpack_snapshot(_snapshot_bytes(e, body[:cut]))


def test_decode_error_details_are_the_same_in_every_process():
    """A dead letter's detail must not carry an object address (a replay would differ)."""
    from streambandit.wire import DecodeError, Reward, decode, encode

    cut = encode(Reward("r", "k", 1, 1.0))[:-3]
    with pytest.raises(DecodeError) as e1:
        decode(cut)
    with pytest.raises(DecodeError) as e2:
        decode(bytes(cut))
    assert e1.value.detail == e2.value.detail and " at 0x" not in e1.value.detail


def _fastavro_models(models: dict) -> list[dict]:
    """The models as fastavro takes them (the records pack_snapshot used to build)."""
    out = []
    for key, state in models.items():
        arrays = [
            {
                "name": k,
                "dtype": v.dtype.newbyteorder("<").str,
                "shape": list(v.shape),
                "data": np.ascontiguousarray(v)
                .astype(v.dtype.newbyteorder("<"), copy=False)
                .tobytes(),
            }
            for k, v in state.items()
            if isinstance(v, np.ndarray)
        ]
        scalars = [
            {"name": k, "value": v} for k, v in state.items() if not isinstance(v, np.ndarray)
        ]
        out.append({"model_key": key, "arrays": arrays, "scalars": scalars})
    return out


def test_the_hand_written_snapshot_body_is_fastavros_byte_for_byte():
    """pack_snapshot writes the models, the pending decisions and the recent ids by hand; the body
    must be exactly what fastavro writes for the whole record, for every kind of array (dtypes,
    byte orders, 0-d, empty, non-contiguous) and of scalar (every branch of the union), for pending
    decisions with and without a reward, and for none of them at all."""
    import io
    import struct
    import zlib

    import fastavro

    rng = np.random.default_rng(3)
    _, e = engine_with_state(40)
    snap = e.snapshot()
    snap["models"] = dict(snap["models"]) | {
        "odd é": {
            "f": rng.standard_normal((3, 4)),
            "big": np.arange(6, dtype=">f8").reshape(2, 3),
            "ints": np.array([-1, 2**40], dtype=np.int64),
            "flags": np.array([True, False]),
            "zero_d": np.array(2.5),
            "empty": np.zeros((0, 3)),
            "strided": np.arange(10.0)[::3],
            "none": None,
            "yes": True,
            "no": False,
            "small": 3,
            "neg": -(2**62),
            "x": -0.0,
            "inf": math.inf,
            "s": "ünï",
        },
        "no-arrays": {"n_updates": 0},
    }
    # Pending decisions with every branch of reward's union and the edges of their fields.
    extra = dict(snap["pending"][0])
    snap["pending"] = list(snap["pending"]) + [
        extra
        | {
            "event_id": "ünï-1",
            "reward": None,
            "n_rewards": 0,
            "trigger_source": -1,
            "trigger_offset": -1,
        },
        extra
        | {
            "event_id": "",
            "reward": -0.0,
            "n_rewards": 3,
            "model_version": 2**62,
            "arm_index": 2**31 - 1,
            "features": np.arange(3, dtype=np.float32),
            "decision_timestamp_ms": -(2**63),
        },
        extra | {"event_id": "x", "reward": 7, "score": math.inf, "features": np.zeros(0)},
    ]
    snap["recent"] = list(snap["recent"]) + [("ünï", True), ("", False), ("y" * 300, 1), ("z", 0)]
    assert any(not observed for _, observed in snap["recent"]) and any(
        observed for _, observed in snap["recent"]
    )
    for models, pending, recent in (
        (snap["models"], snap["pending"], snap["recent"]),
        ({}, [], []),
    ):
        s = dict(snap, models=models, pending=pending, recent=recent)
        head = {
            "partition": 1,
            "created_ms": 2,
            "contexts_offset": 3,
            "rewards_offset": 4,
            "actions_offset": 5,
            "joined_offset": 6,
            "dead_letter_offset": 7,
        }
        data = pack_snapshot(head | {"engine": s})
        body = _record(data)
        assert struct.unpack("<I", data[4:8])[0] == zlib.crc32(data[8:])
        assert (
            len(data) == -(-(16 + struct.unpack("<Q", data[8:16])[0]) // 8) * 8
        )  # no blocks, no buffers
        buf = io.BytesIO()
        pending = [
            {
                **{k: v for k, v in p.items() if k != "features"},
                "features": codec.features_to_bytes(p["features"]),
            }
            for p in s["pending"]
        ]
        early = [
            {
                "event_id": x["event_id"],
                "model_key": x["model_key"],
                "timestamp_ms": x["timestamp_ms"],
                "value": x["value"],
                "source_partition": x["source"].partition,
                "source_offset": x["source"].offset,
                "key": x["source"].key,
                "raw": x["source"].value,
                "source_timestamp_ms": x["source"].timestamp_ms,
            }
            for x in s["early"]
        ]
        fastavro.schemaless_writer(
            buf,
            schemas.READERS[6],
            head
            | {
                "watermark_ms": s["watermark_ms"],
                "models": _fastavro_models(models),
                "pending": pending,
                "early": early,
                "recent": [{"event_id": k, "observed": bool(v)} for k, v in s["recent"]],
                "counters": {k: int(v) for k, v in s["counters"].items()},
            },
        )
        assert body == buf.getvalue()
    back = unpack_snapshot(pack_snapshot(head | {"engine": snap}))["engine"]["models"]["odd é"]
    assert back["big"].tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]] and back["zero_d"].shape == ()
    assert (
        back["x"] == 0.0
        and math.copysign(1, back["x"]) == -1
        and back["none"] is None
        and back["yes"] is True
    )
