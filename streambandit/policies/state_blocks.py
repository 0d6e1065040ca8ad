"""Model states column by column: how a snapshot holds many models of one configuration.

Why: a snapshot of a partition with 100,000 models made of one ``state_dict()`` per model costs
per-model Python work on both sides (a dict, array copies, a constructor and the checks of
``load_state_dict`` on restore), seconds in all, and a moved partition serves again only after its
restore (``python -m bench.snapshots`` measures the restore). The compiled learners keep every
model of one configuration as a row of shared arrays (rows.py), so their states can be copied out
and back a column at a time: a :class:`StateBlock` holds one configuration's header once, the
models' keys, and each state entry as one array with a row per model.

Pure: no I/O. wire/snapshot.py writes a block's columns as raw buffers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

__all__ = ["StateBlock", "ModelStates", "model_states", "layers_of"]


@dataclasses.dataclass
class StateBlock:
    """The states of ``len(keys)`` models of one configuration: ``header`` (``policy``, ``dim``
    and the ``config.*`` entries of ``state_dict()``, the same for all), and per state entry one
    array whose row j belongs to ``keys[j]`` (``arrays``: the state arrays, ``scalars``: the
    state scalars, shape ``(n,)``), and whether a restore may take the columns as they are
    (``adoptable``)."""

    header: dict[str, Any]
    keys: list[str]
    arrays: dict[str, np.ndarray]
    scalars: dict[str, np.ndarray]
    # True when the columns are writable memory nothing else uses (a snapshot file mapped
    # copy-on-write): a restore may then make them the models' rows instead of copying them
    # (hand_over). After that the models write into them, so the block no longer holds the
    # snapshot's states and refuses to be read.
    adoptable: bool = False
    handed_over: bool = False

    def __post_init__(self) -> None:
        n = len(self.keys)
        for name, a in (*self.arrays.items(), *self.scalars.items()):
            if a.shape[:1] != (n,):
                raise ValueError(
                    f"state block column {name!r} has shape {a.shape}, expected {n} rows"
                )
        for name, a in self.scalars.items():
            if a.ndim != 1:
                raise ValueError(
                    f"state block scalar column {name!r} has shape {a.shape}, expected ({n},)"
                )

    def hand_over(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The columns (``arrays``, ``scalars``) of an adoptable block, to become models' rows;
        the block is unusable afterwards."""
        if not self.adoptable:
            raise ValueError("this state block's columns are not its own to hand over")
        self._check_usable()
        self.handed_over = True
        return self.arrays, self.scalars

    def _check_usable(self) -> None:
        if self.handed_over:
            raise ValueError(
                "this state block's columns were handed over to restored models, which change them"
            )

    def state(self, j: int) -> dict[str, Any]:
        """The ``state_dict()`` of model ``keys[j]`` (arrays copied)."""
        self._check_usable()
        state = dict(self.header)
        for k, col in self.scalars.items():
            state[k] = col[j].item()  # int64 -> int, float64 -> float, as state_dict() has them
        for k, col in self.arrays.items():
            state[k] = np.array(col[j])
        return state

    def take(self, rows: np.ndarray) -> "StateBlock":
        """The block of the models at ``rows`` (positions into ``keys``)."""
        self._check_usable()
        return StateBlock(
            self.header,
            [self.keys[j] for j in rows],
            {k: a[rows] for k, a in self.arrays.items()},
            {k: a[rows] for k, a in self.scalars.items()},
        )


class ModelStates(Mapping):
    """``model key -> state dict`` for a snapshot: models in blocks (the row-store learners),
    and the rest one state each in ``records`` (any mapping, e.g. decoded on access). A key is
    in one place only. Reading a key builds its state dict; a restore takes the blocks whole."""

    def __init__(self, records: Mapping[str, dict[str, Any]], blocks: list[StateBlock]) -> None:
        self.records = records
        self.blocks = blocks
        self._where: dict[str, tuple[int, int]] | None = None

    def _index(self) -> dict[str, tuple[int, int]]:
        if self._where is None:
            where: dict[str, tuple[int, int]] = {}
            for b, block in enumerate(self.blocks):
                for j, key in enumerate(block.keys):
                    where[key] = (b, j)
            if len(where) != sum(len(block.keys) for block in self.blocks) or any(
                k in where for k in self.records
            ):
                raise ValueError("a model key appears twice in the snapshot's models")
            self._where = where
        return self._where

    def __getitem__(self, key: str) -> dict[str, Any]:
        at = self._index().get(key)
        if at is None:
            return self.records[key]
        return self.blocks[at[0]].state(at[1])

    def __iter__(self) -> Iterator[str]:
        for block in self.blocks:
            yield from block.keys
        yield from self.records

    def __len__(self) -> int:
        return len(self.records) + sum(len(block.keys) for block in self.blocks)

    def check(self) -> None:
        """Raise ValueError if a key appears twice."""
        self._index()


def model_states(models: Mapping[str, Any], keys: Iterable[str]) -> ModelStates:
    """The states of ``models[k]`` for ``k`` in ``keys``: the row-store learners a block per
    configuration (copied out a column at a time), the others ``state_dict()`` each."""
    records: dict[str, dict[str, Any]] = {}
    groups: dict[int, tuple[list[str], list[Any]]] = {}
    for key in keys:
        m = models[key]
        # A row-store learner (linear_ucb.py) keeps its state as a row of its store's arrays and
        # gathers the rows of many models at once (its class's gather_block).
        store = getattr(m, "_store", None)
        if store is not None:
            ks, ms = groups.setdefault(id(store), ([], []))
            ks.append(key)
            ms.append(m)
        else:
            records[key] = m.state_dict()
    blocks = [type(ms[0]).gather_block(ks, ms) for ks, ms in groups.values()]
    return ModelStates(records, blocks)


def layers_of(models: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The snapshots' model mappings ``models`` is made of, oldest first (a composed chain has
    one per snapshot, engine/chains.py; later ones override earlier ones key by key)."""
    return list(getattr(models, "layers", [models]))
