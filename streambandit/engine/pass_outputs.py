"""The compiled pass's output columns as the Avro bytes the worker writes, with no object between.

engine/compiled_pass.py writes its actions and joined records as columns;
``ArrayPartitionEngine._outputs`` makes an Action or a Joined of each, and the worker encodes
those with wire/batch_encode.py, which gathers their fields back into columns. Making the
objects costs more than the pass saves (bench/results/engine_pass.md). Here one compiled pass
gathers the encoder's columns straight from the pass's (the ids' and arm ids' bytes from the
record columns and the pending arena, the model keys' from their UTF-8 bytes, doubles as their
IEEE bits), and batch_encode's compiled encoders write the records: the same bytes as
``encode_actions_timed`` / ``encode_joined_timed`` of the objects ``_outputs`` makes
(tests/unit/engine/test_pass_outputs.py compares them, pass by pass).
"""

from __future__ import annotations

from operator import sub
from typing import NamedTuple

import numpy as np
from numba import njit

from streambandit.engine.compiled_pass import (
    A_ARM_INDEX,
    A_REC,
    A_VERSION,
    J_DECIDED,
    J_DIM,
    J_ID_LEN,
    J_ID_START,
    J_MODEL,
    J_NOW,
    J_OBSERVED,
    J_PROPENSITY,
    J_REWARD,
    J_TOFF,
    J_TSRC,
    J_VERSION,
    O_ACTION,
    R_ARMS_START,
    R_D,
    R_FEAT_START,
    R_ID_LEN,
    R_ID_START,
    R_MODEL,
    R_OFF,
    R_SRC,
    R_TS,
)
from streambandit.engine.record_columns import RecordColumns, copy_into
from streambandit.numerics.jit import CACHE
from streambandit.wire.batch_encode import (
    ACTION_BOUND,
    JOINED_BOUND,
    encode_action_columns,
    encode_joined_columns,
    slices,
)
from streambandit.wire.codec import ACTION_HEADER, JOINED_HEADER

__all__ = ["EncodedOutputs", "ModelKeyBytes", "encode_outputs", "model_key_bytes"]

_ACTION_HEADER = np.frombuffer(ACTION_HEADER, np.uint8)
_JOINED_HEADER = np.frombuffer(JOINED_HEADER, np.uint8)


class ModelKeyBytes(NamedTuple):
    """The engine's model keys (by model index) as UTF-8: end to end in ``buf``, the end of each
    in ``ends``, and each as bytes (an output's message key)."""

    buf: np.ndarray
    ends: np.ndarray
    each: list[bytes]


def model_key_bytes(keys: list[str]) -> ModelKeyBytes:
    """:class:`ModelKeyBytes` of ``keys`` (``engine.model_keys``)."""
    each = [k.encode() for k in keys]
    buf = np.frombuffer(b"".join(each) or b"\0", dtype=np.uint8)
    ends = np.cumsum(np.fromiter(map(len, each), dtype=np.int64, count=len(each)))
    return ModelKeyBytes(buf, ends, each)


class EncodedOutputs(NamedTuple):
    """A pass's outputs encoded, each kind in output order."""

    actions: list[bytes]
    action_keys: list[bytes]  # the model key: the Kafka message's key
    decided_ms: list[int]  # each action's decision_timestamp_ms
    joined: list[bytes]
    joined_keys: list[bytes]
    delays: list[int]  # join - decision ms of each observed joined record, in record order
    defaults: int  # joined records whose reward was not observed
    kinds: np.ndarray  # per output (the pass's order): O_ACTION or O_JOINED
    records: np.ndarray  # per output: the index of the record that made it


@njit(cache=CACHE)
def _columns(
    out, rec_i, id_buf, feat_buf, arm_buf, arm_start, arm_len, arena, key_buf, key_ends,
    act_i, act_f, jn_i, jn_f, jn_x,
):  # fmt: skip
    """batch_encode's columns of the actions and of the joined records in ``out`` (one pass
    sizing them, one filling them), and each one's model index."""
    n = out.shape[0]
    na = nj = 0
    a_str = a_feat = j_str = j_feat = 0
    for o in range(n):
        k = out[o, 1]
        if out[o, 0] == O_ACTION:
            rec = act_i[k, A_REC]
            m = rec_i[rec, R_MODEL]
            arm = rec_i[rec, R_ARMS_START] + act_i[k, A_ARM_INDEX]
            key_len = key_ends[m] - (key_ends[m - 1] if m > 0 else 0)
            a_str += rec_i[rec, R_ID_LEN] + key_len + arm_len[arm]
            a_feat += rec_i[rec, R_D]
            na += 1
        else:
            m = jn_i[k, J_MODEL]
            key_len = key_ends[m] - (key_ends[m - 1] if m > 0 else 0)
            j_str += jn_i[k, J_ID_LEN] + key_len
            j_feat += jn_i[k, J_DIM]
            nj += 1
    a_strs = np.empty(a_str, dtype=np.uint8)
    a_str_ends = np.empty((na, 3), dtype=np.int64)
    a_ints = np.empty((na, 5), dtype=np.int64)
    a_bits = np.empty((na, 2), dtype=np.float64)  # viewed as int64 by the caller
    a_feats = np.empty(a_feat, dtype=np.float64)  # viewed as bytes by the caller
    a_feat_ends = np.empty(na, dtype=np.int64)
    a_models = np.empty(na, dtype=np.int64)
    j_strs = np.empty(j_str, dtype=np.uint8)
    j_str_ends = np.empty((nj, 2), dtype=np.int64)
    j_ints = np.empty((nj, 6), dtype=np.int64)
    j_bits = np.empty((nj, 2), dtype=np.float64)
    j_feats = np.empty(j_feat, dtype=np.float64)
    j_feat_ends = np.empty(nj, dtype=np.int64)
    j_models = np.empty(nj, dtype=np.int64)
    a = j = 0
    a_s = a_f = j_s = j_f = 0
    for o in range(n):
        k = out[o, 1]
        if out[o, 0] == O_ACTION:
            rec = act_i[k, A_REC]
            r = rec_i[rec]
            m = r[R_MODEL]
            index = act_i[k, A_ARM_INDEX]
            arm = r[R_ARMS_START] + index
            key_start = key_ends[m - 1] if m > 0 else 0
            # event_id, model_key, arm_id (ArrayPartitionEngine._outputs' Action).
            a_s = copy_into(a_strs, a_s, id_buf, r[R_ID_START], r[R_ID_LEN])
            a_str_ends[a, 0] = a_s
            a_s = copy_into(a_strs, a_s, key_buf, key_start, key_ends[m] - key_start)
            a_str_ends[a, 1] = a_s
            a_s = copy_into(a_strs, a_s, arm_buf, arm_start[arm], arm_len[arm])
            a_str_ends[a, 2] = a_s
            a_ints[a, 0], a_ints[a, 1], a_ints[a, 2] = index, act_i[k, A_VERSION], r[R_TS]
            a_ints[a, 3], a_ints[a, 4] = r[R_SRC], r[R_OFF]
            a_bits[a, 0], a_bits[a, 1] = act_f[k, 0], act_f[k, 1]  # score, propensity
            d = r[R_D]
            a_f = copy_into(a_feats, a_f, feat_buf, r[R_FEAT_START] + index * d, d)
            a_feat_ends[a] = a_f * 8
            a_models[a] = m
            a += 1
        else:
            m = jn_i[k, J_MODEL]
            key_start = key_ends[m - 1] if m > 0 else 0
            j_s = copy_into(j_strs, j_s, arena, jn_i[k, J_ID_START], jn_i[k, J_ID_LEN])
            j_str_ends[j, 0] = j_s
            j_s = copy_into(j_strs, j_s, key_buf, key_start, key_ends[m] - key_start)
            j_str_ends[j, 1] = j_s
            j_ints[j, 0] = 1 if jn_i[k, J_OBSERVED] else 0
            j_ints[j, 1], j_ints[j, 2] = jn_i[k, J_DECIDED], jn_i[k, J_NOW]
            j_ints[j, 3], j_ints[j, 4], j_ints[j, 5] = (
                jn_i[k, J_VERSION], jn_i[k, J_TSRC], jn_i[k, J_TOFF],
            )  # fmt: skip
            j_bits[j, 0], j_bits[j, 1] = jn_f[k, J_REWARD], jn_f[k, J_PROPENSITY]
            dim = jn_i[k, J_DIM]
            j_f = copy_into(j_feats, j_f, jn_x[k], 0, dim)
            j_feat_ends[j] = j_f * 8
            j_models[j] = m
            j += 1
    return (
        a_strs, a_str_ends, a_ints, a_bits, a_feats, a_feat_ends, a_models,
        j_strs, j_str_ends, j_ints, j_bits, j_feats, j_feat_ends, j_models,
    )  # fmt: skip


@njit(cache=CACHE)
def _encoded(
    out, rec_i, id_buf, feat_buf, arm_buf, arm_start, arm_len, arena, key_buf, key_ends,
    act_i, act_f, jn_i, jn_f, jn_x, a_header, j_header,
):  # fmt: skip
    """The actions and the joined records of ``out`` encoded, end to end in one buffer per kind
    with each record's end, and the columns the caller reads beside them (one compiled call per
    pass: each call from Python and each array it returns costs microseconds, per 256 records)."""
    (a_strs, a_str_ends, a_ints, a_bits, a_feats, a_feat_ends, a_models,
     j_strs, j_str_ends, j_ints, j_bits, j_feats, j_feat_ends, j_models) = _columns(
        out, rec_i, id_buf, feat_buf, arm_buf, arm_start, arm_len, arena, key_buf, key_ends,
        act_i, act_f, jn_i, jn_f, jn_x,
    )  # fmt: skip
    na, nj = a_ints.shape[0], j_ints.shape[0]
    # Room for every byte of the strings and features, and the fixed fields at their longest.
    a_out = np.empty(a_strs.size + 8 * a_feats.size + na * ACTION_BOUND, dtype=np.uint8)
    a_ends = np.empty(na, dtype=np.int64)
    if na:
        encode_action_columns(
            a_header, a_strs, a_str_ends, a_ints, a_bits.view(np.int64),
            a_feats.view(np.uint8), a_feat_ends, a_out, a_ends,
        )  # fmt: skip
    j_out = np.empty(j_strs.size + 8 * j_feats.size + nj * JOINED_BOUND, dtype=np.uint8)
    j_ends = np.empty(nj, dtype=np.int64)
    if nj:
        encode_joined_columns(
            j_header, j_strs, j_str_ends, j_ints, j_bits.view(np.int64),
            j_feats.view(np.uint8), j_feat_ends, j_out, j_ends,
        )  # fmt: skip
    return a_out, a_ends, a_ints, a_models, j_out, j_ends, j_ints, j_models


def encode_outputs(
    cols: RecordColumns,
    arena: np.ndarray,
    keys: ModelKeyBytes,
    out: np.ndarray,
    act_i: np.ndarray,
    act_f: np.ndarray,
    jn_i: np.ndarray,
    jn_f: np.ndarray,
    jn_x: np.ndarray,
) -> EncodedOutputs:
    """The outputs of one pass over ``cols`` (``out``: its first n_out rows; the columns as
    ``ArrayPartitionEngine.last_pass`` holds them), encoded: ``arena`` is the pending ids' arena
    the pass read (``engine.pending.ids.arena``, before anything reserves again), ``keys``
    :func:`model_key_bytes` of ``engine.model_keys``."""
    a_out, a_ends, a_ints, a_models, j_out, j_ends, j_ints, j_models = _encoded(
        out, cols.rec_i, cols.id_buf, cols.feat_buf, cols.arm_buf, cols.arm_start, cols.arm_len,
        arena, keys.buf, keys.ends, act_i, act_f, jn_i, jn_f, jn_x, _ACTION_HEADER, _JOINED_HEADER,
    )  # fmt: skip
    actions = slices(a_out, a_ends) if len(a_ends) else []
    joined = slices(j_out, j_ends) if len(j_ends) else []
    key_of = keys.each.__getitem__
    observed = j_ints[:, 0] != 0
    # As Python ints, as encode_joined_timed: the difference of two longs may not fit one.
    delays = list(map(sub, j_ints[observed, 2].tolist(), j_ints[observed, 1].tolist()))
    return EncodedOutputs(
        actions,
        list(map(key_of, a_models.tolist())),
        a_ints[:, 2].tolist(),
        joined,
        list(map(key_of, j_models.tolist())),
        delays,
        len(j_ints) - len(delays),
        out[:, 0],
        out[:, 2],
    )
