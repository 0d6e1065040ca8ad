"""streambandit against Vowpal Wabbit, MABWiser and River on the same synthetic stream.

    python -m bench.peers            # full run (~2-3 min), writes bench/results/peers.{md,json}
    python -m bench.peers --quick    # a smoke run, printed, not written

The same run as ``streambandit bench peers`` (streambandit/benchmarks/inprocess.py), with the
commit recorded and the results kept in bench/results/. Every option of ``streambandit bench
peers`` that shapes the run is accepted. The peers are benchmark-only: pip install
'streambandit[bench]'.
"""

from __future__ import annotations

import argparse

from bench import harness
from streambandit.benchmarks import inprocess


def measure(args: argparse.Namespace) -> dict:
    result = inprocess.run_from_args(args)
    ref = next((r for r in result["rows"] if r["key"] == inprocess.REFERENCE), {})
    if ref.get("status") != "ok":
        raise RuntimeError(f"the reference row {inprocess.REFERENCE} could not be measured: {ref}")
    # The peers' versions are part of what the figures mean; harness.machine has the commit.
    return {**result, "versions": inprocess.machine()["versions"]}


def render(res: dict) -> str:
    return inprocess.render_markdown(
        res, command=res["command"], machine_desc={**res["machine"], "versions": res["versions"]}
    )


if __name__ == "__main__":
    raise SystemExit(
        harness.main("peers", __doc__, measure, render, add_arguments=inprocess.add_stream_options)
    )
