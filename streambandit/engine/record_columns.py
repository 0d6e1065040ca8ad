"""A run of decoded records as the columns engine/compiled_pass.py reads.

The worker's decoder makes records (wire/batch_decode.py); until it writes these columns itself,
this builds them from the records: ids and arm ids as bytes in one buffer each, every context's
features in one float buffer, and the sums a caller reserves room by.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
from streambandit.wire import Context, InputRef, Reward

__all__ = ["RecordColumns"]


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
        "keys",
        "contexts_after",
        "id_bytes_after",
        "arm_bytes_after",
    )

    def __init__(self, events: list[tuple[Any, Any]]) -> None:
        n = len(events)
        rec_i = np.zeros((n, R_FIELDS), dtype=np.int64)
        rec_f = np.zeros(n, dtype=np.float64)
        ids, feats, arms, arm_lens = [], [], [], []
        keys: list[str | None] = []
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
                keys.append(None)
                continue
            r[R_TS] = ev.timestamp_ms
            key = ev.model_key
            keys.append(key)
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
        self.rec_i, self.rec_f, self.keys = rec_i, rec_f, keys
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
        col = self.rec_i[:, R_MODEL]
        for i in range(start, len(self.keys)):
            key = self.keys[i]
            col[i] = index_of[key] if key is not None and key in models else -1
