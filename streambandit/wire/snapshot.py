"""A partition's snapshot as bytes, and back: the worker's positions and the engine's state
(models, open decisions, early rewards, recently joined ids, watermark, counters).

A snapshot is a base (every model; ``seq`` 0) or an increment on a base (``seq`` k > 0, the same
``chain``): only the models changed since the previous snapshot of the chain, everything else
whole. ``compose`` lays a chain's increments over its base.

Format (version 3): the record header (magic, schema id 6, version), a flags byte (bit 0: the
record is zlib-compressed), a CRC32 (little-endian) of every byte after it, the record's length
(8 bytes, little-endian), the Avro record (``schemas/snapshot.avsc``), zero bytes up to a multiple
of 8 from the start, then the buffers: the columns of the model blocks (policies/state_blocks.py),
raw little-endian, each at the offset its ``BufferRef`` gives, 8-aligned. The buffers are not
compressed: zlib saves about 40% of a float state's bytes but costs seconds per hundred thousand
models to pack and to unpack, and unpacking is on the path of a moved partition's first decision
(``python -m bench.snapshots``). Versions 1 and 2 (no length, no buffers: header, flags, CRC32,
record) are still read. A checksum mismatch, a record that does not parse or a buffer outside the
snapshot is a :class:`SnapshotError`. The per-model records, the pending decisions and the recent
ids are written by hand (avro.py, the bytes fastavro writes: tests/unit/wire/test_events.py checks) and
the per-model records are decoded one at a time on access (:class:`SnapshotModels`).
"""

from __future__ import annotations

import io
import mmap
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import fastavro
import numpy as np

from streambandit.errors import StreambanditError
from streambandit.policies.state_blocks import ModelStates, StateBlock
from streambandit.wire import avro
from streambandit.wire.codec import action_body, features_from_bytes
from streambandit.wire.records import InputRef
from streambandit.wire.schemas import READERS, VERSIONS, WRITERS
from streambandit.wire.snapshot_header import Snapshot, SnapshotHeader

__all__ = [
    "SnapshotError",
    "SnapshotModels",
    "pack_snapshot",
    "unpack_snapshot",
    "state_from_avro",
    "state_to_avro",
    "MODEL_STATE_SCHEMA",
]


class SnapshotError(StreambanditError, ValueError):
    """A snapshot that is corrupt (checksum), of an unknown format, or does not fit."""


_SNAPSHOT_ID = 6
_COMPRESS_ABOVE = 4096
_RECORD_AT = 16  # header 3, flags 1, CRC32 4, the record's length 8
_ALIGN = 8  # buffers start at multiples of 8 from the snapshot's first byte (aligned float64 reads)


def state_from_avro(arrays: list, scalars: list) -> dict[str, Any]:
    state: dict[str, Any] = {s["name"]: s["value"] for s in scalars}
    for a in arrays:
        state[a["name"]] = (
            np.frombuffer(a["data"], dtype=np.dtype(a["dtype"])).reshape(a["shape"]).copy()
        )
    return state


def state_to_avro(key: str, state: dict[str, Any]) -> dict[str, Any]:
    """A model's state as the snapshot's ``ModelState`` record (the inverse of
    :func:`state_from_avro`), for writers that go through fastavro (a file of model states)."""
    arrays, scalars = [], []
    for name, v in state.items():
        if isinstance(v, np.ndarray):
            le = v.dtype.newbyteorder("<").str
            arrays.append(
                {
                    "name": name,
                    "dtype": le,
                    "shape": list(v.shape),
                    "data": np.ascontiguousarray(v).astype(le, copy=False).tobytes(),
                }
            )
        else:
            scalars.append({"name": name, "value": v})
    return {"model_key": key, "arrays": arrays, "scalars": scalars}


_LE_DTYPE: dict[np.dtype, str] = {}  # dtype -> its little-endian name (ArrayState.dtype)


def _encode_model(key: str, state: dict[str, Any]) -> bytes:
    """One ``ModelState`` item of the snapshot's ``models`` array, written by hand: the bytes
    fastavro writes for the same records (tests/unit/wire/test_events.py checks), at a fraction of the cost,
    because a partition's snapshot is mostly this, once per model (bench/results/memory.md)."""
    arrays, scalars = [], []
    for name, v in state.items():
        if isinstance(v, np.ndarray):
            le = _LE_DTYPE.get(v.dtype)
            if le is None:
                le = _LE_DTYPE[v.dtype] = v.dtype.newbyteorder("<").str
            data = np.ascontiguousarray(v).astype(le, copy=False).tobytes()
            shape = b"".join(map(avro.long, v.shape)) + b"\x00" if v.ndim else b""
            arrays.append(
                b"".join(
                    (
                        avro.string(name),
                        avro.string(le),
                        avro.long(v.ndim),
                        shape,
                        avro.long(len(data)),
                        data,
                    )
                )
            )
        else:
            scalars.append(avro.string(name) + _union_scalar(v))
    return b"".join((avro.string(key), avro.array_block(arrays), avro.array_block(scalars)))


def _union_scalar(v: Any) -> bytes:
    # ScalarState.value: ["null", "boolean", "long", "double", "string"], the branch fastavro picks.
    if v is None:
        return b"\x00"
    if isinstance(v, bool):
        return b"\x02\x01" if v else b"\x02\x00"
    if isinstance(v, int):
        return b"\x04" + avro.long(v)
    if isinstance(v, float):
        return b"\x06" + avro.double(v)
    if isinstance(v, str):
        return b"\x08" + avro.string(v)
    raise TypeError(
        f"a model's state scalar must be None, bool, int, float or str, got {type(v).__name__}"
    )


def _encode_pending(p: dict[str, Any]) -> bytes:
    """One ``PendingDecision`` of the snapshot's ``pending`` array, by hand (fastavro's bytes): the
    action's fields, then ``reward`` (union null / double) and ``n_rewards``. A partition holds a
    window's worth of open decisions (thousands), and the snapshot is a pause of the worker's loop."""
    reward = p["reward"]
    return b"".join(
        (
            action_body(
                p["event_id"],
                p["model_key"],
                p["arm_id"],
                p["arm_index"],
                p["score"],
                p["propensity"],
                p["model_version"],
                p["decision_timestamp_ms"],
                p["features"],
                p["trigger_source"],
                p["trigger_offset"],
            ),
            b"\x00" if reward is None else b"\x02" + avro.double(reward),
            avro.long(p["n_rewards"]),
        )
    )


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


class _Buffers:
    """The buffers section being written: each column's bytes at an 8-aligned offset."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.size = 0

    def ref(self, name: str, column: np.ndarray) -> bytes:
        """Add ``column``; its ``BufferRef``, encoded."""
        le = _LE_DTYPE.get(column.dtype)
        if le is None:
            le = _LE_DTYPE[column.dtype] = column.dtype.newbyteorder("<").str
        data = np.ascontiguousarray(column).astype(le, copy=False)
        offset = self.size
        self.parts.append(memoryview(data).cast("B"))
        self.size += data.nbytes
        if pad := _align(self.size) - self.size:
            self.parts.append(bytes(pad))
            self.size += pad
        return b"".join(
            (
                avro.string(name),
                avro.string(le),
                avro.array_block([avro.long(n) for n in column.shape]),
                avro.long(offset),
                avro.long(data.nbytes),
            )
        )


def _encode_block(block: StateBlock, buffers: _Buffers) -> bytes:
    """One ``ModelBlock``, by hand (fastavro's bytes); its columns go to ``buffers``."""
    return b"".join(
        (
            avro.array_block([avro.string(k) + _union_scalar(v) for k, v in block.header.items()]),
            avro.array_block([avro.string(k) for k in block.keys]),
            avro.array_block([buffers.ref(k, a) for k, a in block.arrays.items()]),
            avro.array_block([buffers.ref(k, a) for k, a in block.scalars.items()]),
        )
    )


def pack_snapshot(snap: Snapshot | Mapping[str, Any]) -> bytes:
    """Serialise a partition snapshot (its header and the engine's state; a mapping of the same
    names is taken as :meth:`Snapshot.of` takes it); the engine's ``models`` a
    :class:`ModelStates` or any mapping of state dicts."""
    snap = Snapshot.of(snap)
    eng = snap.engine
    states = eng["models"]
    records = states.records if isinstance(states, ModelStates) else states
    buffers = _Buffers()
    blocks = avro.array_block([_encode_block(b, buffers) for b in getattr(states, "blocks", ())])
    models = avro.array_block([_encode_model(key, state) for key, state in records.items()])
    pending = avro.array_block([_encode_pending(p) for p in eng["pending"]])
    # Recently joined ids (up to max_recent, 100,000 by default): {event_id, observed} each.
    recent = avro.array_block(
        [avro.string(k) + (b"\x01" if v else b"\x00") for k, v in eng["recent"]]
    )
    early = []
    for e in eng["early"]:
        src: InputRef = e["source"]
        early.append(
            {
                "event_id": e["event_id"],
                "model_key": e["model_key"],
                "timestamp_ms": e["timestamp_ms"],
                "value": e["value"],
                "source_partition": src.partition,
                "source_offset": src.offset,
                "key": src.key,
                "raw": src.value,
                "source_timestamp_ms": src.timestamp_ms,
            }
        )
    head = snap.header.as_dict() | {"watermark_ms": eng["watermark_ms"]}
    # The record's fields back to back: those before ``models``, the models, then pending, early,
    # recent and counters (the reader splits the schema the same way, _SNAPSHOT_PARTS). Models,
    # pending and recent are written by hand: they are most of a snapshot's bytes and time.
    head_schema, _, _ = _SNAPSHOT_PARTS
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, head_schema, head)
    buf.write(models)
    buf.write(blocks)
    buf.write(pending)
    fastavro.schemaless_writer(buf, _SNAPSHOT_FIELDS["early"], {"early": early})
    buf.write(recent)
    fastavro.schemaless_writer(
        buf,
        _SNAPSHOT_FIELDS["counters"],
        {"counters": {k: int(v) for k, v in eng["counters"].items()}},
    )
    record = buf.getvalue()
    flags = 0
    if len(record) > _COMPRESS_ABOVE:
        # Level 1: a third faster than 6 on model state (float64 arrays) for 1% more bytes.
        record, flags = zlib.compress(record, 1), 1
    after_crc = [
        struct.pack("<Q", len(record)),
        record,
        bytes(_align(_RECORD_AT + len(record)) - _RECORD_AT - len(record)),
        *buffers.parts,
    ]
    crc = 0
    for part in after_crc:
        crc = zlib.crc32(part, crc)
    return b"".join(
        (
            avro.header(_SNAPSHOT_ID, VERSIONS[_SNAPSHOT_ID]),
            bytes((flags,)),
            struct.pack("<I", crc),
            *after_crc,
        )
    )


def _split_snapshot_schema(schema: dict) -> tuple[dict, dict, dict]:
    """The snapshot record as three records read one after the other: the fields before
    ``models``, one item of ``models``, and the fields after it. (An Avro record is its fields'
    encodings back to back, and an array is blocks of items, so this reads the same bytes.)"""
    fields = schema["fields"]
    i = next(j for j, f in enumerate(fields) if f["name"] == "models")
    head = {"type": "record", "name": "SnapshotHead", "fields": fields[:i]}
    tail = {"type": "record", "name": "SnapshotTail", "fields": fields[i + 1 :]}
    return (
        fastavro.parse_schema(head),
        fastavro.parse_schema(fields[i]["type"]["items"]),
        fastavro.parse_schema(tail),
    )


_SNAPSHOT_PARTS = _split_snapshot_schema(READERS[_SNAPSHOT_ID])
MODEL_STATE_SCHEMA = _SNAPSHOT_PARTS[1]  # one model's state, as a snapshot holds it
# Single fields of the snapshot record, each as a record of that one field (the same bytes), for
# the parts of the tail pack_snapshot leaves to fastavro.
_SNAPSHOT_FIELDS = {
    f["name"]: fastavro.parse_schema(
        {"type": "record", "name": f"Snapshot_{f['name']}", "fields": [f]}
    )
    for f in READERS[_SNAPSHOT_ID]["fields"]
    if f["name"] in ("early", "counters")
}


class SnapshotModels(Mapping):
    """The model states of a snapshot: ``model key -> state dict``, each decoded when asked for.

    Why not a dict: restoring many models from a dict of decoded states holds every decoded record
    at once, and the allocator keeps that peak resident after it is freed, several times what the
    live models need (bench.memory measures memory after a restore). Decoding one record at a
    time, each record's garbage is reused by the next. ``unpack_snapshot`` has already decoded
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
        return state_from_avro(m["arrays"], m["scalars"])

    def __iter__(self) -> Iterator[str]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


_COLUMN_KINDS = "fiu"  # the dtypes a column may have: numbers (never objects)


def _column(ref: dict[str, Any], buffers: memoryview) -> np.ndarray:
    """A block's column: a view of the snapshot's buffers (read-only unless they are a private
    mapping), checked against them."""
    dtype = np.dtype(ref["dtype"])
    shape = tuple(ref["shape"])
    offset, length = ref["offset"], ref["length"]
    if (
        dtype.kind not in _COLUMN_KINDS
        or min(shape, default=0) < 0
        or offset < 0
        or offset + length > len(buffers)
        or length != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    ):
        raise ValueError(
            f"column {ref['name']!r} ({ref['dtype']}, shape {shape}) does not fit the buffers"
        )
    return np.frombuffer(buffers, dtype, length // dtype.itemsize, offset).reshape(shape)


def _decode_blocks(
    blocks: list[dict[str, Any]], buffers: memoryview, private: bool
) -> list[StateBlock]:
    return [
        StateBlock(
            {s["name"]: s["value"] for s in b["header"]},
            b["keys"],
            {r["name"]: _column(r, buffers) for r in b["arrays"]},
            {r["name"]: _column(r, buffers) for r in b["scalars"]},
            adoptable=private,
        )
        for b in blocks
    ]


def _decode_snapshot_body(body: bytes, version: int) -> dict[str, Any]:
    """The snapshot datum with the per-model records as :class:`SnapshotModels` (current
    version), or fully decoded with Avro's resolution (an older writer version)."""
    if version != VERSIONS[_SNAPSHOT_ID]:
        d = fastavro.schemaless_reader(
            io.BytesIO(body), WRITERS[(_SNAPSHOT_ID, version)], READERS[_SNAPSHOT_ID]
        )
        d["models"] = {
            m["model_key"]: state_from_avro(m["arrays"], m["scalars"]) for m in d["models"]
        }
        return d
    head_schema, model_schema, tail_schema = _SNAPSHOT_PARTS
    stream = io.BytesIO(body)
    d = fastavro.schemaless_reader(stream, head_schema, head_schema)
    offsets: dict[str, int] = {}
    while count := avro.read_long(stream):
        if count < 0:  # a block written with its byte size
            count = -count
            avro.read_long(stream)
        for _ in range(count):
            offset = stream.tell()
            key = fastavro.schemaless_reader(stream, model_schema, model_schema)["model_key"]
            offsets[key] = offset
    d.update(fastavro.schemaless_reader(stream, tail_schema, tail_schema))
    if stream.read(1):
        raise ValueError("bytes left after the snapshot record")
    d["models"] = SnapshotModels(body, offsets)
    return d


def unpack_snapshot(data: bytes | mmap.mmap) -> Snapshot:
    """Inverse of :func:`pack_snapshot`; raises :class:`SnapshotError` on any damage.

    ``data`` may be a writable ``mmap`` of a snapshot file, which must be a private
    (copy-on-write, ``mmap.ACCESS_COPY``) mapping that nothing else uses: its state blocks are
    then adoptable, and a restore makes their columns the models' rows without copying them.
    The file is never written; the models' changes go to private pages."""
    if len(data) < 8 or data[0] != avro.MAGIC or data[1] != _SNAPSHOT_ID:
        raise SnapshotError("not a streambandit snapshot (bad header)")
    if (_SNAPSHOT_ID, data[2]) not in WRITERS:
        raise SnapshotError(f"snapshot format version {data[2]} is not known to this reader")
    version, flags, (crc,) = data[2], data[3], struct.unpack("<I", data[4:8])
    view = memoryview(data)
    if zlib.crc32(view[8:]) != crc:
        raise SnapshotError("snapshot checksum mismatch: the snapshot is corrupt")
    try:
        if version >= 3:
            (length,) = struct.unpack("<Q", data[8:_RECORD_AT])
            body = bytes(view[_RECORD_AT : _RECORD_AT + length])
            buffers = view[_align(_RECORD_AT + length) :]
        else:  # the record is all there is
            body, buffers = bytes(view[8:]), view[:0]
        if flags & 1:
            body = zlib.decompress(body)
        d = _decode_snapshot_body(body, version)
        private = isinstance(data, mmap.mmap) and not view.readonly
        models = ModelStates(d["models"], _decode_blocks(d["model_blocks"], buffers, private))
        models.check()
    except Exception as exc:  # a body that passed its checksum but does not parse: a writer bug
        raise SnapshotError(f"snapshot body does not decode: {exc}") from exc
    engine = {
        "models": models,
        "pending": [{**p, "features": features_from_bytes(p["features"])} for p in d["pending"]],
        "early": [
            {
                "event_id": e["event_id"],
                "model_key": e["model_key"],
                "timestamp_ms": e["timestamp_ms"],
                "value": e["value"],
                "source": InputRef(
                    1,
                    e["source_partition"],
                    e["source_offset"],
                    e["key"],
                    e["raw"],
                    e["source_timestamp_ms"],
                ),
            }
            for e in d["early"]
        ],
        "recent": [(r["event_id"], r["observed"]) for r in d["recent"]],
        "watermark_ms": d["watermark_ms"],
        "counters": dict(d["counters"]),
    }
    return Snapshot(SnapshotHeader.of(d), engine)
