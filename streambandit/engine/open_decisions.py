"""A partition's open decisions in arrays, for compiled code.

engine/partition.py holds each open decision as an Action object and its reward so far, in a
dict keyed by event id. Here the same fields are columns indexed by the decision's *entry* in an
:class:`~streambandit.engine.id_table.IdTable` of the event ids, so that a compiled pass over a
batch opens, finds, updates and closes decisions with no Python object per decision:

- ``ints[entry]``: the model (its index in the engine's list of model keys), the chosen arm (its
  entry in a table of arm ids, each held once, with a count of the decisions that name it), the
  arm's index among the candidates, the model's version that decided, the decision's event time,
  the window's deadline, the deadline's sequence number (which of equal deadlines comes first),
  the rewards received, the trigger (input source and offset) and the features' dimension;
- ``floats[entry]``: the score, the propensity and the reward so far;
- ``features[entry, :dim]``: the chosen arm's features, which the update and the joined record use.

The decisions keep the order they were opened in (the id table's order): the oldest is the one
``max_pending`` evicts, and a snapshot lists them in that order. :meth:`OpenDecisions.rows` and
:meth:`OpenDecisions.from_rows` are the snapshot's ``pending`` list, field for field what the
Python engine writes and reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streambandit.engine.id_table import IdTable

__all__ = ["OpenDecisions", "INT_FIELDS", "FLOAT_FIELDS"]

# The columns of ``ints`` and ``floats``.
MODEL, ARM, ARM_INDEX, VERSION, DECIDED_MS, DEADLINE_MS, SEQ, N_REWARDS = range(8)
TRIGGER_SOURCE, TRIGGER_OFFSET, DIM = 8, 9, 10
INT_FIELDS = 11
SCORE, PROPENSITY, REWARD = range(3)
FLOAT_FIELDS = 3


class OpenDecisions:
    """The open decisions (see the module's docstring). ``model_keys`` is the engine's list of
    model keys, which ``ints[:, MODEL]`` indexes; it is shared, not copied."""

    __slots__ = ("ids", "arm_ids", "arm_refs", "ints", "floats", "features", "model_keys")

    def __init__(self, model_keys: list[str], max_dim: int, capacity: int = 16) -> None:
        self.model_keys = model_keys
        self.ids = IdTable(entries=capacity, arena_bytes=16 * capacity)
        self.arm_ids = IdTable(entries=8)
        self.arm_refs = np.zeros(self.arm_ids.capacity, dtype=np.int64)
        cap = self.ids.capacity
        self.ints = np.zeros((cap, INT_FIELDS), dtype=np.int64)
        self.floats = np.zeros((cap, FLOAT_FIELDS), dtype=np.float64)
        self.features = np.zeros((cap, max(1, max_dim)), dtype=np.float64)

    def __len__(self) -> int:
        return len(self.ids)

    def reserve(self, decisions: int, id_bytes: int, arm_bytes: int) -> None:
        """Room for ``decisions`` more open decisions, whose event ids have ``id_bytes`` bytes in
        all and whose chosen arms' ids ``arm_bytes`` at most, without growing."""
        self.ids.reserve(decisions, id_bytes)
        cap = self.ids.capacity
        if cap > len(self.ints):
            grow = cap - len(self.ints)
            self.ints = np.concatenate([self.ints, np.zeros((grow, INT_FIELDS), np.int64)])
            self.floats = np.concatenate([self.floats, np.zeros((grow, FLOAT_FIELDS))])
            self.features = np.concatenate(
                [self.features, np.zeros((grow, self.features.shape[1]))]
            )
        self.arm_ids.reserve(decisions, arm_bytes)
        if self.arm_ids.capacity > len(self.arm_refs):
            grow = self.arm_ids.capacity - len(self.arm_refs)
            self.arm_refs = np.concatenate([self.arm_refs, np.zeros(grow, np.int64)])

    # -- one decision at a time, from Python ---------------------------------------------------

    def find(self, event_id: str) -> int:
        """The entry of the open decision of ``event_id``, or -1."""
        return self.ids.find(event_id.encode())

    def __contains__(self, event_id: str) -> bool:
        return self.ids.find(event_id.encode()) >= 0

    def open(
        self,
        event_id: str,
        model: int,
        arm_id: str,
        arm_index: int,
        score: float,
        propensity: float,
        version: int,
        decided_ms: int,
        features: np.ndarray,
        trigger: tuple[int, int],
        deadline_ms: int,
        seq: int,
        reward: float | None = None,
        n_rewards: int = 0,
    ) -> int:
        """Open a decision; its entry. An event id open already keeps its place and takes the new
        fields, as a dict's assignment does (recovery opens the logged decisions over those of
        the snapshot)."""
        key, arm = event_id.encode(), arm_id.encode()
        e = self.ids.find(key)
        if e >= 0:
            self._release_arm(int(self.ints[e, ARM]))
            self.reserve(0, 0, len(arm))
        else:
            self.reserve(1, len(key), len(arm))
            e = self.ids.add(key)
        a = self.arm_ids.add(arm)
        self.arm_refs[a] += 1
        dim = len(features)
        if dim > self.features.shape[1]:  # a model configured wider than any before
            wider = np.zeros((len(self.features), dim))
            wider[:, : self.features.shape[1]] = self.features
            self.features = wider
        self.ints[e] = (
            model,
            a,
            arm_index,
            version,
            decided_ms,
            deadline_ms,
            seq,
            n_rewards,
            trigger[0],
            trigger[1],
            dim,
        )
        self.floats[e] = (score, propensity, 0.0 if reward is None else reward)
        self.features[e, :dim] = features
        return e

    def close(self, entry: int) -> None:
        """Forget the decision of ``entry`` (and its arm id, when no other decision names it)."""
        self.ids.remove(entry)
        self._release_arm(int(self.ints[entry, ARM]))

    def _release_arm(self, a: int) -> None:
        self.arm_refs[a] -= 1
        if self.arm_refs[a] == 0:
            self.arm_ids.remove(a)

    def oldest(self) -> int:
        """The entry of the decision opened first of those open, or -1."""
        return self.ids.oldest()

    # -- the snapshot's pending list -----------------------------------------------------------

    def row(self, e: int) -> dict[str, Any]:
        """The decision of entry ``e`` as the snapshot's ``pending`` lists it (engine/partition.py:
        the action's fields, then the reward so far, None before the first, and their count)."""
        i, f = self.ints[e], self.floats[e]
        n_rewards = int(i[N_REWARDS])
        return {
            "event_id": self.ids.key(e).decode(),
            "model_key": self.model_keys[i[MODEL]],
            "arm_id": self.arm_ids.key(int(i[ARM])).decode(),
            "arm_index": int(i[ARM_INDEX]),
            "score": float(f[SCORE]),
            "propensity": float(f[PROPENSITY]),
            "model_version": int(i[VERSION]),
            "decision_timestamp_ms": int(i[DECIDED_MS]),
            "features": self.features[e, : i[DIM]].copy(),
            "trigger_source": int(i[TRIGGER_SOURCE]),
            "trigger_offset": int(i[TRIGGER_OFFSET]),
            "reward": float(f[REWARD]) if n_rewards else None,
            "n_rewards": n_rewards,
        }

    def rows(self) -> list[dict[str, Any]]:
        """Every open decision, in the order they were opened: :meth:`row` of each, with each
        column read once for all (a snapshot lists up to ``max_pending``: bench.e2e part 6)."""
        order = self.ids.order()
        ints, floats = self.ints[order], self.floats[order]
        event_ids = self.ids.keys_of(order)
        arm_ids = self.arm_ids.keys_of(ints[:, ARM])
        features = self.features[order]
        keys = self.model_keys
        out = []
        for k, (i, f) in enumerate(zip(ints.tolist(), floats.tolist())):
            n_rewards = i[N_REWARDS]
            out.append(
                {
                    "event_id": event_ids[k],
                    "model_key": keys[i[MODEL]],
                    "arm_id": arm_ids[k],
                    "arm_index": i[ARM_INDEX],
                    "score": f[SCORE],
                    "propensity": f[PROPENSITY],
                    "model_version": i[VERSION],
                    "decision_timestamp_ms": i[DECIDED_MS],
                    "features": features[k, : i[DIM]],
                    "trigger_source": i[TRIGGER_SOURCE],
                    "trigger_offset": i[TRIGGER_OFFSET],
                    "reward": f[REWARD] if n_rewards else None,
                    "n_rewards": n_rewards,
                }
            )
        return out

    def add_rows(
        self,
        rows: list[dict[str, Any]],
        model_of: dict[str, int],
        deadline_of: Any,
        first_seq: int = 1,
    ) -> int:
        """Open the decisions of a snapshot's ``pending`` list, in its order: ``model_of`` gives
        a model key's index, ``deadline_of(row)`` a decision's deadline (its model's window as
        configured now). Their sequence numbers count from ``first_seq``; the next one free."""
        seq = first_seq
        for r in rows:
            self.open(
                r["event_id"],
                model_of[r["model_key"]],
                r["arm_id"],
                r["arm_index"],
                r["score"],
                r["propensity"],
                r["model_version"],
                r["decision_timestamp_ms"],
                np.asarray(r["features"], dtype=np.float64),
                (r["trigger_source"], r["trigger_offset"]),
                deadline_of(r),
                seq,
                r["reward"],
                r["n_rewards"],
            )
            seq += 1
        return seq
