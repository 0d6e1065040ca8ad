"""The ad-traffic workload the Kafka, replay and memory benchmarks share: one definition of its
shape, its model configuration and its events.

Contexts are ad requests from ``streambandit.sim.ads`` (d = ``D`` features per ad, ``K`` ads per
request) for ``len(MODEL_KEYS)`` placements, one model each, with the learners' hyper-parameters
for ad traffic (``sim.ads.ad_hyper``); a click follows every third request 5 ms later.
"""

from __future__ import annotations

import numpy as np

from streambandit.sim.ads import AdTraffic, ad_hyper
from streambandit.wire import Context, Reward

D, K, PARTITIONS = 20, 10, 2
MODEL_KEYS = tuple(f"placement-{i}" for i in range(4))
WINDOW_MS = 2000

# Event time starts at an epoch timestamp as an application's clock gives (2023-11-14): what the
# worker encodes per record then has the size it has in production (6-byte varints, not 2).
T0_MS = 1_700_000_000_000


def models(
    policy: str, window_ms: int = WINDOW_MS, *, match: str = "placement-*", dim: int = D, **extra
) -> dict:
    """The ``[[models]]`` configuration (as parsed TOML) of one policy for every placement."""
    entry = {
        "match": match,
        "policy": policy,
        "dim": dim,
        "hyper": ad_hyper(policy),
        "reward_window_ms": window_ms,
        "default_reward": 0.0,
        "aggregation": "first",
        **extra,
    }
    return {"models": [entry]}


def models_toml(policy: str, window_ms: int = WINDOW_MS, **extra) -> str:
    """The same configuration as TOML, for a ``streambandit serve`` or ``replay`` subprocess."""
    (entry,) = models(policy, window_ms, **extra)["models"]
    lines = ["[[models]]"]
    for key, value in entry.items():
        if key != "hyper":
            lines.append(f"{key} = {toml_value(value)}")
    if entry["hyper"]:
        lines.append("[models.hyper]")
        lines += [f"{key} = {toml_value(value)}" for key, value in entry["hyper"].items()]
    return "\n".join(lines) + "\n"


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def backlog(n: int, seed: int = 0) -> list[tuple[Context, Reward | None]]:
    """n ad requests (event time 1 ms apart) and a click for every third, 5 ms after it."""
    traffic, rng = AdTraffic(dim=D, k=K, seed=seed), np.random.default_rng(seed)
    out = []
    for i in range(n):
        req, key = traffic.request(rng), MODEL_KEYS[i % len(MODEL_KEYS)]
        ctx = Context(f"e{i}", key, T0_MS + i, req.ad_ids, req.features)
        out.append(
            (ctx, Reward(ctx.event_id, key, ctx.timestamp_ms + 5, 1.0) if i % 3 == 0 else None)
        )
    return out
