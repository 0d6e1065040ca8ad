"""What one object alone keeps alive: the memory accounting of ``bench/memory.py`` and of
``tests/unit/policies/test_memory_accounting.py``.

A compiled learner keeps its state as a row of arrays shared by every model of its configuration
(``streambandit.policies.rows``): walking references cannot tell its row from the others', so
:func:`owned_rows` reports it from the model's own record of where its row is."""

from __future__ import annotations

import gc
import types
from typing import Any, Iterable

import numpy as np

__all__ = ["owned", "owned_rows"]

# Followed no further: classes, modules and functions are shared by every model.
_SKIP = (type, types.ModuleType, types.BuiltinFunctionType, types.FunctionType)


def owned(root: Any, others: Iterable[Any]) -> list:
    """Objects reachable from ``root`` and from none of ``others`` (another model of the same
    configuration, say): what ``root`` alone keeps alive. numpy arrays are followed to their
    ``base`` (ndarray does not traverse it)."""
    shared: set[int] = set()
    stack = list(others)
    while stack:
        o = stack.pop()
        if id(o) in shared or isinstance(o, _SKIP):
            continue
        shared.add(id(o))
        stack.extend(gc.get_referents(o))
        if isinstance(o, np.ndarray) and o.base is not None:
            stack.append(o.base)
    seen: set[int] = set()
    out, stack = [], [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or id(o) in shared or isinstance(o, _SKIP):
            continue
        seen.add(id(o))
        out.append(o)
        stack.extend(gc.get_referents(o))
        if isinstance(o, np.ndarray) and o.base is not None:
            stack.append(o.base)
    return out


def owned_rows(model: Any) -> dict[str, int]:
    """Bytes of the row ``model`` holds in its configuration's row store, by column (its state
    arrays by name, then ``scalars`` and ``count``); empty for a model that keeps its own arrays."""
    from streambandit.policies.linear_ucb import COUNT, SCALARS, LinearUCBPolicy

    if not isinstance(model, LinearUCBPolicy):
        return {}
    chunk, i = model._chunk, model._i
    out = {name: int(chunk[col][i].nbytes) for name, col in model._columns.items()}
    out["scalars"] = int(chunk[SCALARS][i].nbytes)
    out["count"] = int(chunk[COUNT][i].nbytes)
    return out
