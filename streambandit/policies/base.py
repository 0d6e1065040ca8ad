"""The policy interface every learner implements, its input checks, and the registry.

A policy is pure: numpy in, numpy out, no I/O, no global random state, no clock. The same object
runs inside the Kafka worker, over a replayed log and in the simulator.

State is a flat ``dict`` of ``str -> numpy array | Python scalar`` (no objects, so it serialises
to Avro without pickle). It carries the policy name, the dimension and every hyper-parameter under
``config.<name>``, so that loading a state into a differently configured policy is an error rather
than a silently different learner.
"""

from __future__ import annotations

import abc
import functools
import inspect
import math
from typing import Any, ClassVar

import numpy as np

from streambandit.numerics.kernels import MAX_ABS_FEATURE, MAX_ABS_REWARD, features_within_bound

__all__ = ["Policy", "POLICIES", "make_policy", "register", "MAX_ABS_FEATURE", "MAX_ABS_REWARD"]

# What every learner refuses (the compiled kernels and the numpy learners alike): numerics/kernels.py says
# why these bounds.
BAD_ARMS_MESSAGE = (
    f"arms contain NaN or infinite features, or features beyond +-{MAX_ABS_FEATURE:g}"
)
BAD_X_MESSAGE = f"x contains NaN or infinite features, or features beyond +-{MAX_ABS_FEATURE:g}"

Scalar = bool | int | float | str

POLICIES: dict[str, type["Policy"]] = {}


def register(cls: type["Policy"]) -> type["Policy"]:
    """Class decorator: add a policy class to :data:`POLICIES` under ``cls.name``."""
    if cls.name in POLICIES:
        raise RuntimeError(f"policy name {cls.name!r} registered twice")
    POLICIES[cls.name] = cls
    return cls


def make_policy(name: str, dim: int, **hyper: Any) -> "Policy":
    """Build a policy by registry name with keyword hyper-parameters.

    >>> p = make_policy("oful", dim=3, seed=0)
    >>> p.select(np.eye(3))
    0
    """
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; known policies: {', '.join(sorted(POLICIES))}"
        ) from None
    accepted = cls.hyper_parameters()
    unknown = sorted(set(hyper) - set(accepted))
    if unknown:
        raise ValueError(
            f"policy {name!r} has no hyper-parameter {', '.join(map(repr, unknown))}; "
            f"it accepts: {', '.join(accepted)}"
        )
    policy = cls(dim, **hyper)
    if hasattr(
        policy, "__dict__"
    ):  # the row-store learners share theirs through their store (rows.py)
        _share_configuration(policy)
    return policy


# Policies of one configuration share its config dict and the constants their constructors derive
# from it (immutable values), instead of one copy per model: a worker holds one model per key, and
# per-model copies add up (`python -m bench.memory` accounts for every byte). Bounded, so that
# building policies with ever new configurations (a parameter sweep) does not grow it for ever.
# The compiled learners go further: their RowStore (rows.py) holds the configuration, its
# constants and every model's state as rows of shared arrays.
_SHARED: dict[tuple, dict[str, Any]] = {}
_SHARED_MAX = 4096


def _immutable(v: Any) -> bool:
    if isinstance(v, tuple):
        return all(_immutable(e) for e in v)
    return v is None or isinstance(v, (bool, int, float, str))


def _share_configuration(policy: "Policy") -> None:
    key = (
        type(policy),
        policy.dim,
        tuple(sorted((k, type(v).__name__, v) for k, v in policy._config.items())),
    )
    shared = _SHARED.get(key)
    if shared is None:
        if len(_SHARED) >= _SHARED_MAX:
            return
        state = {"dim", *policy._state_arrays, *policy._state_scalars}
        shared = {k: v for k, v in vars(policy).items() if k not in state and _immutable(v)}
        shared["_config"] = policy._config
        _SHARED[key] = shared
    vars(policy).update(shared)


@functools.cache
def _keyword_parameters(cls: type) -> tuple[str, ...]:
    # Once per class: make_policy checks the names for every model it builds (a worker builds one
    # per new model key and per model restored), and inspect.signature is slow.
    sig = inspect.signature(cls.__init__)
    return tuple(
        p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY
    )


def check_positive(name: str, value: float) -> float:
    """``float(value)`` if it is a finite number > 0, else a ValueError naming the parameter."""
    v = float(value)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


def check_in_range(
    name: str, value: float, lo: float, hi: float, *, lo_open: bool = False
) -> float:
    """``float(value)`` if ``lo <= value <= hi`` (``lo < value`` when ``lo_open``), else ValueError."""
    v = float(value)
    ok = (lo < v if lo_open else lo <= v) and v <= hi
    if not (math.isfinite(v) and ok):
        left = "(" if lo_open else "["
        raise ValueError(f"{name} must be in {left}{lo}, {hi}], got {value!r}")
    return v


_F64 = np.dtype(np.float64)


def features_ok(a: np.ndarray) -> bool:
    """True when every element is a number of magnitude at most ``MAX_ABS_FEATURE`` (NaN fails
    the comparison, so it is refused with the infinities and the huge values)."""
    if a.dtype is _F64 and a.flags.c_contiguous:
        # One compiled pass: numpy's abs then max makes a temporary and costs microseconds more
        # on a rank call's matrix.
        return features_within_bound(a)
    return a.size == 0 or bool(np.abs(a).max() <= MAX_ABS_FEATURE)


class Policy(abc.ABC):
    """A contextual-bandit learner over arms given as feature vectors in R^dim.

    Subclasses set :attr:`name`, list their array state in :attr:`_state_arrays` and their mutable
    scalar state in :attr:`_state_scalars`, fill ``self._config`` with their validated
    hyper-parameters, and implement :meth:`scores` and :meth:`_update`.
    """

    name: ClassVar[str]
    _state_arrays: ClassVar[tuple[str, ...]] = ()
    # Arrays among _state_arrays whose shape grows with the data (a sketch's blocks, a kernel
    # learner's pulled points): a loaded state must match their dtype and number of dimensions,
    # not a fresh policy's shape. The policy checks their consistency in _check_loaded_state.
    _state_arrays_resizable: ClassVar[tuple[str, ...]] = ()
    _state_scalars: ClassVar[tuple[str, ...]] = ("n_updates",)
    # Empty, so that a subclass may declare __slots__ and have no per-instance __dict__ (the
    # row-store learners); a subclass without __slots__ gets a __dict__ as usual.
    __slots__ = ()

    def __init__(self, dim: int, *, seed: int = 0) -> None:
        self._init_config(dim, seed)
        self.n_updates = 0

    def _init_config(self, dim: int, seed: int) -> None:
        """Check and set ``dim`` and the configuration's seed (the part of ``__init__`` a learner
        that keeps ``n_updates`` elsewhere also needs)."""
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be an integer >= 1, got {dim!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise ValueError(f"seed must be an integer, got {seed!r}")
        self.dim = int(dim)
        self._config: dict[str, Scalar] = {"seed": int(seed)}

    # -- configuration ------------------------------------------------------------------------

    @classmethod
    def hyper_parameters(cls) -> list[str]:
        """Names of the keyword hyper-parameters the constructor accepts (besides ``dim``)."""
        return list(_keyword_parameters(cls))

    def config(self) -> dict[str, Scalar]:
        """The validated hyper-parameters; ``make_policy(self.name, self.dim, **self.config())``
        builds an identically configured fresh policy."""
        return dict(self._config)

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        """Small configurations the shared contract suite runs this policy with."""
        return [{}]

    # -- decisions ----------------------------------------------------------------------------

    @abc.abstractmethod
    def scores(self, arms: np.ndarray) -> np.ndarray:
        """Index of each arm (K, d) -> (K,): the optimistic (UCB) score the policy maximises."""

    def select(self, arms: np.ndarray) -> int:
        """Index of the chosen arm: the argmax of :meth:`scores`, ties broken by the lowest index
        (``np.argmax`` returns the first maximum), so replay chooses exactly as live did."""
        return int(self.scores(arms).argmax())

    def best(self, arms: np.ndarray) -> tuple[int, float]:
        """``(select(arms), scores(arms)[select(arms)])`` in one call: what the decision rule needs
        when it does not explore (the compiled learners score the arms once for both)."""
        s = self.scores(arms)
        i = int(s.argmax())
        return i, float(s[i])

    def best_versioned(self, arms: np.ndarray) -> tuple[int, float, int]:
        """``(*best(arms), n_updates)``: a decision and the version of the model that made it, in
        one call (the engine's per-context path, where a property read is a Python frame more)."""
        i, score = self.best(arms)
        return i, score, self.n_updates

    def scores_batch(self, arms: np.ndarray) -> np.ndarray:
        """Scores of B contexts (B, K, d) -> (B, K) against the current state, with no update in
        between: row b is exactly ``scores(arms[b])``."""
        a = self._check_arms_batch(arms)
        return np.stack([self.scores(row) for row in a]) if len(a) else np.empty((0, a.shape[1]))

    def select_batch(self, arms: np.ndarray) -> np.ndarray:
        """Choices for B contexts (B, K, d) -> (B,) int64 against the current state, with no
        update in between: entry b is exactly ``select(arms[b])``."""
        return self.scores_batch(arms).argmax(axis=1).astype(np.int64)

    def play(self, arms: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Select and update for each of n rounds in order: ``i = select(arms[t])`` then
        ``update(arms[t, i], rewards[t, i])``; returns the n choices (int64).

        ``arms`` is (n, K, d) and ``rewards`` (n, K), a reward for every arm of which only the
        chosen one is revealed (the simulator's and the benchmarks' loop). The result and the
        final state are those of the Python loop to the bit. Bad input at round t raises a
        ValueError naming t, with rounds before t applied and round t not.
        """
        a, r = self._check_play(arms, rewards)
        chosen = np.empty(len(a), dtype=np.int64)
        for t in range(len(a)):
            try:
                i = self.select(a[t])
                self.update(a[t, i], r[t, i])
            except ValueError as e:
                raise ValueError(f"round {t}: {e}") from None
            chosen[t] = i
        return chosen

    def update(self, x: np.ndarray, reward: float) -> None:
        """Apply one observed ``reward`` for the chosen feature vector ``x`` (d,)."""
        x = self._check_x(x)
        r = self._check_reward(reward)
        self._update(x, r)
        self.n_updates += 1

    def update_versioned(self, x: np.ndarray, reward: float) -> int:
        """:meth:`update`, returning ``n_updates`` as it was before it (the version the update was
        applied to): what the engine records with each join, in one call."""
        version = self.n_updates
        self.update(x, reward)
        return version

    @abc.abstractmethod
    def _update(self, x: np.ndarray, reward: float) -> None:
        """The learner's one-pass update, on validated inputs (x is float64 and may be a view of
        the caller's data: never modify it)."""

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The whole learner as ``str -> numpy array | Python scalar``; arrays are copies."""
        state = self.state_header()
        for k in self._state_scalars:
            state[k] = getattr(self, k)
        for k in self._state_arrays:
            state[k] = self._state_array(k).copy()
        return state

    def state_header(self) -> dict[str, Any]:
        """The entries of ``state_dict()`` fixed by the configuration: ``policy``, ``dim`` and
        ``config.<hyper-parameter>``."""
        state: dict[str, Any] = {"policy": self.name, "dim": self.dim}
        for k, v in self._config.items():
            state[f"config.{k}"] = v
        return state

    def _state_array(self, name: str) -> np.ndarray:
        """The array state entry ``name`` itself (not a copy), for reading."""
        return getattr(self, name)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this policy's state with ``state``; configuration and shapes must match.

        Loading then continuing gives bit-for-bit the results of the policy that saved it.
        """
        if state.get("policy") != self.name:
            raise ValueError(f"state is for policy {state.get('policy')!r}, not {self.name!r}")
        if state.get("dim") != self.dim:
            raise ValueError(f"state has dim {state.get('dim')!r}, this policy has dim {self.dim}")
        theirs = {k[len("config.") :]: v for k, v in state.items() if k.startswith("config.")}
        if theirs != self._config:
            diff = sorted(
                k for k in set(theirs) | set(self._config) if theirs.get(k) != self._config.get(k)
            )
            detail = ", ".join(
                f"{k}: state {theirs.get(k)!r} vs policy {self._config.get(k)!r}" for k in diff
            )
            raise ValueError(f"state configuration does not match this policy ({detail})")
        missing = [k for k in (*self._state_scalars, *self._state_arrays) if k not in state]
        if missing:
            raise ValueError(f"state is missing {', '.join(missing)}")
        arrays = {}
        for k in self._state_arrays:
            mine = self._state_array(k)
            v = np.asarray(state[k])
            resizable = k in self._state_arrays_resizable
            if (
                v.ndim != mine.ndim if resizable else v.shape != mine.shape
            ) or v.dtype != mine.dtype:
                expected = f"{mine.ndim} dimensions" if resizable else f"shape {mine.shape}"
                raise ValueError(
                    f"state array {k!r} has shape {v.shape} {v.dtype}, expected {expected} {mine.dtype}"
                )
            arrays[k] = np.array(v, copy=True, order="C")
        for k in self._state_scalars:
            v = state[k]
            if type(v) is not type(getattr(self, k)):
                raise ValueError(
                    f"state scalar {k!r} is {type(v).__name__}, expected {type(getattr(self, k)).__name__}"
                )
        self._check_loaded_state(arrays, {k: state[k] for k in self._state_scalars})
        # Only assign once everything is checked, so a bad state leaves the policy untouched.
        for k, v in arrays.items():
            setattr(self, k, v)
        for k in self._state_scalars:
            setattr(self, k, state[k])

    def _check_loaded_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        """Raise ValueError if a state that passed the generic checks is inconsistent (policies
        with resizable arrays check their shapes against each other here)."""

    def state_nbytes(self) -> int:
        """Bytes of array state held per model (what a snapshot of it costs, before headers)."""
        return int(sum(self._state_array(k).nbytes for k in self._state_arrays))

    # -- input checks -------------------------------------------------------------------------

    def validate_reward(self, reward: Any) -> float:
        """``reward`` as a float if :meth:`update` would accept it, else a ValueError saying why
        (the worker checks rewards before joining them, to dead-letter a bad one with its reason)."""
        return self._check_reward(reward)

    def reward_range(self) -> tuple[float, float]:
        """The rewards :meth:`validate_reward` accepts: the floats r with ``lo <= r <= hi``
        (compiled code checks a reward with it, no call; a NaN is never within)."""
        return (-MAX_ABS_REWARD, MAX_ABS_REWARD)

    def _check_arms(self, arms: Any) -> np.ndarray:
        a = np.asarray(arms, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError(f"arms must have shape (K, {self.dim}), got {a.shape}")
        if a.shape[0] == 0:
            raise ValueError("arms is empty: there must be at least one arm to choose from")
        if not features_ok(a):
            raise ValueError(BAD_ARMS_MESSAGE)
        return a

    def _check_arms_shape(self, arms: Any) -> np.ndarray:
        """``arms`` as a C-contiguous float64 (K, d) array; the compiled kernels check the values."""
        a = np.ascontiguousarray(arms, dtype=np.float64)
        if a.ndim != 2 or a.shape[1] != self.dim:
            raise ValueError(f"arms must have shape (K, {self.dim}), got {a.shape}")
        if a.shape[0] == 0:
            raise ValueError("arms is empty: there must be at least one arm to choose from")
        return a

    def _check_arms_batch(self, arms: Any) -> np.ndarray:
        a = np.ascontiguousarray(arms, dtype=np.float64)
        if a.ndim != 3 or a.shape[2] != self.dim:
            raise ValueError(f"arms must have shape (B, K, {self.dim}), got {a.shape}")
        if a.shape[1] == 0:
            raise ValueError("arms is empty: there must be at least one arm to choose from")
        return a

    def _check_play(self, arms: Any, rewards: Any) -> tuple[np.ndarray, np.ndarray]:
        a = self._check_arms_batch(arms)
        r = np.ascontiguousarray(rewards, dtype=np.float64)
        if r.shape != a.shape[:2]:
            raise ValueError(f"rewards must have shape (n, K) = {a.shape[:2]}, got {r.shape}")
        return a, r

    def _check_x_shape(self, x: Any) -> np.ndarray:
        """``x`` as a C-contiguous float64 (d,) array; the compiled kernels check the values."""
        v = np.ascontiguousarray(x, dtype=np.float64)
        if v.shape != (self.dim,):
            raise ValueError(f"x must have shape ({self.dim},), got {v.shape}")
        return v

    def _check_x(self, x: Any) -> np.ndarray:
        v = np.asarray(x, dtype=np.float64)
        if v.shape != (self.dim,):
            raise ValueError(f"x must have shape ({self.dim},), got {v.shape}")
        if not features_ok(v):
            raise ValueError(BAD_X_MESSAGE)
        return v

    def _check_reward(self, reward: Any) -> float:
        try:
            r = float(reward)
        except (TypeError, ValueError):
            raise ValueError(f"reward must be a number, got {reward!r}") from None
        if not abs(r) <= MAX_ABS_REWARD:
            raise ValueError(
                f"reward must be finite and within +-{MAX_ABS_REWARD:g}, got {reward!r}"
            )
        return r

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._config.items())
        return f"{type(self).__name__}(dim={self.dim}, {args}, n_updates={self.n_updates})"
