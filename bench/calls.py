"""Per-call costs on the worker's path that no other benchmark isolates (d = 20, K = 10, oful).

    python bench/bench_calls.py             # ~30 s, writes bench/results/calls.{md,json}
    PYTHONPATH=OLD_TREE python bench/bench_calls.py --print   # another checkout's figures, not written

- building a model for a new (or restored) model key, as the engine does (``ModelSpec.build``);
- the decision rule without exploration (``decision.decide``, epsilon 0), against the two calls
  it used to make (``scores`` then argmax) and against ``Policy.best`` alone;
- ``select`` + ``update`` one call at a time.

Microseconds per call: the minimum over REPEATS timeit runs of NUMBER calls each (the minimum,
not the median: these are short, CPU-bound calls, and the slower runs are the shared machine's
other work, not the call's).
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.pin_one_thread()

import numpy as np  # noqa: E402

from streambandit.decision import decide  # noqa: E402
from streambandit.models_config import parse_models_config  # noqa: E402

D, K, NUMBER, REPEATS = 20, 10, 20_000, 7


def per_call_us(f) -> float:
    f()
    return 1e6 * min(timeit.repeat(f, number=NUMBER, repeat=REPEATS)) / NUMBER


def main() -> None:
    spec = parse_models_config({"models": [{"match": "m-*", "policy": "oful", "dim": D, "reward_window_ms": 100,
                                            "default_reward": 0.0}]}).resolve("m-1")
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
        "decide": per_call_us(lambda: decide(model, arms, epsilon=0.0, model_key="m-1", event_id="e", seed=0)),
        "scores_argmax": per_call_us(scores_argmax),
        "best": per_call_us(lambda: model.best(arms)) if hasattr(model, "best") else float("nan"),
        "select_update": per_call_us(lambda: model.update(arms[model.select(arms)], 0.5)),
    }
    res = {"machine": common.machine(), "d": D, "K": K, "number": NUMBER, "repeats": REPEATS, "us": us}
    m = res["machine"]
    md = "\n".join([
        "# Per-call costs on the worker's path",
        "",
        "Command: `python bench/bench_calls.py`. streambandit from "
        f"{Path(decide.__code__.co_filename).parents[2]}. Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
        f"numpy {m['numpy']}, commit {m['commit']}, {m['date']}. `oful`, d = {D}, K = {K}; minimum over {REPEATS} "
        f"runs of {NUMBER:,} calls.",
        "",
        "| call | us |",
        "|---|---:|",
        f"| a new model (`ModelSpec.build`: what the engine does for a new model key, and recovery per model) | "
        f"{us['build']:.1f} |",
        f"| the decision without exploration (`decide`, epsilon 0) | {us['decide']:.2f} |",
        f"| what it used to call: `scores` then argmax | {us['scores_argmax']:.2f} |",
        f"| what it calls now: `Policy.best` (one compiled call) | {us['best']:.2f} |",
        f"| `select` + `update`, one call each | {us['select_update']:.2f} |",
        "",
    ])
    if "--print" in sys.argv:
        print(md)
    else:
        common.write("calls", res, md)


if __name__ == "__main__":
    main()
