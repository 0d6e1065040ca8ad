"""The compiled Avro log reader gives what fastavro's per-record reader gives: the same decisions
bit for bit, the same errors and the same counts of skipped records."""

from __future__ import annotations

import dataclasses

import fastavro
import numpy as np
import pytest

from streambandit.replay import avro_log
from streambandit.replay.files import LOGGED_DECISION_SCHEMA, _from_record, _to_record, read_avro
from streambandit.replay.logged import LogError, LoggedDecision


def _reference(path, skip_bad: bool) -> tuple[list, dict, str | None]:
    """fastavro.reader and _from_record, record by record: the reader before the compiled pass."""
    out, counts, error = [], {}, None
    with open(path, "rb") as f:
        for i, rec in enumerate(fastavro.reader(f), start=1):
            try:
                out.append(_from_record(rec, f"{path} record {i}"))
                counts["read"] = counts.get("read", 0) + 1
            except LogError as err:
                if not skip_bad:
                    return out, counts, str(err)
                counts["skipped"] = counts.get("skipped", 0) + 1
                key = f"skipped_{err.reason}"
                counts[key] = counts.get(key, 0) + 1
    return out, counts, error


def _read(path, skip_bad: bool) -> tuple[list, dict, str | None]:
    out: list = []
    counts: dict = {}
    try:
        for d in read_avro(path, skip_bad=skip_bad, counts=counts):
            out.append(d)
    except LogError as err:
        return out, counts, str(err)
    return out, counts, None


def _bits(d: LoggedDecision) -> tuple:
    fields = [getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "features"]
    return (
        repr(fields),
        d.features.shape,
        d.features.dtype,
        d.features.tobytes(),
        type(d.propensity),
        type(d.action),
    )


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 6))
        d = LoggedDecision(
            1_700_000_000_000 + i,
            f"ev-{i}",
            f"m{i % 3}",
            tuple(f"arm{j}" for j in range(k)),
            rng.normal(size=(k, 3)),
            int(rng.integers(k)),
            float(rng.uniform(1e-9, 1.0)),
            float(rng.normal()),
            int(rng.integers(-1, 1000)),
        )
        out.append(_to_record(d))
    return out


def _bad(recs: list[dict]) -> list[dict]:
    """Every kind of record the compiled pass refuses, spread over the log."""
    r = recs[0]
    bad = [
        dict(r, propensity=None),
        dict(r, propensity=1.5),
        dict(r, propensity=1e-13),
        dict(r, propensity=float("nan")),
        dict(r, action=99),
        dict(r, action=-1),
        dict(r, features=r["features"][:-8]),
        dict(r, dim=0),
        dict(r, features=np.full(len(r["features"]) // 8, np.inf).tobytes()),
        dict(r, reward=float("nan")),
        dict(r, event_id=""),
        dict(r, model_key=""),
        dict(r, arm_ids=[]),
        dict(r, arm_ids=["x", "x"], features=r["features"][:0] + bytes(16 * r["dim"])),
        dict(r, event_id="nul\x00inside"),
        dict(r, arm_ids=["é", "a\x00b"][: len(r["arm_ids"])] + ["z"] * (len(r["arm_ids"]) - 2)),
    ]
    out = list(recs)
    for j, b in enumerate(bad):
        out.insert(7 * j + 3, dict(b, event_id=b["event_id"] and f"bad-{j}-{b['event_id']}"))
    return out


@pytest.mark.parametrize("codec", ["null", "deflate"])
@pytest.mark.parametrize("skip_bad", [False, True])
def test_same_decisions_errors_and_counts_as_the_per_record_reader(tmp_path, codec, skip_bad):
    recs = _bad(_records(avro_log._BATCH_RECORDS + 500))  # more than a batch
    path = tmp_path / "log.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, LOGGED_DECISION_SCHEMA, recs, codec=codec, sync_interval=2000)
    got, want = _read(path, skip_bad), _reference(path, skip_bad)
    assert got[2] == want[2] and got[1] == want[1]
    assert [_bits(d) for d in got[0]] == [_bits(d) for d in want[0]]
    assert (
        (got[1].get("skipped", 0) >= 13) if skip_bad else got[2] is not None
    )  # all bad but 2 NULs


def test_a_corrupt_block_raises_after_the_records_before_it(tmp_path):
    path = tmp_path / "log.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, LOGGED_DECISION_SCHEMA, _records(300), sync_interval=1000)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))
    got, counts, error = _read(path, skip_bad=True)
    assert error is not None and "corrupt data after record" in error
    assert error.startswith(f"{path}: corrupt data after record {len(got)} ")
    assert 0 < len(got) < 300 and counts["read"] == len(got)


def test_another_layout_is_read_by_fastavro(tmp_path):
    """A compatible schema of other fields (no decision_version) takes the per-record path."""
    schema = {**LOGGED_DECISION_SCHEMA}
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "decision_version"]
    recs = [{k: v for k, v in r.items() if k != "decision_version"} for r in _records(20)]
    path = tmp_path / "old.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), recs)
    back = list(read_avro(path))
    assert len(back) == 20 and all(d.decision_version == -1 for d in back)
