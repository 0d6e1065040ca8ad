"""The one admission rule: what a context, a logged decision or a reward must be for a model to
act on it, and the reason code (``streambandit.reasons``) of each refusal.

The engine (engine/partition.py), the Decider (serving/decider.py) and a replica
(serving/replica.py) judge their input with these functions and with no check of their own, so
what one refuses the others refuse, with the same code (tests/unit/engine/test_admission.py holds
all three to one table). Pure: no clock and no state; what a check needs of its caller's state
(the ids it decided, the models it holds) is an argument. A check returns a :class:`Refusal` or
None rather than raising: the engine runs them for every record on the worker's hot path.

In the order a caller applies them:

1. A call's form (:func:`call_context`, :func:`call_id`, :func:`call_time`, :func:`call_reward`):
   what application code passes must have the types of a record. A record read off a topic has
   them by construction (wire/codec.py), so only the Decider and a replica apply these; they
   raise :class:`DecisionError`. They also refuse an empty id and a negative event time, which a
   record may carry and the worker accepts.
2. The record alone (:func:`record_refusal`), before it moves event time: an event time too far
   ahead of the record's own timestamp, an id too long, arms that are not one (K, d) matrix, a
   reward that is not finite. A record refused here leaves event time where it was, as one the
   decoder refused does; recovery counts on that (stream/recovery.py).
3. The model (:func:`context_refusal`, :func:`decided_before`, :func:`model_room_refusal`,
   :func:`learner_refusal`, :func:`reward_refusal`, and :func:`id_refusal` of the chosen arm): a
   configured model key, distinct arm ids, the model's dimension, a new event id, room for a new
   model, features and a reward the learner accepts.

The features' values (:func:`feature_values_refusal`: NaN, infinities, magnitudes past the
learners' bound) are judged before anything else in a call, and of a logged decision, which no
learner scores again; of a context, by the learner that scores it (:func:`learner_refusal`): a
record's values were judged by the decoder already, and the check would cost the worker's hot
path a pass over every feature.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Container, Mapping, Sized
from typing import Any

import numpy as np

from streambandit import reasons
from streambandit.config.models import ModelSpec
from streambandit.errors import StreambanditError
from streambandit.policies.base import BAD_ARMS_MESSAGE, Policy, features_ok
from streambandit.wire import Context, ReplicaDecision, Reward, Tick

__all__ = [
    "Refusal",
    "DecisionError",
    "BAD_TIMESTAMP",
    "raise_if",
    "call_context",
    "call_arms",
    "call_id",
    "call_time",
    "call_reward",
    "record_refusal",
    "too_far_ahead",
    "event_time_refusal",
    "id_refusal",
    "arms_refusal",
    "reward_value_refusal",
    "unknown_model_refusal",
    "context_refusal",
    "decided_before",
    "model_room_refusal",
    "learner_refusal",
    "feature_values_refusal",
    "reward_refusal",
]

# Not a reason code of reasons.py: a record's event time is a long by its schema; only a call can
# pass something else.
BAD_TIMESTAMP = "bad_timestamp"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Why an input is refused: its reason code and a detail for the person reading it."""

    reason: str
    detail: str


class DecisionError(StreambanditError, ValueError):
    """A rank or reward call refused; ``reason`` is the worker's reason code for it."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def raise_if(refusal: Refusal | None) -> None:
    """Raise a call's refusal as a :class:`DecisionError`, if there is one."""
    if refusal is not None:
        raise DecisionError(refusal.reason, refusal.detail)


# -- a call's form -----------------------------------------------------------------------------


def call_context(
    event_id: Any,
    model_key: Any,
    arms: Any,
    features: Any,
    timestamp_ms: Any,
    clock: Callable[[], int],
) -> Context:
    """The context of a rank call (``arms`` and ``features`` as :func:`call_arms` takes them,
    ``timestamp_ms`` as :func:`call_time`), in the form of a record."""
    arm_ids, x = call_arms(arms, features)
    ts = call_time(timestamp_ms, clock)
    call_id("event id", event_id)
    call_id("model key", model_key)
    return Context(event_id, model_key, ts, arm_ids, x)


def call_arms(arms: Any, features: Any) -> tuple[tuple[str, ...], np.ndarray]:
    """``(arm ids, features as float64)`` of a rank call: ``arms`` a mapping of arm id to its
    feature vector, or a sequence of arm ids with ``features`` a (K, d) matrix. The matrix's
    shape is the record's rule (:func:`arms_refusal`)."""
    # A tuple or list of ids (the common call) is told from a mapping without the ABC's check.
    if type(arms) is not tuple and type(arms) is not list and isinstance(arms, Mapping):
        if features is not None:
            raise DecisionError(
                reasons.MALFORMED,
                "arms given as a mapping carry their features: leave features out",
            )
        ids = tuple(arms)
        rows = list(arms.values())
    else:
        if features is None:
            raise DecisionError(
                reasons.MALFORMED, "arms given as ids need features, a (K, d) matrix"
            )
        ids = tuple(arms)
        rows = features
    for a in ids:
        if type(a) is not str or not a:
            raise DecisionError(reasons.MALFORMED, f"arm ids must be non-empty strings, got {a!r}")
    try:
        x = np.asarray(
            rows, dtype=np.float64
        )  # no copy of a float64 matrix: the engine keeps none of it
    except (TypeError, ValueError):
        raise DecisionError(
            reasons.BAD_DIMENSION, "features must be numbers, one row of the same length per arm"
        ) from None
    if not features_ok(x):
        raise_if(feature_values_refusal(x))
    return ids, x


def call_id(what: str, value: Any) -> None:
    """An event id or model key of a call: a non-empty string."""
    if not isinstance(value, str) or not value:
        raise DecisionError(
            reasons.MALFORMED, f"the {what} must be a non-empty string, got {value!r}"
        )


def call_time(timestamp_ms: Any, clock: Callable[[], int]) -> int:
    """A call's event time: ``timestamp_ms``, or the clock's when it is None."""
    if type(timestamp_ms) is int and timestamp_ms >= 0:  # the common call, judged at once
        return timestamp_ms
    if timestamp_ms is None:
        return int(clock())
    if (
        isinstance(timestamp_ms, bool)
        or not isinstance(timestamp_ms, (int, np.integer))
        or timestamp_ms < 0
    ):
        raise DecisionError(
            BAD_TIMESTAMP, f"timestamp_ms must be an integer >= 0, got {timestamp_ms!r}"
        )
    return int(timestamp_ms)


def call_reward(value: Any) -> float:
    """A call's reward value as a float; whether it is finite is the record's rule."""
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DecisionError(
            reasons.NON_FINITE_REWARD, f"reward {value!r} is not a number"
        ) from None


# -- the record alone, before it moves event time -----------------------------------------------


def record_refusal(
    ev: Context | ReplicaDecision | Reward | Tick,
    record_ms: int,
    max_event_time_ahead_ms: int,
    max_id_bytes: int,
) -> Refusal | None:
    """What refuses ``ev`` whatever the model: its event time against ``record_ms`` (the record's
    Kafka timestamp; a call's, the clock's), its ids, its arms or its reward value."""
    if too_far_ahead(ev.timestamp_ms, record_ms, max_event_time_ahead_ms):
        return event_time_refusal(ev.timestamp_ms, record_ms, max_event_time_ahead_ms)
    if type(ev) is Tick:
        return None
    refusal = id_refusal("event id", ev.event_id, max_id_bytes) or id_refusal(
        "model key", ev.model_key, max_id_bytes
    )
    if refusal is not None:
        return refusal
    if type(ev) is Reward:
        return reward_value_refusal(ev.value)
    return arms_refusal(ev.arm_ids, ev.features)


def too_far_ahead(event_ms: int, record_ms: int, max_event_time_ahead_ms: int) -> bool:
    """Whether an event time is beyond its record's timestamp by more than the bound: it would
    move the watermark past every open window for good. Judged from the record alone (a record
    with no timestamp, 0, is not judged), so a replay judges it the same."""
    return record_ms > 0 and event_ms > record_ms + max_event_time_ahead_ms


def event_time_refusal(event_ms: int, record_ms: int, max_event_time_ahead_ms: int) -> Refusal:
    return Refusal(
        reasons.EVENT_TIME_AHEAD,
        f"event time {event_ms} is more than max_event_time_ahead_ms = "
        f"{max_event_time_ahead_ms} ahead of the record's timestamp {record_ms}",
    )


def id_refusal(what: str, value: str, max_id_bytes: int) -> Refusal | None:
    """An id longer than ``max_id_bytes`` in UTF-8: outputs carrying it could exceed what a
    producer accepts."""
    # A str of at most max_id_bytes // 4 characters is within the bound whatever its characters,
    # so nearly every id is judged without encoding it.
    if len(value) > max_id_bytes // 4 and (n := len(value.encode())) > max_id_bytes:
        return Refusal(
            reasons.ID_TOO_LONG,
            f"the {what} has {n} bytes, more than max_id_bytes = {max_id_bytes}",
        )
    return None


def arms_refusal(arm_ids: tuple[str, ...], features: np.ndarray) -> Refusal | None:
    """The candidates of a context: at least one, one row of features each, all rows of one
    positive dimension (what the decoder makes of a record's bytes)."""
    k = len(arm_ids)
    if not k:
        return Refusal(reasons.EMPTY_ARMS, "the context has no candidate arms")
    if features.ndim != 2 or features.shape[0] != k or features.shape[1] == 0:
        return Refusal(reasons.BAD_DIMENSION, f"features of shape {features.shape} for {k} arms")
    return None


def feature_values_refusal(features: np.ndarray) -> Refusal | None:
    """Features a learner does not take: NaN or infinite (the decoder's code for them), or past
    the learners' bound (kernels.MAX_ABS_FEATURE)."""
    if features_ok(features):
        return None
    if not np.isfinite(features).all():
        return Refusal(reasons.NON_FINITE_FEATURES, "features contain NaN or infinite values")
    return Refusal(reasons.FEATURE_OUT_OF_RANGE, BAD_ARMS_MESSAGE)


def reward_value_refusal(value: float) -> Refusal | None:
    if not math.isfinite(value):
        return Refusal(reasons.NON_FINITE_REWARD, f"reward value {value!r} is not finite")
    return None


# -- against the model --------------------------------------------------------------------------


def unknown_model_refusal(model_key: str) -> Refusal:
    return Refusal(reasons.UNKNOWN_MODEL, f"no configuration matches model key {model_key!r}")


def context_refusal(
    model_key: str, arm_ids: tuple[str, ...], features: np.ndarray, spec: ModelSpec | None
) -> Refusal | None:
    """A context against its model's configuration (``spec``, None when no entry matches the
    key): distinct arm ids (an action names its arm by id) of the model's dimension."""
    if spec is None:
        return unknown_model_refusal(model_key)
    if len(set(arm_ids)) != len(arm_ids):
        return Refusal(
            reasons.DUPLICATE_ARM_ID,
            f"arm ids repeat among the {len(arm_ids)} candidates: an action names its arm by id",
        )
    if features.shape[1] != spec.dim:
        return Refusal(
            reasons.BAD_DIMENSION,
            f"features have dimension {features.shape[1]}, model {model_key!r} expects {spec.dim}",
        )
    return None


def decided_before(
    event_id: str, decided: Container[str], also: Container[str] = ()
) -> Refusal | None:
    """An event id among those its holder decided (and still remembers): in ``decided`` or in
    ``also`` (the engine's open and its joined ids). Two named containers, not ``*decided``: a
    varargs tuple and its iterator were two allocations per context on the worker's hot path
    (the engine stage of bench.worker_path)."""
    if event_id in decided or event_id in also:
        return Refusal(reasons.DUPLICATE_EVENT, f"event id {event_id!r} was already decided")
    return None


def model_room_refusal(model_key: str, models: Sized, max_models: int | None) -> Refusal | None:
    """A new model key when ``max_models`` models are held (None: no bound). Where the key comes
    from a client, each new one would otherwise cost a model's state for good."""
    if max_models is not None and len(models) >= max_models:
        return Refusal(
            reasons.TOO_MANY_MODELS,
            f"model key {model_key!r} would be model {len(models) + 1}, over "
            f"max_models = {max_models}",
        )
    return None


def learner_refusal(exc: ValueError, features: np.ndarray) -> Refusal:
    """The learner refused to score ``features`` (raising ``exc``): for their values, if they
    are what :func:`feature_values_refusal` refuses; else for what the learner says."""
    return feature_values_refusal(features) or Refusal(reasons.FEATURE_OUT_OF_RANGE, str(exc))


def reward_refusal(model: Policy, value: float) -> Refusal | None:
    """A reward the model's learner would not update with (e.g. outside [0, 1] for a logistic
    link, negative for Poisson, beyond MAX_ABS_REWARD for any)."""
    try:
        model.validate_reward(value)
    except ValueError as exc:
        return Refusal(reasons.REWARD_OUT_OF_RANGE, str(exc))
    return None
