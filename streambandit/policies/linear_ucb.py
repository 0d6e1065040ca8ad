"""The decision side and the state storage shared by the exact linear-index learners (OFUL,
GLB-OMD, Hvt-UCB).

Each scores an arm as ``x'theta + beta ||x||_{M^-1}`` with a maintained inverse ``M^-1``; only
what theta, M^-1 and beta are differs. Scoring runs in the compiled kernels of
``streambandit.numerics.kernels``, one call per context (or per batch of contexts), so select, select_batch
and scores give the same bits (the kernels' determinism note says why).

State: a model is a row of its configuration's :class:`~streambandit.policies.rows.RowStore`
(theta, the inverse, a third array, float scalars, the update count); the instance holds only
where its row is. The state arrays are properties returning views of the row, which keep the
model alive (so a view never sees the row reused by another model); ``copy.copy``,
``copy.deepcopy`` and pickle give a model with its own row.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from streambandit.numerics import kernels, row_calls
from streambandit.numerics.kernels import MAX_ABS_REWARD
from streambandit.policies import rows
from streambandit.policies.base import BAD_ARMS_MESSAGE, BAD_X_MESSAGE, Policy
from streambandit.policies.state_blocks import StateBlock

__all__ = ["LinearUCBPolicy", "row_array", "row_scalar"]

_NON_FINITE_ARMS = BAD_ARMS_MESSAGE
# Chunk columns (rows.RowStore): the kernels take them in this order.
THETA, INV, OTHER, SCALARS, COUNT = range(5)
_SLOTS = ("dim", "_config", "_store", "_chunk", "_i")
_OK = kernels.OK
_scores_at, _select_at, _best_at, _best_version_at = (
    row_calls.ucb_scores_at,
    row_calls.ucb_select_at,
    row_calls.ucb_best_at,
    row_calls.ucb_best_version_at,
)


def row_array(column: int, doc: str) -> property:
    """A state array of the model: a view of its row in ``column`` (setting it copies in)."""

    def get(self: "LinearUCBPolicy") -> np.ndarray:
        return rows.pinned_view(self, self._chunk[column][self._i])

    def put(self: "LinearUCBPolicy", value: np.ndarray) -> None:
        self._chunk[column][self._i] = value

    return property(get, put, doc=doc)


def row_scalar(j: int, doc: str) -> property:
    """A float state scalar of the model: column ``j`` of its row of ``scalars``."""

    def get(self: "LinearUCBPolicy") -> float:
        return self._chunk[SCALARS].item(self._i, j)

    def put(self: "LinearUCBPolicy", value: float) -> None:
        self._chunk[SCALARS][self._i, j] = value

    return property(get, put, doc=doc)


def _store_const(name: str) -> property:
    """A constant of the model's configuration: ``name`` in its store's ``consts``."""

    def get(self: "LinearUCBPolicy") -> Any:
        return self._store.consts[name]

    return property(get, doc=f"The configuration's constant {name!r} (kept on the store).")


def _rebuild(
    cls: type, dim: int, config: dict[str, Any], state: dict[str, Any]
) -> "LinearUCBPolicy":
    p = cls(dim, **config)
    p.load_state_dict(state)
    return p


class LinearUCBPolicy(Policy):
    """A policy whose index is ``x'theta + beta ||x||_{M^-1}``, its state a row of a RowStore.

    Subclasses name their row's columns in :attr:`_columns` (state array -> THETA, INV or OTHER),
    their radius in :attr:`_radius_kind`, build their configuration's store in
    :meth:`_new_store` and end ``__init__`` with :meth:`_attach`.
    """

    __slots__ = _SLOTS
    _columns: ClassVar[dict[str, int]]
    _row_scalars: ClassVar[
        tuple[str, ...]
    ] = ()  # the float state scalars, by column of the row's ``scalars``
    _radius_kind: ClassVar[int]
    # The names of the constants the learner derives from its configuration (the keys of its
    # store's ``consts``, kept once per configuration): each becomes a read-only property.
    _const_names: ClassVar[tuple[str, ...]] = ()
    _play_kernel: ClassVar[Any]  # the compiled select + update loop over a stream
    # The compiled update of a row with its input checks, (chunk..., i, x, reward, params) ->
    # status (a staticmethod: a numba dispatcher would otherwise bind as a method).
    _update_row: ClassVar[Any]
    # The same update from the chunk's table (numerics/row_calls.py), (table, i, x, reward) ->
    # status: the per-call path.
    _update_at: ClassVar[Any]
    # Its number among row_calls' updates (UPDATE_OFUL, ...): what row_call() tells a caller.
    _update_kind: ClassVar[int]
    _bad_reward_message: ClassVar[str] = (
        f"the chosen arm's reward is not finite or beyond +-{MAX_ABS_REWARD:g}"
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Properties, not a ``__getattr__``: a class with a Python ``__getattr__`` sends every
        # attribute read on its instances through a slower lookup, and the engine reads a
        # model's attributes about a dozen times per context (the engine stage of
        # bench.worker_instructions counts them).
        super().__init_subclass__(**kwargs)
        for name in cls.__dict__.get("_const_names", ()):
            setattr(cls, name, _store_const(name))

    def __init__(self, dim: int, *, seed: int = 0) -> None:
        self._init_config(dim, seed)  # n_updates is the row's count, set when the row is attached

    # -- the row -------------------------------------------------------------------------------

    @abc.abstractmethod
    def _new_store(self) -> rows.RowStore:
        """The store of this configuration (``self.dim``, ``self._config``): its constants, kernel
        parameters and one row's initial values."""

    def _attach(self) -> None:
        """Take a row of this configuration's store (the last step of ``__init__``)."""
        key = (
            type(self),
            self.dim,
            tuple(sorted((k, type(v).__name__, v) for k, v in self._config.items())),
        )
        row_calls.prepare(self._update_at)  # the per-call entry points, compiled and locked once
        store = rows.store_for(key, self._new_store)
        self._config = store.config
        self._store = store
        self._chunk, self._i = store.allocate()

    def __del__(self) -> None:
        try:
            store, chunk, i = self._store, self._chunk, self._i
        except AttributeError:  # the constructor failed before a row was attached
            return
        store.release(chunk, i)

    def __reduce__(self) -> tuple:
        # copy, deepcopy and pickle rebuild the model from its configuration and state, in a row
        # of its own (copying the slots would share the row).
        return _rebuild, (type(self), self.dim, self.config(), self.state_dict())

    @property
    def n_updates(self) -> int:
        """Rewards applied so far (the row's count)."""
        return self._chunk[COUNT].item(self._i)  # a Python int, read without a numpy scalar

    @n_updates.setter
    def n_updates(self, value: int) -> None:
        self._chunk[COUNT][self._i] = value

    def row_call(self) -> tuple[int, int, int]:
        """``(table, row, update)``: the address of this model's chunk table, its row, and its
        learner's update (row_calls.UPDATE_OFUL, ...), for a compiled caller that decides with
        row_calls' scoring and updates as the learner does (engine/compiled_pass.py). A model
        keeps its row for its life, so a caller may keep these as long as it keeps the model."""
        return self._chunk.table, self._i, self._update_kind

    def kernel_row(self) -> tuple:
        """``(theta, inv, scalars, count, i, kind, params)``: the chunk arrays, the row and the
        radius this model's decisions use, for a compiled caller that scores contexts as
        :meth:`scores` does (replay/row_kernel.py). A model keeps its row for its life, so a
        caller may keep these for as long as it keeps the model."""
        theta, inv, _, scalars, count = self._chunk
        return theta, inv, scalars, count, self._i, self._radius_kind, self._store.params

    def _state_array(self, name: str) -> np.ndarray:
        # The row itself, not a pinned view: the callers copy it or read its shape at once.
        return self._chunk[self._columns[name]][self._i]

    # -- many models' state at once (state_blocks.py) -----------------------------------------

    @classmethod
    def gather_block(cls, keys: list[str], models: list["LinearUCBPolicy"]) -> StateBlock:
        """The states of ``models`` (all of one store), named ``keys``, as a StateBlock: each
        column copied out with one fancy index per chunk."""
        store = models[0]._store
        columns = [np.empty((len(models), *a.shape), a.dtype) for a in store.initial]
        for chunk, index, pos in rows.by_chunk([(m._chunk, m._i) for m in models]):
            for column, out in zip(chunk, columns):
                out[pos] = column[index]
        scalars = {"n_updates": columns[COUNT]}
        for j, name in enumerate(cls._row_scalars):
            scalars[name] = np.ascontiguousarray(columns[SCALARS][:, j])
        return StateBlock(
            models[0].state_header(),
            keys,
            {k: columns[c] for k, c in cls._columns.items()},
            scalars,
        )

    def restore_block(self, block: StateBlock) -> list["LinearUCBPolicy"]:
        """New models of this one's configuration holding the states of ``block``, in its order.
        The block is checked as ``load_state_dict`` checks one state (its first model's, with
        the same errors), then column by column for every model. An adoptable block's columns
        become the models' rows (no copy), once."""
        n = len(block.keys)
        if n == 0:
            return []
        probe = type(self)(self.dim, **self.config())
        probe.load_state_dict(block.state(0))  # header, entries, shapes, dtypes and scalar types
        store = self._store
        if store.initial[SCALARS].shape != (len(self._row_scalars),):
            raise TypeError(
                f"{type(self).__name__}._row_scalars does not name every float scalar of its row"
            )
        expected = {k: store.initial[c] for k, c in self._columns.items()}
        expected |= {"n_updates": store.initial[COUNT]}
        expected |= {k: store.initial[SCALARS][j] for j, k in enumerate(self._row_scalars)}
        given = block.arrays | block.scalars
        if set(given) != set(expected):
            raise ValueError(f"state block holds {sorted(given)}, expected {sorted(expected)}")
        for k, a in given.items():
            if a.shape[1:] != expected[k].shape or a.dtype != expected[k].dtype:
                raise ValueError(
                    f"state block column {k!r} has rows of shape {a.shape[1:]} {a.dtype}, "
                    f"expected {expected[k].shape} {expected[k].dtype}"
                )
        # The rows the store has spare (a partition that moved away and back, a reload) are
        # filled by copying; only the models beyond them may take an adoptable block's columns
        # as their rows, so a store does not grow by a partition's rows at each handoff.
        reuse = min(n, store.spare) if block.adoptable else n
        arrays, scalars = block.hand_over() if reuse < n else (block.arrays, block.scalars)
        sources = [None] * len(store.initial)
        for k, c in self._columns.items():
            sources[c] = arrays[k]
        sources[COUNT] = scalars["n_updates"]
        slots = store.allocate_many(reuse)
        for chunk, index, pos in rows.by_chunk(slots):
            for c, column in enumerate(chunk):
                if c == SCALARS:
                    for j, k in enumerate(self._row_scalars):
                        column[index, j] = scalars[k][pos]
                else:
                    column[index] = sources[c][pos]
        if reuse < n:
            # The block's columns are private to it (a snapshot file's copy-on-write mapping):
            # they become the rows, and only the per-model scalars are gathered into one column.
            sources[SCALARS] = np.empty((n, len(self._row_scalars)))
            for j, k in enumerate(self._row_scalars):
                sources[SCALARS][:, j] = scalars[k]
            slots += store.adopt(tuple(column[reuse:] for column in sources))
        cls, dim, config, new = type(self), self.dim, store.config, object.__new__
        out = []
        for chunk, i in slots:
            m = new(cls)
            m.dim, m._config, m._store, m._chunk, m._i = dim, config, store, chunk, i
            out.append(m)
        return out

    # -- decisions ----------------------------------------------------------------------------
    #
    # The per-call path is one compiled call with three or four arguments (numerics/row_calls.py
    # says why): the dispatcher takes only a writable float64 C-contiguous matrix of arms (or
    # vector x) and refuses anything else with a TypeError before any compiled code runs; the
    # kernel checks the shape and the values as it reads them and returns a status. Input it
    # refuses goes through the checks in Python, which convert it or raise, and the row kernels.

    def _check_x(self, x: np.ndarray) -> np.ndarray:
        # The compiled updates check the values themselves and change nothing when one is not
        # finite, so the update only needs the shape here.
        return self._check_x_shape(x)

    def scores(self, arms: np.ndarray) -> np.ndarray:
        try:
            out = np.empty(len(arms))
            status = _scores_at(arms, self._chunk.table, self._i, out)
        except TypeError:
            arms = self._check_arms_shape(arms)
            out = np.empty(arms.shape[0])
            status = kernels.ucb_scores_row(
                arms, *self._chunk, self._i, self._radius_kind, self._store.params, out
            )
        if status != _OK:
            self._raise_for_arms(arms, status)
        return out

    def select(self, arms: np.ndarray) -> int:
        try:
            i = _select_at(arms, self._chunk.table, self._i)
        except TypeError:
            arms = self._check_arms_shape(arms)
            i = kernels.ucb_select_row(
                arms, *self._chunk, self._i, self._radius_kind, self._store.params
            )
        if i < 0:
            self._raise_for_arms(arms, i)
        return i

    def best(self, arms: np.ndarray) -> tuple[int, float]:
        # The kernel's (index, score) tuple is returned as it is: no unpacking and repacking on
        # the engine's per-context path.
        try:
            best = _best_at(arms, self._chunk.table, self._i)
        except TypeError:
            arms = self._check_arms_shape(arms)
            best = kernels.ucb_best_row(
                arms, *self._chunk, self._i, self._radius_kind, self._store.params
            )
        if best[0] < 0:
            self._raise_for_arms(arms, best[0])
        return best

    def best_versioned(self, arms: np.ndarray) -> tuple[int, float, int]:
        # best() and the row's count from one compiled call, its tuple returned as it is.
        try:
            best = _best_version_at(arms, self._chunk.table, self._i)
        except TypeError:
            return super().best_versioned(arms)  # best()'s checks in Python, then the count
        if best[0] < 0:
            self._raise_for_arms(arms, best[0])
        return best

    def _raise_for_arms(self, arms: np.ndarray, status: int) -> None:
        """The error of a kernel's arms status: the shape checks' own, or the values'."""
        if status == kernels.BAD_ARMS:
            raise ValueError(_NON_FINITE_ARMS)
        self._check_arms_shape(arms)
        raise AssertionError(f"status {status} for arms of shape {arms.shape}")

    def _batch(self, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = self._check_arms_batch(arms)
        chosen = np.zeros(a.shape[0], dtype=np.int64)
        scores = np.empty(a.shape[:2])
        status = kernels.ucb_argmax_batch_row(
            a, *self._chunk, self._i, self._radius_kind, self._store.params, chosen, scores
        )
        if status != kernels.OK:
            raise ValueError(f"context {-1 - status}: {_NON_FINITE_ARMS}")
        return chosen, scores

    def scores_batch(self, arms: np.ndarray) -> np.ndarray:
        return self._batch(arms)[1]

    def select_batch(self, arms: np.ndarray) -> np.ndarray:
        return self._batch(arms)[0]

    # -- updates ------------------------------------------------------------------------------

    def update(self, x: np.ndarray, reward: float) -> None:
        # One compiled call (``_update_at``) that checks x's length, the reward's range and x's
        # values before it touches the row, and counts the update only when it succeeds. Input
        # it cannot take as it is (not a float64 C-contiguous vector, not a float), and any
        # refusal, goes through the checks in Python, which convert it or raise the error.
        if isinstance(reward, float):  # a Python float or a numpy float64, taken as it is
            try:
                if self._update_at(self._chunk.table, self._i, x, reward) == _OK:
                    return
            except TypeError:
                pass
        self._update(self._check_x(x), self._check_reward(reward))

    def update_versioned(self, x: np.ndarray, reward: float) -> int:
        # update() with the count read from the row after it, not through the n_updates
        # property before it (a Python frame more per join on the engine's path).
        chunk, i = self._chunk, self._i
        if isinstance(reward, float):
            try:
                if self._update_at(chunk.table, i, x, reward) == _OK:
                    return chunk[COUNT].item(i) - 1
            except TypeError:
                pass
        version = chunk[COUNT].item(i)
        self._update(self._check_x(x), self._check_reward(reward))
        return version

    def _update(self, x: np.ndarray, reward: float) -> None:
        status = self._update_row(*self._chunk, self._i, x, reward, self._store.params)
        if status != kernels.OK:
            raise ValueError(self._status_message(status))

    def play(self, arms: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        # The learner's compiled loop (``_play_kernel``) on this row; bad input at round t is
        # reported as ``round t: <what the status means>``, rounds before t applied.
        a, r = self._check_play(arms, rewards)
        chosen = np.zeros(len(a), dtype=np.int64)
        done, status = type(self)._play_kernel(
            a, r, *self._chunk, self._i, self._store.params, chosen
        )
        if status != kernels.OK:
            raise ValueError(f"round {done}: {self._status_message(status)}")
        return chosen

    def _status_message(self, status: int) -> str:
        """What a kernel's bad-input status means, in the words the learner's errors use."""
        if status == kernels.BAD_X:
            return BAD_X_MESSAGE
        return _NON_FINITE_ARMS if status == kernels.BAD_ARMS else self._bad_reward_message
