"""Shared pieces of the benchmark scripts: the machine description and result writing.

Benchmarks pin BLAS to one thread before numpy is imported (see ``pin_one_thread``), because the
figures are per core and the machines here have two noisy cores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def pin_one_thread() -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


def machine() -> dict:
    import numpy as np
    import scipy

    from streambandit.benchmarks import cpu_model

    cpu = cpu_model()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
    }


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def write(name: str, data: dict, markdown: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)


def event_id_span(value: bytes) -> tuple[int, int]:
    """Where the event id's UTF-8 bytes are in one of our records (contexts, actions, joined: the
    3-byte header, then the id as an Avro string: zig-zag varint length, bytes), without a decode."""
    n, shift, i = 0, 0, 3
    while True:
        b = value[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    return i, i + ((n >> 1) ^ -(n & 1))
