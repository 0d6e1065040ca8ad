"""Decisions in the application's own process: rank and reward with no Kafka round trip.

    >>> from streambandit import Decider
    >>> d = Decider({"models": [{"match": "ads-*", "policy": "oful", "dim": 2,
    ...                          "reward_window_ms": 60_000, "default_reward": 0.0, "epsilon": 0.1}]})
    >>> r = d.rank("req-1", "ads-home", {"ad-a": [1.0, 0.0], "ad-b": [0.0, 1.0]}, timestamp_ms=1_000)
    >>> # explored: ad-b drawn with probability epsilon / K = 0.05 (ad-a, the greedy arm, had 0.95)
    >>> r.arm_id, r.propensity, r.model_version
    ('ad-b', 0.05, 0)
    >>> d.reward("req-1", 1.0, timestamp_ms=2_000)  # aggregation "first": learned at once
    >>> d.models["ads-home"].n_updates
    1

A :class:`Decider` is the worker's engine (engine/partition.py) for one application: the same
configuration file (``[[models]]``), the same decision rule and exploration draw, the same reward
windows, default rewards and aggregation, the same joined records. Fed the same contexts and
rewards in the same order with the same timestamps it makes the same decisions and reaches the
same models as a worker, to the bit (tests/unit/serving/test_decider.py).

Time is event time, as in the worker: each call's ``timestamp_ms`` (the wall clock in ms when it
is left out) moves the watermark, and a window closes when the watermark passes its end; call
:meth:`advance` to close windows while no traffic comes. A call's event time may not run more than
an hour (``max_event_time_ahead_ms``) ahead of the clock. A refused call raises
:class:`DecisionError` with the worker's reason code (``streambandit.reasons``) and decides and
learns nothing (its time still moves event time, as a refused record's does in the worker).
Records produced as a side effect (the joined records of windows a call closed, the rewards that
outlived their window with no decision) go to ``on_record`` when given, as they would go to the
worker's ``joined`` and dead-letter topics.

:meth:`save` writes the whole state (models, open decisions, held rewards, recent ids) as one
snapshot file, atomically; :meth:`Decider.load` continues from it exactly. Not thread-safe: one
Decider per thread, or a lock around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from streambandit import reasons
from streambandit.atomic import write_atomically
from streambandit.config.models import ModelsConfig, load_models_config, parse_models_config
from streambandit.engine.admission import (
    DecisionError,
    call_context,
    call_id,
    call_reward,
    call_time,
)
from streambandit.engine.partition import PartitionEngine, Rejected
from streambandit.wire import (
    Action,
    InputRef,
    Joined,
    Reward,
    Snapshot,
    SnapshotHeader,
    pack_snapshot,
    unpack_snapshot,
)

__all__ = ["Decider", "Ranking", "DecisionError"]

_CONTEXT, _REWARD = 0, 1  # InputRef.source of a call, as the worker's inputs


class Ranking(NamedTuple):
    """A decision: the chosen arm, the probability the rule had of choosing it (what off-policy
    evaluation weighs it by), every arm's score, and the model version (its number of updates)
    it was made with."""

    event_id: str
    model_key: str
    arm_id: str
    arm_index: int
    propensity: float
    score: float
    scores: np.ndarray
    model_version: int


class Decider:
    """Rank and reward in process (module docstring). ``models``: a ``[[models]]`` configuration
    (a :class:`ModelsConfig`, the parsed TOML as a dict, or a path to the file). ``clock``: the
    milliseconds a call without ``timestamp_ms`` takes (default: the wall clock). ``limits``: the
    engine's bounds (``max_pending``, ``max_early_rewards``, ``max_recent``, ``max_id_bytes``)."""

    def __init__(
        self,
        models: ModelsConfig | Mapping[str, Any] | str | Path,
        *,
        on_record: Callable[[Joined | Rejected], None] | None = None,
        clock: Callable[[], int] | None = None,
        **limits: int,
    ) -> None:
        self.config = _config(models)
        self.limits = limits
        self.engine = PartitionEngine(self.config, **limits)
        self.on_record = on_record
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._calls = 0

    # -- decisions -----------------------------------------------------------------------------

    def rank(
        self,
        event_id: str,
        model_key: str,
        arms: Mapping[str, Sequence[float]] | Sequence[str],
        features: Any = None,
        *,
        timestamp_ms: int | None = None,
    ) -> Ranking:
        """Choose one of ``arms`` for the event: a mapping of arm id to its feature vector, or a
        sequence of arm ids with ``features`` a (K, d) matrix, row k the features of arm k."""
        context = call_context(event_id, model_key, arms, features, timestamp_ms, self._clock)
        # This call's position, as an input record's: the engine names it in what it refuses.
        # Its time is the clock's, as a record's is the broker's: an event time more than the
        # engine's ``max_event_time_ahead_ms`` (1 h) ahead of it is refused
        # (``event_time_ahead``), or a caller could move event time past every window for good.
        self._calls += 1
        ref = InputRef(_CONTEXT, 0, self._calls, None, None, int(self._clock()))
        scores: list[np.ndarray] = []  # the decision's scores, computed once by the engine
        out = self.engine.on_context(context, ref, scores=scores)
        if len(out) != 1 or type(out[0]) is not Action:  # not the action alone: more to hand on
            self._emit(out, ref)  # raises if the engine refused this context
        for action in out:
            if type(action) is Action:
                return Ranking(
                    event_id,
                    model_key,
                    action.arm_id,
                    action.arm_index,
                    action.propensity,
                    action.score,
                    scores[0],
                    action.model_version,
                )
        raise AssertionError("the engine accepted a context and made no action")

    def reward(
        self,
        event_id: str,
        value: float,
        *,
        model_key: str | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """The reward of a decision made by :meth:`rank`, applied as its model's ``aggregation``
        says (``first``: now; ``sum``, ``last``: when its window closes). ``model_key`` may be
        left out for an open decision (it is the decision's); a reward for an event not decided
        yet needs it, and is held until its window passes, as the worker holds it."""
        ts = self._now(timestamp_ms)
        call_id("event id", event_id)
        if model_key is None:
            pending = self.engine.pending.get(event_id)
            if pending is None:
                observed = self.engine.recent.get(
                    event_id
                )  # joined already: with a reward, or the default
                reason = (
                    reasons.UNKNOWN_EVENT
                    if observed is None
                    else reasons.DUPLICATE_REWARD
                    if observed
                    else reasons.LATE_REWARD
                )
                raise DecisionError(
                    reason,
                    f"no open decision {event_id!r} (give model_key to hold a reward that "
                    "comes before its decision)",
                )
            model_key = pending.action.model_key
        call_id("model key", model_key)
        value = call_reward(value)
        self._calls += 1  # its position and time, as rank's
        ref = InputRef(_REWARD, 0, self._calls, None, None, int(self._clock()))
        self._emit(self.engine.on_reward(Reward(event_id, model_key, ts, value), ref), ref)

    def advance(self, timestamp_ms: int | None = None) -> list[Joined]:
        """Move event time to ``timestamp_ms`` (default: now) and close the windows it passes:
        their joined records (also given to ``on_record``)."""
        out = self.engine.advance_to(self._now(timestamp_ms))
        self._emit(out, None)
        return [o for o in out if isinstance(o, Joined)]

    # -- state ---------------------------------------------------------------------------------

    @property
    def models(self) -> Mapping[str, Any]:
        """Model key -> its learner (read them; changing one breaks the worker's equivalence)."""
        return self.engine.models

    def save(self, path: str | Path) -> None:
        """The whole state as one snapshot file, written atomically (a crash leaves the previous one)."""
        p = Path(path)
        # The calls made stand where a worker's contexts offset would: load continues their count.
        head = SnapshotHeader(
            partition=0,
            created_ms=self._clock(),
            contexts_offset=self._calls,
            rewards_offset=0,
            actions_offset=0,
            joined_offset=0,
            dead_letter_offset=0,
        )
        write_atomically(
            p.with_name(p.name + ".tmp"), p, pack_snapshot(Snapshot(head, self.engine.snapshot()))
        )

    @classmethod
    def load(
        cls, models: ModelsConfig | Mapping[str, Any] | str | Path, path: str | Path, **kwargs: Any
    ) -> Decider:
        """A Decider in the state :meth:`save` wrote (its configuration must fit the models saved)."""
        snap = unpack_snapshot(Path(path).read_bytes())
        d = cls(models, **kwargs)
        d.engine = PartitionEngine.restore(d.config, snap.engine, **d.limits)
        d._calls = int(snap.header.contexts_offset)
        return d

    # -- internals -----------------------------------------------------------------------------

    def _now(self, timestamp_ms: int | None) -> int:
        return call_time(timestamp_ms, self._clock)

    def _emit(self, out: list, ref: InputRef | None) -> None:
        """Hand on the records a call produced; raise the refusal of the call itself."""
        refused = None
        for o in out:
            if isinstance(o, Rejected) and ref is not None and o.source is ref:
                refused = o
            elif isinstance(o, (Joined, Rejected)) and self.on_record is not None:
                self.on_record(o)
        if refused is not None:
            raise DecisionError(refused.reason, refused.detail)


def _config(models: ModelsConfig | Mapping[str, Any] | str | Path) -> ModelsConfig:
    if isinstance(models, ModelsConfig):
        return models
    if isinstance(models, Mapping):
        return parse_models_config(dict(models))
    return load_models_config(models)
