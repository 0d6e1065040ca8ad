"""The records that travel on the topics, as typed values (their wire format is codec.py).

Records are values: never modify one after it is built. Context, Reward, Action, Joined and
InputRef are not declared frozen because they are built once per event on the worker's hot path,
where a frozen dataclass's constructor (``object.__setattr__`` per field) costs several times as
much, once per event.
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "Context",
    "Reward",
    "Tick",
    "Action",
    "Joined",
    "DeadLetter",
    "InputRef",
    "ReplicaDecision",
    "Trigger",
    "NO_TRIGGER",
]


@dataclasses.dataclass(slots=True)
class Context:
    event_id: str
    model_key: str
    timestamp_ms: int
    arm_ids: tuple[str, ...]
    features: np.ndarray  # (K, d) float64, finite, K >= 1


@dataclasses.dataclass(slots=True)
class ReplicaDecision:
    """A decision made elsewhere (a replica, serving/replica.py) and logged for a learn-only
    worker: the context as it was ranked, the arm chosen, with what probability and score, and
    the version of the model that chose it."""

    event_id: str
    model_key: str
    timestamp_ms: int
    arm_ids: tuple[str, ...]
    features: np.ndarray  # (K, d) float64, finite, K >= 1
    arm_index: int
    score: float
    propensity: float
    model_version: int


@dataclasses.dataclass(slots=True)
class Reward:
    event_id: str
    model_key: str
    timestamp_ms: int
    value: float


@dataclasses.dataclass(frozen=True, slots=True)
class Tick:
    timestamp_ms: int
    group_id: str = ""  # the consumer group whose worker wrote it


Trigger = tuple[
    int, int
]  # (input source, input offset) of the record whose processing wrote an output
NO_TRIGGER: Trigger = (
    -1,
    -1,
)  # an output written by no input (an idle partition's tick, a Decider's advance)


@dataclasses.dataclass(slots=True)
class Action:
    event_id: str
    model_key: str
    arm_id: str
    arm_index: int
    score: float
    propensity: float
    model_version: int
    decision_timestamp_ms: int
    features: np.ndarray
    trigger_source: int = -1
    trigger_offset: int = -1

    @property
    def natural_key(self) -> str:
        """What a redo of this record's batch writes again the same (stream/logs.py, committed_view)."""
        return self.event_id

    @property
    def trigger(self) -> Trigger:
        return (self.trigger_source, self.trigger_offset)


@dataclasses.dataclass(slots=True)
class Joined:
    event_id: str
    model_key: str
    features: np.ndarray
    reward: float
    reward_observed: bool
    propensity: float
    decision_timestamp_ms: int
    join_timestamp_ms: int
    model_version_before: int
    trigger_source: int = -1
    trigger_offset: int = -1

    @property
    def natural_key(self) -> str:
        """What a redo of this record's batch writes again the same (stream/logs.py, committed_view)."""
        return self.event_id

    @property
    def trigger(self) -> Trigger:
        return (self.trigger_source, self.trigger_offset)


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    source_topic: str
    source_partition: int
    source_offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    trigger_source: int = -1
    trigger_offset: int = -1

    @property
    def natural_key(self) -> tuple[str, int, bytes | None]:
        """What a redo of this record's batch writes again the same (stream/logs.py,
        committed_view): the refused input's position. A failed update's dead letter has no
        input position (offset -1); the action it holds names the decision."""
        return (
            self.source_topic,
            self.source_offset,
            self.value if self.source_offset < 0 else b"",
        )

    @property
    def trigger(self) -> Trigger:
        return (self.trigger_source, self.trigger_offset)


@dataclasses.dataclass(slots=True, eq=False)
class InputRef:
    """Where an input record came from, with its original bytes (to dead-letter it intact).
    Identity is the position alone: (source, partition, offset). Treat it as immutable (it is
    hashed by position); like the records above it is not frozen only because a frozen
    dataclass's constructor costs about six times as much, once per record in the worker."""

    source: int  # 0 contexts, 1 rewards
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    timestamp_ms: int = 0

    @property
    def trigger(self) -> Trigger:
        """What the outputs of this input carry as their trigger: its source and offset (the
        partition is the outputs' own)."""
        return (self.source, self.offset)

    def _pos(self) -> tuple[int, int, int]:
        return (self.source, self.partition, self.offset)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, InputRef) and self._pos() == other._pos()

    def __hash__(self) -> int:
        return hash(self._pos())
