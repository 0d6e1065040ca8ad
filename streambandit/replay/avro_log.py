"""Read a LoggedDecision Avro container file in compiled batches.

``fastavro.reader`` builds a dict per record and ``files._from_record`` then a decision from it,
checked by ``logged.validate`` in Python: together most of a replay's reading time. Here fastavro
only splits the file into blocks (and decompresses them); the blocks of a batch are laid end to
end and one numba pass (the worker's varint and string parsers, ``wire.batch_decode``) parses
their records into columns and applies every check of ``validate`` that an Avro record can fail.
Python then makes the strings (one decode per batch) and the decision objects; a decision's
features are a view of its batch's array, which lives as long as any decision of the batch.

A record the compiled pass does not accept (any failed check, a NUL in a string) goes through
``fastavro.schemaless_reader`` and ``files._from_record`` itself, so that its error, reason and
message are the per-record reader's own. A block the pass cannot parse is decoded record by
record by fastavro, which raises as ``fastavro.reader`` would.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator

import fastavro
import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE
from streambandit.replay.logged import MIN_PROPENSITY, LogError, LoggedDecision
from streambandit.wire.batch_decode import _block_count, _copy_nul_ended, _string, _varint

__all__ = ["fits_schema", "read_blocks"]

_BATCH_RECORDS = 4096  # records parsed per compiled call: amortizes the call, bounds the memory
_FAST, _SLOW, _BROKEN = 0, 1, 2  # per record: accepted here, per-record path, block unparsable
_DUP_CHECK_MAX = 64  # arms compared pairwise for duplicates here; more are left to a Python set


def _fields(schema: dict) -> list[tuple[str, str]]:
    """A record schema's fields as (name, type) in order; docs and defaults left out."""
    return [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in schema.get("fields", [])]


def fits_schema(writer: dict, ours: dict) -> bool:
    """Whether a file's writer schema has exactly our fields and types, in our order (the layout
    the compiled pass parses); a compatible schema of another layout is read by fastavro."""
    return writer.get("type") == "record" and _fields(writer) == _fields(ours)


@njit(cache=CACHE, nogil=True)
def _duplicates(arms, a, b, k, starts):
    """Whether the ``k`` NUL-ended strings of ``arms[a:b]`` hold one twice (``starts``: room for
    ``k + 1`` positions)."""
    n = 0
    starts[0] = a
    for j in range(a, b):
        if arms[j] == 0:
            n += 1
            starts[n] = j + 1
    for i in range(k):
        li = starts[i + 1] - starts[i]
        for j in range(i + 1, k):
            if starts[j + 1] - starts[j] != li:
                continue
            same = True
            for q in range(li):
                if arms[starts[i] + q] != arms[starts[j] + q]:
                    same = False
                    break
            if same:
                return True
    return False


@njit(cache=CACHE, nogil=True)
def _parse(buf, block_ends, block_counts, min_p, st, col_i, col_f, ids, keys, arms, feats_b):
    """Parse the records of blocks laid end to end in ``buf`` (block ``b`` ends at
    ``block_ends[b]`` and holds ``block_counts[b]`` records).

    Per record ``r``: ``st[r]`` is _FAST, _SLOW or _BROKEN (this record and the rest of its block
    could not be parsed); ``col_i[r]`` = (record start, end, timestamp, K, d, action, version,
    feature offset in float64s); ``col_f[r]`` = (propensity, reward) as raw bytes (16 of them).
    A fast record's event id, model key and arm ids are appended to ``ids``, ``keys`` and
    ``arms``, each followed by a NUL, and its features to ``feats_b`` (the bytes of a float64
    array). Returns (records, bytes used of ids, keys, arms, float64s used of feats_b)."""
    starts = np.empty(_DUP_CHECK_MAX + 1, np.int64)
    r = 0
    i_at = 0
    k_at = 0
    a_at = 0
    f_at = 0
    pos = 0
    for blk in range(block_ends.shape[0]):
        end = block_ends[blk]
        broken = False
        for _ in range(block_counts[blk]):
            st[r] = _BROKEN
            if broken:
                r += 1
                continue
            col_i[r, 0] = pos
            ok = True  # every check of validate() passes
            ts, pos = _varint(buf, pos, end)
            if pos < 0:
                broken = True
                r += 1
                continue
            ea, eb = _string(buf, pos, end)
            if eb < 0:
                broken = True
                r += 1
                continue
            ka, kb = _string(buf, eb, end)
            if kb < 0:
                broken = True
                r += 1
                continue
            ok = ok and eb > ea and kb > ka
            pos = kb
            i0, k0, a0 = i_at, k_at, a_at
            if ok:
                i_at = _copy_nul_ended(buf, ea, eb, ids, i_at)
                k_at = _copy_nul_ended(buf, ka, kb, keys, k_at)
                ok = i_at >= 0 and k_at >= 0
            k = 0
            while True:  # arm_ids: Avro array blocks (count, [byte size if count < 0], items)
                count, pos = _block_count(buf, pos, end)
                if pos < 0 or count == 0:
                    break
                for _ in range(count):
                    a, b = _string(buf, pos, end)
                    if b < 0:
                        pos = -1
                        break
                    if ok:
                        a_at = _copy_nul_ended(buf, a, b, arms, a_at)
                        ok = a_at >= 0
                    k += 1
                    pos = b
                if pos < 0:
                    break
            if pos < 0:
                broken = True
                r += 1
                continue
            col_i[r, 8] = 0
            if ok and k <= _DUP_CHECK_MAX:
                ok = not _duplicates(arms, a0, a_at, k, starts)
            elif ok:
                col_i[r, 8] = 1  # Python checks the arm ids for duplicates
            dim, pos = _varint(buf, pos, end)
            if pos < 0:
                broken = True
                r += 1
                continue
            fa, fb = _string(buf, pos, end)
            if fb < 0:
                broken = True
                r += 1
                continue
            ok = ok and k >= 1 and dim >= 1 and fb - fa == 8 * k * dim
            if ok:
                feats_b[8 * f_at : 8 * f_at + fb - fa] = buf[fa:fb]
            action, pos = _varint(buf, fb, end)
            if pos < 0:
                broken = True
                r += 1
                continue
            union, pos = _varint(buf, pos, end)
            if pos < 0 or not (union == 0 or union == 1):
                broken = True
                r += 1
                continue
            if union == 1:
                if pos + 8 > end:
                    broken = True
                    r += 1
                    continue
                for j in range(8):
                    col_f[r, j] = buf[pos + j]
                pos += 8
            if pos + 8 > end:
                broken = True
                r += 1
                continue
            for j in range(8):
                col_f[r, 8 + j] = buf[pos + j]
            pos += 8
            version, pos = _varint(buf, pos, end)
            if pos < 0:
                broken = True
                r += 1
                continue
            col_i[r, 1] = pos
            pv = col_f[r, 0:8].copy().view(np.float64)[0]
            rv = col_f[r, 8:16].copy().view(np.float64)[0]
            ok = (
                ok
                and union == 1
                and 0 <= action < k
                and min_p <= pv <= 1.0  # NaN fails
                and np.isfinite(rv)
            )
            if ok:
                x = feats_b[8 * f_at : 8 * (f_at + k * dim)].view(np.float64)
                for j in range(k * dim):
                    if not np.isfinite(x[j]):
                        ok = False
                        break
            col_i[r, 2] = ts
            col_i[r, 3] = k
            col_i[r, 4] = dim
            col_i[r, 5] = action
            col_i[r, 6] = version
            col_i[r, 7] = f_at
            if ok:
                st[r] = _FAST
                f_at += k * dim
            else:
                st[r] = _SLOW
                i_at, k_at, a_at = i0, k0, a0
            r += 1
        if not broken and pos != end:  # bytes left over: the block's count is wrong
            broken = True
        if broken:
            for q in range(r - block_counts[blk], r):
                st[q] = _BROKEN
        pos = end
    return r, i_at, k_at, a_at, f_at


def _same_shape(feats: np.ndarray, st: np.ndarray, col_i: np.ndarray) -> np.ndarray | None:
    """The fast records' features as one (records, K, d) array when they all have the same K and
    d (a record's are then a view of one index, cheaper than a slice and a reshape), else None."""
    fast = st == _FAST
    n = int(fast.sum())
    if not n:
        return None
    k, d = col_i[fast, 3], col_i[fast, 4]
    if k.min() != k.max() or d.min() != d.max():
        return None
    return feats[: n * int(k[0]) * int(d[0])].reshape(n, int(k[0]), int(d[0]))


def _split(buf: np.ndarray) -> list[str] | None:
    """The NUL-ended strings of ``buf``; None if they are not UTF-8."""
    try:
        return buf.tobytes().decode().split("\x00")[:-1]
    except UnicodeDecodeError:
        return None


def read_blocks(
    reader: fastavro.block_reader,
    where: str,
    counts: dict | None,
    kept: Callable[[Callable[[], LoggedDecision]], LoggedDecision | None],
    from_record: Callable[[dict, str], LoggedDecision],
) -> Iterator[LoggedDecision]:
    """The decisions of a file whose schema :func:`fits_schema`, in file order, records numbered
    from 1, counted in ``counts`` as ``files.read_avro`` says. ``kept(parse)`` counts a record
    the per-record path reads (``files._kept``); ``from_record`` is that path's
    (``files._from_record``)."""
    batch = _Batches(reader.writer_schema, where, kept, from_record)
    blocks: list[tuple[bytes, int]] = []
    pending = 0
    it = iter(reader)
    try:
        while True:
            try:
                block = next(it)
            except StopIteration:
                block = None
            except Exception as exc:
                yield from batch.decisions(blocks)
                raise LogError(
                    f"{where}: corrupt data after record {batch.done} ({exc!r})", "file"
                ) from None
            if block is not None:
                blocks.append((block.bytes_.getvalue(), block.num_records))
                pending += block.num_records
                if pending < _BATCH_RECORDS:
                    continue
            yield from batch.decisions(blocks)
            blocks, pending = [], 0
            if block is None:
                return
    finally:
        if counts is not None and batch.read:
            counts["read"] = counts.get("read", 0) + batch.read


class _Batches:
    """The state kept from batch to batch: records done, fast decisions read."""

    def __init__(self, schema: dict, where: str, kept, from_record) -> None:
        self.schema, self.where, self.kept, self.from_record = schema, where, kept, from_record
        self.done = 0  # records of the file handled (yielded, refused, or skipped)
        self.read = 0  # decisions of the compiled path yielded (the others count in kept())

    def decisions(self, blocks: list[tuple[bytes, int]]) -> Iterator[LoggedDecision]:
        if not blocks:
            return
        where = self.where
        raw = b"".join(b for b, _ in blocks)
        buf = np.frombuffer(raw, dtype=np.uint8)
        n_of = np.array([c for _, c in blocks], dtype=np.int64)
        ends = np.cumsum(np.array([len(b) for b, _ in blocks], dtype=np.int64))
        n = int(n_of.sum())
        size = len(raw) + n
        st = np.empty(n, np.int8)
        col_i = np.zeros((n, 9), np.int64)
        col_f = np.zeros((n, 16), np.uint8)
        ids, keys, arms = (np.empty(size, np.uint8) for _ in range(3))
        feats = np.empty(len(raw) // 8 + 1, np.float64)
        _, i_used, k_used, a_used, _ = _parse(
            buf, ends, n_of, MIN_PROPENSITY, st, col_i, col_f, ids, keys, arms, feats.view(np.uint8)
        )
        first_of_block = (np.cumsum(n_of) - n_of).tolist()
        block_of = np.repeat(np.arange(len(blocks)), n_of).tolist()
        strings = [_split(ids[:i_used]), _split(keys[:k_used]), _split(arms[:a_used])]
        if any(x is None for x in strings):
            st[st == _FAST] = _SLOW  # not UTF-8 somewhere: each record is decoded on its own
        event_ids, model_keys, arm_ids = strings
        pr = col_f.view(np.float64)
        columns = zip(
            st.tolist(),
            col_i[:, 2].tolist(),
            col_i[:, 3].tolist(),
            col_i[:, 4].tolist(),
            col_i[:, 5].tolist(),
            col_i[:, 6].tolist(),
            col_i[:, 7].tolist(),
            pr[:, 0].tolist(),
            pr[:, 1].tolist(),
            col_i[:, 8].tolist(),
        )
        feats3 = _same_shape(feats, st, col_i)
        fast = 0  # index of the next fast record's strings
        arm_at = 0
        base = self.done
        for r, (s, ts, k, dim, action, version, f_at, p, rew, check) in enumerate(columns):
            if s == _FAST:
                arms_r = tuple(arm_ids[arm_at : arm_at + k])
                arm_at += k
                x = (
                    feats3[fast]
                    if feats3 is not None
                    else feats[f_at : f_at + k * dim].reshape(k, dim)
                )
                e_id, m_key = event_ids[fast], model_keys[fast]
                fast += 1
                if not check or len(set(arms_r)) == k:
                    self.done = base + r + 1
                    self.read += 1
                    yield LoggedDecision(
                        ts,
                        e_id,
                        m_key,
                        arms_r,
                        x,
                        action,
                        p,
                        rew,
                        version,
                        f"{where} record {base + r + 1}",
                    )
                    continue
                s = _SLOW  # duplicate arm ids: validate() words the error
            self.done = base + r + 1
            if s == _SLOW:
                d = self._one(raw[int(col_i[r, 0]) : int(col_i[r, 1])], base + r + 1)
                if d is not None:
                    yield d
            elif r == first_of_block[block_of[r]]:  # _BROKEN: the whole block by fastavro
                yield from self._block(blocks[block_of[r]], base + r)
        self.done = base + n

    def _one(self, record: bytes, i: int) -> LoggedDecision | None:
        try:
            rec = fastavro.schemaless_reader(io.BytesIO(record), self.schema, None)
        except Exception as exc:
            raise LogError(
                f"{self.where}: corrupt data after record {i - 1} ({exc!r})", "file"
            ) from None
        at = f"{self.where} record {i}"
        return self.kept(lambda: self.from_record(rec, at))

    def _block(self, block: tuple[bytes, int], first: int) -> Iterator[LoggedDecision]:
        """A block the compiled pass could not parse, decoded by fastavro, which raises where
        ``fastavro.reader`` would."""
        data, count = block
        f = io.BytesIO(data)
        for j in range(count):
            try:
                rec = fastavro.schemaless_reader(f, self.schema, None)
            except Exception as exc:
                raise LogError(
                    f"{self.where}: corrupt data after record {first + j} ({exc!r})", "file"
                ) from None
            at = f"{self.where} record {first + j + 1}"
            d = self.kept(lambda: self.from_record(rec, at))
            if d is not None:
                yield d
