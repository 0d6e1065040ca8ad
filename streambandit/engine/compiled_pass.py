"""The common case of a batch's records in one compiled pass over the engine's arrays.

:class:`~streambandit.engine.array_partition.ArrayPartitionEngine` states the engine's rules in
Python on state held in arrays. :func:`run_records` applies the same rules to a run of records
(columns: no Python object per record) for what nearly every record is: a context for a model
that exists, with row-learner state (OFUL, GLB-OMD, Hvt-UCB: policies/rows.py), decided with
its exploration draw when it explores (the event's seed digest computed by the caller), and a
reward for one of its open decisions; with the windows the watermark closes on the way and the
eviction of the oldest decision at ``max_pending``. At the first record it does not handle (a
refusal, which has a detail to write; a new model; an early, late or duplicate reward; a failed
update; a tick) it returns that record's index, having changed nothing the Python rules would
not change first for that record (moving the watermark, closing the windows it passes); the
caller hands that record to the Python rules, which go on from there, and calls this again from
the next. The outputs are columns, in the order the Python rules emit them.

Every branch here is a line of engine/partition.py's rules; tests/unit/engine/test_compiled_pass.py
holds the outputs and the snapshot, byte for byte, to the Python rules' on streams that take
every path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.engine.deadline_queue import queue_next_deadline, queue_pop_due, queue_push
from streambandit.engine.decision import explore_kernel
from streambandit.engine.id_table import (
    COUNT,
    OLDEST,
    fnv1a,
    table_add,
    table_find,
    table_remove,
)
from streambandit.engine.open_decisions import (
    ARM,
    ARM_INDEX,
    DEADLINE_MS,
    DECIDED_MS,
    DIM,
    MODEL,
    N_REWARDS,
    PROPENSITY,
    REWARD,
    SCORE,
    SEQ,
    TRIGGER_OFFSET,
    TRIGGER_SOURCE,
    VERSION,
)
from streambandit.numerics import kernels
from streambandit.numerics.jit import CACHE
from streambandit.numerics.row_calls import (
    KIND,
    UPDATE_GLB_OMD,
    UPDATE_OFUL,
    _count,
    _inv,
    _other_matrix,
    _other_vector,
    _params,
    _scalars,
    _table,
    _theta,
)

__all__ = ["run_records"]

# A record's int columns.
R_KIND, R_TS, R_RECORD_MS, R_SRC, R_OFF, R_ID_START, R_ID_LEN, R_KEY_LEN = range(8)
R_MODEL, R_FEAT_START, R_K, R_D, R_ARMS_START = 8, 9, 10, 11, 12
R_FIELDS = 13
CONTEXT, REWARD_RECORD, OTHER = 0, 1, 2  # R_KIND: anything else is the Python rules' at once

# A model's int and float columns (by the engine's model index).
# M_ROWS: a row learner's (table and row set: its decisions close here); M_FAST: also decided
# here (a row learner, with or without exploration: M_EPS).
M_TABLE, M_ROW, M_UPDATE, M_DIM, M_WINDOW, M_AGG, M_FAST, M_ROWS = range(8)
M_FIELDS = 8
M_DEFAULT, M_LO, M_HI, M_EPS = range(4)
M_FLOATS = 4
AGG_FIRST, AGG_SUM, AGG_LAST = 0, 1, 2

# The engine's scalars and counters.
S_WATERMARK, S_SEQ, S_MAX_PENDING, S_MAX_ID_BYTES, S_AHEAD_MS, S_RECENT_BOUND = range(6)
S_FIELDS = 6
C_ACTIONS, C_REWARDS, C_JOINED_OBSERVED, C_JOINED_DEFAULT, C_EVICTED, C_UPDATES, C_RECENT = range(7)
C_FIELDS = 7
# ``cnt`` holds the counts, then for each the order of its first increment in the pass, then the
# number of counters incremented so far: a counter the engine did not hold yet is added in that
# order (a snapshot lists the counters in the order they were first counted).
C_FIRST = C_FIELDS
C_SIZE = 2 * C_FIELDS + 1

# The outputs: their order (kind, index in its kind's columns, record), an action's columns, a
# joined record's.
O_ACTION, O_JOINED = 0, 1
A_REC, A_ARM_INDEX, A_VERSION = range(3)
J_ID_START, J_ID_LEN, J_MODEL, J_OBSERVED, J_DECIDED, J_NOW, J_VERSION = range(7)
J_TSRC, J_TOFF, J_DIM = 7, 8, 9
J_FIELDS = 10
J_REWARD, J_PROPENSITY = range(2)

DECISION = 0  # the deadline queue's kind of an open decision (array_partition.DECISION)


@njit(cache=CACHE, inline="always")
def _bump(cnt, c):
    if cnt[c] == 0:
        cnt[C_FIRST + c] = cnt[C_SIZE - 1]
        cnt[C_SIZE - 1] += 1
    cnt[c] += 1


@njit(cache=CACHE, inline="always")
def _update(model_i, mod_i, x, reward):
    """The model's update (its row kernel) with ``x`` and ``reward``: (status, the version it
    was applied to). The row is untouched unless the status is OK."""
    t = _table(mod_i[model_i, M_TABLE])
    i = mod_i[model_i, M_ROW]
    kind = mod_i[model_i, M_UPDATE]
    count = _count(t)
    if kind == UPDATE_OFUL:
        status = kernels.oful_update_row(
            _theta(t), _inv(t), _other_vector(t), _scalars(t), count, i, x, reward, _params(t)
        )
    elif kind == UPDATE_GLB_OMD:
        status = kernels.glb_omd_update_row(
            _theta(t), _inv(t), _other_matrix(t), _scalars(t), count, i, x, reward, _params(t)
        )
    else:
        status = kernels.hvt_ucb_update_row(
            _theta(t), _inv(t), _other_matrix(t), _scalars(t), count, i, x, reward, _params(t)
        )
    return status, count[i] - 1


@njit(cache=CACHE, inline="always")
def _best(model_i, mod_i, arms, work, scores):
    """The model's decision without exploration: (index or BAD_ARMS, score, version).
    ``kernels.ucb_best_row``'s steps (the same bits) on scratch the pass allocates once:
    ``work`` (K * d) and ``scores`` (K), at least; the shape is the caller's to check."""
    t = _table(mod_i[model_i, M_TABLE])
    i = mod_i[model_i, M_ROW]
    k, d = arms.shape
    w, s = work[: k * d].reshape((k, d)), scores[:k]
    count = _count(t)
    beta = kernels.radius(t[KIND], _params(t), _scalars(t), count, i)
    if not kernels.ucb_row(arms, _theta(t)[i], _inv(t)[i], beta, s, w):
        return kernels.BAD_ARMS, 0.0, count[i]
    best = kernels.argmax_first(s)
    return best, s[best], count[i]


@njit(cache=CACHE, inline="always")
def _close_due(
    watermark, src, off, P, A, arm_refs, ints, floats, features, R, observed, run, heap, qmeta,
    mod_i, mod_f, st, cnt, out, n_out, jn_i, jn_f, jn_x, jn_n, rec, scratch, item,
):  # fmt: skip
    """Close every open decision whose deadline ``watermark`` has reached, as _advance does:
    (outputs, joined records, done). Not done (False) at an early reward's deadline or an update
    that fails, that item left queued for the Python rules."""
    while True:
        nxt = queue_next_deadline(run, heap, qmeta)
        if nxt > watermark:
            return n_out, jn_n, True
        # Peek: the item is taken only once its close is sure.
        head_is_run = qmeta[1] > 0 and (
            qmeta[2] == 0
            or run[qmeta[0], 0] < heap[0, 0]
            or (run[qmeta[0], 0] == heap[0, 0] and run[qmeta[0], 1] < heap[0, 1])
        )
        peek = run[qmeta[0]] if head_is_run else heap[0]
        if peek[2] != DECISION:
            return n_out, jn_n, False
        e = peek[3]
        live = P[2][e] >= 0 and ints[e, SEQ] == peek[1]
        if not live:  # closed since, or decided again: a stale deadline
            queue_pop_due(run, heap, qmeta, watermark, item)
            continue
        n_out, jn_n, ok = _close(
            e, peek[0], src, off, P, A, arm_refs, ints, floats, features, R, observed,
            mod_i, mod_f, st, cnt, out, n_out, jn_i, jn_f, jn_x, jn_n, rec, scratch,
        )  # fmt: skip
        if not ok:
            return n_out, jn_n, False
        queue_pop_due(run, heap, qmeta, watermark, item)


@njit(cache=CACHE, inline="always")
def _close(
    e, now, src, off, P, A, arm_refs, ints, floats, features, R, observed,
    mod_i, mod_f, st, cnt, out, n_out, jn_i, jn_f, jn_x, jn_n, rec, scratch,
):  # fmt: skip
    """_close of entry ``e``: the update, the joined record, the id remembered; (outputs, joined
    records, done). Not done (nothing changed) when the update fails."""
    model = ints[e, MODEL]
    if mod_i[model, M_ROWS] == 0:
        return n_out, jn_n, False
    dim = ints[e, DIM]
    observed_now = ints[e, N_REWARDS] > 0
    reward = floats[e, REWARD] if observed_now else mod_f[model, M_DEFAULT]
    x = scratch[:dim]
    x[:] = features[e, :dim]
    status, version = _update(model, mod_i, x, reward)
    if status != kernels.OK:
        return n_out, jn_n, False
    start, length = P[1][e], P[2][e]
    j = jn_n
    jn_i[j, J_ID_START], jn_i[j, J_ID_LEN], jn_i[j, J_MODEL] = start, length, model
    jn_i[j, J_OBSERVED], jn_i[j, J_DECIDED], jn_i[j, J_NOW] = observed_now, ints[e, DECIDED_MS], now
    jn_i[j, J_VERSION], jn_i[j, J_TSRC], jn_i[j, J_TOFF], jn_i[j, J_DIM] = version, src, off, dim
    jn_f[j, J_REWARD], jn_f[j, J_PROPENSITY] = reward, floats[e, PROPENSITY]
    jn_x[j, :dim] = x
    out[n_out, 0], out[n_out, 1], out[n_out, 2] = O_JOINED, j, rec
    # The id's bytes stay in the pending arena (removal does not reuse them before a reserve).
    arena = P[7]
    h = P[3][e]
    table_remove(P[0], P[2], P[3], P[4], P[5], P[6], P[8], e)
    a = ints[e, ARM]
    arm_refs[a] -= 1
    if arm_refs[a] == 0:
        table_remove(A[0], A[2], A[3], A[4], A[5], A[6], A[8], a)
    _remember(arena, start, length, h, observed_now, R, observed, st)
    cnt[C_UPDATES] += 1
    cnt[C_RECENT] += 1
    _bump(cnt, C_JOINED_OBSERVED if observed_now else C_JOINED_DEFAULT)
    return n_out + 1, jn_n + 1, True


@njit(cache=CACHE, inline="always")
def _remember(buf, start, length, h, flag, R, observed, st):
    """RecentIds.remember: the id keeps its place if remembered (its flag the new one), else it
    is the newest; then the oldest leave past the bound."""
    r = table_find(R[0], R[1], R[2], R[3], R[7], buf, start, length, h)
    if r < 0:
        r = table_add(R[0], R[1], R[2], R[3], R[4], R[5], R[6], R[7], R[8], buf, start, length, h)
    observed[r] = flag
    meta = R[8]
    while meta[COUNT] > st[S_RECENT_BOUND]:
        table_remove(R[0], R[2], R[3], R[4], R[5], R[6], meta, meta[OLDEST])


@njit(cache=CACHE, inline="always")
def _arm_ids_distinct(arm_buf, arm_start, arm_len, first, k, hashes):
    """No two of the context's ``k`` arm ids are the same bytes: compared by hash first
    (``hashes``: scratch of k or more), byte for byte only when two hashes agree."""
    for a in range(k):
        hashes[a] = fnv1a(arm_buf, arm_start[first + a], arm_len[first + a])
    for a in range(k):
        for b in range(a + 1, k):
            if hashes[a] != hashes[b]:
                continue
            la = arm_len[first + a]
            if la == arm_len[first + b]:
                same = True
                sa, sb = arm_start[first + a], arm_start[first + b]
                for c in range(la):
                    if arm_buf[sa + c] != arm_buf[sb + c]:
                        same = False
                        break
                if same:
                    return False
    return True


@njit(cache=CACHE)
def run_records(
    start, rec_i, rec_f, id_buf, feat_buf, arm_buf, arm_start, arm_len, digests,
    P, A, arm_refs, ints, floats, features, R, observed, E, run, heap, qmeta,
    mod_i, mod_f, st, cnt, out, act_i, act_f, jn_i, jn_f, jn_x, counts,
):  # fmt: skip
    """Apply the rules to records ``start``, ``start + 1``, ... (see the module's docstring);
    the index of the first not handled (``len(rec_i)``: none). ``counts`` holds the outputs,
    actions and joined records written so far, and is kept up to date; ``counts[3]`` is 1 when
    the record before the one returned was decided but what it left to close is the Python
    rules' (the windows it passes hold an early reward's deadline or an update that fails).
    ``digests[i]``: context i's ``event_draw.event_seed`` when its model explores."""
    n_out, act_n, jn_n = counts[0], counts[1], counts[2]
    n = rec_i.shape[0]
    scratch = np.empty(features.shape[1])
    saved = np.empty_like(cnt)
    # The decisions' scratch, once for the run: the largest context's K * d and K.
    k_max = max(1, rec_i[:, R_K].max()) if n else 1
    work = np.empty(k_max * max(1, rec_i[:, R_D].max()) if n else 1)
    scores = np.empty(k_max)
    hashes = np.empty(k_max, dtype=np.uint64)
    item = np.empty(4, dtype=np.int64)
    ahead, max_id = st[S_AHEAD_MS], st[S_MAX_ID_BYTES]
    i = start
    while i < n:
        r = rec_i[i]
        kind, ts, record_ms = r[R_KIND], r[R_TS], r[R_RECORD_MS]
        # The record alone (admission.record_refusal): refused by the Python rules.
        if kind == OTHER or r[R_ID_LEN] > max_id or r[R_KEY_LEN] > max_id:
            break
        if record_ms > 0 and ts > record_ms + ahead:
            break
        if kind == CONTEXT and (r[R_K] == 0 or r[R_D] == 0):
            break
        if kind == REWARD_RECORD and not np.isfinite(rec_f[i]):
            break
        # Event time, and the windows it closes.
        if ts > st[S_WATERMARK]:
            st[S_WATERMARK] = ts
        watermark = st[S_WATERMARK]
        n_out, jn_n, done = _close_due(
            watermark, r[R_SRC], r[R_OFF], P, A, arm_refs, ints, floats, features, R, observed,
            run, heap, qmeta, mod_i, mod_f, st, cnt, out, n_out, jn_i, jn_f, jn_x, jn_n,
            i, scratch, item,
        )  # fmt: skip
        if not done:
            break
        model = r[R_MODEL]
        if model < 0 or mod_i[model, M_FAST] == 0:
            break  # a model to make, or one this pass does not run
        id_start, id_len = r[R_ID_START], r[R_ID_LEN]
        h = fnv1a(id_buf, id_start, id_len)
        e = table_find(P[0], P[1], P[2], P[3], P[7], id_buf, id_start, id_len, h)
        if kind == CONTEXT:
            k, d = r[R_K], r[R_D]
            first = r[R_ARMS_START]
            if d != mod_i[model, M_DIM] or not _arm_ids_distinct(
                arm_buf, arm_start, arm_len, first, k, hashes
            ):
                break
            if e >= 0 or table_find(R[0], R[1], R[2], R[3], R[7], id_buf, id_start, id_len, h) >= 0:
                break  # decided before
            if table_find(E[0], E[1], E[2], E[3], E[7], id_buf, id_start, id_len, h) >= 0:
                break  # rewards wait for it
            fs = r[R_FEAT_START]
            arms = feat_buf[fs : fs + k * d].reshape((k, d))
            index, score, version = _best(model, mod_i, arms, work, scores)
            propensity, eps = 1.0, mod_f[model, M_EPS]
            if index >= 0 and eps > 0.0:
                # decision.choose's draw from all K scores, the event's digest its seed.
                index, score, propensity, _ = explore_kernel(scores[:k], eps, digests[i])
            if index < 0 or arm_len[first + index] > max_id:
                break
            slot = n_out  # the action's place: before the joined record of an eviction
            saved[:] = cnt  # counted in the rules' order, undone if the eviction fails
            _bump(cnt, C_ACTIONS)
            if P[8][COUNT] >= st[S_MAX_PENDING]:  # the oldest decision is joined with what it has
                _bump(cnt, C_EVICTED)
                n_out, jn_n, ok = _close(
                    P[8][OLDEST], ts, r[R_SRC], r[R_OFF], P, A, arm_refs, ints, floats, features,
                    R, observed, mod_i, mod_f, st, cnt, out, slot + 1, jn_i, jn_f, jn_x, jn_n,
                    i, scratch,
                )  # fmt: skip
                if not ok:
                    n_out = slot
                    cnt[:] = saved
                    break
            else:
                n_out = slot + 1
            a = act_n
            act_i[a, A_REC], act_i[a, A_ARM_INDEX], act_i[a, A_VERSION] = i, index, version
            act_f[a, 0], act_f[a, 1] = score, propensity
            out[slot, 0], out[slot, 1], out[slot, 2] = O_ACTION, a, i
            act_n += 1
            # Open it.
            e = table_add(P[0], P[1], P[2], P[3], P[4], P[5], P[6], P[7], P[8],
                          id_buf, id_start, id_len, h)  # fmt: skip
            as_, al = arm_start[first + index], arm_len[first + index]
            ah = fnv1a(arm_buf, as_, al)
            arm = table_find(A[0], A[1], A[2], A[3], A[7], arm_buf, as_, al, ah)
            if arm < 0:
                arm = table_add(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7], A[8],
                                arm_buf, as_, al, ah)  # fmt: skip
            arm_refs[arm] += 1
            deadline = ts + mod_i[model, M_WINDOW]
            st[S_SEQ] += 1
            seq = st[S_SEQ]
            ints[e, MODEL], ints[e, ARM], ints[e, ARM_INDEX], ints[e, VERSION] = (
                model, arm, index, version,
            )  # fmt: skip
            ints[e, DECIDED_MS], ints[e, DEADLINE_MS], ints[e, SEQ], ints[e, N_REWARDS] = (
                ts, deadline, seq, 0,
            )  # fmt: skip
            ints[e, TRIGGER_SOURCE], ints[e, TRIGGER_OFFSET], ints[e, DIM] = r[R_SRC], r[R_OFF], d
            floats[e, SCORE], floats[e, PROPENSITY], floats[e, REWARD] = score, propensity, 0.0
            features[e, :d] = arms[index]
            queue_push(run, heap, qmeta, deadline, seq, DECISION, e)
            # A context after its own window closed is joined at once.
            n_out, jn_n, done = _close_due(
                watermark, r[R_SRC], r[R_OFF], P, A, arm_refs, ints, floats, features, R,
                observed, run, heap, qmeta, mod_i, mod_f, st, cnt, out, n_out, jn_i,
                jn_f, jn_x, jn_n, i, scratch, item,
            )  # fmt: skip
            if not done:
                # The decision is made and open; what is left of this record is the closing of
                # windows, which the Python rules' advance does from here (counts[3] says so).
                counts[0], counts[1], counts[2], counts[3] = n_out, act_n, jn_n, 1
                return i + 1
        else:
            if e < 0 or ints[e, MODEL] != model:
                break  # early, late, duplicate, unknown or of another model
            value = rec_f[i]
            if not mod_f[model, M_LO] <= value <= mod_f[model, M_HI]:
                break
            agg = mod_i[model, M_AGG]
            saved[:] = cnt
            _bump(cnt, C_REWARDS)
            if agg == AGG_FIRST:
                had_n, had_r = ints[e, N_REWARDS], floats[e, REWARD]
                floats[e, REWARD], ints[e, N_REWARDS] = value, 1
                n_out, jn_n, ok = _close(
                    e, ts, r[R_SRC], r[R_OFF], P, A, arm_refs, ints, floats, features, R,
                    observed, mod_i, mod_f, st, cnt, out, n_out, jn_i, jn_f, jn_x, jn_n, i,
                    scratch,
                )  # fmt: skip
                if not ok:
                    ints[e, N_REWARDS], floats[e, REWARD] = had_n, had_r
                    cnt[:] = saved
                    break
            elif agg == AGG_LAST or ints[e, N_REWARDS] == 0:
                floats[e, REWARD] = value
                ints[e, N_REWARDS] += 1
            else:
                floats[e, REWARD] = floats[e, REWARD] + value
                ints[e, N_REWARDS] += 1
        i += 1
    counts[0], counts[1], counts[2], counts[3] = n_out, act_n, jn_n, 0
    return i
