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

from streambandit.config import schema
from streambandit.policies.base import POLICIES, Policy, make_policy

__all__ = [
    "ModelSpec",
    "ModelsConfig",
    "AGGREGATIONS",
    "load_models_config",
    "parse_models_config",
    "dump_models_config",
    "toml_value",
]

AGGREGATIONS = schema.table("models")["aggregation"].choices
# Each field's type, range and default: config/schema.py; hyper holds the policy's own.
_SETTINGS = schema.table("models")
_FIELDS = set(_SETTINGS) | {"hyper"}
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
    aggregation: str = schema.table("models")["aggregation"].default
    epsilon: float = schema.table("models")["epsilon"].default
    seed: int = schema.table("models")["seed"].default

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
        unknown = sorted(set(entry) - _FIELDS)
        if unknown:
            raise ValueError(
                f"{where}: unknown field(s) {', '.join(unknown)}; fields are {', '.join(sorted(_FIELDS))}"
            )
        for key, setting in _SETTINGS.items():
            if setting.default is schema.REQUIRED and key not in entry:
                raise ValueError(f"{where}: missing required field {key!r}")
        match = entry["match"]
        _SETTINGS["match"].check(match, f"{where}:")
        if match in seen:
            raise ValueError(f"{where}: match {match!r} is configured twice")
        seen.add(match)
        where = f"{source}: [[models]] {match!r}"
        if not isinstance(entry["policy"], str) or entry["policy"] not in POLICIES:
            raise ValueError(
                f"{where}: unknown policy {entry['policy']!r}; known: {', '.join(sorted(POLICIES))}"
            )
        for key, value in entry.items():
            if key in _SETTINGS:
                _SETTINGS[key].check(value, f"{where}:")
        hyper = entry.get("hyper", {})
        if not isinstance(hyper, dict):
            raise ValueError(f"{where}: hyper must be a table")
        values = {k: entry.get(k, s.default) for k, s in _SETTINGS.items()}
        for key in ("default_reward", "epsilon"):  # an integer in the file is a float here
            values[key] = float(values[key])
        spec = ModelSpec(**values, hyper=dict(hyper))
        # Build one policy now so a bad dim or hyper-parameter fails at start-up, not on the first
        # event; and the default reward must be one the policy accepts (e.g. in [0, 1] for logistic).
        try:
            policy = spec.build()
            policy.validate_reward(spec.default_reward)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from exc
        specs.append(spec)
    return ModelsConfig(tuple(specs))


def toml_value(v: Any, where: str) -> str:
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
            lines.append(f"{field} = {toml_value(getattr(spec, field), where)}")
        if spec.hyper:
            lines.append("[models.hyper]")
            for key, value in spec.hyper.items():
                if not re.fullmatch(r"[A-Za-z0-9_-]+", key):
                    raise ValueError(
                        f"{where}: hyper-parameter name {key!r} is not a bare TOML key"
                    )
                lines.append(f"{key} = {toml_value(value, where)}")
        lines.append("")
    return "\n".join(lines)
