"""Typed records and their wire format (Avro via fastavro; no pickle anywhere).

Wire format of every record: a 3-byte header, then Avro binary (schemaless) encoding:

    byte 0: magic 0x5B      byte 1: schema id      byte 2: schema version

The header names the writer schema; the reader resolves it against its own current schema, so a
record written by a newer producer with an added (defaulted) field is still read. Schemas live in
``streambandit/schemas/*.avsc``; the evolution rules are in docs/schemas.md.

Feature vectors travel as packed little-endian float64 bytes: one ``np.frombuffer`` per arm
instead of a Python float per element.

Snapshots use the same header plus a flags byte (bit 0: zlib-compressed body) and a CRC32 of the
body; a mismatch is a :class:`SnapshotError`.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import struct
import zlib
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro
import numpy as np

from streambandit import reasons
from streambandit.errors import StreambanditError

__all__ = [
    "Context", "Reward", "Tick", "Action", "Joined", "DeadLetter", "InputRef",
    "DecodeError", "SnapshotError", "encode", "decode", "pack_snapshot", "unpack_snapshot",
    "features_to_bytes", "features_from_bytes", "encode_context_v1", "encode_action", "encode_joined",
]

MAGIC = 0x5B
_SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"


class DecodeError(StreambanditError, ValueError):
    """A record that cannot be turned into an event; ``reason`` is a code from reasons.py."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class SnapshotError(StreambanditError, ValueError):
    """A snapshot that is corrupt (checksum), of an unknown format, or does not fit."""


# -- records -----------------------------------------------------------------------------------
# Records are values: never modify one after it is built. Context, Reward, Action and Joined are
# not declared frozen because they are built once per event on the worker's hot path, where a
# frozen dataclass's constructor (object.__setattr__ per field) costs several times as much (a
# Reward: 0.48 against 0.14 us).


@dataclasses.dataclass(slots=True)
class Context:
    event_id: str
    model_key: str
    timestamp_ms: int
    arm_ids: tuple[str, ...]
    features: np.ndarray  # (K, d) float64, finite, K >= 1


@dataclasses.dataclass(slots=True)
class Reward:
    event_id: str
    model_key: str
    timestamp_ms: int
    value: float


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    timestamp_ms: int


@dataclasses.dataclass(slots=True)
class Action:
    event_id: str
    model_key: str
    arm_id: str
    arm_index: int
    score: float
    propensity: float
    model_version: int
    decision_timestamp_ms: int
    features: np.ndarray
    trigger_source: int = -1
    trigger_offset: int = -1


@dataclasses.dataclass(slots=True)
class Joined:
    event_id: str
    model_key: str
    features: np.ndarray
    reward: float
    reward_observed: bool
    propensity: float
    decision_timestamp_ms: int
    join_timestamp_ms: int
    model_version_before: int
    trigger_source: int = -1
    trigger_offset: int = -1


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    trigger_source: int = -1
    trigger_offset: int = -1


@dataclasses.dataclass(slots=True, eq=False)
class InputRef:
    """Where an input record came from, with its original bytes (to dead-letter it intact).
    Identity is the position alone: (source, partition, offset). Treat it as immutable (it is
    hashed by position); like the records above it is not frozen only because a frozen
    dataclass's constructor costs about six times as much, once per record in the worker."""

    source: int  # 0 contexts, 1 rewards
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    timestamp_ms: int = 0

    def _pos(self) -> tuple[int, int, int]:
        return (self.source, self.partition, self.offset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputRef) and self._pos() == other._pos()

    def __hash__(self) -> int:
        return hash(self._pos())


# -- schemas -----------------------------------------------------------------------------------

_IDS = {"context": 1, "reward": 2, "action": 3, "joined": 4, "dead_letter": 5, "snapshot": 6, "tick": 7}
# The version this code writes, per schema id (header byte 2). Context version 2 carries all the
# arms' features in one packed block (one frombuffer per record instead of one per arm); version 1
# (``context.v1.avsc``: an array of {arm_id, features} records) is still read.
_VERSIONS = {_id: 1 for _id in _IDS.values()} | {1: 2}
_CURRENT_VERSION = 1  # the version of every schema but context's (kept for older callers)


def _load(name: str) -> dict:
    return fastavro.parse_schema(json.loads((_SCHEMA_DIR / f"{name}.avsc").read_text()))


_SCHEMAS: dict[int, dict] = {}  # schema id -> current (reader) schema
_WRITERS: dict[tuple[int, int], dict] = {}  # (schema id, version) -> writer schema
for _name, _id in _IDS.items():
    _SCHEMAS[_id] = _load(_name)
    _WRITERS[(_id, _VERSIONS[_id])] = _SCHEMAS[_id]
# Writer versions whose layout cannot be resolved into the current reader schema by Avro's rules:
# read with their own schema, then converted in ``decode``.
_LEGACY: dict[tuple[int, int], dict] = {(1, 1): _load("context.v1")}
_WRITERS.update(_LEGACY)


def register_writer_schema(name: str, version: int, schema: dict) -> None:
    """Make records written with another version of a schema readable (e.g. an older release's,
    or a newer one that added defaulted fields)."""
    _WRITERS[(_IDS[name], version)] = fastavro.parse_schema(schema)


def features_to_bytes(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype="<f8").tobytes()


def features_from_bytes(b: bytes) -> np.ndarray:
    if len(b) % 8:
        raise DecodeError(reasons.BAD_DIMENSION, f"features have {len(b)} bytes, not a multiple of 8")
    return np.frombuffer(b, dtype="<f8").astype(np.float64)


# -- encode ------------------------------------------------------------------------------------


def _header(schema_id: int, version: int | None = None) -> bytes:
    return bytes((MAGIC, schema_id, _VERSIONS[schema_id] if version is None else version))


def _write(schema_id: int, datum: dict, version: int | None = None) -> bytes:
    """Header + Avro body with the writer schema of ``version`` (the current one by default)."""
    version = _VERSIONS[schema_id] if version is None else version
    buf = io.BytesIO()
    buf.write(_header(schema_id, version))
    fastavro.schemaless_writer(buf, _WRITERS[(schema_id, version)], datum)
    return buf.getvalue()


# Hand-written Avro binary for the two records the worker writes per event (action, joined): the
# same bytes fastavro writes (tests/unit/test_events.py compares them), at about half the cost.
_pack_double = struct.Struct("<d").pack
_ACTION_HEADER = bytes((MAGIC, 3, 1))
_JOINED_HEADER = bytes((MAGIC, 4, 1))


def _varint(n: int) -> bytes:
    """Avro int/long: zigzag, then base-128 varint."""
    n = int(n)
    if not -(2**63) <= n < 2**63:
        raise ValueError(f"{n} does not fit an Avro long")
    return _varint_unsigned((n << 1) ^ (n >> 63))


def _varint_unsigned(z: int) -> bytes:
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_LO, _SMALL_HI = -64, 4096
_SMALL = tuple(_varint(i) for i in range(_SMALL_LO, _SMALL_HI))  # lengths, indices, small ints: a lookup


# The large longs the worker writes per event (event timestamps, input offsets, model versions)
# mostly share all but their low 7 bits with one written just before: their varint is the low
# group's byte followed by the varint of the rest, which is memoised (a dict lookup and a concat:
# ~0.2 us against ~0.65 us for the loop, several times per output record).
_LOW_GROUP = tuple(bytes((i | 0x80,)) for i in range(128))
_HIGH_GROUPS: dict[int, bytes] = {}


def _long(n: int) -> bytes:
    if _SMALL_LO <= n < _SMALL_HI:
        return _SMALL[n - _SMALL_LO]
    n = int(n)  # numpy integers (snapshot scalars) would wrap in the shift below
    if not -(2**63) <= n < 2**63:
        raise ValueError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)  # zigzag; > 0x7F here, so the low group has the continuation bit
    high = z >> 7
    rest = _HIGH_GROUPS.get(high)
    if rest is None:
        if len(_HIGH_GROUPS) >= 4096:
            _HIGH_GROUPS.clear()
        rest = _HIGH_GROUPS[high] = _varint_unsigned(high)
    return _LOW_GROUP[z & 0x7F] + rest


def _str(s: str) -> bytes:
    b = s.encode()
    return _long(len(b)) + b


_NAMES: dict[str, bytes] = {}


def _name(s: str) -> bytes:
    """``_str`` memoised, for the strings that repeat from record to record (model keys, arm ids)."""
    b = _NAMES.get(s)
    if b is None:
        if len(_NAMES) >= 4096:
            _NAMES.clear()
        b = _NAMES[s] = _str(s)
    return b


def encode_action(a: "Action") -> bytes:
    return _ACTION_HEADER + _action_body(a.event_id, a.model_key, a.arm_id, a.arm_index, a.score, a.propensity,
                                         a.model_version, a.decision_timestamp_ms, a.features, a.trigger_source,
                                         a.trigger_offset)


def _action_body(event_id: str, model_key: str, arm_id: str, arm_index: int, score: float, propensity: float,
                 model_version: int, decision_timestamp_ms: int, features: np.ndarray, trigger_source: int,
                 trigger_offset: int) -> bytes:
    """An Action's fields in Avro (no header): the action record, and the head of a snapshot's
    pending decision, which has the same fields first."""
    f = features_to_bytes(features)
    return b"".join((_str(event_id), _name(model_key), _name(arm_id), _long(arm_index), _pack_double(score),
                     _pack_double(propensity), _long(model_version), _long(decision_timestamp_ms), _long(len(f)), f,
                     _long(trigger_source), _long(trigger_offset)))


def encode_joined(j: "Joined") -> bytes:
    f = features_to_bytes(j.features)
    return b"".join((_JOINED_HEADER, _str(j.event_id), _name(j.model_key), _long(len(f)), f, _pack_double(j.reward),
                     b"\x01" if j.reward_observed else b"\x00", _pack_double(j.propensity),
                     _long(j.decision_timestamp_ms), _long(j.join_timestamp_ms), _long(j.model_version_before),
                     _long(j.trigger_source), _long(j.trigger_offset)))


def encode(event: Any) -> bytes:
    """Serialise one record with its header (a context in the current version, 2)."""
    if isinstance(event, Action):
        return encode_action(event)
    if isinstance(event, Joined):
        return encode_joined(event)
    if isinstance(event, Context):
        return _write(1, {"event_id": event.event_id, "model_key": event.model_key, "timestamp_ms": event.timestamp_ms,
                          "arm_ids": list(event.arm_ids), "features": features_to_bytes(event.features)})
    if isinstance(event, Reward):
        return _write(2, {"event_id": event.event_id, "model_key": event.model_key, "timestamp_ms": event.timestamp_ms,
                          "value": event.value})
    if isinstance(event, Tick):
        return _write(7, {"timestamp_ms": event.timestamp_ms})
    if isinstance(event, DeadLetter):
        return _write(5, {f.name: getattr(event, f.name) for f in dataclasses.fields(event)})
    raise TypeError(f"cannot encode {type(event).__name__}")


def encode_context_v1(event: Context) -> bytes:
    """A context in the version 1 layout (one record per arm), as writers before version 2 wrote it."""
    arms = [{"arm_id": a, "features": features_to_bytes(x)} for a, x in zip(event.arm_ids, event.features)]
    return _write(1, {"event_id": event.event_id, "model_key": event.model_key, "timestamp_ms": event.timestamp_ms,
                      "arms": arms}, version=1)


# -- decode ------------------------------------------------------------------------------------


_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def _read(data: bytes) -> tuple[int, int, dict]:
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 3:
        raise DecodeError(reasons.MALFORMED, f"record of {0 if data is None else len(data)} bytes is too short for a header")
    if data[0] != MAGIC:
        raise DecodeError(reasons.MALFORMED, f"bad magic byte 0x{data[0]:02x} (expected 0x{MAGIC:02x})")
    sid, ver = data[1], data[2]
    writer = _WRITERS.get((sid, ver))
    if writer is None:
        raise DecodeError(reasons.UNKNOWN_SCHEMA, f"schema id {sid} version {ver} is not known to this reader")
    # The current version and the legacy layouts are read with their own schema (no resolution:
    # faster, and a legacy layout is converted below); any other version resolves to the current.
    reader = None if (ver == _VERSIONS.get(sid) or (sid, ver) in _LEGACY) else _SCHEMAS[sid]
    try:
        datum = fastavro.schemaless_reader(io.BytesIO(memoryview(data)[3:]), writer, reader)
    except (EOFError, ValueError, TypeError, UnicodeDecodeError, IndexError, KeyError,
            fastavro.read.SchemaResolutionError) as exc:
        code = reasons.MISSING_FIELD if isinstance(exc, fastavro.read.SchemaResolutionError) else reasons.MALFORMED
        # fastavro's messages can name the stream object ("<_io.BytesIO object at 0x...>"): drop
        # the address, or a dead letter's detail would differ between a run and its replay.
        raise DecodeError(code, f"Avro decode failed: {_ADDRESS.sub('the record', str(exc))}") from exc
    return sid, ver, datum


def _context_features(arm_ids: list, block: bytes) -> np.ndarray:
    k, n = len(arm_ids), len(block)
    if not k:
        raise DecodeError(reasons.EMPTY_ARMS, "the context has no candidate arms")
    if n == 0 or n % (8 * k):
        raise DecodeError(reasons.BAD_DIMENSION, f"{n} feature bytes do not hold {k} arms of one dimension "
                                                 f"(8 bytes per value)")
    feats = np.frombuffer(block, dtype="<f8").reshape(k, n // (8 * k)).astype(np.float64)
    if not np.isfinite(feats).all():
        raise DecodeError(reasons.NON_FINITE_FEATURES, "features contain NaN or infinite values")
    return feats


def decode(data: bytes) -> Context | Reward | Tick | Action | Joined | DeadLetter:
    """Parse and validate one record. Raises :class:`DecodeError` with a reason code."""
    sid, ver, d = _read(data)
    if sid == 1:
        if ver == 1:  # one record per arm
            arms = d["arms"]
            if not arms:
                raise DecodeError(reasons.EMPTY_ARMS, "the context has no candidate arms")
            sizes = {len(a["features"]) for a in arms}
            if len(sizes) != 1 or 0 in sizes or min(sizes) % 8:
                raise DecodeError(reasons.BAD_DIMENSION, f"arms have feature sizes {sorted(sizes)} bytes "
                                                         f"(8 bytes per value, all arms of one dimension)")
            ids = [a["arm_id"] for a in arms]
            return Context(d["event_id"], d["model_key"], d["timestamp_ms"], tuple(ids),
                           _context_features(ids, b"".join(a["features"] for a in arms)))
        ids = d["arm_ids"]
        return Context(d["event_id"], d["model_key"], d["timestamp_ms"], tuple(ids), _context_features(ids, d["features"]))
    if sid == 2:
        if not math.isfinite(d["value"]):
            raise DecodeError(reasons.NON_FINITE_REWARD, f"reward value {d['value']!r} is not finite")
        return Reward(d["event_id"], d["model_key"], d["timestamp_ms"], d["value"])
    if sid == 7:
        return Tick(d["timestamp_ms"])
    if sid in (3, 4):
        d["features"] = features_from_bytes(d["features"])
        return (Action if sid == 3 else Joined)(**d)
    if sid == 5:
        return DeadLetter(**d)
    raise DecodeError(reasons.UNKNOWN_SCHEMA, f"schema id {sid} is not an event")


# -- snapshots ---------------------------------------------------------------------------------

_SNAPSHOT_ID = 6
_COMPRESS_ABOVE = 4096


def _state_from_avro(arrays: list, scalars: list) -> dict[str, Any]:
    state: dict[str, Any] = {s["name"]: s["value"] for s in scalars}
    for a in arrays:
        state[a["name"]] = np.frombuffer(a["data"], dtype=np.dtype(a["dtype"])).reshape(a["shape"]).copy()
    return state


_LE_DTYPE: dict[np.dtype, str] = {}  # dtype -> its little-endian name (ArrayState.dtype)


def _encode_model(key: str, state: dict[str, Any]) -> bytes:
    """One ``ModelState`` item of the snapshot's ``models`` array, written by hand: the bytes
    fastavro writes for the same records (tests/unit/test_events.py checks), at a fraction of the cost,
    because a partition's snapshot is mostly this, once per model (bench/results/memory.md)."""
    arrays, scalars = [], []
    for name, v in state.items():
        if isinstance(v, np.ndarray):
            le = _LE_DTYPE.get(v.dtype)
            if le is None:
                le = _LE_DTYPE[v.dtype] = v.dtype.newbyteorder("<").str
            data = np.ascontiguousarray(v).astype(le, copy=False).tobytes()
            shape = b"".join(map(_long, v.shape)) + b"\x00" if v.ndim else b""
            arrays.append(b"".join((_str(name), _str(le), _long(v.ndim), shape, _long(len(data)), data)))
        else:
            scalars.append(_str(name) + _union_scalar(v))
    return b"".join((_str(key), _array_block(arrays), _array_block(scalars)))


def _array_block(items: list[bytes]) -> bytes:
    # An Avro array as fastavro writes it: one block (count, items) and the end marker 0.
    return _long(len(items)) + b"".join(items) + b"\x00" if items else b"\x00"


def _union_scalar(v: Any) -> bytes:
    # ScalarState.value: ["null", "boolean", "long", "double", "string"], the branch fastavro picks.
    if v is None:
        return b"\x00"
    if isinstance(v, bool):
        return b"\x02\x01" if v else b"\x02\x00"
    if isinstance(v, int):
        return b"\x04" + _long(v)
    if isinstance(v, float):
        return b"\x06" + _pack_double(v)
    if isinstance(v, str):
        return b"\x08" + _str(v)
    raise TypeError(f"a model's state scalar must be None, bool, int, float or str, got {type(v).__name__}")


def _encode_pending(p: dict[str, Any]) -> bytes:
    """One ``PendingDecision`` of the snapshot's ``pending`` array, by hand (fastavro's bytes): the
    action's fields, then ``reward`` (union null / double) and ``n_rewards``. A partition holds a
    window's worth of open decisions (thousands), and the snapshot is a pause of the worker's loop."""
    reward = p["reward"]
    return b"".join((_action_body(p["event_id"], p["model_key"], p["arm_id"], p["arm_index"], p["score"],
                                  p["propensity"], p["model_version"], p["decision_timestamp_ms"], p["features"],
                                  p["trigger_source"], p["trigger_offset"]),
                     b"\x00" if reward is None else b"\x02" + _pack_double(reward), _long(p["n_rewards"])))


def pack_snapshot(snap: dict[str, Any]) -> bytes:
    """Serialise a partition snapshot (the worker's header fields plus the engine's state)."""
    eng = snap["engine"]
    models = _array_block([_encode_model(key, state) for key, state in eng["models"].items()])
    pending = _array_block([_encode_pending(p) for p in eng["pending"]])
    # Recently joined ids (up to max_recent, 100,000 by default): {event_id, observed} each.
    recent = _array_block([_str(k) + (b"\x01" if v else b"\x00") for k, v in eng["recent"]])
    early = []
    for e in eng["early"]:
        src: InputRef = e["source"]
        early.append({"event_id": e["event_id"], "model_key": e["model_key"], "timestamp_ms": e["timestamp_ms"],
                      "value": e["value"], "source_partition": src.partition, "source_offset": src.offset,
                      "key": src.key, "raw": src.value, "source_timestamp_ms": src.timestamp_ms})
    head = {k: snap[k] for k in ("partition", "created_ms", "contexts_offset", "rewards_offset",
                                 "actions_offset", "joined_offset", "dead_letter_offset")}
    head["watermark_ms"] = eng["watermark_ms"]
    # The record's fields back to back: those before ``models``, the models, then pending, early,
    # recent and counters (the reader splits the schema the same way, _SNAPSHOT_PARTS). Models,
    # pending and recent are written by hand: they are most of a snapshot's bytes and time.
    head_schema, _, _ = _SNAPSHOT_PARTS
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, head_schema, head)
    buf.write(models)
    buf.write(pending)
    fastavro.schemaless_writer(buf, _SNAPSHOT_FIELDS["early"], {"early": early})
    buf.write(recent)
    fastavro.schemaless_writer(buf, _SNAPSHOT_FIELDS["counters"], {"counters": {k: int(v) for k, v in eng["counters"].items()}})
    body = buf.getvalue()
    flags = 0
    if len(body) > _COMPRESS_ABOVE:
        # Level 1: a third faster than 6 on model state (float64 arrays) for 1% more bytes, and
        # a snapshot's pack time is a pause of the worker's loop (bench/results/memory.md).
        body, flags = zlib.compress(body, 1), 1
    return _header(_SNAPSHOT_ID) + bytes((flags,)) + struct.pack("<I", zlib.crc32(body)) + body


def _read_long(stream: io.BytesIO) -> int:
    """One Avro ``long`` (zig-zag varint) from ``stream``."""
    shift, acc = 0, 0
    while True:
        b = stream.read(1)
        if not b:
            raise EOFError("truncated Avro long")
        acc |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return (acc >> 1) ^ -(acc & 1)
        shift += 7


def _split_snapshot_schema(schema: dict) -> tuple[dict, dict, dict]:
    """The snapshot record as three records read one after the other: the fields before
    ``models``, one item of ``models``, and the fields after it. (An Avro record is its fields'
    encodings back to back, and an array is blocks of items, so this reads the same bytes.)"""
    fields = schema["fields"]
    i = next(j for j, f in enumerate(fields) if f["name"] == "models")
    head = {"type": "record", "name": "SnapshotHead", "fields": fields[:i]}
    tail = {"type": "record", "name": "SnapshotTail", "fields": fields[i + 1:]}
    return (fastavro.parse_schema(head), fastavro.parse_schema(fields[i]["type"]["items"]),
            fastavro.parse_schema(tail))


_SNAPSHOT_PARTS = _split_snapshot_schema(_SCHEMAS[_SNAPSHOT_ID])
# Single fields of the snapshot record, each as a record of that one field (the same bytes), for
# the parts of the tail pack_snapshot leaves to fastavro.
_SNAPSHOT_FIELDS = {f["name"]: fastavro.parse_schema({"type": "record", "name": f"Snapshot_{f['name']}", "fields": [f]})
                    for f in _SCHEMAS[_SNAPSHOT_ID]["fields"] if f["name"] in ("early", "counters")}


class SnapshotModels(Mapping):
    """The model states of a snapshot: ``model key -> state dict``, each decoded when asked for.

    Why not a dict: restoring 100,000 models from a dict of decoded states held every decoded
    record at once, and the allocator kept that peak resident after it was freed (~13 KB per d = 20
    model against the ~4.7 KB a live model needs; bench/results/memory.md). Decoding one record at
    a time, each record's garbage is reused by the next. ``unpack_snapshot`` has already decoded
    every record once (to find them and to refuse a body that does not parse), so access does not
    fail on a snapshot that unpacked.
    """

    def __init__(self, body: bytes, offsets: dict[str, int]) -> None:
        self._body = body
        self._offsets = offsets

    def __getitem__(self, key: str) -> dict[str, Any]:
        stream = io.BytesIO(self._body)
        stream.seek(self._offsets[key])
        m = fastavro.schemaless_reader(stream, _SNAPSHOT_PARTS[1], _SNAPSHOT_PARTS[1])
        return _state_from_avro(m["arrays"], m["scalars"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


def _decode_snapshot_body(body: bytes, version: int) -> dict[str, Any]:
    """The snapshot datum with ``models`` as :class:`SnapshotModels` (current version), or fully
    decoded with Avro's resolution (an older writer version)."""
    if version != _VERSIONS[_SNAPSHOT_ID]:
        d = fastavro.schemaless_reader(io.BytesIO(body), _WRITERS[(_SNAPSHOT_ID, version)], _SCHEMAS[_SNAPSHOT_ID])
        d["models"] = {m["model_key"]: _state_from_avro(m["arrays"], m["scalars"]) for m in d["models"]}
        return d
    head_schema, model_schema, tail_schema = _SNAPSHOT_PARTS
    stream = io.BytesIO(body)
    d = fastavro.schemaless_reader(stream, head_schema, head_schema)
    offsets: dict[str, int] = {}
    while count := _read_long(stream):
        if count < 0:  # a block written with its byte size
            count = -count
            _read_long(stream)
        for _ in range(count):
            offset = stream.tell()
            key = fastavro.schemaless_reader(stream, model_schema, model_schema)["model_key"]
            offsets[key] = offset
    d.update(fastavro.schemaless_reader(stream, tail_schema, tail_schema))
    if stream.read(1):
        raise ValueError("bytes left after the snapshot record")
    d["models"] = SnapshotModels(body, offsets)
    return d


def unpack_snapshot(data: bytes) -> dict[str, Any]:
    """Inverse of :func:`pack_snapshot`; raises :class:`SnapshotError` on any damage."""
    if len(data) < 8 or data[0] != MAGIC or data[1] != _SNAPSHOT_ID:
        raise SnapshotError("not a streambandit snapshot (bad header)")
    if (_SNAPSHOT_ID, data[2]) not in _WRITERS:
        raise SnapshotError(f"snapshot format version {data[2]} is not known to this reader")
    flags, (crc,) = data[3], struct.unpack("<I", data[4:8])
    body = bytes(data[8:])
    if zlib.crc32(body) != crc:
        raise SnapshotError("snapshot checksum mismatch: the snapshot is corrupt")
    try:
        if flags & 1:
            body = zlib.decompress(body)
        d = _decode_snapshot_body(body, data[2])
    except Exception as exc:  # a body that passed its checksum but does not parse: a writer bug
        raise SnapshotError(f"snapshot body does not decode: {exc}") from exc
    engine = {
        "models": d["models"],
        "pending": [{**p, "features": features_from_bytes(p["features"])} for p in d["pending"]],
        "early": [{"event_id": e["event_id"], "model_key": e["model_key"], "timestamp_ms": e["timestamp_ms"],
                   "value": e["value"],
                   "source": InputRef(1, e["source_partition"], e["source_offset"], e["key"], e["raw"],
                                      e["source_timestamp_ms"])} for e in d["early"]],
        "recent": [(r["event_id"], r["observed"]) for r in d["recent"]],
        "watermark_ms": d["watermark_ms"],
        "counters": dict(d["counters"]),
    }
    out = {k: d[k] for k in ("partition", "created_ms", "contexts_offset", "rewards_offset",
                             "actions_offset", "joined_offset", "dead_letter_offset")}
    out["engine"] = engine
    return out
