"""The per-call entry points of the row learners (OFUL, GLB-OMD, Hvt-UCB): one compiled call with
four or five arguments, instead of the row kernels' nine to eleven.

Why: numba's dispatcher types and unboxes every argument of every call, and a numpy array costs
it far more than an int (it builds a memory-info record for each array, and frees it on return).
``select`` and ``update`` passed the arms and a model's whole chunk (five columns), its kernel
parameters and its row: seven arrays per call, most of a microsecond per select + update pair
on a one-core run of ``python -m bench.peers`` (row "streambandit oful, select + update per
call"). Here a chunk is described once, when it is made, by a small int64 *table* (its
columns' addresses and shapes, its store's parameters): a call passes the address of that table
as an int, and the kernel rebuilds the columns from it (``numba.carray``: a view, no copy) and
runs the same row kernel as before, so the bits are the same.

The tables hold raw addresses: a chunk keeps its table, the arrays it describes and the store's
parameters alive (``rows.RowStore`` makes them), and a model keeps its chunk.

The entry points are compiled for one signature each (a writable float64 C-contiguous matrix of
arms, a float64 C-contiguous vector x, a float reward, ints) and then locked
(:func:`prepare`): any other argument raises TypeError at the call, before any compiled code
runs, and the caller falls back to its checks in Python, which convert the input or raise the
error they always raised. So the per-call path checks the input's type in the dispatcher it goes
through anyway, and the shape and values in the kernel, with no Python check of its own.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from streambandit.numerics import kernels
from streambandit.numerics.jit import CACHE

__all__ = [
    "UPDATE_OFUL",
    "UPDATE_GLB_OMD",
    "UPDATE_HVT_UCB",
    "chunk_table",
    "prepare",
    "ucb_scores_at",
    "ucb_select_at",
    "ucb_best_at",
    "ucb_best_version_at",
    "oful_update_at",
    "glb_omd_update_at",
    "hvt_ucb_update_at",
]

# A chunk's table, int64 entries: the columns' addresses in the row kernels' order (theta, the
# inverse, the third array, scalars, count), the store's parameters' address, the sizes, and the
# learner's radius (kernels.RADIUS_OFUL, ...).
THETA, INV, OTHER, SCALARS, COUNT, PARAMS, ROWS, DIM, N_SCALARS, N_PARAMS, KIND = range(11)
TABLE_LENGTH = 11

# Which row update a learner's rows take, for a compiled caller that runs several learners' rows
# (engine/compiled_pass.py): the update entry points below, by number.
UPDATE_OFUL, UPDATE_GLB_OMD, UPDATE_HVT_UCB = 0, 1, 2


def _pointer_intrinsic(dtype: types.Type):
    @intrinsic
    def at(typingctx, address):
        """``address`` (an int64) as a pointer to ``dtype``."""
        if not isinstance(address, types.Integer):
            return None
        sig = types.CPointer(dtype)(address)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return sig, codegen

    return at


_f64_at = _pointer_intrinsic(types.float64)
_i64_at = _pointer_intrinsic(types.int64)


def _address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def chunk_table(columns: tuple[np.ndarray, ...], params: np.ndarray, kind: int) -> np.ndarray:
    """The table of a chunk (its five columns, each C-contiguous with a row per model), of its
    store's kernel parameters (float64, C-contiguous) and of its learner's radius ``kind``. The
    caller keeps the arrays alive as long as the table."""
    theta, inv, other, scalars, count = columns
    rows, dim = theta.shape
    if (
        inv.shape != (rows, dim, dim)
        or other.shape[0] != rows
        or scalars.shape[0] != rows
        or scalars.ndim != 2
        or count.shape != (rows,)
        or any(c.dtype != np.float64 for c in (theta, inv, other, scalars))
        or count.dtype != np.int64
        or params.dtype != np.float64
        or params.ndim != 1
        or not all(c.flags.c_contiguous for c in (*columns, params))
    ):
        raise ValueError("a chunk's columns do not have the layout the row kernels read")
    table = np.empty(TABLE_LENGTH, np.int64)
    table[:PARAMS] = [_address(c) for c in columns]
    table[PARAMS] = _address(params)
    table[ROWS], table[DIM], table[N_SCALARS] = rows, dim, scalars.shape[1]
    table[N_PARAMS] = params.shape[0]
    table[KIND] = kind
    return table


# -- the columns from a table ---------------------------------------------------------------------


@njit(cache=CACHE, nogil=True, inline="always")
def _table(address):
    return carray(_i64_at(address), (TABLE_LENGTH,))


@njit(cache=CACHE, nogil=True, inline="always")
def _theta(t):
    return carray(_f64_at(t[THETA]), (t[ROWS], t[DIM]))


@njit(cache=CACHE, nogil=True, inline="always")
def _inv(t):
    return carray(_f64_at(t[INV]), (t[ROWS], t[DIM], t[DIM]))


@njit(cache=CACHE, nogil=True, inline="always")
def _other_vector(t):
    # OFUL's b: a vector per row.
    return carray(_f64_at(t[OTHER]), (t[ROWS], t[DIM]))


@njit(cache=CACHE, nogil=True, inline="always")
def _other_matrix(t):
    # GLB-OMD's H, Hvt-UCB's V: a matrix per row.
    return carray(_f64_at(t[OTHER]), (t[ROWS], t[DIM], t[DIM]))


@njit(cache=CACHE, nogil=True, inline="always")
def _scalars(t):
    return carray(_f64_at(t[SCALARS]), (t[ROWS], t[N_SCALARS]))


@njit(cache=CACHE, nogil=True, inline="always")
def _count(t):
    return carray(_i64_at(t[COUNT]), (t[ROWS],))


@njit(cache=CACHE, nogil=True, inline="always")
def _params(t):
    return carray(_f64_at(t[PARAMS]), (t[N_PARAMS],))


# -- the entry points: the row kernels of kernels.py on the table's columns -----------------------
#
# The row kernels take the chunk's third column and ignore it when they score; theta stands in
# for it here (any array would do), so that scoring never needs to know its shape.
#
# The entry points hold the GIL (no ``nogil``), unlike the row kernels they call: releasing it and
# taking it back (PyEval_SaveThread, PyEval_RestoreThread and their mutexes) costs each call about
# what typing its arguments does, in a callgrind profile of ``python -m bench.worker_path --quick``,
# for a call too short for another thread to do anything with the GIL meanwhile. The row kernels
# keep ``nogil`` for the callers that run long loops in them (play, batches).


@njit(cache=CACHE)
def ucb_scores_at(arms, table, i, out):
    """``kernels.ucb_scores_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    theta = _theta(t)
    return kernels.ucb_scores_row(
        arms, theta, _inv(t), theta, _scalars(t), _count(t), i, t[KIND], _params(t), out
    )


@njit(cache=CACHE)
def ucb_select_at(arms, table, i):
    """``kernels.ucb_select_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    theta = _theta(t)
    return kernels.ucb_select_row(
        arms, theta, _inv(t), theta, _scalars(t), _count(t), i, t[KIND], _params(t)
    )


@njit(cache=CACHE)
def ucb_best_at(arms, table, i):
    """``kernels.ucb_best_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    theta = _theta(t)
    return kernels.ucb_best_row(
        arms, theta, _inv(t), theta, _scalars(t), _count(t), i, t[KIND], _params(t)
    )


@njit(cache=CACHE)
def ucb_best_version_at(arms, table, i):
    """``ucb_best_at``'s (index, score) and the row's count (the model's version that decided):
    the engine reads both per context, and a second call for the count cost a Python frame."""
    t = _table(table)
    theta = _theta(t)
    index, score = kernels.ucb_best_row(
        arms, theta, _inv(t), theta, _scalars(t), _count(t), i, t[KIND], _params(t)
    )
    return index, score, _count(t)[i]


@njit(cache=CACHE)
def oful_update_at(table, i, x, reward):
    """``kernels.oful_update_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    return kernels.oful_update_row(
        _theta(t), _inv(t), _other_vector(t), _scalars(t), _count(t), i, x, reward, _params(t)
    )


@njit(cache=CACHE)
def glb_omd_update_at(table, i, x, reward):
    """``kernels.glb_omd_update_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    return kernels.glb_omd_update_row(
        _theta(t), _inv(t), _other_matrix(t), _scalars(t), _count(t), i, x, reward, _params(t)
    )


@njit(cache=CACHE)
def hvt_ucb_update_at(table, i, x, reward):
    """``kernels.hvt_ucb_update_row`` of row i of the chunk whose table is at ``table``."""
    t = _table(table)
    return kernels.hvt_ucb_update_row(
        _theta(t), _inv(t), _other_matrix(t), _scalars(t), _count(t), i, x, reward, _params(t)
    )


_MATRIX = types.Array(types.float64, 2, "C")
_VECTOR = types.Array(types.float64, 1, "C")
_I = types.int64
_SCORING = (
    (ucb_scores_at, (_MATRIX, _I, _I, _VECTOR)),
    (ucb_select_at, (_MATRIX, _I, _I)),
    (ucb_best_at, (_MATRIX, _I, _I)),
    (ucb_best_version_at, (_MATRIX, _I, _I)),
)
_UPDATE = (_I, _I, _VECTOR, types.float64)
_prepared: set = set()
_lock = threading.Lock()


def prepare(update: Any) -> None:
    """Compile (or load from numba's cache) the scoring entry points and the learner's
    ``update`` entry point for their one signature each, and lock them there. Called before a
    learner's first model uses them (``LinearUCBPolicy``), not at import, so that importing the
    package compiles nothing and a process loads only the learners it uses."""
    if update in _prepared:
        return
    with _lock:
        for dispatcher, signature in (*_SCORING, (update, _UPDATE)):
            if dispatcher not in _prepared:
                dispatcher.compile(signature)
                dispatcher.disable_compile()
                _prepared.add(dispatcher)
