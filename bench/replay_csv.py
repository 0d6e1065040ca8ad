"""Rows per second of ``streambandit replay`` on a CSV log: the columnar reader against the csv
module's, and the command on the same rows as CSV and as Avro.

    python -m bench.replay_csv            # full run (~3 min), writes bench/results/replay_csv.{md,json}
    python -m bench.replay_csv --quick    # a smoke run with small sizes (results not written)

The log is bench.replay's uniform log (oful, d = 20, K = 10, 4 model keys, 0/1 clicks), written
as CSV with inline features (every number as Python's ``repr``, 17 significant digits: about 4 KB
of text per row) and as Avro. Parts, each a median of REPEATS runs, interleaved:

- *Arrow's CSV parse alone*: ``pyarrow.csv`` splitting the file into text columns, nothing else,
  the floor of the columnar reader;
- *columnar reader*: ``read_csv(LOG)`` with pyarrow installed (streambandit/replay/csv_columnar.py),
  decisions made;
- *csv module reader*: ``read_csv(LOG, columnar=False)``, Python's csv module, ``str.split`` and
  ``float``;
- *command on the CSV* and *command on the Avro*: ``python -m streambandit replay LOG --config
  oful.toml`` in a subprocess, wall time including interpreter start-up and the report.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

from bench import harness
from bench.replay import run_cli, uniform_log
from streambandit.replay.files import read_csv, write_avro
from streambandit.replay.logged import LoggedDecision

ROWS = 50_000


def write_csv_log(path: Path, log: list[LoggedDecision]) -> None:
    """``log`` as a CSV with inline features; every float as its repr, so it reads back exactly."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        cols = ["timestamp_ms", "event_id", "model_key", "arm_ids", "action", "propensity"]
        w.writerow([*cols, "reward", "features"])
        for d in log:
            features = "|".join(" ".join(repr(float(v)) for v in row) for row in d.features)
            w.writerow(
                [
                    d.timestamp_ms,
                    d.event_id,
                    d.model_key,
                    "|".join(d.arm_ids),
                    d.arm_ids[d.action],
                    repr(d.propensity),
                    repr(d.reward),
                    features,
                ]
            )


def rate(n: int, fn) -> float:
    t0 = time.perf_counter()
    got = fn()
    s = time.perf_counter() - t0
    if got != n:
        raise RuntimeError(f"read {got} rows of {n}")
    return n / s


def arrow_parse(path: Path) -> int:
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    with open(path, encoding="utf-8") as f:
        names = next(csv.reader(f))
    table = pa_csv.read_csv(
        path, convert_options=pa_csv.ConvertOptions(column_types={c: pa.string() for c in names})
    )
    return table.num_rows


def measure(args: argparse.Namespace) -> dict:
    repeats, n = (1, 2_000) if args.quick else (3, ROWS)
    log = uniform_log(n, seed=2)
    res: dict = {"events": n, "policy": "oful", "d": 20, "K": 10, "repeats": repeats}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        csv_path, avro_path = work / "log.csv", work / "log.avro"
        write_csv_log(csv_path, log)
        write_avro(avro_path, log)
        res["csv_bytes_per_row"] = csv_path.stat().st_size / n
        for r in range(repeats):
            row = {
                "arrow_parse": rate(n, lambda: arrow_parse(csv_path)),
                "columnar": rate(n, lambda: sum(1 for _ in read_csv(csv_path, columnar=True))),
                "csv_module": rate(n, lambda: sum(1 for _ in read_csv(csv_path, columnar=False))),
                "command_csv": run_cli("oful", csv_path, work, n)["rows_per_s"],
                "command_avro": run_cli("oful", avro_path, work, n)["rows_per_s"],
            }
            for k, v in row.items():
                res.setdefault(k, []).append(v)
            print(f"run {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()), flush=True)
    return res


def render(res: dict) -> str:
    m = {k: harness.median(v) for k, v in res.items() if isinstance(v, list)}
    return "\n".join(
        [
            "# `streambandit replay` on a CSV log: rows per second",
            "",
            harness.provenance(res),
            "",
            f"{res['events']:,} rows of a uniform log (oful, d = {res['d']}, K = {res['K']}), "
            f"written as CSV with inline features (every number as its `repr`, "
            f"{res['csv_bytes_per_row']:,.0f} bytes per row) and as Avro. Median of "
            f"{res['repeats']} runs.",
            "",
            "| part | rows / s | against | ratio |",
            "|---|---:|---|---:|",
            f"| columnar reader (`read_csv(LOG)`, pyarrow installed) | {m['columnar']:,.0f} | "
            f"the csv module's reader (`read_csv(LOG, columnar=False)`), {m['csv_module']:,.0f} "
            f"| {m['columnar'] / m['csv_module']:.2f} |",
            f"| columnar reader | {m['columnar']:,.0f} | Arrow's CSV parse into text columns "
            f"alone, {m['arrow_parse']:,.0f} | {m['columnar'] / m['arrow_parse']:.2f} |",
            f"| command on the CSV (`python -m streambandit replay LOG.csv --config oful.toml`, "
            f"wall time) | {m['command_csv']:,.0f} | the command on the same rows as Avro, "
            f"{m['command_avro']:,.0f} | {m['command_csv'] / m['command_avro']:.2f} |",
            "",
        ]
    )


if __name__ == "__main__":
    sys.exit(harness.main("replay_csv", __doc__, measure, render))
