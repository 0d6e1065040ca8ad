"""The Open Bandit Dataset reader: a small campaign in OBD's layout, decisions and features
checked against values built here from the fixture, bad rows, paths and missing files."""

from __future__ import annotations

import csv
import hashlib
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from streambandit.replay.featurize import hash_slot
from streambandit.replay.logged import LogError
from streambandit.replay.obd import obd_dim, read_obd

K = 5
N_USER = 4
EPOCH_US = 1_574_553_643_640_683  # 2019-11-24 00:00:43.640683 UTC, OBD's first day
# item_id -> (item_feature_0, item_feature_1..3 labels); written to the file in this (shuffled) order.
ITEMS = {
    3: (-0.52, "c", "x", "p"),
    0: (-0.5, "a", "x", "p"),
    4: (1.91, "d", "z", "q"),
    1: (-0.54, "b", "x", "p"),
    2: (0.97, "b", "y", "q"),
}
LOG_HEADER = [
    "",
    "timestamp",
    "item_id",
    "position",
    "click",
    "propensity_score",
    *[f"user_feature_{j}" for j in range(N_USER)],
    *[f"user-item_affinity_{i}" for i in range(K)],
]


def _hex(label: str) -> str:
    """An anonymized category as OBD writes it: a 32-digit hex hash."""
    return hashlib.md5(label.encode()).hexdigest()


def _stamp(us: int) -> str:
    return str(datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us))


def _log_rows(n_impressions: int = 12, seed: int = 7) -> list[dict]:
    """Impressions of three slots; each slot's row shares the impression's timestamp."""
    rng = np.random.default_rng(seed)
    rows = []
    for m in range(n_impressions):
        us = EPOCH_US + m * 37_123_457
        users = [_hex(f"u{j}-{rng.integers(3)}") for j in range(N_USER)]
        affinity = [float(rng.integers(0, 3)) for _ in range(K)]
        for pos, item in enumerate(rng.permutation(K)[:3], start=1):
            rows.append(
                {
                    "index": str(len(rows)),
                    "timestamp": _stamp(us),
                    "us": us,
                    "item_id": int(item),
                    "position": pos,
                    "click": int(rng.random() < 0.3),
                    "propensity_score": 1.0 / K,
                    "users": users,
                    "affinity": affinity,
                }
            )
    return rows


def _log_line(r: dict) -> list[str]:
    return [
        r["index"],
        r["timestamp"],
        str(r["item_id"]),
        str(r["position"]),
        str(r["click"]),
        repr(r["propensity_score"]),
        *r["users"],
        *[repr(a) for a in r["affinity"]],
    ]


def _write_csv(path, header: list[str], lines: list[list[str]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(lines)


def _write_items(directory) -> None:
    lines = [
        [str(n), str(item), repr(v[0]), *[_hex(label) for label in v[1:]]]
        for n, (item, v) in enumerate(ITEMS.items())
    ]
    _write_csv(
        directory / "item_context.csv",
        ["", "item_id", *[f"item_feature_{j}" for j in range(4)]],
        lines,
    )


def _campaign(
    tmp_path, lines: list[list[str]] | None = None, header: list[str] | None = None, rows=None
):
    """``<tmp>/random/men/`` with ``men.csv`` and ``item_context.csv``; returns the directory."""
    d = tmp_path / "random" / "men"
    d.mkdir(parents=True)
    _write_items(d)
    if lines is None:
        lines = [_log_line(r) for r in (rows if rows is not None else _log_rows())]
    _write_csv(d / "men.csv", header or LOG_HEADER, lines)
    return d


def _item_matrix() -> np.ndarray:
    """The arms' features by hand: item_feature_0, then one-hot of each category column over its
    sorted distinct hex strings; rows in item_id order."""
    ids = sorted(ITEMS)
    cols = [[ITEMS[i][0] for i in ids]]
    for j in (1, 2, 3):
        vocab = sorted({_hex(ITEMS[i][j]) for i in ids})
        for v in vocab:
            cols.append([1.0 if _hex(ITEMS[i][j]) == v else 0.0 for i in ids])
    return np.array(cols, dtype=np.float64).T


def _user_vector(users: list[str], dim: int) -> np.ndarray:
    u = np.zeros(dim)
    for j, value in enumerate(users):
        if not value:  # a missing category adds nothing
            continue
        slot, sign = hash_slot(f"user_feature_{j}={value}", dim)
        u[slot] += sign
    return u


def _expected_features(users: list[str], dim: int, rule: str) -> np.ndarray:
    items, u = _item_matrix(), _user_vector(users, dim)
    k, c = items.shape
    if rule == "concat":
        return np.array([[*u, *items[a]] for a in range(k)])
    one_u = [1.0, *u]
    x = np.zeros((k, (dim + 1) * c))
    for a in range(k):
        for i in range(dim + 1):
            for j in range(c):
                x[a, i * c + j] = one_u[i] * items[a, j]
    return x


# -- decisions ------------------------------------------------------------------------------------


def test_decisions_follow_the_rows(tmp_path):
    rows = _log_rows()
    d = _campaign(tmp_path, rows=rows)
    ds = list(read_obd(d, model_key="zozo"))
    assert len(ds) == len(rows) == 36
    for n, (dec, r) in enumerate(zip(ds, rows), start=1):
        assert dec.arm_ids == ("0", "1", "2", "3", "4")
        assert dec.arm_ids[dec.action] == str(r["item_id"]) and dec.action == r["item_id"]
        assert dec.position == r["position"] - 1
        assert dec.propensity == r["propensity_score"] and dec.reward == float(r["click"])
        assert dec.event_id == r["index"]
        assert dec.timestamp_ms == r["us"] // 1000
        assert dec.slate_id == ""  # no impression id in OBD: slot by slot
        assert (dec.model_key, dec.decision_version) == ("zozo", -1)
        assert dec.source == f"{d / 'men.csv'} row {n} (line {n + 1})"
        assert dec.features.dtype == np.float64


def test_timestamps_in_obds_text_form(tmp_path):
    rows = _log_rows(1)
    rows[0]["timestamp"] = "2019-11-24 00:00:43.640683+00:00"
    rows[1]["timestamp"] = "2019-11-24 09:00:43.640683+09:00"  # the same instant in JST
    rows[2]["timestamp"] = "2019-11-24 00:00:43"  # no offset: UTC, no fraction
    ds = list(read_obd(_campaign(tmp_path, rows=rows)))
    assert [x.timestamp_ms for x in ds] == [1_574_553_643_640, 1_574_553_643_640, 1_574_553_643_000]


def test_arms_in_numeric_item_id_order(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    _write_csv(
        d / "item_context.csv",
        ["", "item_id", "item_feature_0"],
        [["0", "10", "1.0"], ["1", "3", "2.0"], ["2", "7", "3.0"]],
    )
    header = LOG_HEADER[:7]
    _write_csv(
        d / "c.csv", header, [["0", "2019-11-24 00:00:00+00:00", "10", "1", "0", "0.5", "h"]]
    )
    (dec,) = read_obd(d, combine="concat", user_dim=2)
    assert dec.arm_ids == ("3", "7", "10") and dec.action == 2
    assert dec.features[:, -1].tolist() == [2.0, 3.0, 1.0]


@pytest.mark.parametrize("rule", ["outer", "concat"])
@pytest.mark.parametrize("user_dim", [1, 8])
def test_features_equal_the_hand_built_vectors(tmp_path, rule, user_dim):
    rows = _log_rows()
    ds = list(read_obd(_campaign(tmp_path, rows=rows), combine=rule, user_dim=user_dim))
    for n in (0, 17):
        np.testing.assert_array_equal(
            ds[n].features, _expected_features(rows[n]["users"], user_dim, rule)
        )


def test_an_empty_user_feature_adds_nothing(tmp_path):
    rows = _log_rows(1)
    rows[0]["users"] = [rows[0]["users"][0], "", *rows[0]["users"][2:]]
    dec = next(read_obd(_campaign(tmp_path, rows=rows), user_dim=8))
    np.testing.assert_array_equal(dec.features, _expected_features(rows[0]["users"], 8, "outer"))


@pytest.mark.parametrize("rule", ["outer", "concat"])
@pytest.mark.parametrize("affinity", [False, True])
def test_obd_dim_is_the_features_width(tmp_path, rule, affinity):
    d = _campaign(tmp_path)
    dim = obd_dim(d, user_dim=8, combine=rule, affinity=affinity)
    dec = next(read_obd(d, user_dim=8, combine=rule, affinity=affinity))
    assert dec.features.shape == (K, dim)
    c = _item_matrix().shape[1]
    assert dim == (9 * c if rule == "outer" else 8 + c) + affinity


def test_affinity_appends_each_arms_score(tmp_path):
    rows = _log_rows()
    d = _campaign(tmp_path, rows=rows)
    plain = list(read_obd(d))
    with_aff = list(read_obd(d, affinity=True))
    for p, a, r in zip(plain, with_aff, rows):
        np.testing.assert_array_equal(a.features[:, :-1], p.features)
        # arm j is item j here (ids 0..K-1), whose score is column user-item_affinity_<j>
        assert a.features[:, -1].tolist() == r["affinity"]


def test_directory_and_file_paths_agree(tmp_path):
    d = _campaign(tmp_path)
    by_dir, by_file = list(read_obd(d)), list(read_obd(str(d / "men.csv")))
    assert len(by_dir) == len(by_file) == 36
    for x, y in zip(by_dir, by_file):
        assert (
            x.event_id,
            x.action,
            x.position,
            x.propensity,
            x.reward,
            x.timestamp_ms,
            x.slate_id,
            x.source,
        ) == (
            y.event_id,
            y.action,
            y.position,
            y.propensity,
            y.reward,
            y.timestamp_ms,
            y.slate_id,
            y.source,
        )
        np.testing.assert_array_equal(x.features, y.features)
    assert obd_dim(d) == obd_dim(d / "men.csv")


# -- bad input ------------------------------------------------------------------------------------

BAD = {  # row field -> (bad value, reason)
    "unknown item": ("item_id", "9", "catalog"),
    "non-integer item": ("item_id", "two", "catalog"),
    "position 0": ("position", "0", "position"),
    "position past the arms": ("position", str(K + 1), "position"),
    "propensity 0": ("propensity_score", "0", "propensity"),
    "propensity missing": ("propensity_score", "", "propensity"),
    "click not a number": ("click", "yes", "reward"),
    "click not 0/1": ("click", "2", "reward"),
    "bad timestamp": ("timestamp", "yesterday", "malformed"),
}


def _with(line: list[str], field: str, value: str) -> list[str]:
    out = list(line)
    out[LOG_HEADER.index(field)] = value
    return out


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_row_raises_naming_it(tmp_path, case):
    field, value, reason = BAD[case]
    lines = [_log_line(r) for r in _log_rows(2)]
    lines[3] = _with(lines[3], field, value)
    d = _campaign(tmp_path, lines=lines)
    it = read_obd(d)
    assert len([next(it) for _ in range(3)]) == 3
    with pytest.raises(LogError, match=r"men\.csv row 4 \(line 5\)") as err:
        next(it)
    assert err.value.reason == reason


def test_a_non_numeric_affinity_is_a_features_error(tmp_path):
    lines = [_log_line(r) for r in _log_rows(1)]
    lines[2] = _with(lines[2], "user-item_affinity_1", "high")
    d = _campaign(tmp_path, lines=lines)
    assert len(list(read_obd(d))) == 3  # unread without affinity=True
    with pytest.raises(LogError, match=r"row 3 \(line 4\).*affinity 'high'") as err:
        list(read_obd(d, affinity=True))
    assert err.value.reason == "features"


def test_a_row_with_too_few_fields_is_malformed(tmp_path):
    lines = [_log_line(r) for r in _log_rows(1)]
    lines[1] = lines[1][:-1]
    with pytest.raises(LogError, match=r"row 2 \(line 3\).*fields") as err:
        list(read_obd(_campaign(tmp_path, lines=lines)))
    assert err.value.reason == "malformed"


def test_bad_rows_skipped_and_counted_by_reason(tmp_path):
    lines = [_log_line(r) for r in _log_rows()]
    bad = [
        (0, "item_id", "42"),
        (5, "position", "0"),
        (6, "position", "9"),
        (10, "propensity_score", "0"),
        (11, "click", "x"),
        (20, "item_id", "-1"),
    ]
    for n, field, value in bad:
        lines[n] = _with(lines[n], field, value)
    lines.insert(30, ["1", "2"])
    counts: dict[str, int] = {}
    ds = list(read_obd(_campaign(tmp_path, lines=lines), skip_bad=True, counts=counts))
    assert len(ds) == 30
    assert counts == {
        "read": 30,
        "skipped": 7,
        "skipped_catalog": 2,
        "skipped_position": 2,
        "skipped_propensity": 1,
        "skipped_reward": 1,
        "skipped_malformed": 1,
    }
    assert {x.event_id for x in ds}.isdisjoint({str(n) for n, _, _ in bad})


def test_missing_files_raise(tmp_path):
    d = _campaign(tmp_path)
    with pytest.raises(LogError, match="no such file") as err:
        read_obd(d / "women.csv")
    assert err.value.reason == "file"
    (d / "item_context.csv").unlink()
    for call in (lambda: read_obd(d), lambda: obd_dim(d)):
        with pytest.raises(LogError, match="item_context.csv") as err:
            call()
        assert err.value.reason == "file"


def test_a_missing_log_column_raises(tmp_path):
    header = [h for h in LOG_HEADER if h != "click"]
    lines = [[v for h, v in zip(LOG_HEADER, _log_line(r)) if h != "click"] for r in _log_rows(1)]
    it = read_obd(_campaign(tmp_path, lines=lines, header=header))
    with pytest.raises(LogError, match=r"lacks the columns \['click'\]") as err:
        next(it)
    assert err.value.reason == "file"


def test_affinity_needs_every_items_column(tmp_path):
    header = [h for h in LOG_HEADER if h != "user-item_affinity_3"]
    lines = [
        [v for h, v in zip(LOG_HEADER, _log_line(r)) if h != "user-item_affinity_3"]
        for r in _log_rows(1)
    ]
    d = _campaign(tmp_path, lines=lines, header=header)
    assert len(list(read_obd(d))) == 3
    with pytest.raises(LogError, match="user-item_affinity_3") as err:
        next(read_obd(d, affinity=True))
    assert err.value.reason == "file"


def test_item_context_without_item_id_raises(tmp_path):
    d = _campaign(tmp_path)
    _write_csv(d / "item_context.csv", ["", "item_feature_0"], [["0", "1.0"]])
    with pytest.raises(LogError, match="item_id") as err:
        obd_dim(d)
    assert err.value.reason == "file"


@pytest.mark.parametrize("cell", ["", "nan"])
def test_a_bad_item_feature_is_a_catalog_error(tmp_path, cell):
    d = _campaign(tmp_path)
    _write_csv(
        d / "item_context.csv",
        ["", "item_id", "item_feature_0"],
        [["0", "0", "1.0"], ["1", "1", cell]],
    )
    with pytest.raises(LogError, match=r"item_context\.csv") as err:
        read_obd(d)
    assert err.value.reason == "catalog"


def test_bad_arguments(tmp_path):
    d = _campaign(tmp_path)
    with pytest.raises(ValueError, match="combining rule"):
        read_obd(d, combine="sum")
    with pytest.raises(ValueError, match="user_dim"):
        obd_dim(d, user_dim=0)
