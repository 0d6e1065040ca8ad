"""Avro binary encoding by hand, for the records written once per event (actions, joined
records) and for the bulk of a snapshot (models, pending decisions): the bytes fastavro writes
(tests/unit/wire/test_events.py compares them), at a fraction of its per-call cost
(bench/results/worker_path.md measures the worker's encode stage).

An Avro ``long`` is zig-zag encoded, then written as a base-128 varint; a string is its UTF-8
length as a long, then the bytes; a double is 8 little-endian bytes; an array is blocks of
(count, items) ended by a zero count.
"""

from __future__ import annotations

import io
import struct

__all__ = [
    "MAGIC",
    "header",
    "double",
    "varint",
    "long",
    "string",
    "name",
    "array_block",
    "read_long",
]

# Byte 0 of every record and snapshot (the header: magic, schema id, schema version).
MAGIC = 0x5B

double = struct.Struct("<d").pack


def header(schema_id: int, version: int) -> bytes:
    """The 3-byte header of a record: magic, schema id, schema version."""
    return bytes((MAGIC, schema_id, version))


def varint(n: int) -> bytes:
    """Avro int/long: zigzag, then base-128 varint (the reference :func:`long` is checked against)."""
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
_SMALL = tuple(
    varint(i) for i in range(_SMALL_LO, _SMALL_HI)
)  # lengths, indices, small ints: a lookup

# The large longs the worker writes per event (event timestamps, input offsets, model versions)
# mostly share all but their low 7 bits with one written just before: their varint is the low
# group's byte followed by the varint of the rest, which is memoised (a dict lookup and a concat
# instead of the loop, several times per output record).
_LOW_GROUP = tuple(bytes((i | 0x80,)) for i in range(128))
_HIGH_GROUPS: dict[int, bytes] = {}


def long(n: int) -> bytes:
    """:func:`varint`'s bytes, from lookups for small and recently seen values."""
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


def string(s: str) -> bytes:
    b = s.encode()
    return long(len(b)) + b


_NAMES: dict[str, bytes] = {}


def name(s: str) -> bytes:
    """:func:`string` memoised, for the strings that repeat from record to record (model keys, arm ids)."""
    b = _NAMES.get(s)
    if b is None:
        if len(_NAMES) >= 4096:
            _NAMES.clear()
        b = _NAMES[s] = string(s)
    return b


def array_block(items: list[bytes]) -> bytes:
    """An Avro array as fastavro writes it: one block (count, items) and the end marker 0."""
    return long(len(items)) + b"".join(items) + b"\x00" if items else b"\x00"


def read_long(stream: io.BytesIO) -> int:
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
