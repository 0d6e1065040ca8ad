"""CSV logs read column by column: Arrow's CSV reader, and the inline features parsed in bulk.

A CSV log's cost is its features: d = 20 features of K = 10 arms are 200 numbers of up to 17
digits per row, split and converted one by one by Python's ``csv`` module, ``str.split`` and
``float`` (``python -m bench.replay``, its CSV rows, measures both readers). Here:

- Arrow's CSV reader (``pyarrow.csv``, optional: ``pip install 'streambandit[arrow]'``) splits
  the file into rows and fields in compiled code, block by block, every column read as text.
- One compiled pass over a block's ``features`` column (:func:`scan_inline`) checks each row's
  shape (K arms of d numbers each) and copies its number tokens into one buffer, and Arrow
  converts them all to float64 in one call.
- Each row then becomes a :class:`LoggedDecision` through the same checks as the ``csv``
  module's rows (``files._parse_row``), with its features already parsed.

The ``csv`` module's reader stays the definition of the format, and this one hands over to it
wherever the two could differ, so that a file gives the same decisions, errors, skip counts and
row/line names either way (tests/unit/replay/test_csv_columnar.py compares them on every kind of
row):

- A row whose features are not plain ASCII numbers (``inf``, ``1_000``, a non-ASCII space) or
  whose shape is wrong is parsed by ``files._parse_inline`` from its text, which raises the same
  error. Over the characters ``0-9 . e E + -``, Arrow's conversion accepts exactly the strings
  Python's ``float`` accepts and gives the same value, correctly rounded, for each.
- A block Arrow cannot parse (a row with the wrong number of fields, a blank line, text that is
  not UTF-8), or with a field holding a quote or a line break (where ``skipinitialspace`` or a
  quoted newline would change the fields or the line numbers) ends this reader: it returns the
  number of rows it gave, and ``read_csv`` goes on from the next row with the ``csv`` module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

try:  # the optional columnar reader; without it read_csv uses the csv module alone
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv
except ImportError:  # pragma: no cover - the dev install has pyarrow
    pa = None

__all__ = ["AVAILABLE", "Row", "read_rows", "scan_inline"]

AVAILABLE = pa is not None

# Arrow's blocks: large enough that the per-block calls vanish, small enough that a reader
# handing over to the csv module mid-file has not read far ahead.
_BLOCK_BYTES = 1 << 22

# Byte classes of the inline features' scan.
_OTHER, _DIGITS, _SPACE, _BAR, _HANDOVER = 0, 1, 2, 3, 4
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[np.frombuffer(b"0123456789.eE+-", dtype=np.uint8)] = _DIGITS
# str.split()'s whitespace among ASCII characters (the line breaks are classed apart)
_CLASS[np.frombuffer(b" \t\x0b\x0c\x1c\x1d\x1e\x1f", dtype=np.uint8)] = _SPACE
_CLASS[ord("|")] = _BAR
# a line break, or a quote the csv module's skipinitialspace would read otherwise than Arrow
_CLASS[np.frombuffer(b'\r\n"', dtype=np.uint8)] = _HANDOVER

# scan_inline's row status
ROW_PARSED = 0  # the row's numbers are in the token buffer
ROW_BY_TEXT = 1  # parse the row from its text (files._parse_inline), which raises if it must
ROW_HANDOVER = 2  # a line break or a quote in the field: the csv module must read this row


@njit(cache=CACHE, nogil=True)
def scan_inline(data, offsets, classes, out, out_offsets, arms, dims, status):  # pragma: no cover
    """Split each row's inline features ``"x x x | x x x | ..."`` (row i is
    ``data[offsets[i]:offsets[i+1]]``) into arms at ``|`` and numbers at whitespace, as
    ``files._parse_inline`` does with ``str.split``. A row of ``arms[i]`` arms of ``dims[i] > 0``
    numbers each, every byte a number character, whitespace or ``|``, gets ``status[i] =
    ROW_PARSED`` and its numbers appended to ``out`` (number j is ``out[out_offsets[j]:
    out_offsets[j+1]]``); any other row is left to the text parser. Returns the number of
    numbers written, or -1 (nothing done) when a buffer is too small for ``data``."""
    n = offsets.shape[0] - 1
    # The writes below are unchecked (numba checks no bounds): buffers smaller than a number per
    # byte of data would be written past their end, so such a call is refused here.
    if (
        out.shape[0] < data.shape[0]
        or out_offsets.shape[0] < data.shape[0] + 2
        or min(arms.shape[0], dims.shape[0], status.shape[0]) < n
        or (n > 0 and (offsets[0] < 0 or offsets[n] > data.shape[0]))
    ):
        return -1
    ntok = 0
    pos = 0
    out_offsets[0] = 0
    for i in range(n):
        start, end = offsets[i], offsets[i + 1]
        row_tok, row_pos = ntok, pos
        k, d, in_arm, in_tok = 1, -1, 0, False
        state = ROW_PARSED
        nonempty = False
        for b in range(start, end):
            c = classes[data[b]]
            if c == 1:  # _DIGITS
                if not in_tok:
                    in_tok = True
                    in_arm += 1
                    nonempty = True
                out[pos] = data[b]
                pos += 1
            else:
                if in_tok:
                    in_tok = False
                    ntok += 1
                    out_offsets[ntok] = pos
                if c == 2:  # _SPACE
                    continue
                if c == 3:  # _BAR: an arm ends; every arm has the first arm's count
                    if in_arm == 0 or (d >= 0 and in_arm != d):
                        state = ROW_BY_TEXT
                    d = in_arm
                    in_arm = 0
                    k += 1
                    nonempty = True
                elif c == 4:  # _HANDOVER
                    state = ROW_HANDOVER
                    break
                else:
                    state = ROW_BY_TEXT
        if in_tok and state != ROW_HANDOVER:
            ntok += 1
            out_offsets[ntok] = pos
        if state == ROW_PARSED and (in_arm == 0 or (d >= 0 and in_arm != d) or not nonempty):
            state = ROW_BY_TEXT
        if state != ROW_PARSED:
            ntok, pos = row_tok, row_pos  # drop what the row wrote
        arms[i] = k
        dims[i] = in_arm if d < 0 else d
        status[i] = state
    return ntok


@njit(cache=CACHE, nogil=True)
def _holds_quote_or_break(data):  # pragma: no cover
    for b in range(data.shape[0]):
        c = data[b]
        if c == 34 or c == 10 or c == 13:  # '"', '\n', '\r'
            return True
    return False


def _unsafe(col, field_limit: int, scanned: bool) -> bool:
    """A column the csv module may read otherwise: a field over the csv module's limit, or a
    quote or line break in a field (the features' own scan finds those in its column)."""
    offsets, data = _string_buffers(col)
    if len(col) and int(np.max(offsets[1:] - offsets[:-1])) > field_limit:
        return True
    return not scanned and _holds_quote_or_break(data)


def _row_lengths(batch) -> np.ndarray:
    """Each row's bytes over its fields."""
    total = np.zeros(batch.num_rows, dtype=np.int64)
    for col in batch.columns:
        offsets, _ = _string_buffers(col)
        total += offsets[1:] - offsets[:-1]
    return total


def _string_buffers(col) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (rebased to its slice) and bytes, without copying."""
    _, off_buf, data_buf = col.buffers()
    offsets = np.frombuffer(off_buf, dtype=np.int32)[col.offset : col.offset + len(col) + 1]
    data = (
        np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    )
    return offsets, data


class Row:
    """One row of a block: its fields (``features`` left out), and its inline features parsed,
    of as many arms as its ``arm_ids``, or their text for the text parser (both None: the file
    has no ``features`` column)."""

    __slots__ = ("fields", "features", "features_text")

    def __init__(self, fields: dict, features: np.ndarray | None, features_text: str | None):
        self.fields, self.features, self.features_text = fields, features, features_text


def _features(col, n: int):
    """Parse a block's ``features`` column: (status, arms, values per row as a list of
    arrays or None)."""
    offsets, data = _string_buffers(col)
    arms = np.empty(n, dtype=np.int64)
    dims = np.empty(n, dtype=np.int64)
    status = np.empty(n, dtype=np.uint8)
    out = np.empty(max(int(data.shape[0]), 1), dtype=np.uint8)
    out_offsets = np.empty(int(data.shape[0]) + 2, dtype=np.int32)  # a number per byte at most
    ntok = scan_inline(data, offsets, _CLASS, out, out_offsets, arms, dims, status)
    assert ntok >= 0  # the buffers above are sized for data
    tokens = pa.Array.from_buffers(
        pa.string(), ntok, [None, pa.py_buffer(out_offsets[: ntok + 1]), pa.py_buffer(out)]
    )
    try:
        values = pc.cast(tokens, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:  # a token such as "1e" or "+-": every row of the block by its text
        values = None
        status[status == ROW_PARSED] = ROW_BY_TEXT
    return status, arms, dims, values


def read_rows(
    path: str | os.PathLike,
    names: list[str],
    field_limit: int,
    share=None,
    share_every: int = 4096,
) -> Iterator[Row]:
    """The rows after the header (its one line skipped; ``names`` are the stripped header names,
    one per column) as :class:`Row`. Returns (the generator's value) None at the end of the
    file, or the number of rows given when the rest needs the csv module (module docstring).
    A block with a field of over ``field_limit`` bytes is the csv module's too: it refuses a
    field over its limit of characters. ``share`` (a files.ReadShare) follows the bytes read,
    every ``share_every`` rows, spread over each block's rows."""
    given = 0
    nfields = len(names)
    opts = dict(
        read_options=pa_csv.ReadOptions(
            skip_rows=1,
            column_names=[f"c{j}" for j in range(nfields)],
            block_size=_BLOCK_BYTES,
        ),
        parse_options=pa_csv.ParseOptions(newlines_in_values=False, ignore_empty_lines=False),
        convert_options=pa_csv.ConvertOptions(
            column_types={f"c{j}": pa.string() for j in range(nfields)},
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        ),
    )
    source = pa.OSFile(os.fspath(path), "rb")
    try:
        try:
            reader = pa_csv.open_csv(source, **opts)
        except (pa.ArrowInvalid, UnicodeDecodeError):
            return given
        feat = names.index("features") if "features" in names else -1
        others = [j for j in range(nfields) if j != feat]
        other_names = [names[j] for j in others]
        read_before = 0  # bytes read before this block
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return None
            except (pa.ArrowInvalid, UnicodeDecodeError):
                return given
            n = batch.num_rows
            cols = [batch.column(j) for j in others]
            if any(_unsafe(c, field_limit, j == feat) for j, c in enumerate(batch.columns)):
                return given
            # Arrow reads a blank line, which the csv module skips, as a row of empty fields
            if not _row_lengths(batch).all():
                return given
            if feat >= 0:
                fcol = batch.column(feat)
                status, arms, dims, values = _features(fcol, n)
                if (status == ROW_HANDOVER).any():
                    return given
            values_of = [c.to_pylist() for c in cols]
            start = 0
            read_to = source.tell() if share is not None else 0
            for i, fields in enumerate(zip(*values_of, strict=True)):
                if share is not None and i % share_every == 0:
                    share.done = read_before + (read_to - read_before) * i // n
                row = dict(zip(other_names, fields, strict=True))
                features = text = None
                if feat >= 0:
                    if status[i] == ROW_PARSED:
                        k, m = int(arms[i]), int(arms[i] * dims[i])
                        features = values[start : start + m].reshape(k, -1)
                        start += m
                    # a row whose arms do not match its arm_ids: the text parser says how
                    if features is None or k != row["arm_ids"].count("|") + 1:
                        features, text = None, fcol[i].as_py()
                yield Row(row, features, text)
                given += 1
            if share is not None:
                share.done = read_before = read_to
    finally:
        source.close()
