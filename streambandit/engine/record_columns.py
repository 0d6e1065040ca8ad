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
        self.id_buf = np.frombuffer(b"".join(ids) or b"\0", dtype=np.uint8)
        self.feat_buf = np.concatenate(feats) if feats else np.zeros(1)
        self.arm_buf = np.frombuffer(b"".join(arms) or b"\0", dtype=np.uint8)
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
    def gather(cls, parts: list[tuple[Any, np.ndarray, np.ndarray]]) -> "RecordColumns":
        """The columns of a run of records held in decoded batches: ``parts``, in run order, of
        ``(batch, rows, meta)``: a ``DecodedColumns``, the indices of its records in the run, and
        per record (rows of ``meta``, META_FIELDS columns) the kind the pass should see it as
        (CONTEXT, REWARD_RECORD or OTHER: the caller knows whether it came on the right input,
        keyed by its model key), its source, offset and record timestamp."""
        self = cls.__new__(cls)
        n = sum(len(rows) for _, rows, _ in parts)
        rec_i = np.zeros((n, R_FIELDS), dtype=np.int64)
        rec_f = np.zeros(n, dtype=np.float64)
        key_col = np.empty(n, dtype=np.int64)
        names: dict[str, int] = {}
        id_parts, feat_parts, arm_parts, start_parts, len_parts = [], [], [], [], []
        at = id_at = feat_at = arm_at = n_arms = 0
        for batch, rows, meta in parts:
            m = len(rows)
            # The batch's key numbers as the run's (-1, no key, reads the last entry).
            renumber = np.array(
                [names.setdefault(k, len(names)) for k in batch.key_names] + [-1], dtype=np.int64
            )
            _gather(
                rows, meta, batch.ts, batch.value, batch.shape, batch.feat_start, batch.id_start,
                batch.id_len, batch.key_len, batch.key_id, batch.arm_first, renumber,
                id_at, feat_at, n_arms, rec_i[at : at + m], rec_f[at : at + m],
                key_col[at : at + m],
            )  # fmt: skip
            id_parts.append(batch.ids)
            feat_parts.append(batch.feats)
            arm_parts.append(batch.arms)
            start_parts.append(batch.arm_start + arm_at)
            len_parts.append(batch.arm_len)
            id_at += len(batch.ids)
            feat_at += len(batch.feats)
            arm_at += len(batch.arms)
            n_arms += len(batch.arm_start)
            at += m
        one = len(parts) == 1
        self.id_buf = id_parts[0] if one else np.concatenate(id_parts)
        self.feat_buf = feat_parts[0] if one else np.concatenate(feat_parts)
        self.arm_buf = arm_parts[0] if one else np.concatenate(arm_parts)
        self.arm_start = start_parts[0] if one else np.concatenate(start_parts)
        self.arm_len = len_parts[0] if one else np.concatenate(len_parts)
        self.rec_i, self.rec_f, self.key_col, self.key_names = rec_i, rec_f, key_col, list(names)
        is_ctx = rec_i[:, R_KIND] == CONTEXT
        arm_bytes = np.zeros(n + 1, dtype=np.int64)
        arm_bytes[:n] = np.where(is_ctx, _arm_bytes(parts), 0)
        contexts = np.zeros(n + 1, dtype=np.int64)
        contexts[:n] = is_ctx
        id_bytes = np.zeros(n + 1, dtype=np.int64)
        id_bytes[:n] = np.where(is_ctx, rec_i[:, R_ID_LEN], 0)
        self.contexts_after = np.cumsum(contexts[::-1])[::-1]
        self.id_bytes_after = np.cumsum(id_bytes[::-1])[::-1]
        self.arm_bytes_after = np.cumsum(arm_bytes[::-1])[::-1]
        return self


def _arm_bytes(parts: list) -> np.ndarray:
    """Each record's arm ids' bytes (0 for a record that is not a context), in run order."""
    if len(parts) == 1:
        batch, rows, _ = parts[0]
        return batch.arm_bytes[rows]
    return np.concatenate([batch.arm_bytes[rows] for batch, rows, _ in parts])


# ``gather``'s meta columns (the caller's, per record of the run).
META_KIND, META_SRC, META_OFF, META_RECORD_MS = range(4)
META_FIELDS = 4


@njit(cache=CACHE)
def _gather(rows, meta, ts, value, shape, feat_start, id_start, id_len, key_len, key_id,
            arm_first, renumber, id_at, feat_at, arm_at, rec_i, rec_f, key_col):  # fmt: skip
    """The run's rows from one decoded batch, whose buffers start at ``id_at``, ``feat_at`` and
    ``arm_at`` in the run's."""
    for j in range(rows.shape[0]):
        i = rows[j]
        r = rec_i[j]
        kind = meta[j, META_KIND]
        r[R_KIND] = kind
        r[R_SRC], r[R_OFF] = meta[j, META_SRC], meta[j, META_OFF]
        r[R_RECORD_MS] = meta[j, META_RECORD_MS]
        if kind == OTHER:
            key_col[j] = -1
            continue
        r[R_TS] = ts[i]
        r[R_ID_START], r[R_ID_LEN], r[R_KEY_LEN] = id_start[i] + id_at, id_len[i], key_len[i]
        key_col[j] = renumber[key_id[i]]
        if kind == CONTEXT:
            r[R_FEAT_START], r[R_K], r[R_D] = feat_start[i] + feat_at, shape[i, 0], shape[i, 1]
            r[R_ARMS_START] = arm_first[i] + arm_at
        else:
            rec_f[j] = value[i]
