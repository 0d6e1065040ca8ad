"""Per-call costs on the worker's path that no other benchmark isolates (d = 20, K = 10, oful).

    python -m bench.calls             # ~30 s, writes bench/results/calls.{md,json}
    cd OLD_TREE && PYTHONPATH=THIS_CHECKOUT python -m bench.calls --print   # another checkout's figures

(The working directory comes first on ``python -m``'s path, so the package measured is the one in
the directory the command runs from; the report names it.)

- building a model for a new (or restored) model key, as the engine does (``ModelSpec.build``);
- the decision rule without exploration (``decision.decide``, epsilon 0), against ``scores``
  then argmax and against ``Policy.best`` alone;
- ``select`` + ``update`` one call at a time.

Microseconds per call: the minimum over REPEATS timeit runs of NUMBER calls each (the minimum,
not the median: these are short, CPU-bound calls, and the slower runs are the shared machine's
other work, not the call's).
"""

from __future__ import annotations

import argparse
import timeit
from pathlib import Path

import numpy as np

from bench import harness
from streambandit.config.models import parse_models_config
from streambandit.engine.decision import decide

D, K, NUMBER, REPEATS = 20, 10, 20_000, 7


def per_call_us(f) -> float:
    f()
    return 1e6 * min(timeit.repeat(f, number=NUMBER, repeat=REPEATS)) / NUMBER


def measure(args: argparse.Namespace) -> dict:
    spec = parse_models_config(
        {
            "models": [
                {
                    "match": "m-*",
                    "policy": "oful",
                    "dim": D,
                    "reward_window_ms": 100,
                    "default_reward": 0.0,
                }
            ]
        }
    ).resolve("m-1")
    rng = np.random.default_rng(0)
    arms = rng.standard_normal((K, D)) / np.sqrt(D)
    model = spec.build()
    for _ in range(100):
        model.update(arms[int(rng.integers(K))], float(rng.random()))
    built: list = []

    def build() -> None:
        built.append(spec.build())
        if len(built) > 1000:  # keep the row store's free list in use, as a worker's churn would
            built.clear()

    def scores_argmax() -> tuple[int, float]:
        s = model.scores(arms)
        i = int(s.argmax())
        return i, float(s[i])

    us = {
        "build": per_call_us(build),
        "decide": per_call_us(
            lambda: decide(model, arms, epsilon=0.0, model_key="m-1", event_id="e", seed=0)
        ),
        "scores_argmax": per_call_us(scores_argmax),
        "best": per_call_us(lambda: model.best(arms)) if hasattr(model, "best") else float("nan"),
        "select_update": per_call_us(lambda: model.update(arms[model.select(arms)], 0.5)),
    }
    return {
        "d": D,
        "K": K,
        "number": NUMBER,
        "repeats": REPEATS,
        "us": us,
        "package": str(Path(decide.__code__.co_filename).parents[1]),
    }


def render(res: dict) -> str:
    us = res["us"]
    return "\n".join(
        [
            "# Per-call costs on the worker's path",
            "",
            harness.provenance(
                res,
                f"streambandit from {res['package']}. `oful`, d = {res['d']}, K = {res['K']}; "
                f"minimum over {res['repeats']} runs of {res['number']:,} calls.",
            ),
            "",
            "| call | us |",
            "|---|---:|",
            f"| a new model (`ModelSpec.build`: what the engine does for a new model key, and recovery per model) | "
            f"{us['build']:.1f} |",
            f"| the decision without exploration (`decide`, epsilon 0) | {us['decide']:.2f} |",
            f"| `scores` then argmax, two calls | {us['scores_argmax']:.2f} |",
            f"| `Policy.best` (one compiled call, what `decide` calls) | {us['best']:.2f} |",
            f"| `select` + `update`, one call each | {us['select_update']:.2f} |",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("calls", __doc__, measure, render))
