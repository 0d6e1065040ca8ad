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
    M_FAST,
    M_FIELDS,
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
    decides for the model (a row learner that decides without exploration) and whether it joins
    its decisions (a row learner); ``floats[m]``: the default reward and the range of rewards its
    learner accepts."""

    __slots__ = ("ints", "floats")

    def __init__(self) -> None:
        self.ints = np.zeros((8, M_FIELDS), dtype=np.int64)
        self.floats = np.zeros((8, 3), dtype=np.float64)

    def set(self, m: int, spec: Any, model: Any) -> None:
        """The columns of model index ``m``: its configuration ``spec`` and its learner."""
        if m >= len(self.ints):
            size = max(m + 1, 2 * len(self.ints))
            ints = np.zeros((size, M_FIELDS), dtype=np.int64)
            floats = np.zeros((size, 3), dtype=np.float64)
            ints[: len(self.ints)], floats[: len(self.floats)] = self.ints, self.floats
            self.ints, self.floats = ints, floats
        row = self.ints[m]
        row[:] = 0
        row[M_DIM], row[M_WINDOW] = spec.dim, spec.reward_window_ms
        row[M_AGG] = _AGGREGATIONS[spec.aggregation]
        lo, hi = model.reward_range()
        f = self.floats[m]
        f[M_DEFAULT], f[M_LO], f[M_HI] = spec.default_reward, lo, hi
        if isinstance(model, LinearUCBPolicy):
            row[M_TABLE], row[M_ROW], row[M_UPDATE] = model.row_call()
            row[M_ROWS] = 1
            row[M_FAST] = spec.epsilon <= 0.0
