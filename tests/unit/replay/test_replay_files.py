"""Logged-decision files: CSV with a catalog or inline features, Avro containers, bad rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from streambandit.replay.files import read_avro, read_catalog, read_csv, write_avro
from streambandit.replay.logged import LogError, LoggedDecision, validate

HEADER = "timestamp_ms,event_id,model_key,arm_ids,action,propensity,reward\n"
CATALOG = "arm_id,f0,f1\na,1.0,0.0\nb,0.0,1.0\nc,0.5,-0.25\n"
GOOD = ["1000,e1,m,a|b|c,b,0.5,1.0", "1001,e2,m,c|a,c,0.25,0.0"]


def _write(tmp_path, name: str, text: str):
    p = tmp_path / name
    p.write_text(text)
    return p


def _decision(i: int, rng: np.random.Generator) -> LoggedDecision:
    k = int(rng.integers(1, 5))
    return LoggedDecision(
        timestamp_ms=1_700_000_000_000 + i,
        event_id=f"ev-{i}",
        model_key=f"m{i % 3}",
        arm_ids=tuple(f"arm{j}" for j in range(k)),
        features=rng.normal(size=(k, 3)) * 10.0 ** rng.integers(-300, 300),
        action=int(rng.integers(k)),
        propensity=float(rng.uniform(1e-9, 1.0)),
        reward=float(rng.normal()),
        decision_version=int(rng.integers(-1, 1000)),
    )


def _same(a: LoggedDecision, b: LoggedDecision) -> bool:
    for f in dataclasses.fields(LoggedDecision):
        if not f.compare:  # where it was read
            continue
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                return False
        elif type(x) is float:
            if np.float64(x).tobytes() != np.float64(y).tobytes():
                return False
        elif x != y:
            return False
    return True


# -- CSV ---------------------------------------------------------------------------------------


def test_csv_with_a_catalog(tmp_path):
    log = _write(tmp_path, "log.csv", HEADER + "\n".join(GOOD) + "\n")
    cat = _write(tmp_path, "arms.csv", CATALOG)
    ds = list(read_csv(log, cat))
    assert len(ds) == 2
    d = ds[0]
    assert (d.timestamp_ms, d.event_id, d.model_key, d.arm_ids, d.action) == (
        1000,
        "e1",
        "m",
        ("a", "b", "c"),
        1,
    )
    assert d.propensity == 0.5 and d.reward == 1.0 and d.decision_version == -1
    assert (
        np.array_equal(d.features, [[1.0, 0.0], [0.0, 1.0], [0.5, -0.25]])
        and d.features.dtype == np.float64
    )
    assert ds[1].arm_ids == ("c", "a") and ds[1].action == 0
    assert np.array_equal(ds[1].features, [[0.5, -0.25], [1.0, 0.0]])
    # an already read catalog works too
    assert all(_same(x, y) for x, y in zip(ds, read_csv(log, read_catalog(cat))))


def test_csv_with_inline_features(tmp_path):
    text = (
        "timestamp_ms,event_id,model_key,arm_ids,action,propensity,reward,features,decision_version\n"
        '5,e1,m,x|y,y,0.75,2.5,"1 2 3|4 5 6e-3",17\n'
        "6,e2,m,x,x,1,0,0.1 -0.2 0.3,\n"
    )
    ds = list(read_csv(_write(tmp_path, "inline.csv", text)))
    assert np.array_equal(ds[0].features, [[1, 2, 3], [4, 5, 6e-3]]) and ds[0].action == 1
    assert ds[0].decision_version == 17 and ds[1].decision_version == -1
    assert ds[1].features.shape == (1, 3)


BAD_ROWS = [  # (row, reason, words in the message)
    ("1002,e3,m,a|b,b,,1.0", "propensity", "missing propensity"),
    ("1002,e3,m,a|b,b,0,1.0", "propensity", "not in (0, 1]"),
    ("1002,e3,m,a|b,b,1.5,1.0", "propensity", "not in (0, 1]"),
    ("1002,e3,m,a|b,b,nan,1.0", "propensity", "NaN"),
    ("1002,e3,m,a|b,z,0.5,1.0", "action", "'z' is not among the arms"),
    ("1002,e3,m,a|b,b,0.5", "malformed", "wrong number of fields"),
    ("1002,e3,m,a|b,b,0.5,1.0,extra", "malformed", "wrong number of fields"),
    ("soon,e3,m,a|b,b,0.5,1.0", "malformed", "timestamp_ms"),
    ("1002,e3,m,a|b,b,0.5,lots", "reward", "reward 'lots' is not a number"),
    ("1002,e3,m,a|b,b,0.5,inf", "reward", "non-finite reward"),
    ("1002,e3,m,a|q,a,0.5,1.0", "catalog", "unknown arm ids ['q']"),
    ("1002,e3,m,a|a,a,0.5,1.0", "arms", "duplicate arm ids"),
]


@pytest.mark.parametrize("row,reason,words", BAD_ROWS)
def test_a_bad_csv_row_raises_naming_the_row(tmp_path, row, reason, words):
    log = _write(tmp_path, "log.csv", HEADER + "\n".join([GOOD[0], GOOD[1], row, GOOD[0]]) + "\n")
    cat = _write(tmp_path, "arms.csv", CATALOG)
    it = read_csv(log, cat)
    assert len([next(it), next(it)]) == 2  # the good rows before it are read
    with pytest.raises(LogError) as exc:
        next(it)
    assert exc.value.reason == reason
    msg = str(exc.value)
    assert msg.startswith(f"{log} row 3 (line 4): ") and words in msg, msg


def test_skip_bad_skips_and_counts_every_bad_row(tmp_path):
    rows = [GOOD[0]] + [r for r, _, _ in BAD_ROWS] + [GOOD[1]]
    log = _write(tmp_path, "log.csv", HEADER + "\n".join(rows) + "\n")
    cat = _write(tmp_path, "arms.csv", CATALOG)
    counts: dict[str, int] = {}
    ds = list(read_csv(log, cat, skip_bad=True, counts=counts))
    assert [d.event_id for d in ds] == ["e1", "e2"]
    assert counts["read"] == 2 and counts["skipped"] == len(BAD_ROWS)
    assert (
        counts["skipped_propensity"] == 4
        and counts["skipped_malformed"] == 3
        and counts["skipped_reward"] == 2
    )
    assert counts["skipped_action"] == counts["skipped_catalog"] == counts["skipped_arms"] == 1


@pytest.mark.parametrize(
    "features,words",
    [
        ("1 2|3", "wrong feature count"),
        ("1 2", "features give 1 arms, arm_ids has 2"),
        ("1 x|3 4", "non-numeric"),
        ("1 nan|3 4", "non-finite"),
    ],
)
def test_bad_inline_features(tmp_path, features, words):
    text = HEADER.strip() + ",features\n" + f"1,e1,m,a|b,a,0.5,1.0,{features}\n"
    with pytest.raises(LogError, match="row 1") as exc:
        list(read_csv(_write(tmp_path, "log.csv", text)))
    assert words in str(exc.value) and exc.value.reason == "features"


def test_whole_file_problems_always_raise(tmp_path):
    cat = _write(tmp_path, "arms.csv", CATALOG)
    no_reward = _write(
        tmp_path, "a.csv", "timestamp_ms,event_id,model_key,arm_ids,action,propensity\n"
    )
    with pytest.raises(LogError, match=r"lacks the columns \['reward'\]"):
        list(read_csv(no_reward, cat, skip_bad=True))
    with pytest.raises(LogError, match="no catalog"):
        list(read_csv(_write(tmp_path, "b.csv", HEADER + GOOD[0] + "\n")))
    with pytest.raises(LogError, match="row 2"):
        read_catalog(_write(tmp_path, "c.csv", "arm_id,f0\na,1\nb,\n"))
    with pytest.raises(LogError, match="column 'f0' has a non-finite value"):
        read_catalog(_write(tmp_path, "c.csv", "arm_id,f0\na,1\nb,nan\n"))
    with pytest.raises(LogError, match="header"):
        read_catalog(_write(tmp_path, "d.csv", "id,f0\na,1\n"))


# -- Avro --------------------------------------------------------------------------------------


def test_avro_round_trip_is_bit_exact(tmp_path):
    rng = np.random.default_rng(0)
    ds = [_decision(i, rng) for i in range(300)]
    ds.append(
        dataclasses.replace(
            ds[0],
            event_id="edge",
            features=np.array([[-0.0, 5e-324, 1.7976931348623157e308]]),
            arm_ids=("only",),
            action=0,
            propensity=1.0,
            reward=-0.0,
        )
    )
    for codec in ("null", "deflate"):
        path = tmp_path / f"log-{codec}.avro"
        assert write_avro(path, iter(ds), codec=codec) == len(ds)
        back = list(read_avro(path))
        assert len(back) == len(ds) and all(_same(a, b) for a, b in zip(ds, back))


def test_avro_bad_records(tmp_path):
    rng = np.random.default_rng(1)
    good = [_decision(i, rng) for i in range(3)]
    path = tmp_path / "log.avro"
    write_avro(path, good)
    # a record the writer refuses is a LogError naming it
    bad = dataclasses.replace(good[1], propensity=0.0)
    with pytest.raises(LogError, match="decision 2 .*not in \\(0, 1\\]"):
        write_avro(tmp_path / "x.avro", [good[0], bad])

    # records from another producer (same schema, no validation): a null propensity, a propensity
    # of 1.5, an action out of range, features of the wrong size, a NaN reward
    import fastavro

    from streambandit.replay.files import LOGGED_DECISION_SCHEMA, _to_record

    recs = [_to_record(d) for d in good]
    broken = [
        dict(recs[0], propensity=None),
        dict(recs[0], propensity=1.5),
        dict(recs[0], action=99),
        dict(recs[0], features=recs[0]["features"][:-8]),
        dict(recs[0], reward=float("nan")),
    ]
    raw = tmp_path / "raw.avro"
    with open(raw, "wb") as f:
        fastavro.writer(f, LOGGED_DECISION_SCHEMA, [recs[0], *broken, recs[2]])
    with pytest.raises(LogError, match=rf"^{raw} record 2: missing propensity"):
        list(read_avro(raw))
    counts: dict[str, int] = {}
    back = list(read_avro(raw, skip_bad=True, counts=counts))
    assert [d.event_id for d in back] == [good[0].event_id, good[2].event_id]
    assert counts == {
        "read": 2,
        "skipped": 5,
        "skipped_propensity": 2,
        "skipped_action": 1,
        "skipped_features": 1,
        "skipped_reward": 1,
    }


def test_not_an_avro_file(tmp_path):
    p = _write(tmp_path, "log.csv", HEADER + GOOD[0] + "\n")
    with pytest.raises(LogError, match="not an Avro container file"):
        list(read_avro(p, skip_bad=True))


def test_validate_directly():
    d = LoggedDecision(0, "e", "m", ("a", "b"), np.zeros((2, 2)), 1, 0.5, 1.0)
    assert validate(d, "here") is d
    for bad, words in [
        (dataclasses.replace(d, arm_ids=(), features=np.zeros((0, 2)), action=0), "empty arm list"),
        (dataclasses.replace(d, features=np.zeros((3, 2))), "3 feature rows for 2 arms"),
        (dataclasses.replace(d, features=np.array([[0.0, np.inf], [0.0, 0.0]])), "non-finite"),
        (dataclasses.replace(d, action=2), "action 2"),
        (dataclasses.replace(d, propensity=None), "missing propensity"),
        (dataclasses.replace(d, propensity=float("nan")), "NaN"),
        (dataclasses.replace(d, reward=float("-inf")), "non-finite reward"),
    ]:
        with pytest.raises(LogError, match="^here: ") as exc:
            validate(bad, "here")
        assert words in str(exc.value)


def test_unreadable_csv_rows(tmp_path, monkeypatch):
    # A row the csv module refuses (here a field over a field size limit lowered for the test;
    # the reader's own limit is 2**31 - 1) is malformed, and the next row is still read.
    import csv

    from streambandit.replay import files

    monkeypatch.setattr(files, "_FIELD_LIMIT", 1000)
    saved = csv.field_size_limit(1000)  # the process-wide limit, whatever an earlier test set
    big = "1002,e3,m,a|b,b,0.5,1.0," + '"' + "1 " * 600 + '"'
    log = _write(
        tmp_path,
        "log.csv",
        HEADER.strip() + ",features\n" + big + "\n" + GOOD[0] + ",1 2|3 4|5 6\n",
    )
    try:
        _unreadable_rows(tmp_path, log)
    finally:
        csv.field_size_limit(saved)


def _unreadable_rows(tmp_path, log):
    with pytest.raises(LogError, match="row 1 .*malformed row"):
        list(read_csv(log))
    counts: dict[str, int] = {}
    assert [d.event_id for d in read_csv(log, skip_bad=True, counts=counts)] == ["e1"]
    assert counts == {"read": 1, "skipped": 1, "skipped_malformed": 1}
    latin = tmp_path / "latin.csv"
    latin.write_bytes(HEADER.encode() + "1,\xe9v,m,a,a,1,0\n".encode("latin-1"))
    with pytest.raises(LogError, match="not UTF-8"):
        list(read_csv(latin, {"a": np.zeros(2)}))


def test_a_read_share_follows_the_reading_to_the_end(tmp_path, monkeypatch):
    from streambandit.replay import avro_log, files

    monkeypatch.setattr(files, "_SHARE_EVERY", 100)
    monkeypatch.setattr(avro_log, "_BATCH_RECORDS", 200)
    rng = np.random.default_rng(2)
    ds = [_decision(i, rng) for i in range(1000)]
    path = tmp_path / "log.avro"
    write_avro(path, ds)
    share = files.ReadShare()
    assert share.fraction is None
    seen = [share.fraction for _ in files.read_avro(path, share=share)]
    assert seen[0] == 0.0 and 0.0 < seen[500] < 1.0 and share.fraction == 1.0
    assert seen == sorted(seen)
    rows = "".join(f"{1000 + i},e{i},m,a|b|c,b,0.5,1.0\n" for i in range(1000))
    log = _write(tmp_path, "log.csv", HEADER + rows)
    share = files.ReadShare()
    catalog = _write(tmp_path, "arms.csv", CATALOG)
    seen = [share.fraction for _ in read_csv(log, catalog, share=share)]
    assert seen[0] == 0.0 and 0.0 < seen[-1] <= 1.0 and seen == sorted(seen)
