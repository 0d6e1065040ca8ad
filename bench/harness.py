"""What every benchmark shares: the command line, the machine description, result files.

A benchmark module defines ``measure(args) -> dict`` and ``render(result) -> str`` and ends with
``harness.main(NAME, __doc__, measure, render)``. ``render`` reads only the result it is given, so
a report can always be rebuilt from its JSON (``--render``), and a test checks that the committed
reports are exactly that.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """Where a result was measured: CPU, cores, versions, commit, date."""
    import numpy as np
    import scipy

    from streambandit.benchmarks import cpu_model

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }


def provenance(result: dict, extra: str = "") -> str:
    """The report's first paragraph: the command, the machine, and what the benchmark adds."""
    m = result["machine"]
    text = (
        f"Command: `{result['command']}`. Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
        f"numpy {m['numpy']}, commit {m['commit']}, {m['date']}."
    )
    return text + (" " + extra if extra else "")


def median(xs) -> float:
    return statistics.median(xs)


def plain(x):
    """numpy scalars and arrays, tuples and non-string keys to what JSON holds."""
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x.tolist() if hasattr(x, "tolist") else x


def write(name: str, result: dict, report: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(report)


def load(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def parser(name: str, doc: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=f"python -m bench.{name}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, for a smoke run: the report is printed, not written",
    )
    ap.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="measure and print the report, write nothing (e.g. another checkout on PYTHONPATH)",
    )
    ap.add_argument(
        "--render",
        action="store_true",
        help=f"rewrite results/{name}.md from results/{name}.json, measure nothing",
    )
    return ap


def main(
    name: str,
    doc: str,
    measure: Callable[[argparse.Namespace], dict],
    render: Callable[[dict], str],
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
    argv: list[str] | None = None,
) -> int:
    ap = parser(name, doc)
    if add_arguments is not None:
        add_arguments(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.render:
        report = render(load(name))
        (RESULTS / f"{name}.md").write_text(report)
        print(report)
        return 0
    # The JSON carries the command that reproduces it, and the report quotes it from there.
    result = {"command": " ".join([f"python -m bench.{name}", *argv]), "machine": machine()}
    result.update(measure(args))
    result = plain(result)
    report = render(result)
    print(report)
    if not (args.quick or args.print_only):
        write(name, result, report)
    return 0
