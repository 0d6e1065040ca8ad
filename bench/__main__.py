"""``python -m bench``: the benchmarks, what each measures, and how long a full run takes."""

import ast
from pathlib import Path

# Each benchmark writes bench/results/NAME.{json,md}; the other modules here are shared pieces.
BENCHMARKS = (
    "policies",
    "sketch",
    "bkb",
    "bkb_stream",
    "regret_vs_oful",
    "default_scale",
    "calls",
    "early_rewards",
    "peers",
    "play_bound",
    "replay",
    "replay_csv",
    "obd_vs_obp",
    "ope_coverage",
    "ope_coverage_learners",
    "decider",
    "api_http",
    "freshness",
    "worker_path",
    "worker_instructions",
    "engine_pass",
    "memory",
    "handoff",
    "join",
    "fetch_pause",
    "membership",
    "recovery",
    "snapshots",
    "scaling",
    "tansu",
    "group_restarts",
    "e2e",
    "kafka",
)


def summary(name: str) -> tuple[str, str]:
    """The docstring's first line, and the comment of its full-run usage line (time, output)."""
    doc = ast.get_docstring(ast.parse((Path(__file__).parent / f"{name}.py").read_text())) or ""
    usage = next(
        (
            line.split("#", 1)[1].strip()
            for line in doc.splitlines()
            if line.strip().startswith(f"python -m bench.{name} ") and "#" in line
        ),
        "",
    )
    return doc.splitlines()[0], usage


if __name__ == "__main__":
    print("python -m bench.NAME [--quick | --print | --render] [-h]\n")
    for name in BENCHMARKS:
        first, usage = summary(name)
        print(f"  {name:15} {first}\n  {'':15} {usage}")
