"""DSJSON (Vowpal Wabbit / Azure Personalizer decision-service logs): decisions, hashed features
against hand-written feature names, gzip, bad lines by reason, CCB refused, over-long lines."""

from __future__ import annotations

import copy
import gzip
import json
from datetime import datetime, timezone

import numpy as np
import pytest

from streambandit.replay import dsjson
from streambandit.replay.dsjson import parse_line, read_dsjson
from streambandit.replay.featurize import hash_slot
from streambandit.replay.logged import LogError

DIM = 64

# The shape Personalizer writes and `vw --dsjson --cb_explore_adf` reads: labels before "c".
E1 = {
    "_label_cost": -1.0,
    "_label_probability": 0.6,
    "_label_Action": 2,
    "_labelIndex": 1,
    "o": [{"v": 1.0, "EventId": "ev-1", "ActionTaken": False}],
    "Timestamp": "2024-03-01T12:30:45.1234567Z",
    "Version": "1",
    "EventId": "ev-1",
    "a": [2, 1, 3],
    "c": {
        "User": {"id": "u1", "age": 0.25, "premium": True, "churned": False, "_segment": "hidden"},
        "Geo": {"city": "New York"},
        "hour": 14,
        "_multi": [
            {"_tag": "a1", "Item": {"id": "a1", "price": 1.5}},
            {"_tag": "a2", "Item": {"id": "a2", "price": 2.0}},
            {"_tag": "a3", "Item": {"id": "a3"}, "Style": {"color": "red"}},
        ],
    },
    "p": [0.6, 0.2, 0.2],
    "VWState": {"m": "model-1/abc"},
}
E2 = {
    "_label_cost": 0.0,
    "_label_probability": 0.5,
    "_label_Action": 1,
    "_labelIndex": 0,
    "o": [{"v": 0.0, "EventId": "ev-2", "ActionTaken": False}],
    "Timestamp": "2024-03-01T12:31:00.0000000Z",
    "Version": "1",
    "EventId": "ev-2",
    "a": [1, 3, 2],
    "c": {
        "User": {"id": "u2", "age": 0.5},
        "Geo": {"city": "Paris"},
        "hour": 9,
        "_multi": E1["c"]["_multi"],
    },
    "p": [0.5, 0.25, 0.25],
    "VWState": {"m": "model-1/abc"},
}
E3 = {
    "_label_cost": -0.5,
    "_label_probability": 0.25,
    "_label_Action": 3,
    "_labelIndex": 2,
    "Timestamp": "2024-03-01T12:32:10.5000000Z",
    "Version": "1",
    "EventId": "ev-3",
    "a": [3, 1, 2],
    "c": {"User": {"id": "u3"}, "_multi": E1["c"]["_multi"]},
    "p": [0.25, 0.5, 0.25],
    "VWState": {"m": "model-1/abc"},
}

# The oracle for E1, written out by hand from the module's rules.
E1_SHARED = [
    ("User^idu1", 1.0),
    ("User^age", 0.25),
    ("User^premium", 1.0),
    ("Geo^cityNew_York", 1.0),
    ("hour", 14.0),
]
E1_OWN = [
    [("Item^ida1", 1.0), ("Item^price", 1.5)],
    [("Item^ida2", 1.0), ("Item^price", 2.0)],
    [("Item^ida3", 1.0), ("Style^colorred", 1.0)],
]
E1_CROSSES_ARM0 = [
    ("User^idu1*Item^ida1", 1.0),
    ("User^idu1*Item^price", 1.5),
    ("User^age*Item^ida1", 0.25),
    ("User^age*Item^price", 0.375),
    ("User^premium*Item^ida1", 1.0),
    ("User^premium*Item^price", 1.5),
    ("Geo^cityNew_York*Item^ida1", 1.0),
    ("Geo^cityNew_York*Item^price", 1.5),
    ("hour*Item^ida1", 14.0),
    ("hour*Item^price", 21.0),
]

# VW's JSON value rules in one line: nested object, array with null/zero/object, _text, zero, null.
RULES = {
    "_label_cost": 1.0,
    "_label_probability": 1.0,
    "_labelIndex": 0,
    "Timestamp": "2024-01-01T00:00:00Z",
    "EventId": "rules",
    "a": [1, 2],
    "c": {
        "User": {
            "geo": {"city": "Paris"},
            "emb": [0.5, None, 0, 2, {"k": 1}],
            "z": 0,
            "note": None,
            "_hidden": 3,
            "_text": "big  red:x",
        },
        "n": 2,
        "s": "a b",
        "_multi": [{"A": {"tags": "x|y:z"}}, {}],
    },
}
RULES_SHARED = [
    ("geo^cityParis", 1.0),
    ("emb^[0]", 0.5),
    ("emb^[2]", 2.0),
    ("emb^k", 1.0),
    ("User^big", 1.0),
    ("User^red_x", 1.0),
    ("n", 2.0),
    ("sa_b", 1.0),
]
RULES_OWN = [[("A^tagsx_y_z", 1.0)], []]


def _line(event: dict) -> str:
    return json.dumps(event, separators=(",", ":"))


def _write(tmp_path, events, name: str = "log.dsjson"):
    p = tmp_path / name
    p.write_text("".join((e if isinstance(e, str) else _line(e)) + "\n" for e in events))
    return p


def _oracle(named, dim: int = DIM) -> np.ndarray:
    x = np.zeros(dim)
    for name, value in named:
        i, sign = hash_slot(name, dim)
        x[i] += sign * value
    return x


def _ms(*args) -> int:
    return int(datetime(*args, tzinfo=timezone.utc).timestamp()) * 1000


# -- good logs -------------------------------------------------------------------------------------


def test_reads_the_logged_decisions(tmp_path):
    path = _write(tmp_path, [E1, E2, E3])
    ds = list(read_dsjson(path, dim=DIM, model_key="personalizer"))
    assert [d.event_id for d in ds] == ["ev-1", "ev-2", "ev-3"]
    assert [d.action for d in ds] == [1, 0, 2]
    assert [d.propensity for d in ds] == [0.6, 0.5, 0.25]
    assert [d.reward for d in ds] == [1.0, 0.0, 0.5]  # -_label_cost
    assert [d.timestamp_ms for d in ds] == [
        _ms(2024, 3, 1, 12, 30, 45) + 123,
        _ms(2024, 3, 1, 12, 31, 0),
        _ms(2024, 3, 1, 12, 32, 10) + 500,
    ]
    for n, d in enumerate(ds, start=1):
        assert d.arm_ids == ("0", "1", "2")
        assert d.features.shape == (3, DIM) and d.features.dtype == np.float64
        assert (d.model_key, d.decision_version, d.source) == (
            "personalizer",
            -1,
            f"{path} line {n}",
        )


def test_features_equal_the_hashed_hand_written_names():
    d = parse_line(_line(E1), dim=DIM)
    assert np.allclose(d.features[0], _oracle(E1_SHARED + E1_OWN[0] + E1_CROSSES_ARM0))
    for a in (1, 2):
        crosses = [(f"{s}*{t}", u * v) for s, u in E1_SHARED for t, v in E1_OWN[a]]
        assert np.allclose(d.features[a], _oracle(E1_SHARED + E1_OWN[a] + crosses))


def test_without_interactions_there_are_no_crosses():
    d = parse_line(_line(E1), dim=DIM, interactions=False)
    for a in range(3):
        assert np.allclose(d.features[a], _oracle(E1_SHARED + E1_OWN[a]))
    assert not np.allclose(d.features, parse_line(_line(E1), dim=DIM).features)


def test_vw_json_value_rules():
    d = parse_line(_line(RULES), dim=DIM, interactions=False)
    for a in range(2):
        assert np.allclose(d.features[a], _oracle(RULES_SHARED + RULES_OWN[a]))
    assert (d.action, d.propensity, d.reward) == (0, 1.0, -1.0)


def _vw_audit(path, capfd) -> list[dict[str, float]]:
    """Per action example, the features `vw --dsjson --cb_explore_adf --audit -t` prints (VW
    writes the audit to the process's stdout)."""
    pyvw = pytest.importorskip("vowpalwabbit.pyvw")
    capfd.readouterr()
    vw = pyvw.Workspace(
        arg_list=["--cb_explore_adf", "--dsjson", "--audit", "-t", "--quiet", "-d", str(path)]
    )
    vw.run_parser()
    vw.finish()
    rows = []
    for entry in capfd.readouterr().out.splitlines():
        if entry.startswith("\t"):
            fields = [f.rsplit(":", 3) for f in entry.strip("\t\n").split("\t")]
            rows.append({f[0]: float(f[2]) for f in fields if f[0] != "Constant"})
    return rows


def test_feature_names_are_the_ones_vw_audit_prints(tmp_path, capfd):
    path = _write(tmp_path, [E1, RULES])
    rows = _vw_audit(path, capfd)
    assert len(rows) == 5  # one per action: E1 has 3, RULES 2
    assert rows[0] == pytest.approx(dict(E1_SHARED + E1_OWN[0]))
    assert rows[3] == pytest.approx(dict(RULES_SHARED + RULES_OWN[0]))
    ds = list(read_dsjson(path, dim=DIM, interactions=False))
    ours = [x for d in ds for x in d.features]
    for mine, theirs in zip(ours, rows, strict=True):
        assert np.allclose(mine, _oracle(theirs.items()), atol=1e-6)  # VW prints float32 values


def test_gzip_file(tmp_path):
    plain = list(read_dsjson(_write(tmp_path, [E1, E2]), dim=DIM))
    gz = tmp_path / "log.dsjson.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(_line(E1) + "\n" + _line(E2) + "\n")
    zipped = list(read_dsjson(gz, dim=DIM))
    assert [d.event_id for d in zipped] == ["ev-1", "ev-2"]
    assert all(np.array_equal(a.features, b.features) for a, b in zip(plain, zipped))
    assert zipped[1].source == f"{gz} line 2"


def test_blank_lines_crlf_and_a_byte_order_mark(tmp_path):
    path = tmp_path / "log.dsjson"
    path.write_bytes(
        b"\xef\xbb\xbf" + _line(E1).encode() + b"\r\n\r\n   \n" + _line(E2).encode()
    )  # no final newline
    counts: dict[str, int] = {}
    ds = list(read_dsjson(path, dim=DIM, counts=counts))
    assert [d.source for d in ds] == [f"{path} line 1", f"{path} line 4"]
    assert counts == {"read": 2}


@pytest.mark.parametrize(
    "text, ms",
    [
        ("2024-03-01T12:30:45.1234567Z", _ms(2024, 3, 1, 12, 30, 45) + 123),
        ("2024-03-01T12:30:45Z", _ms(2024, 3, 1, 12, 30, 45)),
        ("2024-03-01T12:30:45.9Z", _ms(2024, 3, 1, 12, 30, 45) + 900),
        ("2024-03-01T14:30:45.500+02:00", _ms(2024, 3, 1, 12, 30, 45) + 500),
        ("1969-12-31T23:59:59.5000000Z", -500),
    ],
)
def test_timestamps(text, ms):
    assert parse_line(_line({**E1, "Timestamp": text}), dim=DIM).timestamp_ms == ms


def test_propensity_falls_back_to_p0_and_action_to_label_action():
    e = copy.deepcopy(E1)
    del e["_label_probability"], e["_labelIndex"]
    d = parse_line(_line(e), dim=DIM)
    assert (d.action, d.propensity) == (1, 0.6)


# -- bad lines -------------------------------------------------------------------------------------


def _edit(**changes):
    """E1 with top-level keys replaced (None deletes) and "c." keys set inside the context."""
    e = copy.deepcopy(E1)
    for key, value in changes.items():
        target, key = (e["c"], key[2:]) if key.startswith("c_") else (e, key)
        if value is None:
            del target[key]
        else:
            target[key] = value
    return _line(e)


BAD = [
    ("not JSON", '{"EventId": "x",', "malformed"),
    ("not an object", "[1, 2]", "malformed"),
    ("no context", _edit(c=None), "malformed"),
    ("context not an object", _edit(c=[1]), "malformed"),
    ("bad Timestamp", _edit(Timestamp="2024-03-01 12:30:45"), "malformed"),
    ("month 13", _edit(Timestamp="2024-13-01T00:00:00Z"), "malformed"),
    ("no Timestamp", _edit(Timestamp=None), "malformed"),
    ("continuous-action label", _edit(_label_ca={"action": 1.5}), "malformed"),
    ("no _multi", _edit(c__multi=None), "arms"),
    ("empty _multi", _edit(c__multi=[]), "arms"),
    ("action not an object", _edit(c__multi=[{"A": {"x": 1}}, 2]), "arms"),
    ("_labelIndex out of range", _edit(_labelIndex=3, _label_Action=None, a=None), "action"),
    ("_labelIndex and _label_Action disagree", _edit(_labelIndex=0), "action"),
    ("a[0] disagrees", _edit(a=[1, 2, 3]), "action"),
    ("a names no action", _edit(a=[2, 7]), "action"),
    ("no action label", _edit(_labelIndex=None, _label_Action=None), "action"),
    ("_labelIndex not an integer", _edit(_labelIndex="1"), "action"),
    ("probability 0", _edit(_label_probability=0), "propensity"),
    ("probability over 1", _edit(_label_probability=1.5), "propensity"),
    ("probability a string", _edit(_label_probability="0.6"), "propensity"),
    ("no probability", _edit(_label_probability=None, p=None), "propensity"),
    ("p without a", _edit(_label_probability=None, a=None), "propensity"),
    ("no cost", _edit(_label_cost=None), "reward"),
    ("skipLearn", _edit(_skipLearn=True), "reward"),
    ("cost NaN", _edit(_label_cost="NaN"), "reward"),
    (
        "cost infinite",
        _edit(_label_cost=-1.0).replace('"_label_cost":-1.0', '"_label_cost":-1e400'),
        "reward",
    ),
    ("feature NaN", _edit(c_hour=float("nan")), "features"),
    ("feature overflows", _edit(c_hour=1.0).replace('"hour":1.0', '"hour":1e400'), "features"),
    ("string in an array", _edit(c_tags=["x", "y"]), "features"),
    ("_text not a string", _edit(c__text=3), "features"),
    ("deduplicated action", _edit(c__multi=[{"__aid": 7}, {"A": {"x": 1}}], a=None), "features"),
    (
        "cross overflows",
        _edit(c_hour=1e200, c__multi=[{"A": {"x": 1e200}}, {"A": {"x": 1}}], a=None),
        "features",
    ),
    ("no EventId", _edit(EventId=None), "event_id"),
    ("empty EventId", _edit(EventId=""), "event_id"),
    ("numeric EventId", _edit(EventId=7), "event_id"),
]


@pytest.mark.parametrize("line, reason", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_line_raises_naming_it_and_is_skipped_by_reason(tmp_path, line, reason):
    path = _write(tmp_path, [E2, line, E3])
    with pytest.raises(LogError, match=f"^{path} line 2: ") as err:
        list(read_dsjson(path, dim=DIM))
    assert err.value.reason == reason
    counts: dict[str, int] = {}
    ds = list(read_dsjson(path, dim=DIM, skip_bad=True, counts=counts))
    assert [d.event_id for d in ds] == ["ev-2", "ev-3"]
    assert counts == {"read": 2, "skipped": 1, f"skipped_{reason}": 1}


def test_a_ccb_line_is_refused_as_unsupported():
    # The CCB shape of VW's test/train-sets/issue4669.dsjson.
    ccb = {
        "Timestamp": "2024-01-01T00:00:00Z",
        "EventId": "ccb-1",
        "c": {"_multi": [{"f": "1"}, {"f": "2"}], "_slots": [{"_inc": [0, 1]}, {"_inc": [1]}]},
        "_outcomes": [
            {"_label_cost": 1.0, "_a": [0, 1], "_p": [0.5, 0.5]},
            {"_label_cost": 0.0, "_a": [1], "_p": [1]},
        ],
    }
    with pytest.raises(LogError, match="CCB/slates DSJSON is not supported") as err:
        parse_line(_line(ccb), dim=DIM, where="x line 1")
    assert err.value.reason == "malformed"


def test_an_over_long_line_is_refused_without_being_read_whole(tmp_path, monkeypatch):
    limit = max(len(_line(e)) for e in (E1, E2, E3)) + 50
    monkeypatch.setattr(dsjson, "MAX_LINE_BYTES", limit)
    at_limit = _edit(pad="")
    at_limit = _edit(pad="x" * (limit - len(at_limit)))
    assert len(at_limit) == limit
    long = _edit(pad="x" * (20 * limit))
    path = tmp_path / "log.dsjson"
    path.write_text(
        "\n".join([_line(E2), long, at_limit, long[: limit + 1]])
    )  # the last one ends the file

    sizes: list[int] = []
    opened = dsjson._open

    class Spy:
        def __init__(self, p):
            self.f = opened(p)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def readline(self, size=-1):
            assert 0 < size <= limit + 1
            line = self.f.readline(size)
            sizes.append(len(line))
            return line

    monkeypatch.setattr(dsjson, "_open", Spy)
    with pytest.raises(LogError, match=f"^{path} line 2: line longer than {limit} bytes") as err:
        list(read_dsjson(path, dim=DIM))
    assert err.value.reason == "malformed"
    counts: dict[str, int] = {}
    ds = list(read_dsjson(path, dim=DIM, skip_bad=True, counts=counts))
    assert [d.source for d in ds] == [f"{path} line 1", f"{path} line 3"]
    assert counts == {"read": 2, "skipped": 2, "skipped_malformed": 2}
    assert max(sizes) <= limit + 1


def test_text_that_is_not_utf8_always_raises(tmp_path):
    path = tmp_path / "log.dsjson"
    path.write_bytes(
        _line(E1).encode() + b"\n" + _line(E2).encode().replace(b"Paris", b"Par\xefs") + b"\n"
    )
    for skip_bad in (False, True):
        with pytest.raises(LogError, match=f"^{path} line 2: not UTF-8") as err:
            list(read_dsjson(path, dim=DIM, skip_bad=skip_bad))
        assert err.value.reason == "file"


def test_a_corrupt_gzip_file_raises(tmp_path):
    path = tmp_path / "log.dsjson.gz"
    path.write_bytes(gzip.compress((_line(E1) + "\n").encode() * 50)[:-40])  # truncated
    with pytest.raises(LogError) as err:
        list(read_dsjson(path, dim=DIM, skip_bad=True))
    assert err.value.reason == "file"


def test_too_many_crosses_are_refused(monkeypatch):
    monkeypatch.setattr(dsjson, "MAX_CROSSES", 29)  # E1: 5 shared features times 6 action features
    with pytest.raises(LogError, match="crosses") as err:
        parse_line(_line(E1), dim=DIM)
    assert err.value.reason == "features"
    assert parse_line(_line(E1), dim=DIM, interactions=False).action == 1


def test_arguments_are_checked_before_the_file_is_opened(tmp_path):
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="dim"):
            read_dsjson(tmp_path / "missing.dsjson", dim=bad)
    with pytest.raises(ValueError, match="model_key"):
        read_dsjson(tmp_path / "missing.dsjson", dim=DIM, model_key="")
