"""What the compiled pass needs of each model, as columns by the engine's model index.

engine/compiled_pass.py decides and updates a model through its row (a row learner's chunk
table and row, policies/linear_ucb.py's ``row_call``) and applies its configuration (window,
aggregation, default reward, the rewards its learner accepts). These columns hold them, set once
when the engine makes or restores the model: a model keeps its row for its life.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streambandit.engine.compiled_pass import (
    AGG_FIRST,
    AGG_LAST,
    AGG_SUM,
    M_AGG,
    M_DEFAULT,
    M_DIM,
    M_EPS,
    M_FAST,
    M_FIELDS,
    M_FLOATS,
    M_HI,
    M_LO,
    M_ROW,
    M_ROWS,
    M_TABLE,
    M_UPDATE,
    M_WINDOW,
)
from streambandit.policies.linear_ucb import LinearUCBPolicy

__all__ = ["ModelColumns"]

_AGGREGATIONS = {"first": AGG_FIRST, "sum": AGG_SUM, "last": AGG_LAST}


class ModelColumns:
    """``ints[m]``: table, row, update, dimension, window, aggregation, whether the compiled pass
    decides for the model and whether it joins its decisions (both: a row learner); ``floats[m]``:
    the default reward, the range of rewards its learner accepts and its exploration rate."""

    __slots__ = ("ints", "floats")

    def __init__(self) -> None:
        self.ints = np.zeros((8, M_FIELDS), dtype=np.int64)
        self.floats = np.zeros((8, M_FLOATS), dtype=np.float64)

    def set(self, m: int, spec: Any, model: Any) -> None:
        """The columns of model index ``m``: its configuration ``spec`` and its learner."""
        if m >= len(self.ints):
            size = max(m + 1, 2 * len(self.ints))
            ints = np.zeros((size, M_FIELDS), dtype=np.int64)
            floats = np.zeros((size, M_FLOATS), dtype=np.float64)
            ints[: len(self.ints)], floats[: len(self.floats)] = self.ints, self.floats
            self.ints, self.floats = ints, floats
        lo, hi = model.reward_range()
        if isinstance(model, LinearUCBPolicy):
            table, row, update = model.row_call()
            fast = rows = 1
        else:
            table = row = update = fast = rows = 0
        # One row assignment each (a restore sets a column row per model, 100,000 of them in
        # bench.kafka's handoff).
        ints = [0] * M_FIELDS
        ints[M_TABLE], ints[M_ROW], ints[M_UPDATE], ints[M_FAST], ints[M_ROWS] = (
            table, row, update, fast, rows,
        )  # fmt: skip
        ints[M_DIM], ints[M_WINDOW] = spec.dim, spec.reward_window_ms
        ints[M_AGG] = _AGGREGATIONS[spec.aggregation]
        self.ints[m] = ints
        floats = [0.0] * M_FLOATS
        floats[M_DEFAULT], floats[M_LO], floats[M_HI] = spec.default_reward, lo, hi
        floats[M_EPS] = spec.epsilon
        self.floats[m] = floats
