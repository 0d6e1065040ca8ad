"""Feature vectors for logs that do not carry them per arm: a user's features beside an item
catalog, categorical values, and named (hashed) features.

The rules, one each, documented in docs/replay_formats.md:

- **Combining a row's context ``u`` (m,) with the arms' features ``c_a`` (c,)** into the arm
  vectors a model scores: ``concat`` gives ``x_a = [u, c_a]`` (m + c); ``outer`` gives
  ``x_a = vec([1, u] c_a')`` ((m + 1) c), the item features alone and crossed with every context
  feature, so a linear model learns per-context preferences. Under ``concat`` the context adds
  the same ``theta_u . u`` to every arm and cannot change which arm wins: use it only when the
  arms' own features carry the context (or for a disjoint model per context).
- **Categorical columns of a catalog** (any value not a number) are one-hot over the column's
  distinct values, sorted; numeric columns stay as they are. The vocabulary is the catalog's,
  read whole before the log.
- **Categorical and named features of a row** (a user's segment, DSJSON's ``"device": "ios"``)
  are hashed (Weinberger et al. 2009, "Feature hashing for large scale multitask learning"):
  the name ``"namespace^feature"`` (with the string value appended for categorical values)
  goes to index ``h mod dim`` with sign ``+-1`` from another bit of ``h``, ``h`` a 64-bit
  blake2b of the name, so no vocabulary is needed in one pass and every run, process and
  machine agrees. Collisions add; their sign makes them cancel in expectation.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "COMBINE_RULES",
    "MAX_HASH_DIM",
    "check_hash_dim",
    "combine",
    "combined_dim",
    "hash_slot",
    "hash_features",
    "encode_columns",
]

COMBINE_RULES = ("concat", "outer")
# A bound on hashed dimensions: every arm of every row gets a vector of this many doubles, and a
# learner's state grows with its square; a dimension above it is a typo, not a model.
MAX_HASH_DIM = 1 << 16


def check_hash_dim(dim: int, what: str, *, allow_zero: bool = False) -> None:
    """A ValueError naming ``what`` unless ``dim`` is an integer in [1 (or 0), MAX_HASH_DIM]."""
    low = 0 if allow_zero else 1
    if isinstance(dim, bool) or not isinstance(dim, int) or not low <= dim <= MAX_HASH_DIM:
        raise ValueError(f"{what} must be an integer in [{low}, {MAX_HASH_DIM}], got {dim!r}")


@functools.lru_cache(maxsize=1 << 16)  # names repeat on every row: hash each once (bounded)
def hash_slot(name: str, dim: int) -> tuple[int, float]:
    """The index in ``[0, dim)`` and the sign of the named feature ``name``."""
    h = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")
    return h % dim, (1.0 if (h >> 63) & 1 == 0 else -1.0)


def hash_features(features: Iterable[tuple[str, float]], dim: int) -> np.ndarray:
    """``(name, value)`` pairs hashed into a (dim,) vector (module docstring); a non-finite
    value is a ValueError naming the feature."""
    if dim < 1:
        raise ValueError(f"hashing needs a dimension >= 1, got {dim}")
    x = np.zeros(dim)
    for name, value in features:
        v = float(value)
        if not math.isfinite(v):
            raise ValueError(f"feature {name!r} has the non-finite value {value!r}")
        i, sign = hash_slot(name, dim)
        x[i] += sign * v
    return x


def combined_dim(context_dim: int, item_dim: int, rule: str) -> int:
    """The dimension of the arm vectors :func:`combine` makes."""
    if rule == "concat":
        return context_dim + item_dim
    if rule == "outer":
        return (context_dim + 1) * item_dim
    raise ValueError(f"unknown combining rule {rule!r}; known: {', '.join(COMBINE_RULES)}")


def combine(context: np.ndarray, items: np.ndarray, rule: str) -> np.ndarray:
    """The (K, d) arm vectors of one row from its context (m,) and the arms' features (K, c)."""
    u = np.asarray(context, dtype=np.float64)
    c = np.asarray(items, dtype=np.float64)
    if u.ndim != 1 or c.ndim != 2:
        raise ValueError(
            f"combine needs a context (m,) and items (K, c), got {u.shape} and {c.shape}"
        )
    if rule == "concat":
        return np.concatenate([np.broadcast_to(u, (c.shape[0], u.shape[0])), c], axis=1)
    if rule == "outer":
        # x_a[i * c + j] = [1, u][i] * c_a[j]: the items' features, then each crossed with u_i.
        one_u = np.concatenate([[1.0], u])
        return (one_u[None, :, None] * c[:, None, :]).reshape(c.shape[0], -1)
    raise ValueError(f"unknown combining rule {rule!r}; known: {', '.join(COMBINE_RULES)}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def encode_columns(
    names: Sequence[str], rows: Sequence[Sequence[str]]
) -> tuple[np.ndarray, list[str]]:
    """A table of text values as numbers: a column whose every value is a number stays one
    feature; any other column becomes one-hot features, one per distinct value (sorted), named
    ``column=value``. Returns the (rows, features) matrix and the features' names. A numeric
    column with a NaN or an infinity is a ValueError naming it (not a category)."""
    if not rows:
        return np.zeros((0, 0)), []
    cols, out_names = [], []
    for j, name in enumerate(names):
        values = [r[j].strip() for r in rows]
        numbers = [_number(v) for v in values]
        if all(v is not None for v in numbers):
            if not all(math.isfinite(v) for v in numbers):  # type: ignore[arg-type]
                raise ValueError(f"column {name!r} has a non-finite value")
            cols.append(np.array(numbers, dtype=np.float64)[:, None])
            out_names.append(name)
            continue
        vocab = sorted(set(values))
        index = {v: i for i, v in enumerate(vocab)}
        onehot = np.zeros((len(values), len(vocab)))
        onehot[np.arange(len(values)), [index[v] for v in values]] = 1.0
        cols.append(onehot)
        out_names += [f"{name}={v}" for v in vocab]
    return np.concatenate(cols, axis=1), out_names
