"""A reader for the Open Bandit Dataset (OBD; Saito et al. 2020, "Open Bandit Dataset and
Pipeline", logs of ZOZOTOWN's fashion recommendations) as :class:`LoggedDecision` objects.

Layout, as ``obp.dataset.OpenBanditDataset`` reads it: ``<root>/<behavior_policy>/<campaign>/``
holds ``<campaign>.csv`` (the log) and ``item_context.csv`` (the items). ``path`` is that
campaign directory, or the log CSV itself with ``item_context.csv`` beside it.

- The log's first column is an index (unnamed in the released files; whatever its name, it is
  the index, as for obp's ``index_col=0``), then ``timestamp, item_id, position, click,
  propensity_score, user_feature_0..3, user-item_affinity_0..K-1``.
- ``item_context.csv``: an index, ``item_id``, ``item_feature_0`` (a number) and
  ``item_feature_1..3`` (categories anonymized as hex hash strings). Columns are found by name;
  every ``item_feature_*`` column is used, in file order.

One decision per log row, in file order (the released files are sorted by timestamp, the order
obp sorts them in; this reader does not sort):

- ``arm_ids``: every item of ``item_context.csv``, as the text of its integer ``item_id``, in
  increasing item_id order; K is their number. ``action`` is the index of the row's item_id in
  ``arm_ids`` (OBD's ids are 0..K-1, so it equals the item_id, as obp's action does).
- ``position``: the CSV's 1-based ``position`` minus 1 (OBD's 1, 2, 3 are the left, center and
  right slots). obp takes a dense rank of the column instead, which is the same when every
  position occurs in the file. It must be a slot in ``[0, K)`` (CSV ``1..K``).
- ``propensity``: ``propensity_score``, the probability that the logging policy showed that
  item at that position (a marginal per slot, not the slate's probability; OBD's README calls it
  ``action_prob``). ``reward``: ``click``, which must be 0 or 1.
- ``slate_id``: none. OBD has no impression id (the rows of one impression mostly carry
  timestamps microseconds to milliseconds apart) and gives each item's probability per slot,
  not the slate's, so its rows are evaluated slot by slot (the independent per-position
  estimators); the cascade estimator needs a log with slate ids (docs/replay_formats.md).
- ``timestamp_ms``: the timestamp (ISO 8601, e.g. ``2019-11-24 00:00:43.640683+00:00``; UTC when
  it has no offset) in whole milliseconds since the Unix epoch, rounded down. ``event_id``: the
  index column's text, the row's id in the file. ``decision_version``: -1 (unknown).
  ``source``: ``"<csv path> row i (line n)"``, rows numbered from 1 after the header, blank lines
  skipped; ``model_key``: the argument.

Features (:mod:`streambandit.replay.featurize`; obp's own preprocessing, dummy user columns and
label-encoded item categories, is not reproduced):

- items: :func:`~streambandit.replay.featurize.encode_columns` of the ``item_feature_*`` columns
  over all items (numeric columns kept, the others one-hot over their sorted distinct values),
  read once, before the log;
- user: :func:`~streambandit.replay.featurize.hash_features` of ``("<column>=<value>", 1.0)``
  for each ``user_feature_*`` column of the row (an empty value adds nothing) into ``user_dim``
  buckets;
- arm vectors: ``featurize.combine(user, items, combine)`` (``outer`` or ``concat``); with
  ``affinity=True`` one more column is appended: for the arm of item ``j``, the row's
  ``user-item_affinity_<j>`` (a click-history score obp's default context leaves out).
  :func:`obd_dim` gives their dimension, ``combined_dim(user_dim, item columns, combine)``
  ``+ 1`` with affinity.

Errors, as :func:`streambandit.replay.files.read_csv`'s: bad arguments raise ValueError at the
call; a missing file or column raises :class:`LogError` (reason ``file``), a bad
``item_context.csv`` one with reason ``catalog``, both at the call, except the log's header,
checked when iteration starts. A bad row raises LogError naming the file, row and line, with the
reason ``malformed`` (field count, index, timestamp), ``catalog`` (an item_id not in
``item_context.csv``), ``position``, ``propensity``, ``reward`` or ``features`` (an affinity
value), and every decision passes :func:`~streambandit.replay.logged.validate`. With
``skip_bad=True`` bad rows are skipped and counted in ``counts`` (``read``, ``skipped``,
``skipped_<reason>``). The log is read in one pass; memory is the item table's and up to 64 MB of arm vectors
shared by the rows of the same user values.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from streambandit.replay import featurize
from streambandit.replay.files import _FIELD_LIMIT, _SHARE_EVERY, PathLike, ReadShare, _kept
from streambandit.replay.logged import LogError, LoggedDecision, validate

__all__ = ["read_obd", "obd_dim", "OBD_COLUMNS", "ITEM_CONTEXT"]

OBD_COLUMNS = ("timestamp", "item_id", "position", "click", "propensity_score")
ITEM_CONTEXT = "item_context.csv"
_USER_PREFIX = "user_feature_"
_ITEM_PREFIX = "item_feature_"
_AFFINITY_PREFIX = "user-item_affinity_"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_SHARED_FLOATS = 8_000_000  # arm vector values kept for rows of the same user values (64 MB)


@dataclasses.dataclass(frozen=True)
class _Items:
    """The arms: ``item_context.csv`` read once."""

    arm_ids: tuple[str, ...]
    index: dict[int, int]  # item_id -> arm index
    features: np.ndarray  # (K, c)


@dataclasses.dataclass(frozen=True)
class _Columns:
    """Where the log's columns are, by index in a row."""

    width: int
    named: dict[str, int]
    user: tuple[tuple[str, int], ...]  # (column name, index)
    affinity: tuple[int, ...] | None  # per arm, in arm order


# -- paths and items -------------------------------------------------------------------------------


def _paths(path: PathLike) -> tuple[Path, Path]:
    """The log CSV and its item_context.csv."""
    p = Path(path)
    log = p / f"{p.resolve().name}.csv" if p.is_dir() else p
    items = log.parent / ITEM_CONTEXT
    for f in (log, items):
        if not f.is_file():
            raise LogError(
                f"{f}: no such file (an OBD campaign directory holds <campaign>.csv and {ITEM_CONTEXT})",
                "file",
            )
    return log, items


def _read_header(reader, where: str) -> list[str]:
    try:
        header = next(reader, None)
    except UnicodeDecodeError as exc:
        raise LogError(f"{where}: not UTF-8 text ({exc})", "file") from None
    except csv.Error as exc:
        raise LogError(f"{where}: unreadable CSV header ({exc})", "file") from None
    if not header:
        raise LogError(f"{where}: empty file, no header", "file")
    return [h.strip() for h in header]


def _read_items(path: Path) -> _Items:
    where = str(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = _read_header(reader, where)
            rows = [r for r in reader if r]
    except UnicodeDecodeError as exc:
        raise LogError(f"{where}: not UTF-8 text ({exc})", "catalog") from None
    except csv.Error as exc:
        raise LogError(f"{where}: malformed CSV ({exc})", "catalog") from None
    if "item_id" not in header[1:]:
        raise LogError(f"{where}: header lacks the column 'item_id'", "file")
    id_col = header.index("item_id", 1)
    feature_cols = [j for j, h in enumerate(header) if j > 0 and h.startswith(_ITEM_PREFIX)]
    if not feature_cols:
        raise LogError(f"{where}: header has no '{_ITEM_PREFIX}*' columns", "file")
    if not rows:
        raise LogError(f"{where}: no items", "catalog")
    by_id: dict[int, list[str]] = {}
    for i, row in enumerate(rows, start=1):
        at = f"{where} item row {i}"
        if len(row) != len(header):
            raise LogError(f"{at}: {len(row)} fields, the header has {len(header)}", "catalog")
        try:
            item_id = int(row[id_col])
        except ValueError:
            raise LogError(f"{at}: item_id {row[id_col]!r} is not an integer", "catalog") from None
        if item_id in by_id:
            raise LogError(f"{at}: duplicate item_id {item_id}", "catalog")
        values = [row[j].strip() for j in feature_cols]
        # An empty cell would silently turn a numeric column into a one-hot over its values.
        if not all(values):
            raise LogError(f"{at}: empty item feature", "catalog")
        by_id[item_id] = values
    ids = sorted(by_id)
    try:
        features, _ = featurize.encode_columns(
            [header[j] for j in feature_cols], [by_id[i] for i in ids]
        )
    except ValueError as exc:  # a numeric column with a NaN or an infinity
        raise LogError(f"{where}: {exc}", "catalog") from None
    return _Items(tuple(str(i) for i in ids), {item: a for a, item in enumerate(ids)}, features)


def _check_args(user_dim: int, combine: str) -> None:
    featurize.check_hash_dim(user_dim, "user_dim")
    featurize.combined_dim(user_dim, 1, combine)  # raises ValueError for an unknown rule


def _dim(items: _Items, user_dim: int, combine: str, affinity: bool) -> int:
    return featurize.combined_dim(user_dim, items.features.shape[1], combine) + int(bool(affinity))


def obd_dim(
    path: PathLike, *, user_dim: int = 16, combine: str = "outer", affinity: bool = False
) -> int:
    """The dimension of the arm vectors :func:`read_obd` gives with these options (for the model
    configuration); reads ``item_context.csv`` only."""
    _check_args(user_dim, combine)
    return _dim(_read_items(_paths(path)[1]), user_dim, combine, affinity)


# -- the log ---------------------------------------------------------------------------------------


def _columns(header: list[str], items: _Items, affinity: bool, where: str) -> _Columns:
    named: dict[str, int] = {}
    for j, h in enumerate(header[1:], start=1):
        named.setdefault(h, j)
    missing = [c for c in OBD_COLUMNS if c not in named]
    if missing:
        raise LogError(f"{where}: header lacks the columns {missing}", "file")
    user = tuple((h, j) for h, j in named.items() if h.startswith(_USER_PREFIX))
    if not user:
        raise LogError(f"{where}: header has no '{_USER_PREFIX}*' columns", "file")
    aff = None
    if affinity:
        names = [f"{_AFFINITY_PREFIX}{a}" for a in items.arm_ids]
        absent = [n for n in names if n not in named]
        if absent:
            raise LogError(
                f"{where}: affinity=True but the header lacks the columns {absent}", "file"
            )
        aff = tuple(named[n] for n in names)
    return _Columns(len(header), named, user, aff)


def _timestamp_ms(text: str, where: str) -> int:
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise LogError(f"{where}: malformed timestamp {text!r}", "malformed") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // _MS


def _action(text: str, items: _Items, where: str) -> int:
    try:
        return items.index[int(text)]
    except (ValueError, KeyError):
        raise LogError(
            f"{where}: item_id {text!r} is not an item of {ITEM_CONTEXT}", "catalog"
        ) from None


def _position(text: str, k: int, where: str) -> int:
    try:
        p = int(text)
    except ValueError:
        raise LogError(f"{where}: position {text!r} is not an integer", "position") from None
    if not 1 <= p <= k:
        raise LogError(
            f"{where}: position {p} is not a slot in 1..{k} (OBD's positions count from 1)",
            "position",
        )
    return p - 1


def _propensity(text: str, where: str) -> float:
    if not text:
        raise LogError(f"{where}: missing propensity_score", "propensity")
    try:
        return float(text)
    except ValueError:
        raise LogError(
            f"{where}: propensity_score {text!r} is not a number", "propensity"
        ) from None


def _click(text: str, where: str) -> float:
    try:
        r = float(text)
    except ValueError:
        raise LogError(f"{where}: click {text!r} is not a number", "reward") from None
    if r not in (0.0, 1.0):
        raise LogError(f"{where}: click {text!r} is not 0 or 1", "reward")
    return r


def _affinities(row: list[str], cols: tuple[int, ...], where: str) -> np.ndarray:
    out = np.empty(len(cols))
    for a, j in enumerate(cols):
        try:
            out[a] = float(row[j])
        except ValueError:
            raise LogError(f"{where}: affinity {row[j]!r} is not a number", "features") from None
        if not math.isfinite(out[a]):
            raise LogError(f"{where}: non-finite affinity {row[j]!r}", "features")
    return out


@dataclasses.dataclass(frozen=True)
class _Options:
    model_key: str
    user_dim: int
    combine: str


def _dim_of(shared: dict[tuple[str, ...], np.ndarray]) -> int:
    return next(iter(shared.values())).shape[1] if shared else 0


def _arms(row: list[str], cols: _Columns, items: _Items, opt: _Options) -> np.ndarray:
    """The row's arm vectors: its hashed user features combined with the items'."""
    user = featurize.hash_features(
        ((f"{name}={row[j].strip()}", 1.0) for name, j in cols.user if row[j].strip()), opt.user_dim
    )
    return featurize.combine(user, items.features, opt.combine)


def _decision(
    row: list[str] | csv.Error,
    cols: _Columns,
    items: _Items,
    opt: _Options,
    where: str,
    shared: dict[tuple[str, ...], np.ndarray],
) -> LoggedDecision:
    if isinstance(row, csv.Error):
        raise LogError(f"{where}: malformed row ({row})", "malformed")
    if len(row) != cols.width:
        raise LogError(
            f"{where}: malformed row: {len(row)} fields, the header has {cols.width}", "malformed"
        )
    field = lambda name: row[cols.named[name]].strip()
    event_id = row[0].strip()
    if not event_id:
        raise LogError(f"{where}: malformed row: empty index (event id)", "malformed")
    stamp = field("timestamp")
    ts = _timestamp_ms(stamp, where)
    action = _action(field("item_id"), items, where)
    position = _position(field("position"), len(items.arm_ids), where)
    propensity = _propensity(field("propensity_score"), where)
    reward = _click(field("click"), where)
    arms_checked, user = False, None
    if cols.affinity is not None:
        x = np.column_stack((_arms(row, cols, items, opt), _affinities(row, cols.affinity, where)))
    else:
        # OBD's users have few distinct feature values (240 in the 10,000-row sample): rows
        # of the same values share one read-only matrix, which the replay also scores once per
        # model state (runner._Model.scores).
        user = tuple(row[j].strip() for _, j in cols.user)
        x = shared.get(user)
        if x is None:
            x = _arms(row, cols, items, opt)
            x.flags.writeable = False
        else:
            # A matrix shared with an earlier row that passed, and the catalog's arm ids: the
            # validation's scans of them (1.6 and 1.2 us a row at K = 80) are not repeated.
            arms_checked = True
    d = LoggedDecision(
        ts,
        event_id,
        opt.model_key,
        items.arm_ids,
        x,
        action,
        propensity,
        reward,
        -1,
        where,
        position=position,
    )
    validate(d, where, arms_checked=arms_checked)
    if user is not None and not arms_checked:  # shared only once it has passed
        if len(shared) * items.features.shape[0] * _dim_of(shared) >= _SHARED_FLOATS:
            shared.clear()
        shared[user] = x
    return d


def _stream(
    log: Path,
    items: _Items,
    opt: _Options,
    affinity: bool,
    skip_bad: bool,
    counts: dict[str, int] | None,
    share: ReadShare | None,
) -> Iterator[LoggedDecision]:
    where = str(log)
    # The csv module's limit is process-wide; keep it where read_csv sets it, so readers agree.
    csv.field_size_limit(max(csv.field_size_limit(), _FIELD_LIMIT))
    with open(log, newline="", encoding="utf-8") as f:
        if share is not None:
            share.opened(f)
        reader = csv.reader(f)
        cols = _columns(_read_header(reader, where), items, affinity, where)
        shared: dict[tuple[str, ...], np.ndarray] = {}
        i = 0
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # a NUL byte, an unterminated quote, ...
                row = exc
            except UnicodeDecodeError as exc:
                raise LogError(
                    f"{where}: not UTF-8 text, near row {i + 1} ({exc})", "file"
                ) from None
            if not row:
                continue
            i += 1
            if share is not None and i % _SHARE_EVERY == 0:
                share.done = f.buffer.tell()
            at = f"{where} row {i} (line {reader.line_num})"
            d = _kept(lambda: _decision(row, cols, items, opt, at, shared), skip_bad, counts)
            if d is not None:
                yield d


def read_obd(
    path: PathLike,
    *,
    model_key: str = "obd",
    user_dim: int = 16,
    combine: str = "outer",
    affinity: bool = False,
    skip_bad: bool = False,
    counts: dict[str, int] | None = None,
    share: ReadShare | None = None,
) -> Iterator[LoggedDecision]:
    """The decisions of an OBD log (module docstring), in file order.

    ``path``: a campaign directory (``<dir>/<dir name>.csv`` and ``item_context.csv``) or the log
    CSV with ``item_context.csv`` beside it. ``user_dim``: the hashed user vector's dimension;
    ``combine``: ``outer`` or ``concat``; ``affinity``: append each arm's user-item affinity;
    ``share``: how much of the log CSV is read.
    """
    if not model_key:
        raise ValueError("model_key must not be empty")
    _check_args(user_dim, combine)
    log, item_path = _paths(path)
    items = _read_items(item_path)
    opt = _Options(model_key, user_dim, combine)
    return _stream(log, items, opt, affinity, skip_bad, counts, share)
