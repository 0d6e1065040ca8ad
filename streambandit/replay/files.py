"""Readers and a writer for logged decisions on disk: CSV (with an arm catalog or inline
features) and Avro object container files. Formats: docs/replay_formats.md.

Every decision goes through :func:`streambandit.replay.logged.validate`. By default the first bad
row or record raises :class:`LogError` naming the file, the row (or record) number and what is
wrong. With ``skip_bad=True`` bad rows are skipped instead; pass a ``counts`` dict to learn how
many: the readers add to ``counts["read"]`` (decisions yielded), ``counts["skipped"]`` and
``counts["skipped_<reason>"]`` (reason codes of :class:`LogError`). Problems with a whole file
(missing header columns, a bad catalog, a file that is not Avro, a corrupt block) always raise.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import fastavro
import numpy as np

from streambandit.replay import avro_log, csv_columnar
from streambandit.replay.featurize import (
    COMBINE_RULES,
    check_hash_dim,
    encode_columns,
    hash_features,
)
from streambandit.replay.featurize import combine as combine_features
from streambandit.replay.logged import LogError, LoggedDecision, validate
from streambandit.wire import features_to_bytes
from streambandit.wire.schemas import SCHEMA_DIR

__all__ = [
    "read_csv",
    "read_catalog",
    "read_avro",
    "write_avro",
    "read_target_probs",
    "LOGGED_DECISION_SCHEMA",
    "CSV_COLUMNS",
    "PROBS_PREFIX",
    "ReadShare",
]

CSV_COLUMNS = ("timestamp_ms", "event_id", "model_key", "arm_ids", "action", "propensity", "reward")
_OPTIONAL = ("features", "decision_version", "context", "position", "slate_id")
PROBS_PREFIX = "probs:"  # a column "probs:NAME" holds external target NAME's probabilities
_FIELD_LIMIT = 2**31 - 1  # the largest the csv module accepts on every platform
_SCHEMA_PATH = SCHEMA_DIR / "logged_decision.avsc"
LOGGED_DECISION_SCHEMA = fastavro.parse_schema(json.loads(_SCHEMA_PATH.read_text()))

PathLike = str | os.PathLike


class ReadShare:
    """How much of its file a reader has read, for a progress bar: ``done`` of ``total`` bytes.
    A reader given one sets ``total`` when it opens the file and ``done`` every batch of rows."""

    __slots__ = ("total", "done")

    def __init__(self) -> None:
        self.total = 0
        self.done = 0

    @property
    def fraction(self) -> float | None:
        """The share read, None before the file is open (or when it is empty)."""
        return min(self.done / self.total, 1.0) if self.total else None

    def opened(self, f) -> None:
        self.total, self.done = os.fstat(f.fileno()).st_size, 0


_SHARE_EVERY = 4096  # rows between updates of a ReadShare


def _count(counts: dict | None, key: str) -> None:
    if counts is not None:
        counts[key] = counts.get(key, 0) + 1


def _skip(counts: dict | None, err: LogError) -> None:
    _count(counts, "skipped")
    _count(counts, f"skipped_{err.reason}")


# -- CSV ---------------------------------------------------------------------------------------


def _kept(
    parse: Callable[[], LoggedDecision], skip_bad: bool, counts: dict | None
) -> LoggedDecision | None:
    """``parse()``, counted as read; a bad record raises, or with ``skip_bad`` is counted by reason
    and gives None (both readers treat bad records this way)."""
    try:
        d = parse()
    except LogError as err:
        if not skip_bad:
            raise
        _skip(counts, err)
        return None
    _count(counts, "read")
    return d


def read_catalog(path: PathLike) -> dict[str, np.ndarray]:
    """An arm catalog: CSV with a header ``arm_id, f0, f1, ...`` (the feature columns' names are
    free, their order is the feature order), one row per arm. A column with any value that is
    not a number is categorical: one-hot over its distinct values, sorted (``featurize``). Any
    problem raises LogError."""
    try:
        return _read_catalog(path)
    except UnicodeDecodeError as exc:
        raise LogError(f"{path}: not UTF-8 text ({exc})", "catalog") from None
    except csv.Error as exc:
        raise LogError(f"{path}: malformed CSV ({exc})", "catalog") from None


def _read_catalog(path: PathLike) -> dict[str, np.ndarray]:
    where = str(path)
    arms: list[str] = []
    rows: list[list[str]] = []
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if not header or header[0].strip() != "arm_id" or len(header) < 2:
            raise LogError(f"{where}: a catalog needs a header 'arm_id, f0, f1, ...'", "catalog")
        d = len(header) - 1
        seen: set[str] = set()
        for i, row in enumerate(reader, start=1):
            if not row:
                continue
            at = f"{where} row {i} (line {reader.line_num})"
            if len(row) != d + 1:
                raise LogError(f"{at}: {len(row) - 1} features, the header has {d}", "catalog")
            arm = row[0].strip()
            if not arm or arm in seen:
                raise LogError(f"{at}: empty or duplicate arm id {arm!r}", "catalog")
            if any(not v.strip() for v in row[1:]):
                raise LogError(f"{at}: an empty feature value", "catalog")
            seen.add(arm)
            arms.append(arm)
            rows.append(row[1:])
    if not arms:
        raise LogError(f"{where}: the catalog has no arms", "catalog")
    try:
        matrix, _ = encode_columns([h.strip() for h in header[1:]], rows)
    except ValueError as exc:
        raise LogError(f"{where}: {exc}", "catalog") from None
    return {arm: matrix[j] for j, arm in enumerate(arms)}


def _parse_inline(text: str, k: int, where: str) -> np.ndarray:
    arms = text.split("|")
    if len(arms) != k:
        raise LogError(f"{where}: features give {len(arms)} arms, arm_ids has {k}", "features")
    try:
        rows = [[float(v) for v in arm.split()] for arm in arms]
    except ValueError:
        shown = text if len(text) <= 200 else text[:200] + f"... ({len(text)} characters)"
        raise LogError(f"{where}: non-numeric value in features {shown!r}", "features") from None
    d = len(rows[0])
    if d == 0 or any(len(r) != d for r in rows):
        raise LogError(
            f"{where}: wrong feature count: arms have {[len(r) for r in rows]} values", "features"
        )
    return np.array(rows, dtype=np.float64)


def _parse_probs(text: str, k: int, where: str, name: str) -> np.ndarray:
    parts = text.split("|")
    if len(parts) != k:
        raise LogError(
            f"{where}: target {name!r}: {len(parts)} probabilities for {k} arms", "target"
        )
    try:
        return np.array([float(v) for v in parts], dtype=np.float64)
    except ValueError:
        raise LogError(
            f"{where}: target {name!r}: non-numeric probability in {text[:200]!r}", "target"
        ) from None


def _parse_context(text: str, hash_dim: int, where: str) -> np.ndarray:
    """A row's context: numbers in order, then ``name=value`` tokens hashed into ``hash_dim``."""
    numbers, named = [], []
    for token in text.split():
        try:
            numbers.append(float(token))
        except ValueError:
            named.append((token, 1.0))
    if named and hash_dim < 1:
        raise LogError(f"{where}: categorical context {named[0][0]!r} needs --hash-dim", "features")
    if not numbers and not named:
        raise LogError(f"{where}: empty context", "features")
    u = np.array(numbers, dtype=np.float64)
    return np.concatenate([u, hash_features(named, hash_dim)]) if hash_dim else u


class _Shape:
    """How rows become decisions beyond the fixed columns (read_csv's options)."""

    def __init__(self, rule: str, hash_dim: int, targets: list[str]) -> None:
        self.rule, self.hash_dim, self.targets = rule, hash_dim, targets
        self.context_dim: int | None = None  # every row's context has the first row's length


def _parse_row(
    row: dict,
    catalog: dict[str, np.ndarray] | None,
    where: str,
    shape: _Shape,
    inline_features: np.ndarray | None = None,
) -> LoggedDecision:
    """``inline_features``: the row's inline features already parsed (the columnar reader's),
    of as many arms as ``arm_ids`` has; ``row["features"]`` is then not read."""
    if None in row or None in row.values():
        raise LogError(f"{where}: malformed row: wrong number of fields", "malformed")
    try:
        ts = int(row["timestamp_ms"].strip())
    except ValueError:
        raise LogError(
            f"{where}: malformed timestamp_ms {row['timestamp_ms']!r}", "malformed"
        ) from None
    event_id = row["event_id"].strip()
    if not event_id:
        raise LogError(f"{where}: malformed row: empty event_id", "malformed")
    arm_ids = tuple(map(str.strip, row["arm_ids"].split("|")))
    if "" in arm_ids:
        raise LogError(f"{where}: empty arm id in arm_ids {row['arm_ids']!r}", "arms")
    action_id = row["action"].strip()
    try:
        action = arm_ids.index(action_id)
    except ValueError:
        raise LogError(
            f"{where}: action {action_id!r} is not among the arms {list(arm_ids)}", "action"
        ) from None
    ptext = row["propensity"].strip()
    if not ptext:
        raise LogError(f"{where}: missing propensity", "propensity")
    try:
        propensity = float(ptext)
    except ValueError:
        raise LogError(f"{where}: propensity {ptext!r} is not a number", "propensity") from None
    try:
        reward = float(row["reward"].strip())
    except ValueError:
        raise LogError(f"{where}: reward {row['reward']!r} is not a number", "reward") from None
    inline = "" if inline_features is not None else (row.get("features") or "").strip()
    context = (row.get("context") or "").strip()
    if inline or inline_features is not None:
        if context:
            raise LogError(
                f"{where}: both inline features and a context (a context goes with a catalog)",
                "features",
            )
        features = (
            inline_features
            if inline_features is not None
            else _parse_inline(inline, len(arm_ids), where)
        )
    elif catalog is not None:
        missing = [a for a in arm_ids if a not in catalog]
        if missing:
            raise LogError(f"{where}: unknown arm ids {missing} (not in the catalog)", "catalog")
        features = np.stack([catalog[a] for a in arm_ids])
        if context:
            u = _parse_context(context, shape.hash_dim, where)
            if shape.context_dim is None:
                shape.context_dim = u.shape[0]
            elif u.shape[0] != shape.context_dim:
                raise LogError(
                    f"{where}: a context of {u.shape[0]} features, earlier rows had {shape.context_dim}",
                    "features",
                )
            features = combine_features(u, features, shape.rule)
    else:
        raise LogError(f"{where}: no inline features and no catalog", "features")
    ptext = (row.get("position") or "").strip()
    try:
        position = int(ptext) if ptext else -1
    except ValueError:
        raise LogError(f"{where}: position {ptext!r} is not an integer", "position") from None
    external = tuple(
        (name, _parse_probs(row[PROBS_PREFIX + name].strip(), len(arm_ids), where, name))
        for name in shape.targets
        if row[PROBS_PREFIX + name].strip()
    )
    vtext = (row.get("decision_version") or "").strip()
    try:
        version = int(vtext) if vtext else -1
    except ValueError:
        raise LogError(f"{where}: malformed decision_version {vtext!r}", "malformed") from None
    d = LoggedDecision(
        ts,
        event_id,
        row["model_key"].strip(),
        arm_ids,
        features,
        action,
        propensity,
        reward,
        version,
        where,
        position,
        (row.get("slate_id") or "").strip(),
        external,
    )
    return validate(d, where)


def _csv_decision(
    row: dict | csv.Error, cat: dict[str, np.ndarray] | None, at: str, shape: _Shape
) -> LoggedDecision:
    if isinstance(row, csv.Error):
        raise LogError(f"{at}: malformed row ({row})", "malformed")
    return _parse_row(row, cat, at, shape)


def _columnar_decision(
    r: csv_columnar.Row, cat: dict[str, np.ndarray] | None, at: str, shape: _Shape
) -> LoggedDecision:
    if r.features_text is not None:
        r.fields["features"] = r.features_text
    return _parse_row(r.fields, cat, at, shape, r.features)


def read_csv(
    path: PathLike,
    catalog: PathLike | dict[str, np.ndarray] | None = None,
    *,
    skip_bad: bool = False,
    counts: dict[str, int] | None = None,
    combine: str = "outer",
    hash_dim: int = 0,
    share: ReadShare | None = None,
    columnar: bool | None = None,
) -> Iterator[LoggedDecision]:
    """Logged decisions from a CSV file (docs/replay_formats.md), in file order.

    ``catalog``: a catalog file (see :func:`read_catalog`) or an already read ``{arm_id: (d,)}``
    dict, used for rows with no inline ``features``. A row's ``context`` (numbers, and
    ``name=value`` tokens hashed into ``hash_dim`` features) is combined with its arms' catalog
    features by the rule ``combine`` (``featurize``). ``position`` and ``slate_id`` make a row a
    slot of a slate; each ``probs:NAME`` column holds external target NAME's probabilities.
    Rows are numbered from 1 after the header. ``share``: how much of the file is read.

    ``columnar``: read the rows with Arrow's CSV reader and parse inline features in bulk
    (:mod:`streambandit.replay.csv_columnar`; the same decisions and errors, several times
    faster); None (the default) does when pyarrow is installed, False never does.
    """
    if combine not in COMBINE_RULES:
        raise ValueError(f"unknown combining rule {combine!r}; known: {', '.join(COMBINE_RULES)}")
    check_hash_dim(hash_dim, "hash_dim", allow_zero=True)
    cat = read_catalog(catalog) if isinstance(catalog, (str, os.PathLike)) else catalog
    where = str(path)
    # Python's csv refuses a field over 131,072 characters by default; a row of a thousand arms'
    # inline features is longer. Memory is the only limit on a row.
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    with open(path, newline="", encoding="utf-8") as f:
        if share is not None:
            share.opened(f)
        reader = csv.DictReader(f, skipinitialspace=True)
        try:
            fieldnames = reader.fieldnames or []
        except UnicodeDecodeError as exc:
            raise LogError(f"{where}: not UTF-8 text ({exc})", "file") from None
        except csv.Error as exc:
            raise LogError(f"{where}: unreadable CSV header ({exc})", "file") from None
        header = [h.strip() for h in fieldnames]
        missing = [c for c in CSV_COLUMNS if c not in header]
        if missing:
            raise LogError(f"{where}: header lacks the columns {missing}", "file")
        reader.fieldnames = header
        if cat is None and "features" not in header:
            raise LogError(f"{where}: no 'features' column and no catalog", "file")
        targets = [h[len(PROBS_PREFIX) :] for h in header if h.startswith(PROBS_PREFIX)]
        if any(not t for t in targets) or len(set(targets)) != len(targets):
            raise LogError(
                f"{where}: each '{PROBS_PREFIX}NAME' column needs its own non-empty NAME", "file"
            )
        shape = _Shape(combine, hash_dim, targets)
        i = 0
        if columnar is None:
            columnar = csv_columnar.AVAILABLE
        elif columnar and not csv_columnar.AVAILABLE:
            raise ValueError("columnar=True needs pyarrow: pip install 'streambandit[arrow]'")
        # The columnar reader numbers lines as rows + 1: a header of one line, unique names.
        if columnar and reader.line_num == 1 and len(set(header)) == len(header):
            rows = csv_columnar.read_rows(path, header, _FIELD_LIMIT, share, _SHARE_EVERY)
            while True:
                try:
                    r = next(rows)
                except StopIteration as done:
                    given = done.value
                    break
                i += 1
                at = f"{where} row {i} (line {i + 1})"
                d = _kept(lambda: _columnar_decision(r, cat, at, shape), skip_bad, counts)
                if d is not None:
                    yield d
            if given is None:
                return
            # What the columnar reader handed over, the csv module reads from the next row.
            for _ in range(given):
                next(reader)
        while True:
            i += 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # e.g. a field over csv.field_size_limit(), a NUL byte
                row = exc
            except UnicodeDecodeError as exc:
                raise LogError(f"{where}: not UTF-8 text, near row {i} ({exc})", "file") from None
            if share is not None and i % _SHARE_EVERY == 0:
                share.done = f.buffer.tell()
            at = f"{where} row {i} (line {reader.line_num})"
            d = _kept(lambda: _csv_decision(row, cat, at, shape), skip_bad, counts)
            if d is not None:
                yield d


def read_target_probs(path: PathLike) -> dict[str, np.ndarray]:
    """An external target's probabilities from a side file: CSV with the header
    ``event_id,probs``, ``probs`` the target's probability of each of the event's arms, in the
    log's arm order, separated by ``|`` (for a slate's row: at that row's slot). Every problem
    (a duplicate event id, a value that is not a number, probabilities that are not a
    distribution) raises LogError naming the row; the count of arms is checked against the log
    when it is read."""
    where = str(path)
    out: dict[str, np.ndarray] = {}
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = [h.strip() for h in next(reader, [])]
            if header[:2] != ["event_id", "probs"]:
                raise LogError(
                    f"{where}: a target's probabilities need the header 'event_id,probs'", "file"
                )
            for i, row in enumerate(reader, start=1):
                if not row:
                    continue
                at = f"{where} row {i} (line {reader.line_num})"
                if len(row) != 2 or not row[0].strip():
                    raise LogError(f"{at}: expected 'event_id,probs'", "malformed")
                event_id = row[0].strip()
                if event_id in out:
                    raise LogError(f"{at}: duplicate event id {event_id!r}", "duplicate")
                probs = _parse_probs(row[1].strip(), len(row[1].split("|")), at, Path(path).stem)
                if not (
                    np.isfinite(probs).all()
                    and probs.min() >= 0
                    and abs(float(probs.sum()) - 1.0) <= 1e-6
                ):
                    raise LogError(
                        f"{at}: the probabilities are not a distribution (>= 0, summing to 1)",
                        "target",
                    )
                out[event_id] = probs
    except UnicodeDecodeError as exc:
        raise LogError(f"{where}: not UTF-8 text ({exc})", "file") from None
    except csv.Error as exc:
        raise LogError(f"{where}: malformed CSV ({exc})", "file") from None
    return out


# -- Avro --------------------------------------------------------------------------------------


def _to_record(d: LoggedDecision) -> dict:
    return {
        "timestamp_ms": int(d.timestamp_ms),
        "event_id": d.event_id,
        "model_key": d.model_key,
        "arm_ids": list(d.arm_ids),
        "dim": int(d.features.shape[1]),
        "features": features_to_bytes(d.features),
        "action": int(d.action),
        "propensity": float(d.propensity),
        "reward": float(d.reward),
        "decision_version": int(d.decision_version),
    }


def write_avro(path: PathLike, decisions: Iterable[LoggedDecision], *, codec: str = "null") -> int:
    """Write ``decisions`` to an Avro object container file; returns how many. Each decision is
    validated first (a bad one raises LogError; the file is then incomplete). ``codec``: any
    fastavro codec, e.g. ``"deflate"``."""
    n = 0

    def records() -> Iterator[dict]:
        nonlocal n
        for d in decisions:
            n += 1
            yield _to_record(validate(d, f"decision {n} written to {path}"))

    with open(path, "wb") as f:
        fastavro.writer(f, LOGGED_DECISION_SCHEMA, records(), codec=codec)
    return n


def _from_record(r: dict, where: str) -> LoggedDecision:
    try:
        arm_ids = tuple(r["arm_ids"])
        k, dim, raw = len(arm_ids), int(r["dim"]), r["features"]
        if dim < 1 or len(raw) != 8 * k * dim:
            raise LogError(
                f"{where}: wrong feature count: {len(raw)} bytes for {k} arms of dimension {dim}",
                "features",
            )
        features = np.frombuffer(raw, dtype="<f8").astype(np.float64).reshape(k, dim)
        d = LoggedDecision(
            int(r["timestamp_ms"]),
            r["event_id"],
            r["model_key"],
            arm_ids,
            features,
            int(r["action"]),
            r["propensity"],
            r["reward"],
            int(r.get("decision_version", -1)),
            where,
        )
    except (KeyError, TypeError) as exc:
        raise LogError(f"{where}: malformed record ({exc!r})", "malformed") from None
    return validate(d, where)


def read_avro(
    path: PathLike,
    *,
    skip_bad: bool = False,
    counts: dict[str, int] | None = None,
    share: ReadShare | None = None,
) -> Iterator[LoggedDecision]:
    """Logged decisions from an Avro container file written with the LoggedDecision schema (or
    a compatible one), in file order. Records are numbered from 1. ``share``: how much of the
    file is read."""
    where = str(path)
    with open(path, "rb") as f:
        if share is None:
            yield from _read_avro(f, where, skip_bad, counts)
            return
        share.opened(f)
        for i, d in enumerate(_read_avro(f, where, skip_bad, counts), start=1):
            if i % _SHARE_EVERY == 0:
                share.done = f.tell()
            yield d
        share.done = share.total


def _read_avro(f, where: str, skip_bad: bool, counts: dict | None) -> Iterator[LoggedDecision]:
    """read_avro's decisions from the open file ``f``."""
    try:
        blocks = fastavro.block_reader(f)
    except Exception as exc:  # fastavro raises ValueError, EOFError, ... on a non-Avro file
        raise LogError(f"{where}: not an Avro container file ({exc})", "file") from None
    if avro_log.fits_schema(blocks.writer_schema, LOGGED_DECISION_SCHEMA):
        yield from avro_log.read_blocks(
            blocks, where, counts, lambda parse: _kept(parse, skip_bad, counts), _from_record
        )
        return
    f.seek(0)
    reader = fastavro.reader(f)
    i = 0
    while True:
        try:
            r = next(reader)
        except StopIteration:
            return
        except Exception as exc:
            raise LogError(f"{where}: corrupt data after record {i} ({exc!r})", "file") from None
        i += 1
        d = _kept(lambda: _from_record(r, f"{where} record {i}"), skip_bad, counts)
        if d is not None:
            yield d
