"""The columnar CSV reader against the csv module's, its definition: the same decisions (to the
bit), the same errors and skip counts, the same row and line names, on every kind of row and
wherever it hands over to the csv module mid-file."""

from __future__ import annotations

import dataclasses
import itertools
import random

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")  # the dev install has it; the reader is optional

from streambandit.replay import csv_columnar  # noqa: E402
from streambandit.replay.files import read_csv  # noqa: E402
from streambandit.replay.logged import LogError  # noqa: E402

HEADER = "timestamp_ms,event_id,model_key,arm_ids,action,propensity,reward,features"


def _fields(d) -> tuple:
    out = []
    for f in dataclasses.fields(d):
        v = getattr(d, f.name)
        if isinstance(v, np.ndarray):
            v = (v.dtype.str, v.shape, v.tobytes())
        elif isinstance(v, float):
            v = np.float64(v).tobytes()
        elif f.name == "external":
            v = tuple((name, p.tobytes()) for name, p in v)
        out.append(v)
    return tuple(out)


def _read(path, columnar: bool, **kw):
    """Every decision's fields (where included) and the counts, or the error's reason and text."""
    counts: dict[str, int] = {}
    try:
        ds = [_fields(d) for d in read_csv(path, columnar=columnar, counts=counts, **kw)]
    except LogError as err:
        return ("error", err.reason, str(err))
    return ds, counts


def _agree(path, **kw):
    """Both readers' results, strict and with skip_bad, which must be equal: (strict, skipping)."""
    out = []
    for skip_bad in (False, True):
        a = _read(path, True, skip_bad=skip_bad, **kw)
        b = _read(path, False, skip_bad=skip_bad, **kw)
        assert a == b
        out.append(b)
    return tuple(out)


def _row(i: int, rng: random.Random, k: int = 3, d: int = 2) -> str:
    arms = "|".join(f"a{j}" for j in range(k))
    feats = "|".join(
        " ".join(repr(rng.uniform(-1, 1) * 10 ** rng.randint(-5, 5)) for _ in range(d))
        for _ in range(k)
    )
    return f"{1000 + i},e{i},m{i % 2},{arms},a{rng.randrange(k)},{rng.uniform(0.01, 1)},{rng.random()},{feats}"


# Rows the columnar reader parses itself, or from their text, or hands over to the csv module.
ODD_FEATURES = [
    "1 2|3 4|5 6",  # plain
    "  1   2 | 3\t4|5 6  ",  # runs of whitespace, a tab
    "1e5 -2.5E-3|+.5 5.|0 -0",  # every number form of the alphabet
    "1 2|3 4",  # two arms for three ids
    "1 2|3 4|5",  # an arm short
    "1 2|3 4|5 6 7",  # an arm long
    "1 2||5 6",  # an empty arm
    "|",  # nothing
    "   ",  # blank: the catalog path, and no catalog
    "1 2|3 4|5 inf",  # non-finite
    "1 2|3 4|5 nan(1)",  # Arrow would read NaN, Python refuses
    "1 2|3 4|5 1_0",  # Python reads 10, Arrow refuses
    "1 2|3 4|5 1e",  # neither reads it
    "1 2|3 4|5 0x10",
    "1 2|3\x1c4|5 6",  # a separator str.split knows and Arrow does not
    "1 2|3\u00a04|5 6",  # a non-ASCII space
    "1 2|3 4|5 ٣",  # a non-ASCII digit
]


@pytest.mark.parametrize("features", ODD_FEATURES)
def test_every_kind_of_inline_features_reads_the_same(tmp_path, features):
    rng = random.Random(1)
    rows = [_row(i, rng) for i in range(3)]
    rows.insert(1, f'2000,odd,m0,a0|a1|a2,a1,0.5,1,"{features}"')
    p = tmp_path / "log.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    _agree(p)


BAD_FIELDS = [
    "soon,e,m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6",  # timestamp
    "1,,m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6",  # empty event id
    "1,e,m,a0|a1|a2,zz,0.5,1,1 2|3 4|5 6",  # action not an arm
    "1,e,m,a0|a0|a2,a0,0.5,1,1 2|3 4|5 6",  # duplicate arms
    "1,e,m,a0||a2,a0,0.5,1,1 2|3 4|5 6",  # empty arm id
    "1,e,m,a0|a1|a2,a1,,1,1 2|3 4|5 6",  # no propensity
    "1,e,m,a0|a1|a2,a1,1.5,1,1 2|3 4|5 6",
    "1,e,m,a0|a1|a2,a1,0.5,lots,1 2|3 4|5 6",
    "1,e,m,a0|a1|a2,a1,0.5,1",  # a field short: Arrow refuses the block, the csv module reads it
    "1,e,m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6,extra",
    "",  # a blank line: the csv module skips it, Arrow would too, and the lines would shift
    '1, "e,x",m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6',  # skipinitialspace before a quote
    '1,"e\nx",m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6',  # a line break in a field
    '1,e,m,a0|a1|a2,a1,0.5,1,"1 2\n|3 4|5 6"',  # ... in the features
    '1,e,m,a0|a1|a2,a1,0.5,1, "1 2|3 4|5 6"',  # a quote after a space in the features
    '1,"e""x",m,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6',  # a doubled quote
]


@pytest.mark.parametrize("bad", BAD_FIELDS)
@pytest.mark.parametrize("block_bytes", [64, 1 << 22])
def test_bad_rows_and_hand_overs_read_the_same(tmp_path, monkeypatch, bad, block_bytes):
    # Small blocks: the hand-over comes mid-file, after rows the columnar reader gave.
    monkeypatch.setattr(csv_columnar, "_BLOCK_BYTES", block_bytes)
    rng = random.Random(2)
    rows = [_row(i, rng) for i in range(40)]
    rows.insert(25, bad)
    p = tmp_path / "log.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    _agree(p)


def test_the_columnar_reader_gives_the_rows_before_a_hand_over_and_the_csv_module_the_rest(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(csv_columnar, "_BLOCK_BYTES", 256)
    rng = random.Random(3)
    rows = [_row(i, rng) for i in range(60)]
    rows[45] = '1045, "e45",m1,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6'
    p = tmp_path / "log.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    columnar_rows = csv_columnar.read_rows(p, HEADER.split(","), 2**31 - 1)
    given = []
    with pytest.raises(StopIteration) as stop:
        while True:
            given.append(next(columnar_rows))
    assert 0 < stop.value.value == len(given) < 45  # whole blocks before the quote
    ds = _agree(p)[0][0]
    assert len(ds) == 60 and ds[45][1] == "e45"  # the csv module read the quoted id


def test_line_numbers_and_text_that_is_not_ascii_or_not_utf8(tmp_path):
    rng = random.Random(4)
    rows = [_row(i, rng) for i in range(5)]
    rows[3] = rows[3].replace(",m1,", ",mé,")  # UTF-8 model key
    rows[4] = "9,e9,m0,a0|a1|a2,a1,0.5,1,1 2|3 4|5 6 6"  # an error naming row 5, line 6
    p = tmp_path / "log.csv"
    p.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    err, (ds, counts) = _agree(p)
    assert err[0] == "error" and " row 5 (line 6): " in err[2]
    assert counts == {"read": 4, "skipped": 1, "skipped_features": 1} and ds[3][2] == "mé"
    latin = tmp_path / "latin.csv"
    latin.write_bytes(
        (HEADER + "\n" + rows[0] + "\n").encode() + "1,\xe9,m,a,a,1,0,1\n".encode("latin-1")
    )
    assert "not UTF-8 text" in _agree(latin)[0][2]


def test_a_field_over_the_csv_modules_limit_is_malformed_for_both(tmp_path, monkeypatch):
    import csv

    from streambandit.replay import files

    monkeypatch.setattr(files, "_FIELD_LIMIT", 1000)
    saved = csv.field_size_limit(1000)  # process-wide; restored below
    try:
        rng = random.Random(8)
        rows = [_row(i, rng) for i in range(4)]
        rows[2] = "7,e7,m0,a0,a0,1,0," + "1 " * 600
        p = tmp_path / "log.csv"
        p.write_text(HEADER + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
        err, (ds, counts) = _agree(p)
    finally:
        csv.field_size_limit(saved)
    assert err[1] == "malformed" and counts == {"read": 3, "skipped": 1, "skipped_malformed": 1}


def test_a_large_log_reads_the_same_in_many_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(csv_columnar, "_BLOCK_BYTES", 4096)
    rng = random.Random(5)
    rows = [_row(i, rng, k=rng.randint(1, 6), d=4) for i in range(600)]
    p = tmp_path / "log.csv"
    p.write_text(
        HEADER + ",decision_version\n" + "\n".join(r + f",{i}" for i, r in enumerate(rows)) + "\n"
    )
    ds, counts = _agree(p)[1]
    assert len(ds) == 600 and counts == {"read": 600}


def _oracle(text: str):
    """What files._parse_inline makes of ``text`` with str.split, as scan_inline's status."""
    if any(c in text for c in '\r\n"'):
        return csv_columnar.ROW_HANDOVER, None
    arms = [a.split() for a in text.split("|")]
    plain = all(t and set(t) <= set("0123456789.eE+-") for a in arms for t in a)
    if not plain or not text.isascii() or not arms[0] or any(len(a) != len(arms[0]) for a in arms):
        return csv_columnar.ROW_BY_TEXT, None
    return csv_columnar.ROW_PARSED, arms


def test_the_scan_splits_as_str_split_does():
    rng = random.Random(6)
    alphabet = '12.e-+ |\t\x1c\x0bx\n"é'
    texts = ["".join(t) for n in range(4) for t in itertools.product("1 |x", repeat=n)]
    texts += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(20000)
    ]
    data = "".join(texts).encode("utf-8")
    lengths = [len(t.encode("utf-8")) for t in texts]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    n = len(texts)
    out = np.empty(len(data) + 1, np.uint8)
    out_offsets = np.empty(len(data) + 2, np.int32)
    arms, dims, status = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.uint8)
    raw = np.frombuffer(data, np.uint8)
    ntok = csv_columnar.scan_inline(
        raw, offsets, csv_columnar._CLASS, out, out_offsets, arms, dims, status
    )
    tokens = [bytes(out[out_offsets[j] : out_offsets[j + 1]]).decode() for j in range(ntok)]
    at = 0
    for i, text in enumerate(texts):
        want, split = _oracle(text)
        assert status[i] == want, (text, status[i], want)
        if want == csv_columnar.ROW_PARSED:
            assert (arms[i], dims[i]) == (len(split), len(split[0]))
            m = len(split) * len(split[0])
            assert tokens[at : at + m] == [t for a in split for t in a]
            at += m
    assert at == ntok


def test_arrow_reads_a_number_exactly_when_float_does_and_to_the_same_bits():
    # The scan hands Arrow only tokens over "0-9 . e E + -"; over them Arrow must accept what
    # Python's float accepts, and give the same double.
    rng = random.Random(7)
    tokens = {"".join(t) for n in range(1, 5) for t in itertools.product("1.eE+-0", repeat=n)}
    tokens |= {
        "".join(rng.choice("0123456789.eE+-") for _ in range(rng.randint(1, 14)))
        for _ in range(30000)
    }
    tokens |= {repr(rng.uniform(-1, 1) * 10.0 ** rng.randint(-320, 308)) for _ in range(30000)}
    accepted, refused = [], []
    for t in sorted(tokens):
        try:
            accepted.append((t, float(t)))
        except ValueError:
            refused.append(t)
    got = pa.compute.cast(pa.array([t for t, _ in accepted]), pa.float64()).to_numpy()
    assert got.tobytes() == np.array([v for _, v in accepted]).tobytes()
    for t in refused:
        with pytest.raises(pa.ArrowInvalid):
            pa.compute.cast(pa.array([t]), pa.float64())


def test_without_pyarrow_the_csv_module_reads_and_the_command_says_how_to_read_faster(tmp_path):
    import subprocess
    import sys

    rng = random.Random(9)
    p = tmp_path / "log.csv"
    p.write_text(HEADER + "\n" + "\n".join(_row(i, rng, d=2) for i in range(50)) + "\n")
    cfg = tmp_path / "oful.toml"
    cfg.write_text(
        '[[models]]\nmatch = "*"\npolicy = "oful"\ndim = 2\nreward_window_ms = 1000\n'
        "default_reward = 0.0\n"
    )
    script = (
        "import sys; sys.modules['pyarrow'] = None\n"  # an install without the arrow extra
        "from streambandit.replay import csv_columnar, files\n"
        "assert not csv_columnar.AVAILABLE\n"
        f"assert sum(1 for _ in files.read_csv({str(p)!r})) == 50\n"
        "try:\n"
        f"    files.read_csv({str(p)!r}, columnar=True).__next__()\n"
        "except ValueError as e:\n"
        "    assert 'pyarrow' in str(e)\n"
        "else:\n"
        "    raise AssertionError('columnar=True without pyarrow')\n"
        "import runpy\n"
        f"sys.argv = ['streambandit', 'replay', {str(p)!r}, '--config', {str(cfg)!r},"
        f" '--out', {str(tmp_path / 'out')!r}]\n"
        "runpy.run_module('streambandit', run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "pip install 'streambandit[arrow]'" in out.stderr
    assert (tmp_path / "out").is_dir()


def test_the_scan_refuses_buffers_too_small_for_its_data():
    data = np.frombuffer(b"1 2|3 4", np.uint8)
    offsets = np.array([0, data.size], np.int32)
    one = np.zeros(1, np.int64)
    args = (one, one.copy(), np.zeros(1, np.uint8))
    scan = csv_columnar.scan_inline
    ok = scan(
        data, offsets, csv_columnar._CLASS, np.empty(7, np.uint8), np.empty(9, np.int32), *args
    )
    assert ok == 4
    assert (
        scan(
            data, offsets, csv_columnar._CLASS, np.empty(6, np.uint8), np.empty(9, np.int32), *args
        )
        == -1
    )
    assert (
        scan(
            data, offsets, csv_columnar._CLASS, np.empty(7, np.uint8), np.empty(8, np.int32), *args
        )
        == -1
    )
    past_end = np.array([0, data.size + 1], np.int32)
    assert (
        scan(
            data, past_end, csv_columnar._CLASS, np.empty(7, np.uint8), np.empty(9, np.int32), *args
        )
        == -1
    )
