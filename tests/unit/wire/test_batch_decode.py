"""decode_batch is codec.decode record by record: same records, same errors (reason and detail)."""

import numpy as np
import pytest

from streambandit.wire import (
    Action,
    Context,
    DecodeError,
    Reward,
    Tick,
    avro,
    codec,
    encode,
    encode_context_v1,
    schemas,
)
from streambandit.wire.batch_decode import DecodedColumns, _utf8_ok, decode_batch


def one_by_one(values):
    out = []
    for v in values:
        try:
            out.append(codec.decode(v))
        except DecodeError as exc:
            out.append(exc)
    return out


def same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, DecodeError):
        return (a.reason, a.detail) == (b.reason, b.detail)
    if isinstance(a, Context):
        return (
            (a.event_id, a.model_key, a.timestamp_ms, a.arm_ids)
            == (b.event_id, b.model_key, b.timestamp_ms, b.arm_ids)
            and a.features.shape == b.features.shape
            and a.features.dtype == b.features.dtype
            and a.features.tobytes() == b.features.tobytes()
        )
    if isinstance(a, (Action,)):
        return a.event_id == b.event_id and a.features.tobytes() == b.features.tobytes()
    return a == b


def assert_same(values):
    got, want = decode_batch(values), one_by_one(values)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert same(g, w), (i, values[i], g, w)
    assert_columns(values, want)


def assert_columns(values, want):
    """DecodedColumns gives each record as codec.decode does, and its columns say what the
    record holds: the record's own strings, numbers and features, for every record it takes."""
    # Message keys: the model key, another key, or none, in turn.
    keys = []
    for i, w in enumerate(want):
        model_key = getattr(w, "model_key", "k")
        keys.append([model_key.encode(), b"other", None][i % 3])
    cols = DecodedColumns(values, keys)
    assert len(cols) == len(values)
    for i, w in enumerate(want):
        assert same(cols.record(i), w), (i, values[i])
        fast = int(cols.fast[i])
        assert fast in (0, 1, 2)
        if fast == 0:
            # Only a record outside the fast layouts, or one the per-record decoder refuses, or
            # with a NUL in a string (the fast layout's own rule) is left to codec.decode.
            continue
        assert type(w) is (Context if fast == 1 else Reward)
        a, m = int(cols.id_start[i]), int(cols.id_len[i])
        assert cols.ids[a : a + m].tobytes() == w.event_id.encode()
        assert cols.key_names[cols.key_id[i]] == w.model_key
        assert cols.key_len[i] == len(w.model_key.encode())
        assert cols.ts[i] == w.timestamp_ms
        assert bool(cols.key_ok[i]) == (keys[i] == w.model_key.encode())
        if fast == 2:
            assert cols.value[i] == w.value
            continue
        k, d = w.features.shape
        assert tuple(cols.shape[i]) == (k, d)
        f = int(cols.feat_start[i])
        assert cols.feats[f : f + k * d].tobytes() == w.features.tobytes()
        first = int(cols.arm_first[i])
        arms = [
            cols.arms[s : s + n].tobytes().decode()
            for s, n in zip(cols.arm_start[first : first + k], cols.arm_len[first : first + k])
        ]
        assert tuple(arms) == w.arm_ids
        assert cols.arm_bytes[i] == sum(len(x.encode()) for x in w.arm_ids)
    names = cols.key_names
    assert len(set(names)) == len(names)


def test_utf8_check_agrees_with_pythons_strict_decoder():
    rng = np.random.default_rng(5)
    # Every 1- and 2-byte string, then random 3- and 4-byte ones weighted to the lead bytes.
    cases = [bytes([a]) for a in range(256)] + [
        bytes([a, b]) for a in range(256) for b in range(256)
    ]
    leads = [0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xC0, 0xC2, 0x80]
    for _ in range(60_000):
        n = int(rng.integers(3, 5))
        b = rng.integers(0x70, 0x100, size=n).astype(np.uint8)
        b[0] = leads[int(rng.integers(len(leads)))] if rng.random() < 0.7 else b[0]
        cases.append(b.tobytes())
    cases += ["é-ü€😀".encode(), "\ud800".encode("utf-8", "surrogatepass")]
    for c in cases:
        try:
            c.decode()
            want = True
        except UnicodeDecodeError:
            want = False
        buf = np.frombuffer(b"#" + c + b"#", np.uint8)
        assert _utf8_ok(buf, 1, 1 + len(c)) == want, c


def contexts(rng, n=30):
    out = []
    for i in range(n):
        k, d = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        arms = tuple(rng.choice(["ad-1", "", "é-ü", "x" * 70, "a b", "ad-2"], size=k).tolist())
        out.append(
            Context(
                f"ev-{i}-ß",
                f"key-{i % 3}",
                int(rng.integers(-(2**62), 2**62)),
                arms,
                rng.standard_normal((k, d)) * 10.0 ** rng.integers(-300, 300),
            )
        )
    return out


def test_valid_records_of_every_kind_match():
    rng = np.random.default_rng(0)
    cs = contexts(rng)
    values = [encode(c) for c in cs]
    values += [
        encode(Reward("r1", "key-0", 5, 0.25)),
        encode(Reward("r2", "ké", -(2**63), -1e308)),
        encode(Tick(7)),
        encode_context_v1(cs[0]),
        encode(Action("e", "k", "a", 0, 0.5, 1.0, 3, 9, np.ones(3), 0, 1)),
    ]
    rng.shuffle(values)
    assert_same(values)
    got = decode_batch(values)
    assert sum(isinstance(g, Context) for g in got) == len(cs) + 1


def test_every_truncation_and_corruption_matches():
    rng = np.random.default_rng(1)
    good = [encode(c) for c in contexts(rng, 4)] + [encode(Reward("r", "k", 1, 1.0))]
    values = [
        None,
        b"",
        b"\x5b",
        b"\x5b\x01",
        b"\x00\x01\x02",
        b"\x5b\x09\x01\x00",
        b"\x5b\x01\x07",
    ]
    for g in good:
        values += [g[:cut] for cut in range(len(g))]  # every prefix
        values.append(g + b"\x00")  # a trailing byte
        for pos in rng.integers(0, len(g), size=40):  # random byte flips
            b = bytearray(g)
            b[pos] ^= int(rng.integers(1, 256))
            values.append(bytes(b))
    assert_same(values)


def test_hand_built_edge_cases_match():
    hdr, rhdr = bytes((avro.MAGIC, 1, 2)), bytes((avro.MAGIC, 2, 1))

    def s(x: bytes) -> bytes:
        return avro.long(len(x)) + x

    feats = np.array([[1.0, np.nan]]).tobytes()
    values = [
        hdr + s(b"e") + s(b"k") + avro.long(1) + b"\x00" + s(feats),  # no arms
        hdr + s(b"e") + s(b"k") + avro.long(1) + avro.long(1) + s(b"a") + b"\x00" + s(feats),  # NaN
        hdr
        + s(b"e")
        + s(b"k")
        + avro.long(1)
        + avro.long(1)
        + s(b"a\x00b")
        + b"\x00"
        + s(b"\x00" * 8),  # NUL in id
        hdr
        + s(b"e")
        + s(b"k")
        + avro.long(1)
        + avro.long(2)
        + s(b"a")
        + s(b"b")
        + b"\x00"
        + s(b"\x00" * 24),  # 24 B for 2 arms
        hdr
        + s(b"e")
        + s(b"k")
        + avro.long(1)
        + avro.long(-2)
        + avro.long(4)
        + s(b"a")
        + s(b"b")
        + b"\x00"
        + s(b"\x00" * 16),  # a negative block count with its byte size
        hdr
        + s(b"\xff")
        + s(b"k")
        + avro.long(1)
        + avro.long(1)
        + s(b"a")
        + b"\x00"
        + s(b"\x00" * 8),  # bad UTF-8
        hdr
        + s(b"e")
        + s(b"k")
        + avro.long(1)
        + avro.long(1)
        + s(b"\xc3")
        + b"\x00"
        + s(b"\x00" * 8),  # bad UTF-8 arm
        hdr
        + s(b"e")
        + s(b"k")
        + b"\xff" * 9
        + b"\x7f"
        + avro.long(1)
        + s(b"a")
        + b"\x00"
        + s(b"\x00" * 8),  # > 64 bits
        hdr
        + s(b"e")
        + s(b"k")
        + b"\xff" * 9
        + b"\x01"
        + avro.long(1)
        + s(b"a")
        + b"\x00"
        + s(b"\x00" * 8),  # 64 bits
        rhdr + s(b"e") + s(b"k") + avro.long(3) + np.array([np.inf]).tobytes(),
        rhdr + s(b"e") + s(b"k") + avro.long(3) + np.array([-0.0]).tobytes(),
    ]
    assert_same(values)


def test_features_are_an_independent_float64_array():
    c = Context("e", "k", 1, ("a", "b"), np.arange(6.0).reshape(2, 3))
    (got,) = decode_batch([encode(c)])
    assert (
        got.features.dtype == np.float64
        and got.features.flags.c_contiguous
        and got.features.shape == (2, 3)
    )
    np.testing.assert_array_equal(got.features, c.features)


def test_a_replaced_writer_schema_is_honoured(monkeypatch):
    """A writer registered for a fast layout's (id, version) turns the fast pass off for it: here
    one that writes the model key before the event id, which the fast pass would read swapped."""
    import fastavro

    schema = {
        "type": "record",
        "name": "Reward",
        "namespace": "streambandit",
        "fields": [
            {"name": "model_key", "type": "string"},
            {"name": "event_id", "type": "string"},
            {"name": "timestamp_ms", "type": "long"},
            {"name": "value", "type": "double"},
        ],
    }
    value = encode(Reward("the-key", "the-id", 1, 1.0))  # written with the built-in schema
    monkeypatch.setitem(schemas.WRITERS, (2, 1), fastavro.parse_schema(schema))
    (got,) = decode_batch([value])
    assert (got.event_id, got.model_key) == ("the-id", "the-key")
    assert_same([value])


def test_empty_batch():
    assert decode_batch([]) == []


@pytest.mark.parametrize("n", [1, 2, 500])
def test_batches_of_any_size(n):
    rng = np.random.default_rng(n)
    assert_same([encode(c) for c in contexts(rng, n)])


@pytest.mark.parametrize("bad", ["key", "event_id", "arm", "nul_in_event_id"])
def test_one_bad_string_amid_good_records_leaves_the_others_their_own_strings(bad):
    """The batch's event ids and arm ids are decoded in one go: a record whose key does not
    decode (or whose id or arm id sends the batch the per-record way, or that goes the slow way)
    must not shift the strings of the records after it."""
    hdr = bytes((avro.MAGIC, 1, 2))

    def s(x: bytes) -> bytes:
        return avro.long(len(x)) + x

    eid, key, arm = b"mid", b"k", b"a"
    if bad == "key":
        key = b"\xc3("
    elif bad == "event_id":
        eid = b"\xff"
    elif bad == "arm":
        arm = b"\xc3"
    else:
        eid = b"m\x00d"
    middle = hdr + s(eid) + s(key) + avro.long(1) + avro.long(1) + s(arm) + b"\x00" + s(b"\x00" * 8)
    rng = np.random.default_rng(9)
    before, after = contexts(rng, 5), contexts(rng, 5)
    values = (
        [encode(c) for c in before]
        + [middle, encode(Reward("r-ü", "key-0", 3, 1.0))]
        + [encode(c) for c in after]
    )
    assert_same(values)
    got = decode_batch(values)
    assert [g.arm_ids for g in got[-5:]] == [c.arm_ids for c in after]
    assert [g.event_id for g in got[-5:]] == [c.event_id for c in after]


@pytest.mark.parametrize("bad", ["key", "nan", "slow"])
def test_contexts_of_one_shape_keep_their_own_features_around_a_bad_record(bad):
    """When every context of a batch has the same (K, d), the features are views of one
    (contexts, K, d) array indexed by the context's ordinal: a record in the middle that fails
    after its features were laid out (a model key that does not decode), that never got any (a
    NaN feature), or that goes the slow way must not shift the features of the contexts after it."""
    hdr = bytes((avro.MAGIC, 1, 2))

    def s(x: bytes) -> bytes:
        return avro.long(len(x)) + x

    rng = np.random.default_rng(11)
    same_shape = [
        Context(f"e{i}", "key-0", i, ("a", "b", "c"), rng.standard_normal((3, 4)))
        for i in range(12)
    ]
    feats = rng.standard_normal((3, 4))
    if bad == "nan":
        feats[1, 2] = np.nan
    key = b"\xc3(" if bad == "key" else b"key-0"
    middle = (
        encode(Tick(5))
        if bad == "slow"
        else hdr
        + s(b"mid")
        + s(key)
        + avro.long(1)
        + avro.long(3)
        + s(b"a")
        + s(b"b")
        + s(b"c")
        + b"\x00"
        + s(feats.tobytes())
    )
    values = (
        [encode(c) for c in same_shape[:6]]
        + [middle, encode(Reward("r", "key-0", 3, 1.0))]
        + [encode(c) for c in same_shape[6:]]
    )
    assert_same(values)
    got = [g for g in decode_batch(values) if isinstance(g, Context)]
    assert [g.event_id for g in got] == [c.event_id for c in same_shape]
    for g, c in zip(got, same_shape):
        np.testing.assert_array_equal(g.features, c.features)


@pytest.mark.parametrize("n", [2, 3, 40])
def test_one_shape_batch_made_by_column_matches_record_by_record(n):
    # Every record parsed and one (K, d): decode_batch makes the records by column
    # (_records_by_column), not in its per-record loop; they must still be codec.decode's, with
    # the same field types, in record order.
    rng = np.random.default_rng(n)
    recs = []
    for i in range(n):
        key = f"m-{i % 4}-é"
        if rng.random() < 0.5:
            recs.append(Reward(f"r{i}", key, int(rng.integers(-(2**62), 2**62)), float(i) / 7))
        else:
            feats = rng.standard_normal((3, 2))
            recs.append(Context(f"c{i}", key, int(rng.integers(0, 2**40)), ("a", "bé", ""), feats))
    values = [encode(r) for r in recs]
    assert_same(values)
    for got, want in zip(decode_batch(values), recs):
        assert type(got) is type(want)
        for name in ("event_id", "model_key", "timestamp_ms"):
            assert type(getattr(got, name)) is type(getattr(want, name))
            assert getattr(got, name) == getattr(want, name)
        if isinstance(got, Reward):
            assert type(got.value) is float and got.value == want.value
        else:
            assert got.arm_ids == want.arm_ids and type(got.arm_ids) is tuple
            assert got.features.tobytes() == want.features.tobytes()


def test_a_model_key_with_a_nul_is_decoded_as_codec_does():
    # _parse copies model keys NUL-separated, so a key holding a NUL takes codec.decode.
    recs = [Reward("r", "a\x00b", 5, 1.0), Reward("s", "ab", 6, 2.0)]
    values = [encode(r) for r in recs]
    assert_same(values)
    assert [r.model_key for r in decode_batch(values)] == ["a\x00b", "ab"]
