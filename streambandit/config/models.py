"""Model configuration: which model keys use which policy, and how their rewards are joined.

Read from a TOML file (``tomllib``, standard library). Example::

    [[models]]
    match = "ads-*"             # an exact model key, or a shell-style pattern (fnmatch)
    policy = "glb_omd"
    dim = 20
    reward_window_ms = 60000    # event time from the decision until the window closes
    default_reward = 0.0        # applied when the window closes with no reward
    aggregation = "first"       # first | last | sum, when several rewards arrive for one event
    epsilon = 0.05              # uniform exploration mixed over the policy's choice (0: none)
    seed = 0                    # seeds the exploration draws and the policy
    [models.hyper]              # keyword hyper-parameters of the policy
    link = "logistic"
    S = 8.0

A key is resolved by the first entry that matches it exactly, else by the first pattern that
matches it, in file order. A key nothing matches has no configuration: the worker dead-letters
its events (``unknown_model``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from streambandit.policies.base import POLICIES, Policy, make_policy

__all__ = [
    "ModelSpec",
    "ModelsConfig",
    "AGGREGATIONS",
    "load_models_config",
    "parse_models_config",
    "dump_models_config",
]

AGGREGATIONS = ("first", "last", "sum")
_GLOB_CHARS = set("*?[")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """How the models whose keys match ``match`` are built and joined."""

    match: str
    policy: str
    dim: int
    hyper: dict[str, Any]
    reward_window_ms: int
    default_reward: float
    aggregation: str = "first"
    epsilon: float = 0.0
    seed: int = 0

    @property
    def is_pattern(self) -> bool:
        return bool(_GLOB_CHARS & set(self.match))

    def build(self) -> Policy:
        """A fresh policy for one model key."""
        return make_policy(self.policy, dim=self.dim, seed=self.seed, **self.hyper)


@dataclasses.dataclass(frozen=True)
class ModelsConfig:
    """The ordered model specifications of one worker."""

    specs: tuple[ModelSpec, ...]

    def __post_init__(self) -> None:
        # Looked up for every event and every restored model: exact keys in a dict (the first
        # entry of a key wins), patterns compiled once, as fnmatch.fnmatchcase would compile them.
        exact: dict[str, ModelSpec] = {}
        for spec in self.specs:
            if not spec.is_pattern:
                exact.setdefault(spec.match, spec)
        patterns = tuple(
            (re.compile(fnmatch.translate(s.match)).match, s) for s in self.specs if s.is_pattern
        )
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_patterns", patterns)

    def resolve(self, model_key: str) -> ModelSpec | None:
        """The spec for ``model_key``: exact matches first, then patterns, each in file order."""
        spec = self._exact.get(model_key)
        if spec is not None:
            return spec
        for match, spec in self._patterns:
            if match(model_key):
                return spec
        return None


def load_models_config(path: str | Path) -> ModelsConfig:
    """Read and validate a model configuration file."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"model configuration {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"model configuration {p} is not valid TOML: {exc}") from exc
    return parse_models_config(raw, source=str(p))


def parse_models_config(raw: dict[str, Any], source: str = "<config>") -> ModelsConfig:
    """Validate the ``[[models]]`` tables of a parsed TOML document. Every error names the entry."""
    entries = raw.get("models")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{source}: needs at least one [[models]] table")
    specs = []
    seen: set[str] = set()
    for n, entry in enumerate(entries, start=1):
        where = f"{source}: [[models]] #{n}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a table")
        known = {f.name for f in dataclasses.fields(ModelSpec)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(sorted(known))}"
            )
        for required in ("match", "policy", "dim", "reward_window_ms", "default_reward"):
            if required not in entry:
                raise ValueError(f"{where}: missing required field {required!r}")
        match = entry["match"]
        if not isinstance(match, str) or not match:
            raise ValueError(f"{where}: match must be a non-empty string")
        if match in seen:
            raise ValueError(f"{where}: match {match!r} is configured twice")
        seen.add(match)
        where = f"{source}: [[models]] {match!r}"
        if entry["policy"] not in POLICIES:
            raise ValueError(
                f"{where}: unknown policy {entry['policy']!r}; known: {', '.join(sorted(POLICIES))}"
            )
        window = entry["reward_window_ms"]
        if isinstance(window, bool) or not isinstance(window, int) or window <= 0:
            raise ValueError(
                f"{where}: reward_window_ms must be a positive integer, got {window!r}"
            )
        aggregation = entry.get("aggregation", "first")
        if aggregation not in AGGREGATIONS:
            raise ValueError(
                f"{where}: aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}"
            )
        epsilon = entry.get("epsilon", 0.0)
        if (
            isinstance(epsilon, bool)
            or not isinstance(epsilon, (int, float))
            or not 0.0 <= epsilon <= 1.0
        ):
            raise ValueError(f"{where}: epsilon must be in [0, 1], got {epsilon!r}")
        hyper = entry.get("hyper", {})
        if not isinstance(hyper, dict):
            raise ValueError(f"{where}: hyper must be a table")
        default_reward = entry["default_reward"]
        if (
            isinstance(default_reward, bool)
            or not isinstance(default_reward, (int, float))
            or not math.isfinite(default_reward)
        ):
            raise ValueError(
                f"{where}: default_reward must be a finite number, got {default_reward!r}"
            )
        spec = ModelSpec(
            match=match,
            policy=entry["policy"],
            dim=entry["dim"],
            hyper=dict(hyper),
            reward_window_ms=window,
            default_reward=float(default_reward),
            aggregation=aggregation,
            epsilon=float(epsilon),
            seed=entry.get("seed", 0),
        )
        # Build one policy now so a bad dim or hyper-parameter fails at start-up, not on the first
        # event; and the default reward must be one the policy accepts (e.g. in [0, 1] for logistic).
        try:
            policy = spec.build()
            policy.validate_reward(spec.default_reward)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        specs.append(spec)
    return ModelsConfig(tuple(specs))


def _toml_value(v: Any, where: str) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"{where}: {v!r} has no TOML form here")
        return repr(v)  # the shortest text that reads back to the same double
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    raise ValueError(f"{where}: a {type(v).__name__} has no TOML form here")


def dump_models_config(config: ModelsConfig) -> str:
    """The ``[[models]]`` tables of ``config`` as TOML text that :func:`parse_models_config`
    reads back to an equal configuration."""
    lines: list[str] = []
    for spec in config.specs:
        where = f"[[models]] {spec.match!r}"
        lines.append("[[models]]")
        for field in (
            "match",
            "policy",
            "dim",
            "reward_window_ms",
            "default_reward",
            "aggregation",
            "epsilon",
            "seed",
        ):
            lines.append(f"{field} = {_toml_value(getattr(spec, field), where)}")
        if spec.hyper:
            lines.append("[models.hyper]")
            for key, value in spec.hyper.items():
                if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
                    raise ValueError(
                        f"{where}: hyper-parameter name {key!r} is not a bare TOML key"
                    )
                lines.append(f"{key} = {_toml_value(value, where)}")
        lines.append("")
    return "\n".join(lines)
