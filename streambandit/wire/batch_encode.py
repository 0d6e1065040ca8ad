"""Encode a batch's actions and joined records in one compiled pass each.

The worker writes an action per context and a joined record per update. One at a time
(``codec.encode_action`` / ``encode_joined``) most of the cost is Python building a varint per
long and a bytes object per field (``python -m bench.e2e``, part 2). Here the batch's
fields are gathered into columns (a list comprehension per field), one numba pass writes every
record into one buffer, and the records are sliced out of it: the same bytes
(tests/unit/wire/test_batch_encode.py compares them with the one-at-a-time encoders, which stay the
reference).

A batch whose fields do not all fit the columns (an int outside int64, a feature array that is
not a plain float vector, a string that does not encode as UTF-8, ...) is encoded one record at a
time, so an error is the one-at-a-time encoder's own.
"""

from __future__ import annotations

import struct
import sys
from itertools import chain
from operator import sub

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE
from streambandit.wire.codec import ACTION_HEADER, JOINED_HEADER, encode_action, encode_joined
from streambandit.wire.records import Action, Joined

__all__ = [
    "encode_actions",
    "encode_actions_timed",
    "encode_joined_records",
    "encode_joined_timed",
]


@njit(cache=CACHE, nogil=True, inline="always")
def _put_long(out, pos, n):
    """Avro long: zig-zag, then base-128 varint."""
    z = np.uint64((n << 1) ^ (n >> 63))
    while z > np.uint64(0x7F):
        out[pos] = np.uint8((z & np.uint64(0x7F)) | np.uint64(0x80))
        pos += 1
        z >>= np.uint64(7)
    out[pos] = np.uint8(z)
    return pos + 1


@njit(cache=CACHE, nogil=True, inline="always")
def _put_bits(out, pos, bits):
    """A double as 8 little-endian bytes, from its IEEE bits (int64)."""
    b = np.uint64(bits)
    for i in range(8):
        out[pos + i] = np.uint8((b >> np.uint64(8 * i)) & np.uint64(0xFF))
    return pos + 8


@njit(cache=CACHE, nogil=True, inline="always")
def _put_bytes(out, pos, src, start, stop):
    """Avro bytes / string: the length as a long, then the bytes ``src[start:stop]``."""
    pos = _put_long(out, pos, stop - start)
    for j in range(start, stop):
        out[pos] = src[j]
        pos += 1
    return pos


@njit(cache=CACHE, nogil=True, inline="always")
def _put_head(out, pos, header, strs, str_ends, i, s):
    """Record i's 3-byte header, then its strings (``strs`` from ``s`` to each ``str_ends[i, j]``);
    returns the position after them and where the next record's strings start."""
    for j in range(3):
        out[pos + j] = header[j]
    pos += 3
    for j in range(str_ends.shape[1]):
        e = str_ends[i, j]
        pos = _put_bytes(out, pos, strs, s, e)
        s = e
    return pos, s


@njit(cache=CACHE, nogil=True)
def _encode_actions(header, strs, str_ends, ints, bits, feats, feat_ends, out, ends):
    """Record i: header, event_id / model_key / arm_id (``strs`` up to ``str_ends[i]``), arm_index,
    score and propensity (``bits[i]``), model_version, decision_timestamp_ms, features
    (``feats`` up to ``feat_ends[i]``), trigger_source, trigger_offset (``ints[i]``: arm_index,
    model_version, decision_timestamp_ms, trigger_source, trigger_offset)."""
    pos, s, f = 0, 0, 0
    for i in range(ints.shape[0]):
        pos, s = _put_head(out, pos, header, strs, str_ends, i, s)
        pos = _put_long(out, pos, ints[i, 0])
        pos = _put_bits(out, pos, bits[i, 0])
        pos = _put_bits(out, pos, bits[i, 1])
        pos = _put_long(out, pos, ints[i, 1])
        pos = _put_long(out, pos, ints[i, 2])
        pos = _put_bytes(out, pos, feats, f, feat_ends[i])
        f = feat_ends[i]
        pos = _put_long(out, pos, ints[i, 3])
        pos = _put_long(out, pos, ints[i, 4])
        ends[i] = pos


@njit(cache=CACHE, nogil=True)
def _encode_joined(header, strs, str_ends, ints, bits, feats, feat_ends, out, ends):
    """Record i: header, event_id / model_key, features, reward (``bits[i, 0]``), reward_observed
    (``ints[i, 0]``), propensity (``bits[i, 1]``), decision_timestamp_ms, join_timestamp_ms,
    model_version_before, trigger_source, trigger_offset (``ints[i, 1:]``)."""
    pos, s, f = 0, 0, 0
    for i in range(ints.shape[0]):
        pos, s = _put_head(out, pos, header, strs, str_ends, i, s)
        pos = _put_bytes(out, pos, feats, f, feat_ends[i])
        f = feat_ends[i]
        pos = _put_bits(out, pos, bits[i, 0])
        out[pos] = np.uint8(1 if ints[i, 0] else 0)
        pos += 1
        pos = _put_bits(out, pos, bits[i, 1])
        for j in range(1, 6):
            pos = _put_long(out, pos, ints[i, j])
        ends[i] = pos


# For engine/pass_outputs.py, which writes these columns from the compiled pass's outputs.
encode_action_columns = _encode_actions
encode_joined_columns = _encode_joined


class _Unfit(Exception):
    """A batch the columns cannot hold exactly: encode it one record at a time."""


# A record's fixed-size fields packed by one ``struct`` call per record, then read back as int64
# columns: longs as themselves, doubles as their IEEE bits, the joined record's flag as 0 or 1.
# ``struct`` refuses what ``avro.long`` would not write the same way (a float, a value outside a
# long) and converts a double and a flag (truthiness) as ``avro.double`` and ``encode_joined`` do;
# numpy's conversion of a list of Python ints per column cost more than the rest of the encoding
# (python -m bench.worker_path, encode stage).
_ACTION_FIXED = struct.Struct("<qqqqqdd")  # arm_index .. trigger_offset, score, propensity
_JOINED_FIXED = struct.Struct("<?7xqqqqqdd")  # reward_observed, 7 zero bytes, longs, doubles
_F8 = np.dtype(np.float64)
# The columns are read back, and features copied, as native int64 / float64: little-endian only.
_LITTLE = sys.byteorder == "little"


def _strings(*columns: list) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of the records' strings, record by record (column order within a record),
    and the running end of each string: ``ends[i, j]``."""
    n, m = len(columns[0]), len(columns)
    flat = list(chain.from_iterable(zip(*columns)))
    try:
        text = "".join(flat)
        data = text.encode()
    except (TypeError, UnicodeEncodeError) as exc:  # not str, or a lone surrogate
        raise _Unfit from exc
    sizes = map(len, flat) if text.isascii() else (len(s.encode()) for s in flat)
    ends = np.cumsum(np.fromiter(sizes, dtype=np.int64, count=n * m)).reshape(n, m)
    return np.frombuffer(data, dtype=np.uint8), ends


def _fixed(layout: struct.Struct, n: int, *columns: list) -> np.ndarray:
    """The columns packed record by record with ``layout`` (8-byte fields), as an (n, fields)
    int64 array."""
    if not _LITTLE:
        raise _Unfit
    try:
        raw = b"".join(map(layout.pack, *columns))
    except struct.error as exc:
        raise _Unfit from exc
    return np.frombuffer(raw, dtype=np.int64).reshape(n, layout.size // 8)


def _features(arrays: list) -> tuple[np.ndarray, np.ndarray]:
    """The feature vectors' little-endian float64 bytes back to back (``features_to_bytes`` of
    each), and the running end of each."""
    if all([a.dtype is _F8 for a in arrays]):
        # Native float64 (little-endian: _fixed, called first, checks it) and C-contiguous:
        # each array's buffer is its features_to_bytes.
        try:
            raw = b"".join(arrays)
        except (BufferError, ValueError, TypeError):
            pass  # not C-contiguous
        else:
            sizes = np.fromiter([a.nbytes for a in arrays], dtype=np.int64, count=len(arrays))
            return np.frombuffer(raw, dtype=np.uint8), np.cumsum(sizes)
    try:
        flat = np.concatenate(arrays)  # C order per array, as tobytes writes it
    except (ValueError, TypeError) as exc:
        raise _Unfit from exc
    if flat.dtype != np.float64 or flat.ndim != 1:  # 1-D only if every array is (2-D ones stack)
        raise _Unfit
    sizes = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)) * 8
    return np.ascontiguousarray(flat, dtype="<f8").view(np.uint8), np.cumsum(sizes)


def _slices(out: np.ndarray, ends: np.ndarray) -> list[bytes]:
    raw = out[: ends[-1]].tobytes()
    starts = [0, *ends[:-1].tolist()]
    return list(map(raw.__getitem__, map(slice, starts, ends.tolist())))


# A record's bytes past its strings and features, at most: the header, a varint (10 bytes at
# most) per string or feature length and per long, the doubles (and the joined record's flag).
ACTION_BOUND = 3 + 4 * 10 + 5 * 10 + 16
JOINED_BOUND = 3 + 3 * 10 + 1 + 5 * 10 + 16
slices = _slices  # the records of one buffer, by their ends (engine/pass_outputs.py)


def _bound(strs: np.ndarray, feats: np.ndarray, n: int, per_record: int) -> int:
    # Every byte of the strings and features, plus the fixed fields and varints at their longest.
    return len(strs) + len(feats) + n * per_record


def encode_actions(actions: list[Action]) -> list[bytes]:
    """``[encode_action(a) for a in actions]``, in one compiled pass."""
    return encode_actions_timed(actions)[0]


def encode_actions_timed(actions: list[Action]) -> tuple[list[bytes], list[int]]:
    """:func:`encode_actions`, and each action's ``decision_timestamp_ms`` (the worker's
    latency histogram reads them: here they come from the columns already made)."""
    if not actions:
        return [], []
    n = len(actions)
    try:
        strs, str_ends = _strings(
            [a.event_id for a in actions],
            [a.model_key for a in actions],
            [a.arm_id for a in actions],
        )
        fixed = _fixed(
            _ACTION_FIXED,
            n,
            [a.arm_index for a in actions],
            [a.model_version for a in actions],
            [a.decision_timestamp_ms for a in actions],
            [a.trigger_source for a in actions],
            [a.trigger_offset for a in actions],
            [a.score for a in actions],
            [a.propensity for a in actions],
        )
        ints, bits = np.ascontiguousarray(fixed[:, :5]), np.ascontiguousarray(fixed[:, 5:])
        feats, feat_ends = _features([a.features for a in actions])
    except _Unfit:
        return [encode_action(a) for a in actions], [a.decision_timestamp_ms for a in actions]
    out = np.empty(_bound(strs, feats, n, ACTION_BOUND), dtype=np.uint8)
    ends = np.empty(n, dtype=np.int64)
    _encode_actions(
        np.frombuffer(ACTION_HEADER, np.uint8),
        strs,
        str_ends,
        ints,
        bits,
        feats,
        feat_ends,
        out,
        ends,
    )
    return _slices(out, ends), ints[:, 2].tolist()


def encode_joined_records(joined: list[Joined]) -> list[bytes]:
    """``[encode_joined(j) for j in joined]``, in one compiled pass."""
    return encode_joined_timed(joined)[0]


def encode_joined_timed(joined: list[Joined]) -> tuple[list[bytes], list[int]]:
    """:func:`encode_joined_records`, and the reward delay (``join_timestamp_ms -
    decision_timestamp_ms``) of each record whose reward was observed, in record order (the
    worker's latency histogram and its default-reward count read them)."""
    if not joined:
        return [], []
    n = len(joined)
    try:
        strs, str_ends = _strings([j.event_id for j in joined], [j.model_key for j in joined])
        fixed = _fixed(
            _JOINED_FIXED,
            n,
            [j.reward_observed for j in joined],
            [j.decision_timestamp_ms for j in joined],
            [j.join_timestamp_ms for j in joined],
            [j.model_version_before for j in joined],
            [j.trigger_source for j in joined],
            [j.trigger_offset for j in joined],
            [j.reward for j in joined],
            [j.propensity for j in joined],
        )
        ints, bits = np.ascontiguousarray(fixed[:, :6]), np.ascontiguousarray(fixed[:, 6:])
        feats, feat_ends = _features([j.features for j in joined])
    except _Unfit:
        return [encode_joined(j) for j in joined], [
            j.join_timestamp_ms - j.decision_timestamp_ms for j in joined if j.reward_observed
        ]
    out = np.empty(_bound(strs, feats, n, JOINED_BOUND), dtype=np.uint8)
    ends = np.empty(n, dtype=np.int64)
    _encode_joined(
        np.frombuffer(JOINED_HEADER, np.uint8),
        strs,
        str_ends,
        ints,
        bits,
        feats,
        feat_ends,
        out,
        ends,
    )
    observed = ints[:, 0] != 0
    # As Python ints: the difference of two longs may not fit one.
    return _slices(out, ends), list(
        map(sub, ints[observed, 2].tolist(), ints[observed, 1].tolist())
    )
