"""streambandit against Vowpal Wabbit, MABWiser and River on the same synthetic stream.

    python bench/bench_peers.py            # full run (~2-3 min), writes bench/results/peers.{md,json}
    python bench/bench_peers.py --quick    # a smoke run, writes bench/results/peers_quick.{md,json}

The same run as `streambandit bench` (streambandit/benchmarks/inprocess.py), with BLAS pinned to
one thread and the commit recorded. Every option of `streambandit bench` is accepted.
The peers are benchmark-only: pip install 'streambandit[bench]'.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.pin_one_thread()

from streambandit.benchmarks import inprocess  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = inprocess.build_parser().parse_args(argv)
    result = inprocess.run_from_args(args)
    command = "python bench/bench_peers.py" + "".join(f" {a}" for a in argv)
    desc = {**inprocess.machine(), **{k: v for k, v in common.machine().items() if k in ("commit", "scipy")}}
    result["machine"] = desc
    result["command"] = command
    md = inprocess.render_markdown(result, command=command, machine_desc=desc)
    common.write("peers_quick" if args.quick else "peers", _plain(result), md)
    ref = next((r for r in result["rows"] if r["key"] == inprocess.REFERENCE), {})
    return 0 if ref.get("status") == "ok" else 1


def _plain(x):
    """numpy scalars and arrays to plain JSON types."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.tolist() if hasattr(x, "tolist") else x


if __name__ == "__main__":
    raise SystemExit(main())
