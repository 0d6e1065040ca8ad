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

__all__ = ["DecodedColumns", "decode_batch"]

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
def _parse(buf, starts, ends, magic, status, ts, spans, shape, feats, arms, ids, id_at, value):
    """One pass over records ``buf[starts[i]:ends[i]]``; returns the bytes used of ``ids`` and
    ``arms``.

    Columns per record: ``spans[i]`` = event id (0, 1), model key (2, 3), arm ids in ``arms``
    (4, 5) and features in ``feats`` (6, 7) as start/stop; ``shape[i]`` = (K, d); ``value[i]`` a
    reward's value. The event ids and model keys of the records handled here are copied into
    ``ids`` (event id, model key, event id, ...; ``id_at[i]`` where record i's event id starts)
    and their arm ids into ``arms``, each followed by a NUL byte, so that Python decodes and
    splits each buffer once for the whole batch instead of once per string; a record whose event
    id, model key or arm ids contain a NUL goes the slow way."""
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
            id_at[i] = i0
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
        id_at[i] = i0
        status[i] = _CONTEXT
    return i_at, a_at


class _Parsed:
    """``_parse``'s columns of a batch's values, and the buffers they point into."""

    __slots__ = (
        "raw", "status", "ts", "spans", "shape", "value", "feats", "arms", "ids", "id_at",
        "n_ids", "n_arms",
    )  # fmt: skip

    def __init__(self, values: list) -> None:
        n = len(values)
        fast_layouts = WRITERS.get((1, 2)) is READERS[1] and WRITERS.get((2, 1)) is READERS[2]
        clean = [v if isinstance(v, bytes) else b"" for v in values]
        self.raw = raw = b"".join(clean)
        buf = np.frombuffer(raw, dtype=np.uint8)
        sizes = np.fromiter(map(len, clean), dtype=np.int64, count=n)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        self.status = np.zeros(n, np.int8)
        self.ts = np.zeros(n, np.int64)
        self.spans = np.zeros((n, 8), np.int64)
        self.shape = np.zeros((n, 2), np.int64)
        self.value = np.zeros(n, np.float64)
        self.feats = np.empty(len(raw) // 8 + 1, np.float64)
        # Every arm id and a NUL after each (an arm id is >= 1 byte in raw); the event id and
        # model key, a NUL after each.
        self.arms = np.empty(len(raw) + n + 1, np.uint8)
        self.ids = np.empty(len(raw) + 2 * n + 1, np.uint8)
        self.id_at = np.zeros(n, np.int64)
        self.n_ids = self.n_arms = 0
        if fast_layouts:
            self.n_ids, self.n_arms = _parse(
                buf, starts, ends, MAGIC, self.status, self.ts, self.spans, self.shape,
                self.feats, self.arms, self.ids, self.id_at, self.value,
            )  # fmt: skip


def decode_batch(values: list) -> list:
    """``[codec.decode(v) for v in values]``, with each failure returned as its
    :class:`DecodeError` instead of raised, in one compiled pass for the common layouts."""
    n = len(values)
    if n == 0:
        return []
    parsed = _Parsed(values)
    raw, status, ts, spans, shape = parsed.raw, parsed.status, parsed.ts, parsed.spans, parsed.shape
    value, feats, arms, ids = parsed.value, parsed.feats, parsed.arms, parsed.ids
    n_ids, n_arms = parsed.n_ids, parsed.n_arms
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


# -- the batch as columns, for the engine's compiled pass (engine/record_columns.py) -----------


@njit(cache=CACHE, nogil=True)
def _utf8_ok(buf, a, b):
    """Whether ``buf[a:b]`` is UTF-8 as Python's strict decoder takes it: no overlong form, no
    surrogate, nothing above U+10FFFF, no sequence cut short."""
    j = a
    while j < b:
        c = buf[j]
        if c < 0x80:
            j += 1
            continue
        if 0xC2 <= c <= 0xDF:
            n, lo, hi = 1, 0x80, 0xBF
        elif c == 0xE0:
            n, lo, hi = 2, 0xA0, 0xBF
        elif c == 0xED:
            n, lo, hi = 2, 0x80, 0x9F  # U+D800..DFFF (surrogates) refused
        elif 0xE1 <= c <= 0xEF:
            n, lo, hi = 2, 0x80, 0xBF
        elif c == 0xF0:
            n, lo, hi = 3, 0x90, 0xBF
        elif 0xF1 <= c <= 0xF3:
            n, lo, hi = 3, 0x80, 0xBF
        elif c == 0xF4:
            n, lo, hi = 3, 0x80, 0x8F
        else:
            return False
        if j + n >= b:
            return False
        if not lo <= buf[j + 1] <= hi:
            return False
        for t in range(2, n + 1):
            if not 0x80 <= buf[j + t] <= 0xBF:
                return False
        j += n + 1
    return True


@njit(cache=CACHE, nogil=True)
def _columns(status, spans, ids, id_at, arms, keys, key_start, key_len, arm_first, arm_start, arm_len,
             key_id, key_first, key_ok):  # fmt: skip
    """What the engine's pass reads beyond ``_parse``'s columns, per record parsed there: its
    strings checked as UTF-8 (a record with one that is not goes back to ``codec.decode``, for
    its error), its arm ids split (``arm_first[i]``: its first arm's index in ``arm_start`` and
    ``arm_len``, positions in ``arms``), its model key numbered among the batch's distinct keys
    (``key_id[i]``; ``key_first[j]``: the first record of key j), and whether the message key
    (``key_len[i]`` bytes of ``keys`` from ``key_start[i]``; none when the length is < 0) is
    the model key. Returns
    how many distinct keys."""
    n = status.shape[0]
    size = 16
    while size < 2 * n:
        size *= 2
    slots = np.full(size, -1, np.int64)  # key id per hash slot
    hashes = np.zeros(n, np.uint64)
    n_keys = 0
    n_arms = 0
    for i in range(n):
        key_id[i] = -1
        key_ok[i] = False
        if status[i] == _SLOW:
            continue
        e0 = id_at[i]
        e1 = e0 + spans[i, 1] - spans[i, 0]
        k0 = e1 + 1
        k1 = k0 + spans[i, 3] - spans[i, 2]
        ok = _utf8_ok(ids, e0, e1) and _utf8_ok(ids, k0, k1)
        if ok and status[i] == _CONTEXT:
            ok = _utf8_ok(arms, spans[i, 4], spans[i, 5])
        if not ok:
            status[i] = _SLOW
            continue
        if status[i] == _CONTEXT:
            arm_first[i] = n_arms
            at = spans[i, 4]
            for j in range(spans[i, 4], spans[i, 5] + 1):
                if j == spans[i, 5] or arms[j] == 0:
                    arm_start[n_arms], arm_len[n_arms] = at, j - at
                    n_arms += 1
                    at = j + 1
        # The model key among the batch's keys (FNV-1a, open addressing).
        h = np.uint64(14695981039346656037)
        for j in range(k0, k1):
            h = (h ^ np.uint64(ids[j])) * np.uint64(1099511628211)
        s = np.int64(h & np.uint64(size - 1))
        while True:
            kid = slots[s]
            if kid < 0:
                slots[s] = n_keys
                hashes[n_keys] = h
                key_first[n_keys] = i
                key_id[i] = n_keys
                n_keys += 1
                break
            if hashes[kid] == h:
                f = key_first[kid]
                f0 = id_at[f] + spans[f, 1] - spans[f, 0] + 1
                if spans[f, 3] - spans[f, 2] == k1 - k0:
                    same = True
                    for j in range(k1 - k0):
                        if ids[f0 + j] != ids[k0 + j]:
                            same = False
                            break
                    if same:
                        key_id[i] = kid
                        break
            s = np.int64((s + 1) % size)
        m0 = key_start[i]
        if key_len[i] == k1 - k0:
            same = True
            for j in range(k1 - k0):
                if keys[m0 + j] != ids[k0 + j]:
                    same = False
                    break
            key_ok[i] = same
    return n_keys


class DecodedColumns:
    """A poll batch's values as columns, for the engine's compiled pass, and on demand the record
    :func:`decode_batch` makes of any one of them (the records the pass does not take).

    Per record: ``fast`` (1 a context, 2 a reward, both well formed under the fast layouts'
    every rule and their strings UTF-8; 0 anything else, for ``codec.decode``), ``ts``,
    ``value`` (a reward's), ``shape`` (K, d), ``feat_start`` (in ``feats``), the event id's
    ``id_start``/``id_len`` in ``ids``, ``key_len`` (the model key's bytes), ``key_id`` (its
    number among the batch's distinct ``key_names``), ``key_ok`` (the message key is the model
    key), ``arm_first`` (the first arm id's index in ``arm_start``/``arm_len``, positions in
    ``arms``) and ``arm_bytes`` (a context's arm ids' bytes)."""

    __slots__ = (
        "values", "fast", "ts", "value", "shape", "feat_start", "feats", "ids", "id_start",
        "id_len", "key_len", "key_id", "key_names", "key_ok", "arms", "arm_first", "arm_start",
        "arm_len", "arm_bytes", "_spans",
    )  # fmt: skip

    def __init__(self, values: list, keys: list) -> None:
        """``values`` and message ``keys`` (bytes or None) of the batch's records."""
        n = len(values)
        p = _Parsed(values)
        self.values = values
        self.fast, self.ts, self.value, self.shape = p.status, p.ts, p.value, p.shape
        self.feats, self.ids, self.arms, self._spans = p.feats, p.ids, p.arms, p.spans
        key_lens = [-1 if k is None else len(k) for k in keys]
        key_start = np.zeros(n, np.int64)
        key_len = np.array(key_lens, np.int64).reshape(n)
        if n > 1:
            np.cumsum(np.maximum(key_len[:-1], 0), out=key_start[1:])
        message_keys = np.frombuffer(b"".join(k or b"" for k in keys) or b"\0", np.uint8)
        self.arm_first = np.zeros(n, np.int64)
        n_arms = int(p.shape[p.status == _CONTEXT, 0].sum())  # at most: _columns may refuse some
        self.arm_start = np.zeros(n_arms + 1, np.int64)
        self.arm_len = np.zeros(n_arms + 1, np.int64)
        self.key_id = np.zeros(n, np.int64)
        key_first = np.zeros(n + 1, np.int64)
        self.key_ok = np.zeros(n, np.bool_)
        n_keys = _columns(
            p.status, p.spans, p.ids, p.id_at, p.arms, message_keys, key_start, key_len,
            self.arm_first, self.arm_start, self.arm_len, self.key_id, key_first, self.key_ok,
        )  # fmt: skip
        spans = p.spans
        self.id_start = p.id_at
        self.id_len = spans[:, 1] - spans[:, 0]
        self.key_len = spans[:, 3] - spans[:, 2]
        self.feat_start = spans[:, 6]
        # Arm ids' bytes: the span less the NULs between them.
        self.arm_bytes = np.where(
            p.status == _CONTEXT, spans[:, 5] - spans[:, 4] - p.shape[:, 0] + 1, 0
        )
        ids = p.ids
        self.key_names = [
            ids[a : a + m].tobytes().decode()
            for a, m in zip(
                (p.id_at[key_first[:n_keys]] + self.id_len[key_first[:n_keys]] + 1).tolist(),
                self.key_len[key_first[:n_keys]].tolist(),
            )
        ]

    def __len__(self) -> int:
        return len(self.values)

    def record(self, i: int) -> object:
        """Record ``i`` as :func:`decode_batch` returns it (a DecodeError for a bad one)."""
        fast = self.fast[i]
        if fast == _SLOW:
            return _decode_or_error(self.values[i])
        a = int(self.id_start[i])
        event_id = self.ids[a : a + self.id_len[i]].tobytes().decode()
        key = self.key_names[self.key_id[i]]
        if fast == _REWARD:
            return Reward(event_id, key, int(self.ts[i]), float(self.value[i]))
        sp = self._spans[i]
        k, d = self.shape[i].tolist()
        arm_ids = tuple(self.arms[sp[4] : sp[5]].tobytes().decode().split("\x00"))
        f = int(sp[6])
        return Context(
            event_id, key, int(self.ts[i]), arm_ids, self.feats[f : f + k * d].reshape(k, d)
        )
