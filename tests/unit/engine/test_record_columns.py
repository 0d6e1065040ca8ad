"""engine/record_columns.py: a run gathered from the decoder's columns (RecordColumns.gather) is
the run the records give, to the engine's compiled pass: the same outputs, record for record and
byte for byte, and the same snapshot, with runs that span several poll batches."""

import numpy as np
import pytest

from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.compiled_pass import CONTEXT, OTHER, R_ID_LEN, R_ID_START, REWARD_RECORD
from streambandit.engine.partition import PartitionEngine
from streambandit.engine.record_columns import META_FIELDS, RecordColumns
from streambandit.wire import Context, DecodeError, InputRef, encode
from streambandit.wire.batch_decode import DecodedColumns, decode_batch

from .test_array_partition import as_bytes, snapshot_bytes
from .test_compiled_pass import config, python_outputs, records
from .test_engine_recovery import LIMITS


def encoded_stream(seed: int) -> list[tuple[bytes, InputRef]]:
    """test_compiled_pass's hostile stream as the bytes a worker fetches, each with its
    InputRef (a NaN reward's bytes, which do not decode, left out: the engine takes records)."""
    out = []
    for ev, src in records(seed):
        value = encode(ev)
        if not isinstance(decode_batch([value])[0], DecodeError):
            out.append((value, src))
    return out


def in_batches(stream, rng) -> list[tuple[DecodedColumns, list, int]]:
    """The stream's records spread over two inputs at random, each input cut into poll batches
    at random and each batch decoded into columns; per record, in stream order, its (batch,
    refs, row): neighbours come from different batches, as the merge releases them."""
    lanes = rng.integers(0, 2, len(stream))
    flat: list = [None] * len(stream)
    for lane in (0, 1):
        idx = np.flatnonzero(lanes == lane).tolist()
        at = 0
        while at < len(idx):
            take = idx[at : at + int(rng.integers(1, 90))]
            part = [stream[t] for t in take]
            cols = DecodedColumns([v for v, _ in part], [ref.key for _, ref in part])
            refs = [ref for _, ref in part]
            for row, t in enumerate(take):
                flat[t] = (cols, refs, row)
            at += len(take)
    return flat


def runs(flat, rng):
    """Runs of (batch, refs, row) in stream order, of random lengths (some short enough that
    all their contexts are in one batch)."""
    at = 0
    while at < len(flat):
        n = int(rng.integers(1, 150) if rng.random() < 0.7 else rng.integers(1, 6))
        yield flat[at : at + n]
        at += n


def gathered(run) -> tuple[RecordColumns, list]:
    """The run's columns and its (record, InputRef) pairs; a record is the pass's when it
    decoded by the fast layouts (its kind), another's otherwise."""
    parts: dict[int, tuple] = {}
    events = []
    for j, (b, refs, i) in enumerate(run):
        ref = refs[i]
        fast = int(b.fast[i])
        kind = CONTEXT if fast == 1 else REWARD_RECORD if fast == 2 else OTHER
        rows, at, meta = parts.setdefault(id(b), (b, [], [], []))[1:]
        rows.append(i)
        at.append(j)
        meta.append([kind, ref.source, ref.offset, ref.timestamp_ms])
        events.append((b.record(i), ref))
    cols = RecordColumns.gather(
        len(run),
        [
            (
                b,
                np.array(rows, np.int64),
                np.array(at, np.int64),
                np.array(meta, np.int64).reshape(-1, META_FIELDS),
            )
            for b, rows, at, meta in parts.values()
        ],
    )
    return cols, events


@pytest.mark.parametrize("seed,max_pending", [(0, 30), (1, 5), (3, 100_000)])
def test_runs_gathered_from_decoded_batches_give_the_python_engines_outputs(seed, max_pending):
    cfg = config(0.0)
    limits = {**LIMITS, "max_pending": max_pending, "max_id_bytes": 64, "max_models": 8,
              "max_event_time_ahead_ms": 60_000}  # fmt: skip
    python, arrays = PartitionEngine(cfg, **limits), ArrayPartitionEngine(cfg, **limits)
    rng = np.random.default_rng(seed)
    stream = encoded_stream(seed)
    multi = compiled = 0
    for run in runs(in_batches(stream, rng), rng):
        cols, events = gathered(run)
        # Runs whose batches interleave: more changes of batch than batches less one.
        changes = sum(a[0] is not b[0] for a, b in zip(run, run[1:]))
        multi += changes > len({id(b) for b, _, _ in run}) - 1
        want = [as_bytes(python_outputs(python, ev, src)) for ev, src in events]
        per_record = [[] for _ in events]
        arrays.process_columns(cols, events, per_record)
        assert [as_bytes(p) for p in per_record] == want
        assert snapshot_bytes(arrays) == snapshot_bytes(python)
        compiled += arrays.counters["actions"]
    assert multi > 0 and compiled > 0


def test_a_gathered_run_holds_each_records_own_bytes():
    rng = np.random.default_rng(7)
    stream = encoded_stream(2)
    shared = copied = 0  # runs whose features are read in their batch's buffer, or copied
    for run in runs(in_batches(stream, rng), rng):
        cols, events = gathered(run)
        reference = RecordColumns(events)
        in_batch = any(cols.feat_buf is b.feats for b, _, _ in run)
        shared += in_batch
        copied += not in_batch and any(isinstance(ev, Context) for ev, _ in events)
        n = len(events)
        for j, (ev, _) in enumerate(events):
            r = cols.rec_i[j]
            if r[0] == OTHER:
                continue
            a, m = int(r[R_ID_START]), int(r[R_ID_LEN])
            assert cols.id_buf[a : a + m].tobytes() == ev.event_id.encode()
            assert cols.key_of(j) == ev.model_key
            if isinstance(ev, Context):
                k, d = ev.features.shape
                f = int(r[9])
                assert cols.feat_buf[f : f + k * d].tobytes() == ev.features.tobytes()
                first = int(r[12])
                got = [
                    cols.arm_buf[s : s + ln].tobytes().decode()
                    for s, ln in zip(
                        cols.arm_start[first : first + k], cols.arm_len[first : first + k]
                    )
                ]
                assert tuple(got) == ev.arm_ids
        # What a caller reserves room by: as the records count it.
        for name in ("contexts_after", "id_bytes_after", "arm_bytes_after"):
            assert (
                getattr(cols, name)[: n + 1].tolist() == getattr(reference, name)[: n + 1].tolist()
            ), name
    assert shared > 0 and copied > 0
