"""A run of records as the columns engine/compiled_pass.py reads.

Two ways in: :meth:`RecordColumns.gather`, from the columns the worker's decoder made of its poll
batches (wire/batch_decode.py's ``DecodedColumns``: no Python object per record), and the
constructor, from records (a call's, a replay's, a test's). Either gives ids and arm ids as
bytes in one buffer each, every context's features in one float buffer, each record's model key
as a number among the run's distinct keys, and the sums a caller reserves room by.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from streambandit.engine.compiled_pass import (
    CONTEXT,
    OTHER,
    R_ARMS_START,
    R_D,
    R_FEAT_START,
    R_FIELDS,
    R_ID_LEN,
    R_ID_START,
    R_K,
    R_KEY_LEN,
    R_KIND,
    R_MODEL,
    R_OFF,
    R_RECORD_MS,
    R_SRC,
    R_TS,
    REWARD_RECORD,
)
from streambandit.numerics.jit import CACHE
from streambandit.wire import Context, InputRef, Reward

__all__ = ["META_FIELDS", "META_KIND", "META_OFF", "META_RECORD_MS", "META_SRC", "RecordColumns"]


class RecordColumns:
    """The columns of ``events``, (record, source) pairs as the engine takes them."""

    __slots__ = (
        "rec_i",
        "rec_f",
        "id_buf",
        "feat_buf",
        "arm_buf",
        "arm_start",
        "arm_len",
        "key_col",
        "key_names",
        "contexts_after",
        "id_bytes_after",
        "arm_bytes_after",
    )

    def __init__(self, events: list[tuple[Any, Any]]) -> None:
        n = len(events)
        rec_i = np.zeros((n, R_FIELDS), dtype=np.int64)
        rec_f = np.zeros(n, dtype=np.float64)
        ids, feats, arms, arm_lens = [], [], [], []
        key_col = np.full(n, -1, dtype=np.int64)
        key_number: dict[str, int] = {}
        id_at = feat_at = arm_at = 0
        contexts = np.zeros(n + 1, dtype=np.int64)  # per record, then summed from the end
        id_bytes = np.zeros(n + 1, dtype=np.int64)
        arm_bytes = np.zeros(n + 1, dtype=np.int64)
        for i, (ev, source) in enumerate(events):
            r = rec_i[i]
            if type(source) is InputRef:
                r[R_RECORD_MS], r[R_SRC], r[R_OFF] = (
                    source.timestamp_ms,
                    source.source,
                    source.offset,
                )
            else:  # a call's or a test's input: the engine's NO_INPUT trigger
                r[R_RECORD_MS], r[R_SRC], r[R_OFF] = getattr(source, "timestamp_ms", 0), -1, -1
            cls = type(ev)
            if cls is Context and ev.features.ndim == 2:
                r[R_KIND] = CONTEXT
            elif cls is Reward:
                r[R_KIND] = REWARD_RECORD
                rec_f[i] = ev.value
            else:
                r[R_KIND] = OTHER
                continue
            r[R_TS] = ev.timestamp_ms
            key = ev.model_key
            key_col[i] = key_number.setdefault(key, len(key_number))
            b = ev.event_id.encode()
            ids.append(b)
            r[R_ID_START], r[R_ID_LEN], r[R_KEY_LEN] = id_at, len(b), len(key.encode())
            id_at += len(b)
            if cls is Context:
                x = np.ascontiguousarray(ev.features, dtype=np.float64)
                k, d = x.shape
                feats.append(x.ravel())
                r[R_FEAT_START], r[R_K], r[R_D], r[R_ARMS_START] = feat_at, k, d, arm_at
                feat_at += k * d
                encoded = [a.encode() for a in ev.arm_ids]
                arms += encoded
                arm_lens += [len(a) for a in encoded]
                arm_at += len(encoded)
                contexts[i], id_bytes[i] = 1, len(b)
                arm_bytes[i] = sum(arm_lens[-len(encoded) :]) if encoded else 0
        self.rec_i, self.rec_f = rec_i, rec_f
        self.key_col, self.key_names = key_col, list(key_number)
        # Writable, as the worker's gathered buffers are: one compiled signature of the pass.
        self.id_buf = np.frombuffer(bytearray(b"".join(ids) or b"\0"), dtype=np.uint8)
        self.feat_buf = np.concatenate(feats) if feats else np.zeros(1)
        self.arm_buf = np.frombuffer(bytearray(b"".join(arms) or b"\0"), dtype=np.uint8)
        lens = np.array(arm_lens, dtype=np.int64)
        self.arm_len = lens if len(lens) else np.zeros(1, dtype=np.int64)
        starts = np.zeros(max(1, len(lens)), dtype=np.int64)
        if len(lens) > 1:
            np.cumsum(lens[:-1], out=starts[1:])
        self.arm_start = starts
        # From record i on: the contexts, their ids' bytes and their arm ids' bytes.
        self.contexts_after = np.cumsum(contexts[::-1])[::-1]
        self.id_bytes_after = np.cumsum(id_bytes[::-1])[::-1]
        self.arm_bytes_after = np.cumsum(arm_bytes[::-1])[::-1]

    def set_models(self, start: int, index_of: dict[str, int], models: dict[str, Any]) -> None:
        """The model column from record ``start`` on: a model's index, -1 when none is made."""
        # Indexed by key number, with -1 (no key) reading the last entry.
        lookup = np.array(
            [index_of[k] if k in models else -1 for k in self.key_names] + [-1], dtype=np.int64
        )
        self.rec_i[start:, R_MODEL] = lookup[self.key_col[start:]]

    def key_of(self, i: int) -> str:
        """Record ``i``'s model key."""
        return self.key_names[self.key_col[i]]

    @classmethod
    def gather(
        cls, n: int, parts: list[tuple[Any, np.ndarray, np.ndarray, np.ndarray]]
    ) -> "RecordColumns":
        """The columns of a run of ``n`` records held in decoded batches: ``parts``, one per
        batch, of ``(batch, rows, at, meta)``: a ``DecodedColumns``, the indices of its records
        in the run, their places in the run, and per record (rows of ``meta``, META_FIELDS
        columns) the kind the pass should see it as (CONTEXT, REWARD_RECORD or OTHER: the caller
        knows whether it came on the right input, keyed by its model key), its source, offset
        and record timestamp.

        One part per batch, not per stretch of the run: the merge interleaves the contexts'
        and the rewards' batches record by record, and a part costs Python calls."""
        self = cls.__new__(cls)
        rec_i = np.zeros((n, R_FIELDS), dtype=np.int64)
        rec_f = np.zeros(n, dtype=np.float64)
        key_col = np.empty(n, dtype=np.int64)
        # The run's own buffers, holding only its records' ids, features and arm ids: a batch's
        # buffers hold all of its records, and a run may span several batches.
        sizes = np.zeros(4, dtype=np.int64)  # id bytes, feature numbers, arm ids, arm id bytes
        # The features are most of a run's bytes: when its contexts all come from one batch
        # (rewards carry none), the pass reads them where that batch's decoder put them.
        with_contexts = [
            batch
            for batch, rows, _, meta in parts
            if _add_sizes(rows, meta, batch.shape, batch.id_len, batch.arm_bytes, sizes)
        ]
        id_buf = np.empty(max(1, sizes[0]), dtype=np.uint8)
        copy_feats = len(with_contexts) > 1
        if copy_feats:
            feat_buf = np.empty(max(1, sizes[1]), dtype=np.float64)
        else:
            feat_buf = with_contexts[0].feats if with_contexts else np.zeros(1)
        arm_start = np.zeros(max(1, sizes[2]), dtype=np.int64)
        arm_len = np.zeros(max(1, sizes[2]), dtype=np.int64)
        arm_buf = np.empty(max(1, sizes[3]), dtype=np.uint8)
        arm_bytes = np.zeros(n + 1, dtype=np.int64)  # per record, then summed from the end
        names: dict[str, int] = {}
        pos = np.zeros(4, dtype=np.int64)  # where the next part's bytes go, as sizes
        for batch, rows, at, meta in parts:
            # The batch's key numbers as the run's (-1, no key, reads the last entry): only
            # the keys of the run's rows are looked at (a batch may hold thousands).
            renumber = np.full(len(batch.key_names) + 1, -1, dtype=np.int64)
            key_names = batch.key_names
            for k in np.unique(batch.key_id[rows]).tolist():
                if k >= 0:
                    renumber[k] = names.setdefault(key_names[k], len(names))
            _gather(
                rows, at, meta, batch.ts, batch.value, batch.shape, batch.feat_start, batch.feats,
                batch.ids, batch.id_start, batch.id_len, batch.key_len, batch.key_id, renumber,
                batch.arms, batch.arm_first, batch.arm_start, batch.arm_len, pos,
                rec_i, rec_f, key_col, arm_bytes, id_buf, feat_buf, arm_buf, arm_start, arm_len,
                copy_feats,
            )  # fmt: skip
        self.id_buf, self.feat_buf, self.arm_buf = id_buf, feat_buf, arm_buf
        self.arm_start, self.arm_len = arm_start, arm_len
        self.rec_i, self.rec_f, self.key_col, self.key_names = rec_i, rec_f, key_col, list(names)
        self.contexts_after = np.empty(n + 1, dtype=np.int64)
        self.id_bytes_after = np.empty(n + 1, dtype=np.int64)
        self.arm_bytes_after = arm_bytes
        _sums_after(rec_i, self.contexts_after, self.id_bytes_after, arm_bytes)
        return self


# ``gather``'s meta columns (the caller's, per record of the run).
META_KIND, META_SRC, META_OFF, META_RECORD_MS = range(4)
META_FIELDS = 4


@njit(cache=CACHE)
def _add_sizes(rows, meta, shape, id_len, arm_bytes, sizes):
    """Add to ``sizes`` (id bytes, feature numbers, arm ids, arm id bytes) what one batch's
    ``rows`` of a run hold; whether any is a context."""
    any_context = False
    for q in range(rows.shape[0]):
        kind = meta[q, META_KIND]
        if kind == OTHER:
            continue
        i = rows[q]
        sizes[0] += id_len[i]
        if kind == CONTEXT:
            any_context = True
            sizes[1] += shape[i, 0] * shape[i, 1]
            sizes[2] += shape[i, 0]
            sizes[3] += arm_bytes[i]
    return any_context


@njit(cache=CACHE)
def _sums_after(rec_i, contexts, id_bytes, arm_bytes):
    """From each record of the run on (and 0 past its end): the contexts, their ids' bytes and
    their arm ids' bytes (``arm_bytes`` holds each record's own on the way in)."""
    n = rec_i.shape[0]
    contexts[n] = id_bytes[n] = arm_bytes[n] = 0
    for i in range(n - 1, -1, -1):
        is_ctx = rec_i[i, R_KIND] == CONTEXT
        contexts[i] = contexts[i + 1] + (1 if is_ctx else 0)
        id_bytes[i] = id_bytes[i + 1] + (rec_i[i, R_ID_LEN] if is_ctx else 0)
        arm_bytes[i] += arm_bytes[i + 1]


@njit(cache=CACHE, inline="always")
def copy_into(dst, at, src, start, n):
    """``src[start:start + n]`` into ``dst`` from ``at`` (no slice made); the position after."""
    for c in range(n):
        dst[at + c] = src[start + c]
    return at + n


@njit(cache=CACHE)
def _gather(rows, at, meta, ts, value, shape, feat_start, feats, ids, id_start, id_len, key_len,
            key_id, renumber, arms, arm_first, arm_start, arm_len, pos, rec_i, rec_f, key_col,
            arm_bytes, id_buf, feat_buf, arm_buf, run_arm_start, run_arm_len,
            copy_feats):  # fmt: skip
    """The run's rows from one decoded batch: their columns at their places ``at`` in the run,
    and their ids, features and arm ids copied into the run's buffers from ``pos`` (id bytes,
    feature numbers, arm ids, arm id bytes used so far; moved on past what is copied). With
    ``copy_feats`` False, ``feat_buf`` is the batch's ``feats`` and nothing is copied there."""
    for q in range(rows.shape[0]):
        i, j = rows[q], at[q]
        r = rec_i[j]
        kind = meta[q, META_KIND]
        r[R_KIND] = kind
        r[R_SRC], r[R_OFF] = meta[q, META_SRC], meta[q, META_OFF]
        r[R_RECORD_MS] = meta[q, META_RECORD_MS]
        if kind == OTHER:
            key_col[j] = -1
            continue
        r[R_TS] = ts[i]
        a, m = id_start[i], id_len[i]
        r[R_ID_START], r[R_ID_LEN], r[R_KEY_LEN] = pos[0], m, key_len[i]
        copy_into(id_buf, pos[0], ids, a, m)
        pos[0] += m
        key_col[j] = renumber[key_id[i]]
        if kind != CONTEXT:
            rec_f[j] = value[i]
            continue
        k, d = shape[i, 0], shape[i, 1]
        f = feat_start[i]
        r[R_K], r[R_D] = k, d
        if copy_feats:
            r[R_FEAT_START] = pos[1]
            copy_into(feat_buf, pos[1], feats, f, k * d)
            pos[1] += k * d
        else:
            r[R_FEAT_START] = f
        r[R_ARMS_START] = pos[2]
        total = 0
        for t in range(k):
            s, n = arm_start[arm_first[i] + t], arm_len[arm_first[i] + t]
            run_arm_start[pos[2]], run_arm_len[pos[2]] = pos[3], n
            copy_into(arm_buf, pos[3], arms, s, n)
            pos[2] += 1
            pos[3] += n
            total += n
        arm_bytes[j] = total
