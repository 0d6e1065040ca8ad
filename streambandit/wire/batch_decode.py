"""Decode a whole poll batch of input records in one compiled pass.

``codec.decode`` spends nearly all of its time per version-2 context in fastavro's per-call
overhead and in building Python objects field by field, and the worker decodes every input
record (``python -m bench.e2e``, part 2, measures both decoders). Here the values of a batch are laid end
to end and one numba pass parses the two layouts that make up the stream (context version 2 and
reward version 1) into columns; Python then only makes the strings and the record objects.

The result is exactly ``codec.decode``'s for every record: the compiled pass accepts a record
only if it is well formed under the fast layout's every rule (header, varints, lengths, UTF-8
left to Python's strict decode, K >= 1, K * d * 8 feature bytes, finite values, no trailing bytes);
anything else, and every other schema or version, goes through ``codec.decode`` itself, so the
error reason and detail of a bad record are the per-record decoder's own.
"""

from __future__ import annotations

import operator

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE
from streambandit.wire import codec
from streambandit.wire.avro import MAGIC
from streambandit.wire.codec import DecodeError
from streambandit.wire.records import Context, Reward
from streambandit.wire.schemas import READERS, WRITERS

__all__ = ["decode_batch"]

# Per-record outcome of the compiled pass.
_SLOW = 0  # not handled here: codec.decode decides (another schema, or anything malformed)
_CONTEXT = 1
_REWARD = 2


@njit(cache=CACHE, nogil=True)
def _varint(buf, pos, end):
    """Avro long (zig-zag varint) at ``pos``; returns (value, next pos), next pos -1 if the
    varint is cut off by ``end`` or longer than a long's 10 bytes."""
    acc = np.uint64(0)
    shift = np.uint64(0)
    for i in range(10):
        if pos >= end:
            return 0, -1
        b = np.uint64(buf[pos])
        pos += 1
        if i == 9 and b > np.uint64(1):  # beyond 64 bits: Python's decoder would not wrap it
            return 0, -1
        acc |= (b & np.uint64(0x7F)) << shift
        if not b & np.uint64(0x80):
            return np.int64(acc >> np.uint64(1)) ^ -np.int64(acc & np.uint64(1)), pos
        shift += np.uint64(7)
    return 0, -1


@njit(cache=CACHE, nogil=True)
def _string(buf, pos, end):
    """An Avro string or bytes at ``pos``: (start, stop) of its bytes, stop -1 if malformed."""
    n, pos = _varint(buf, pos, end)
    if pos < 0 or n < 0 or pos + n > end:
        return 0, -1
    return pos, pos + n


@njit(cache=CACHE, nogil=True)
def _block_count(buf, pos, end):
    """The item count of an Avro array block at ``pos`` (its byte size, written after a negative
    count, skipped); returns (count, next pos), next pos -1 if malformed. A count of 0 ends the
    array."""
    count, pos = _varint(buf, pos, end)
    if pos >= 0 and count < 0:
        count = -count
        _, pos = _varint(buf, pos, end)
    return count, pos


@njit(cache=CACHE, nogil=True, inline="always")
def _copy_nul_ended(buf, a, b, out, at):
    """``buf[a:b]`` copied into ``out`` from ``at``, a NUL after it: the position after the NUL,
    or -1 when the string holds a NUL itself (its record then goes the slow way)."""
    for j in range(a, b):
        if buf[j] == 0:
            return -1
        out[at] = buf[j]
        at += 1
    out[at] = 0
    return at + 1


@njit(cache=CACHE, nogil=True)
def _parse(buf, starts, ends, magic, status, ts, spans, shape, feats, arms, ids, value):
    """One pass over records ``buf[starts[i]:ends[i]]``; returns the bytes used of ``ids`` and
    ``arms``.

    Columns per record: ``spans[i]`` = event id (0, 1), model key (2, 3), arm ids in ``arms``
    (4, 5) and features in ``feats`` (6, 7) as start/stop; ``shape[i]`` = (K, d); ``value[i]`` a
    reward's value. The event ids and model keys of the records handled here are copied into
    ``ids`` (event id, model key, event id, ...) and their arm ids into ``arms``, each followed by
    a NUL byte, so that Python decodes and splits each buffer once for the whole batch instead of
    once per string; a record whose event id, model key or arm ids contain a NUL goes the slow
    way."""
    f_at = 0
    a_at = 0
    i_at = 0
    for i in range(starts.shape[0]):
        status[i] = _SLOW
        pos, end = starts[i], ends[i]
        if end - pos < 3 or buf[pos] != magic:
            continue
        sid, ver = buf[pos + 1], buf[pos + 2]
        is_ctx = sid == 1 and ver == 2
        if not (is_ctx or (sid == 2 and ver == 1)):
            continue
        pos += 3
        a, b = _string(buf, pos, end)  # event_id
        if b < 0:
            continue
        spans[i, 0], spans[i, 1] = a, b
        i0 = i_at
        i_at = _copy_nul_ended(buf, a, b, ids, i0)
        if i_at < 0:
            i_at = i0
            continue
        a, b = _string(buf, b, end)  # model_key, copied after the event id the same way
        if b < 0:
            i_at = i0
            continue
        i_at = _copy_nul_ended(buf, a, b, ids, i_at)
        if i_at < 0:
            i_at = i0
            continue
        spans[i, 2], spans[i, 3] = a, b
        t, pos = _varint(buf, b, end)  # timestamp_ms
        if pos < 0:
            i_at = i0
            continue
        ts[i] = t
        if not is_ctx:
            if pos + 8 != end:  # value: one little-endian double, then nothing
                i_at = i0
                continue
            v = buf[pos:end].copy().view(np.float64)[0]
            if not np.isfinite(v):
                i_at = i0
                continue
            value[i] = v
            status[i] = _REWARD
            continue
        # arm_ids: Avro array blocks (count, [byte size if count < 0], items), ended by count 0.
        k = 0
        a0 = a_at
        ok = True
        while ok:
            count, pos = _block_count(buf, pos, end)
            if pos < 0:
                ok = False
                break
            if count == 0:
                break
            for _ in range(count):
                a, b = _string(buf, pos, end)
                if b < 0:
                    ok = False
                    break
                for j in range(a, b):
                    if buf[j] == 0:
                        ok = False
                    arms[a_at] = buf[j]
                    a_at += 1
                arms[a_at] = 0
                a_at += 1
                k += 1
                pos = b
        if not ok or k == 0:
            a_at, i_at = a0, i0
            continue
        a, b = _string(buf, pos, end)  # features: K x d little-endian float64
        n = b - a
        if b != end or n == 0 or n % (8 * k) != 0:
            a_at, i_at = a0, i0
            continue
        m = n // 8
        block = buf[a:b].copy().view(np.float64)
        finite = True
        for j in range(m):
            x = block[j]
            if not np.isfinite(x):
                finite = False
                break
            feats[f_at + j] = x
        if not finite:
            a_at, i_at = a0, i0
            continue
        spans[i, 4], spans[i, 5] = a0, a_at - 1  # without the last arm's NUL
        spans[i, 6], spans[i, 7] = f_at, f_at + m
        shape[i, 0], shape[i, 1] = k, m // k
        f_at += m
        status[i] = _CONTEXT
    return i_at, a_at


def decode_batch(values: list) -> list:
    """``[codec.decode(v) for v in values]``, with each failure returned as its
    :class:`DecodeError` instead of raised, in one compiled pass for the common layouts."""
    n = len(values)
    if n == 0:
        return []
    fast_layouts = WRITERS.get((1, 2)) is READERS[1] and WRITERS.get((2, 1)) is READERS[2]
    clean = [v if isinstance(v, bytes) else b"" for v in values]
    raw = b"".join(clean)
    buf = np.frombuffer(raw, dtype=np.uint8)
    sizes = np.fromiter(map(len, clean), dtype=np.int64, count=n)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    status = np.zeros(n, np.int8)
    ts = np.zeros(n, np.int64)
    spans = np.zeros((n, 8), np.int64)
    shape = np.zeros((n, 2), np.int64)
    value = np.zeros(n, np.float64)
    feats = np.empty(len(raw) // 8 + 1, np.float64)
    arms = np.empty(
        len(raw) + n + 1, np.uint8
    )  # every arm id and a NUL after each (an arm id is >= 1 byte in raw)
    ids = np.empty(len(raw) + 2 * n + 1, np.uint8)  # event id and model key, a NUL after each
    n_ids = n_arms = 0
    if fast_layouts:
        n_ids, n_arms = _parse(
            buf, starts, ends, MAGIC, status, ts, spans, shape, feats, arms, ids, value
        )
    # Every event id and every arm id of the batch in one decode and one split (a NUL ends each;
    # none holds one). Bytes that are not UTF-8 anywhere: each record is decoded on its own below,
    # so the bad one gets the per-record decoder's error and the others their strings.
    try:
        all_ids = ids[:n_ids].tobytes().decode().split("\x00")
        all_arms = arms[:n_arms].tobytes().decode().split("\x00")
    except UnicodeDecodeError:
        all_ids = all_arms = None
    if all_ids is None:
        return _records_one_by_one(
            values, raw, arms[:n_arms].tobytes(), status, ts, spans, shape, feats, value
        )
    # The common case: every string of the batch already decoded. Only the columns this loop reads
    # are turned into lists, and when every context has the same (K, d) (the usual stream) the
    # batch's features (laid end to end in context order) are one (contexts, K, d) array, so a
    # record's features are one view of it rather than a slice and a reshape.
    event_ids = all_ids[0:-1:2]  # of each record handled by _parse, in order (the last '' left)
    keys = all_ids[1::2]
    # A batch holds few model keys: its records share one string object per key (as the engine's
    # dicts are keyed by them, each key's hash is then computed once).
    one_of = {k: k for k in set(keys)}
    keys = list(map(one_of.__getitem__, keys))
    is_ctx = status == _CONTEXT
    n_ctx = int(is_ctx.sum())
    per_ctx = arm_tuples = None
    if n_ctx:
        k0, d0 = shape[is_ctx][0]
        if (shape[is_ctx] == (k0, d0)).all():
            # Every context's (K, d) view, and its tuple of K arm ids, made in one C loop each
            # (a slice and a tuple, or an index, per record cost more).
            per_ctx = list(feats[: n_ctx * k0 * d0].reshape(n_ctx, k0, d0))
            arm_tuples = list(zip(*[iter(all_arms)] * int(k0)))  # the last, empty, string left
    else:
        per_ctx = arm_tuples = []
    if per_ctx is not None and n > 1 and len(event_ids) == n:
        return _records_by_column(event_ids, keys, is_ctx, ts, value, arm_tuples, per_ctx)
    out = []
    next_id = next_arm = next_ctx = 0
    for i, (st, t, k, v) in enumerate(
        zip(status.tolist(), ts.tolist(), shape[:, 0].tolist(), value.tolist())
    ):
        if st == _SLOW:
            out.append(_decode_or_error(values[i]))
            continue
        event_id, key = event_ids[next_id], keys[next_id]
        next_id += 1
        if st == _CONTEXT:
            if per_ctx is not None:
                arm_ids = arm_tuples[next_ctx]
                features = per_ctx[next_ctx]
            else:
                arm_ids = tuple(all_arms[next_arm : next_arm + k])
                next_arm += k
                a, b = spans[i, 6], spans[i, 7]
                features = feats[a:b].reshape(k, (b - a) // k)
            next_ctx += 1
            out.append(Context(event_id, key, t, arm_ids, features))
        else:
            out.append(Reward(event_id, key, t, v))
    return out


def _records_by_column(
    event_ids: list, keys: list, is_ctx, ts, value, arm_tuples: list, per_ctx: list
) -> list:
    """``decode_batch``'s records when every one of the ``n > 1`` records was parsed by ``_parse``
    and every context has the same (K, d): the contexts and the rewards each made in one ``map``
    over their columns, then put back in record order by one ``itemgetter`` (the per-record loop
    above makes the same records, one at a time; tests/unit/wire/test_batch_decode.py compares
    the two)."""
    is_rew = ~is_ctx
    ids = np.array(event_ids, dtype=object)
    key = np.array(keys, dtype=object)
    ctxs = list(
        map(
            Context,
            ids[is_ctx].tolist(),
            key[is_ctx].tolist(),
            ts[is_ctx].tolist(),
            arm_tuples,
            per_ctx,
        )
    )
    rews = list(
        map(
            Reward,
            ids[is_rew].tolist(),
            key[is_rew].tolist(),
            ts[is_rew].tolist(),
            value[is_rew].tolist(),
        )
    )
    # Record i is contexts[c] (c contexts before it) or rewards[r] (r rewards before it).
    place = np.where(is_ctx, np.cumsum(is_ctx) - 1, len(ctxs) + np.cumsum(is_rew) - 1)
    return list(operator.itemgetter(*place.tolist())(ctxs + rews))


def _records_one_by_one(
    values: list, raw: bytes, arm_bytes: bytes, status, ts, spans, shape, feats, value
) -> list:
    """``decode_batch``'s records when the batch's strings are not all UTF-8: each record's
    strings decoded on their own, so only the bad record fails (with ``codec.decode``'s error)."""
    out = []
    for i, (st, t, sp, (k, d), v) in enumerate(
        zip(status.tolist(), ts.tolist(), spans.tolist(), shape.tolist(), value.tolist())
    ):
        try:
            if st == _SLOW:
                out.append(codec.decode(values[i]))
                continue
            event_id = raw[sp[0] : sp[1]].decode()
            key = raw[sp[2] : sp[3]].decode()
            if st == _CONTEXT:
                arm_ids = tuple(arm_bytes[sp[4] : sp[5]].decode().split("\x00"))
                out.append(Context(event_id, key, t, arm_ids, feats[sp[6] : sp[7]].reshape(k, d)))
            else:
                out.append(Reward(event_id, key, t, v))
        except UnicodeDecodeError:
            out.append(_decode_or_error(values[i]))
        except DecodeError as exc:
            out.append(exc)
    return out


def _decode_or_error(value: bytes) -> object:
    try:
        return codec.decode(value)
    except DecodeError as exc:
        return exc
