"""Logged decisions from decision-service JSON (DSJSON): the contextual-bandit logs that Azure
Personalizer writes and Vowpal Wabbit reads with ``--dsjson --cb_explore_adf``.

**File.** One event per line (UTF-8; a byte-order mark before line 1 is allowed); blank lines
are ignored; a path ending ``.gz`` is read through gzip. Lines are numbered from 1, blank ones
included, and every decision's ``source`` is ``"<path> line <n>"``. A line over
:data:`MAX_LINE_BYTES` (16 MiB) is refused (``malformed``) without ever being held whole: it is
read in pieces of at most that size up to its newline, and never parsed.

**An event** (the shape Personalizer writes; VW's ``vowpalwabbit/json_parser``)::

    {"_label_cost":-1,"_label_probability":0.5,"_label_Action":2,"_labelIndex":1,
     "o":[...],"Timestamp":"2024-01-01T00:00:00.0000000Z","Version":"1","EventId":"abc",
     "a":[2,1],"c":{"User":{"id":"u1","age":0.3},
                    "_multi":[{"Action":{"id":"a1","price":1.5}},{"Action":{"id":"a2"}}]},
     "p":[0.5,0.5],"VWState":{"m":"..."}}

- **Arms**: the entries of ``c._multi``, in order; arm ``i``'s id is ``str(i)`` (DSJSON actions
  have no ids of their own: ``a`` and ``_label_Action`` number them from 1).
- **Action** (0-based): ``_labelIndex``; without it ``_label_Action - 1``. Both present and
  different is an error, and so is ``a[0] - 1`` differing from it when ``a`` is present (VW
  lists the chosen action first in ``a``). Indices are integers (``2.0`` is accepted); every
  entry of ``a`` must number an arm.
- **Propensity**: ``_label_probability``; without it ``p[0]``, which is the chosen action's only
  because ``p`` follows the order of ``a``, so that fallback needs ``a``.
- **Reward** ``= -_label_cost``: VW minimises cost and Personalizer logs ``cost = -reward``. An
  event without ``_label_cost`` (never rewarded) or with ``"_skipLearn": true`` (never
  activated; VW does not learn from it) is a ``reward`` error, skippable like any other.
- ``_label_`` suffixes are matched without regard to case, as VW does (``_label_Cost``); any other
  ``_label...`` key (continuous actions' ``_label_ca``, a text ``_label``) is ``malformed``.
- **Timestamp**: ``YYYY-MM-DDTHH:MM:SS[.f]`` then ``Z`` or ``+HH:MM``/``-HH:MM``, ``f`` 1 to 9
  digits (Personalizer writes 7), truncated to milliseconds; required.
- **EventId**: a non-empty string, required. ``model_key`` is the reader's argument and
  ``decision_version`` is -1 (unknown).
- Ignored: ``Version``, ``VWState``, ``o`` (Personalizer's reward observations, already joined
  into ``_label_cost``), ``_original_label_cost``, ``_ba``, ``pdrop`` and any unknown key.
  ``pdrop`` > 0 means the log kept each event with probability ``1 - pdrop`` (VW reweights by
  ``1 / (1 - pdrop)``); the decisions here are unweighted, which leaves mean estimates unbiased
  only when ``pdrop`` is the same for every event.
- Not supported: conditional-bandit and slates logs (``_slots`` or ``_outcomes``) and
  deduplicated actions (``__aid``): errors saying so.

**Features**, VW's JSON rules (``DefaultState``/``ArrayState`` in ``parse_example_json.cc``);
names are what ``vw --audit`` prints, ``namespace^feature``, bare in the default namespace:

- ``c``'s own keys (except ``_multi``) are the shared features, in the default namespace
  (VW's ``" "``); each ``_multi`` entry is one action's features, also from the default namespace.
- An object value is a namespace named by its key alone, however deeply it is nested (VW does
  not join the path: ``{"User": {"geo": {"city": "Paris"}}}`` gives ``geo^cityParis``).
- A number is the feature ``ns^key`` with that value; zero is dropped (as VW does).
- A string is the feature ``ns^key<value>`` (key and value joined) with value 1, the value's
  spaces, tabs, ``|`` and ``:`` turned into ``_`` (``"city": "New York"`` -> ``ns^cityNew_York``).
- ``true`` is ``ns^key`` with value 1; ``false`` and ``null`` give nothing.
- An array is a namespace named by its key: its i-th number is ``key^[i]`` (nulls are skipped and
  take no index; zeros take one and are dropped); an object in it adds its features to that
  namespace. Strings, booleans or arrays in an array are errors (VW refuses them).
- ``"_text": "a b"`` adds one feature per space- or tab-separated word (``:`` and ``|`` in it
  turned into ``_``), value 1, in the current namespace. ``_multi`` anywhere but the top of ``c``,
  ``_slots`` and ``__aid`` are errors; every other key starting with ``_`` (``_tag``, a
  ``_label...`` inside ``c``, ``_p``, ...) is ignored, value and all, as VW does.
- Values are read as float64 (VW reads float32); a non-finite one (``NaN``, ``1e400``) is a
  ``features`` error. VW's ``Constant`` feature is not added: it is the same for every arm.

**Arm vectors**: arm ``a``'s (dim,) vector is :func:`~streambandit.replay.featurize.hash_features`
of the shared features, arm ``a``'s own, and with ``interactions`` (the default) every product
``shared * own`` named ``"<shared name>*<own name>"`` (VW's audit name for a quadratic feature).
That is the shared-by-action part of VW's ``-q ::``; it leaves out shared x shared (the same for
every arm, so it cannot change a choice) and action x action. Without the crosses the shared
features add the same ``theta . x_shared`` to every arm, so a linear model cannot make its
choice depend on them (on the user): use ``interactions=False`` only when the actions' own
features already carry the context. A line whose crosses would number over
:data:`MAX_CROSSES` is refused (``features``) rather than hashed for minutes.

**Bad lines** raise :class:`LogError` naming the path and line, with a reason code:
``malformed`` (not JSON, not an object, no ``c`` object, bad Timestamp, unsupported label keys,
CCB/slates, over-long), ``arms`` (``_multi`` missing, empty or not objects), ``action``,
``propensity``, ``reward``, ``features``, ``event_id``; every decision then goes through
:func:`~streambandit.replay.logged.validate`. ``skip_bad`` and ``counts`` work as for
:func:`~streambandit.replay.files.read_csv`: ``counts["read"]``, ``counts["skipped"]`` and
``counts["skipped_<reason>"]``. Text that is not UTF-8 and an unreadable (corrupt) gzip stream are
``file`` errors and always raise.

Differences from VW: VW streams the line and applies the label when ``c`` ends, so the
``_label...`` keys must come before ``c`` there; here key order is free. VW silently drops lines
that do not start with ``{`` and events with no ``a``; here the first is ``malformed`` and the
second is read if ``_labelIndex`` or ``_label_Action`` names the action.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import BinaryIO, NoReturn

import numpy as np

from streambandit.replay.featurize import check_hash_dim, hash_features
from streambandit.replay.files import PathLike, _kept
from streambandit.replay.logged import LogError, LoggedDecision, validate

__all__ = ["read_dsjson", "parse_line", "rank_request_vectors", "MAX_LINE_BYTES", "MAX_CROSSES"]

MAX_LINE_BYTES = 16 * 2**20
# A few hundred shared features times a few thousand action features already take seconds to hash.
MAX_CROSSES = 1_000_000

Feature = tuple[str, float]

_LABEL_KEYS = {
    "_label_cost": "cost",
    "_label_probability": "probability",
    "_label_action": "action",
    "_labelindex": "index",
}
_VW_ESCAPE = str.maketrans({" ": "_", "\t": "_", "|": "_", ":": "_"})
_TIMESTAMP = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)", re.ASCII
)
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def read_dsjson(
    path: PathLike,
    *,
    dim: int,
    model_key: str = "dsjson",
    interactions: bool = True,
    skip_bad: bool = False,
    counts: dict[str, int] | None = None,
) -> Iterator[LoggedDecision]:
    """Logged decisions from a DSJSON file (module docstring), in file order, each with ``dim``
    hashed features per arm. ``dim`` and ``model_key`` are checked now (ValueError); the file is
    opened when iteration starts."""
    _check_arguments(dim, model_key)
    return _read(path, dim, model_key, interactions, skip_bad, counts)


def parse_line(
    line: str,
    *,
    dim: int,
    model_key: str = "dsjson",
    interactions: bool = True,
    where: str = "DSJSON line",
) -> LoggedDecision:
    """One DSJSON event (one line, as text) as a validated decision; a bad one raises
    :class:`LogError` whose message starts with ``where``, which is also the decision's source."""
    _check_arguments(dim, model_key)
    event = _load(line, where)
    context = event.get("c")
    if not isinstance(context, dict):
        raise LogError(f"{where}: no context: 'c' is missing or not an object", "malformed")
    _refuse_unsupported(event, context, where)
    labels = _labels(event, where)
    actions = _actions(context, where)
    action = _action(event, labels, len(actions), where)
    propensity = _propensity(event, labels, where)
    reward = _reward(event, labels, where)
    event_id = event.get("EventId")
    if not isinstance(event_id, str) or not event_id:
        raise LogError(f"{where}: 'EventId' is missing or not a non-empty string", "event_id")
    timestamp_ms = _timestamp_ms(event.get("Timestamp"), where)
    features = _arm_vectors(context, actions, dim, interactions, where)
    arm_ids = tuple(str(i) for i in range(len(actions)))
    d = LoggedDecision(
        timestamp_ms, event_id, model_key, arm_ids, features, action, propensity, reward, -1, where
    )
    return validate(d, where)


def rank_request_vectors(
    context_features: object, action_features: object, *, dim: int, interactions: bool = True
) -> np.ndarray:
    """The (K, dim) arm vectors of a Personalizer Rank request, hashed as :func:`read_dsjson`
    hashes a logged event: ``contextFeatures`` (a list of objects, merged) as the event's shared
    features (``c``), and each action's ``features`` (a list of objects, merged) as its ``_multi``
    entry. A model trained on a team's DSJSON logs thus decides live on the vectors it learned on.
    Raises :class:`LogError` (``features`` or ``malformed``) for what VW would refuse."""
    check_hash_dim(dim, "dim")
    context = _merged(context_features, "contextFeatures")
    if not isinstance(action_features, list) or not action_features:
        raise LogError("the request: no actions", "arms")
    own = [_merged(f, f"actions[{i}].features") for i, f in enumerate(action_features)]
    return _arm_vectors(context, own, dim, interactions, "the request")


def _merged(objects: object, what: str) -> dict:
    """A list of feature objects as one object (Personalizer sends features as such lists)."""
    if objects is None:
        return {}
    if not isinstance(objects, list) or not all(isinstance(o, dict) for o in objects):
        raise LogError(f"the request: {what} must be a list of objects", "malformed")
    out: dict = {}
    for o in objects:
        for key, value in o.items():
            if key in out:
                raise LogError(f"the request: {what} names {key!r} twice", "malformed")
            out[key] = value
    return out


def _check_arguments(dim: int, model_key: str) -> None:
    check_hash_dim(dim, "dim")
    if not model_key:
        raise ValueError("model_key must be a non-empty string")


# -- lines -------------------------------------------------------------------------------------


def _read(
    path: PathLike,
    dim: int,
    model_key: str,
    interactions: bool,
    skip_bad: bool,
    counts: dict[str, int] | None,
) -> Iterator[LoggedDecision]:
    name = str(path)
    with _open(path) as f:
        for n, raw in _lines(f, name):
            at = f"{name} line {n}"
            if raw is None:
                _kept(lambda: _too_long(at), skip_bad, counts)
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise LogError(f"{at}: not UTF-8 text ({exc})", "file") from None
            if n == 1:
                text = text.removeprefix("\ufeff")
            if not text.strip(" \t\r\n"):
                continue
            d = _kept(
                lambda: parse_line(
                    text, dim=dim, model_key=model_key, interactions=interactions, where=at
                ),
                skip_bad,
                counts,
            )
            if d is not None:
                yield d


def _open(path: PathLike) -> BinaryIO:
    if os.fspath(path).endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _lines(f: BinaryIO, name: str) -> Iterator[tuple[int, bytes | None]]:
    """``(number, bytes)`` of each line, ``None`` for one over MAX_LINE_BYTES. No read returns
    more than MAX_LINE_BYTES + 1 bytes, so a huge line never sits in memory whole."""
    limit = MAX_LINE_BYTES
    n = 0
    while True:
        raw = _readline(f, limit + 1, name, n)
        if not raw:
            return
        n += 1
        # Up to limit + 1 bytes with no newline is an over-long line, unless the file ended first.
        if len(raw) <= limit or raw.endswith(b"\n"):
            yield n, raw
            continue
        while (rest := _readline(f, limit + 1, name, n)) and not rest.endswith(b"\n"):
            pass
        yield n, None


def _readline(f: BinaryIO, size: int, name: str, n: int) -> bytes:
    try:
        return f.readline(size)
    except (
        OSError,
        EOFError,
        zlib.error,
    ) as exc:  # gzip: BadGzipFile, a truncated or corrupt stream
        raise LogError(f"{name}: unreadable after line {n} ({exc})", "file") from None


def _too_long(where: str) -> NoReturn:
    raise LogError(f"{where}: line longer than {MAX_LINE_BYTES} bytes, not read", "malformed")


# -- the event ---------------------------------------------------------------------------------


def _load(line: str, where: str) -> dict:
    try:
        event = json.loads(line)
    except (
        ValueError,
        RecursionError,
    ) as exc:  # ValueError: JSONDecodeError, an integer of over 4300 digits
        raise LogError(f"{where}: not JSON ({exc})", "malformed") from None
    if not isinstance(event, dict):
        raise LogError(f"{where}: not a JSON object", "malformed")
    return event


def _refuse_unsupported(event: dict, context: dict, where: str) -> None:
    if "_slots" in context or "_outcomes" in event:
        raise LogError(
            f"{where}: a conditional contextual bandit (CCB) or slates event (_slots/_outcomes): "
            "CCB/slates DSJSON is not supported, only one decision per event (CB)",
            "malformed",
        )


def _labels(event: dict, where: str) -> dict[str, object]:
    """The ``_label...`` keys by meaning (cost, probability, action, index); a later spelling of
    one (``_label_Cost`` after ``_label_cost``) wins, as in VW."""
    labels: dict[str, object] = {}
    for key, value in event.items():
        if not key.startswith("_label"):
            continue
        meaning = _LABEL_KEYS.get("_label" + key[6:].lower())
        if meaning is None:
            raise LogError(
                f"{where}: unsupported label key {key!r} (only _label_cost, _label_probability, "
                "_label_Action and _labelIndex: continuous-action logs are not supported)",
                "malformed",
            )
        labels[meaning] = value
    return labels


def _actions(context: dict, where: str) -> list[dict]:
    multi = context.get("_multi")
    if not isinstance(multi, list) or not multi:
        raise LogError(f"{where}: no actions: 'c._multi' is missing, empty or not an array", "arms")
    for i, entry in enumerate(multi):
        if not isinstance(entry, dict):
            raise LogError(f"{where}: action {i} in 'c._multi' is not an object", "arms")
    return multi


def _action(event: dict, labels: dict, k: int, where: str) -> int:
    index, label_action = labels.get("index"), labels.get("action")
    if index is None and label_action is None:
        raise LogError(
            f"{where}: no _labelIndex or _label_Action: the logged action is unknown", "action"
        )
    action = None if index is None else _integer(index, "_labelIndex", where)
    if label_action is not None:
        one_based = _integer(label_action, "_label_Action", where)
        if action is not None and one_based - 1 != action:
            raise LogError(
                f"{where}: _labelIndex {action} and _label_Action {one_based} disagree "
                "(_label_Action counts from 1)",
                "action",
            )
        action = one_based - 1
    if not 0 <= action < k:
        raise LogError(
            f"{where}: logged action index {action} is not among the {k} actions of c._multi",
            "action",
        )
    ranked = event.get("a")
    if ranked is not None:
        if not isinstance(ranked, list) or not ranked:
            raise LogError(f"{where}: 'a' is not a non-empty array of action numbers", "action")
        numbers = [_integer(x, "an entry of 'a'", where) for x in ranked]
        if any(not 1 <= x <= k for x in numbers):
            raise LogError(f"{where}: 'a' = {numbers} numbers actions outside 1..{k}", "action")
        if numbers[0] - 1 != action:
            raise LogError(
                f"{where}: 'a' starts with action {numbers[0]} but the label says {action + 1} "
                "(VW lists the chosen action first, counting from 1)",
                "action",
            )
    return action


def _integer(value: object, what: str, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise LogError(f"{where}: {what} {value!r} is not an integer", "action")


def _propensity(event: dict, labels: dict, where: str) -> float:
    p = labels.get("probability")
    if p is None:
        probs = event.get("p")
        if probs is None:
            raise LogError(f"{where}: no _label_probability and no 'p'", "propensity")
        if event.get("a") is None:
            raise LogError(
                f"{where}: no _label_probability, and without 'a' the order of 'p' is unknown",
                "propensity",
            )
        if not isinstance(probs, list) or not probs:
            raise LogError(f"{where}: 'p' is not a non-empty array", "propensity")
        p = probs[0]
    v = _number(p)
    if v is None:
        raise LogError(f"{where}: propensity {p!r} is not a number", "propensity")
    return v


def _reward(event: dict, labels: dict, where: str) -> float:
    if event.get("_skipLearn") is True:
        raise LogError(
            f"{where}: _skipLearn is true (an event never activated: no reward, VW does not learn "
            "from it)",
            "reward",
        )
    cost = labels.get("cost")
    if cost is None:
        raise LogError(f"{where}: no _label_cost: the event was never rewarded", "reward")
    c = _number(cost)
    if c is None:
        raise LogError(f"{where}: _label_cost {cost!r} is not a number", "reward")
    return 0.0 - c  # not -c: a cost of 0.0 gives the reward 0.0, not -0.0


def _number(value: object) -> float | None:
    """A JSON number as a float (an integer too large for one is infinite); None for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _timestamp_ms(value: object, where: str) -> int:
    m = _TIMESTAMP.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise LogError(
            f"{where}: 'Timestamp' {value!r} is not an ISO 8601 time like 2024-01-01T00:00:00.0000000Z",
            "malformed",
        )
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    try:
        tz = (
            timezone.utc
            if zone == "Z"
            else timezone(
                (1 if zone[0] == "+" else -1)
                * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
            )
        )
        t = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=tz
        )
    except ValueError as exc:  # a month 13, an offset of 24 hours or more
        raise LogError(
            f"{where}: 'Timestamp' {value!r} is not a valid time ({exc})", "malformed"
        ) from None
    return (t - _EPOCH) // _MS + int((fraction or "0").ljust(3, "0")[:3])


# -- features ----------------------------------------------------------------------------------


def _arm_vectors(
    context: dict, actions: list[dict], dim: int, interactions: bool, where: str
) -> np.ndarray:
    try:
        shared = _namespace(" ", {k: v for k, v in context.items() if k != "_multi"}, where, [])
        own = [_namespace(" ", entry, where, []) for entry in actions]
    except RecursionError:
        raise LogError(f"{where}: features nested too deeply", "features") from None
    if interactions and len(shared) * sum(map(len, own)) > MAX_CROSSES:
        raise LogError(
            f"{where}: {len(shared)} shared features times {sum(map(len, own))} action features is over "
            f"{MAX_CROSSES} crosses",
            "features",
        )
    try:
        base = hash_features(shared, dim)  # the shared part of every arm, hashed once
        rows = [
            base + hash_features(_with_crosses(shared, mine) if interactions else mine, dim)
            for mine in own
        ]
    except ValueError as exc:  # a cross whose product overflows
        raise LogError(f"{where}: {exc}", "features") from None
    return np.stack(rows)


def _with_crosses(shared: list[Feature], mine: list[Feature]) -> list[Feature]:
    return mine + [(f"{s}*{t}", u * v) for s, u in shared for t, v in mine]


def _name(ns: str, feature: str) -> str:
    return feature if ns == " " else f"{ns}^{feature}"


def _namespace(ns: str, obj: dict, where: str, out: list[Feature]) -> list[Feature]:
    """The features of the JSON object ``obj`` read in namespace ``ns``, appended to ``out``."""
    for key, value in obj.items():
        if key.startswith("_"):
            _special(ns, key, value, where, out)
        elif isinstance(value, dict):
            _namespace(key, value, where, out)
        elif isinstance(value, list):
            _array(key, value, where, out)
        elif isinstance(value, str):
            out.append((_name(ns, key + value.translate(_VW_ESCAPE)), 1.0))
        elif value is True:
            out.append((_name(ns, key), 1.0))
        elif value is not None and value is not False:
            _add(out, _name(ns, key), value, where)
    return out


def _array(ns: str, items: list, where: str, out: list[Feature]) -> None:
    i = 0
    for item in items:
        if item is None:
            continue
        if isinstance(item, dict):
            _namespace(ns, item, where, out)
            continue
        if _number(item) is None:
            raise LogError(
                f"{where}: array {ns!r} holds {item!r}: VW arrays hold numbers, nulls and objects",
                "features",
            )
        _add(out, _name(ns, f"[{i}]"), item, where)
        i += 1


def _special(ns: str, key: str, value: object, where: str, out: list[Feature]) -> None:
    if key == "_text":
        if not isinstance(value, str):
            raise LogError(f"{where}: '_text' is {value!r}, not a string", "features")
        out.extend(
            (_name(ns, word.translate(_VW_ESCAPE)), 1.0)
            for word in re.split("[ \t]", value)
            if word
        )
    elif key == "_slots":
        raise LogError(
            f"{where}: '_slots' in namespace {ns!r}: CCB/slates DSJSON is not supported",
            "malformed",
        )
    elif key == "_multi":
        raise LogError(
            f"{where}: '_multi' inside namespace {ns!r}: actions are only read at the top of 'c'",
            "malformed",
        )
    elif key == "__aid":
        raise LogError(
            f"{where}: a deduplicated action ('__aid'): its features are not in the line",
            "features",
        )


def _add(out: list[Feature], name: str, value: object, where: str) -> None:
    v = _number(value)
    if v is None:
        raise LogError(f"{where}: feature {name!r} has the value {value!r}", "features")
    if not math.isfinite(v):
        raise LogError(f"{where}: feature {name!r} has the non-finite value {value!r}", "features")
    if v != 0.0:  # VW drops zeros; they would add nothing to the hashed vector either
        out.append((name, v))
