"""One logged decision, the unit that off-policy evaluation and replay consume.

A :class:`LoggedDecision` is what a logging policy did for one context event: the candidate arms
with their features, the arm it took, the probability it had of taking that arm (the propensity)
and the reward that followed. The file readers in :mod:`streambandit.replay.files` produce them;
:func:`validate` is the one place that decides whether a decision is usable.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from streambandit.errors import StreambanditError

__all__ = ["LoggedDecision", "LogError", "validate", "MIN_PROPENSITY"]

# Below this a propensity's importance weight (1 / p, up to 1e12) swamps every estimate, and its
# square overflows the sums the intervals need long before p reaches the smallest double.
MIN_PROPENSITY = 1e-12


@dataclasses.dataclass(frozen=True, slots=True)
class LoggedDecision:
    """One decision of the logging policy, with its outcome."""

    timestamp_ms: int
    event_id: str
    model_key: str
    arm_ids: tuple[str, ...]
    features: np.ndarray  # (K, d) float64, the candidate arms
    action: int  # index in arm_ids of the logged (taken) arm
    propensity: float  # probability the logging policy chose `action`, in (0, 1]
    reward: float
    decision_version: int = -1  # the live model's update count when it decided (-1: unknown)
    # Where the decision was read ("log.csv row 3 (line 4)"), for errors found after reading.
    source: str = dataclasses.field(default="", compare=False)
    # Slates: the 0-based position the logged arm was shown at (-1: not a slate), the propensity
    # is then the probability of that arm at that position; rows of one slate share a slate id and
    # are consecutive in the log, in position order (the cascade estimator reads them so).
    position: int = -1
    slate_id: str = ""
    # External targets' probabilities for this row (name, (K,) over arm_ids, at ``position`` for
    # a slate row): a policy from another system, given by what it would have done.
    external: tuple[tuple[str, np.ndarray], ...] = dataclasses.field(default=(), compare=False)

    @property
    def where(self) -> str:
        """Its place in the log if known, else its event id: how an error names it."""
        return (
            f"{self.source} (event {self.event_id!r})"
            if self.source
            else f"event {self.event_id!r}"
        )


class LogError(StreambanditError, ValueError):
    """A logged decision (or a whole log) that cannot be used.

    The message starts with where the problem is (file and row or record number); ``reason`` is
    a short code (``propensity``, ``action``, ``features``, ``reward``, ``arms``, ``malformed``,
    ``catalog``, ``file``, ``event_id``, ``model_key``, ``duplicate``, ``position``, ``target``) that readers and the
    replay use to count skipped rows by cause.
    """

    def __init__(self, message: str, reason: str = "invalid") -> None:
        super().__init__(message)
        self.reason = reason


def validate(d: LoggedDecision, where: str, *, arms_checked: bool = False) -> LoggedDecision:
    """Return ``d`` if it is usable, else raise :class:`LogError` with ``where`` in the message.

    ``arms_checked``: ``d``'s ``arm_ids`` and ``features`` are the very objects (read-only) of an
    earlier decision that passed, as a reader shares them between rows: their distinct ids and
    finite values are not scanned again.

    Checks: a non-empty event id and model key; at least one arm; ``arm_ids`` and the feature
    rows agree in number; features a finite 2-D float array; ``action`` an integer in ``[0, K)``;
    propensity present, not NaN, in ``[MIN_PROPENSITY, 1]``; a position of -1 or in ``[0, K)``;
    external targets' probabilities a probability vector over the arms; reward finite.
    """
    if not d.event_id:
        raise LogError(f"{where}: empty event id", "event_id")
    if not d.model_key:
        raise LogError(f"{where}: empty model key", "model_key")
    k = len(d.arm_ids)
    if k == 0:
        raise LogError(f"{where}: empty arm list", "arms")
    if not arms_checked and len(set(d.arm_ids)) != k:
        raise LogError(f"{where}: duplicate arm ids in {list(d.arm_ids)}", "arms")
    f = d.features
    if not isinstance(f, np.ndarray) or f.ndim != 2:
        raise LogError(
            f"{where}: features must be a (K, d) array, got shape {getattr(f, 'shape', None)}",
            "features",
        )
    if f.shape[0] != k:
        raise LogError(f"{where}: {f.shape[0]} feature rows for {k} arms", "features")
    if f.shape[1] == 0:
        raise LogError(f"{where}: features have dimension 0", "features")
    if f.dtype != np.float64:
        raise LogError(f"{where}: features must be float64, got {f.dtype}", "features")
    if not arms_checked and not np.isfinite(f).all():
        raise LogError(f"{where}: non-finite (NaN or infinite) features", "features")
    a = d.action
    if isinstance(a, bool) or not isinstance(a, (int, np.integer)) or not 0 <= a < k:
        raise LogError(f"{where}: action {a!r} is not an arm index in [0, {k})", "action")
    p = d.propensity
    if p is None:
        raise LogError(f"{where}: missing propensity", "propensity")
    try:
        p = float(p)
    except (TypeError, ValueError):
        raise LogError(
            f"{where}: propensity {d.propensity!r} is not a number", "propensity"
        ) from None
    if math.isnan(p):
        raise LogError(f"{where}: propensity is NaN", "propensity")
    if not 0.0 < p <= 1.0:
        raise LogError(f"{where}: propensity {p!r} is not in (0, 1]", "propensity")
    if p < MIN_PROPENSITY:
        raise LogError(
            f"{where}: propensity {p!r} is below {MIN_PROPENSITY:g}: its importance weight would swamp "
            "every estimate (a logging bug, or a probability logged as a log-probability?)",
            "propensity",
        )
    pos = d.position
    if isinstance(pos, bool) or not isinstance(pos, (int, np.integer)) or not -1 <= pos < k:
        raise LogError(
            f"{where}: position {pos!r} is not -1 (no slate) or a slot in [0, {k})", "position"
        )
    if d.slate_id and pos < 0:
        raise LogError(f"{where}: a slate id without a position", "position")
    for name, probs in d.external:
        if not isinstance(probs, np.ndarray) or probs.shape != (k,) or not np.isfinite(probs).all():
            raise LogError(
                f"{where}: target {name!r}: probabilities must be {k} finite numbers, one per arm",
                "target",
            )
        if probs.min() < 0.0 or abs(float(probs.sum()) - 1.0) > 1e-6:
            raise LogError(
                f"{where}: target {name!r}: probabilities must be >= 0 and sum to 1 "
                f"(they sum to {float(probs.sum())!r})",
                "target",
            )
    try:
        r = float(d.reward)
    except (TypeError, ValueError):
        raise LogError(f"{where}: reward {d.reward!r} is not a number", "reward") from None
    if not math.isfinite(r):
        raise LogError(f"{where}: non-finite reward {r!r}", "reward")
    return d
