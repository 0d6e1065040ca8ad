"""The compiled pass's outputs to the worker's bytes: through Action/Joined objects, and straight.

    python -m bench.pass_outputs            # 2,000 contexts and their rewards, oful and glb_omd
    python -m bench.pass_outputs --contexts 300 --repeats 3

bench.engine_pass's records (bench/traffic.py's backlog, per partition, runs of 256 records) go
through ``ArrayPartitionEngine.process_columns`` once; every pass's output columns are kept. Then,
on those same columns, alternately, REPEATS times each (CPU time of the thread, median):

1. ``objects``: ``ArrayPartitionEngine._outputs`` (the Action and Joined objects, by record), the
   objects in output order per kind, ``encode_actions_timed`` / ``encode_joined_timed`` and the
   message keys (``model_key.encode()``), as stream/batch.py's OutputBuffer.take reads them;
2. ``columns``: engine/pass_outputs.py's ``encode_outputs`` (the model keys' bytes made once per
   engine, as the engine caches them).

Both give the same bytes (tests/unit/engine/test_pass_outputs.py; checked here too). Prints the
time per output of each and their ratio; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from bench.engine_pass import RUN, _engines, streams


def _passes(policy: str, n: int) -> list[tuple]:
    """Every pass of the stream: (engine stand-in for _outputs, columns, events, key bytes,
    output columns)."""
    from streambandit.engine.array_partition import ArrayPartitionEngine
    from streambandit.engine.pass_outputs import model_key_bytes
    from streambandit.engine.record_columns import RecordColumns

    kept: list[tuple] = []

    class Keeping(ArrayPartitionEngine):
        def _run_compiled(self, cols, start, per_record):
            result = super()._run_compiled(cols, start, per_record)
            arena, keys = self.pending.ids.arena, list(self.model_keys)
            # What _outputs reads of the engine: the arena the pass read, the model keys.
            stand_in = SimpleNamespace(pending=SimpleNamespace(ids=SimpleNamespace(arena=arena)))
            stand_in.model_keys = keys
            kept.append((stand_in, cols, self._events, model_key_bytes(keys), self.last_pass))
            return result

    for eng, records in zip(_engines(policy, Keeping), streams(n)):
        for at in range(0, len(records), RUN):
            run = records[at : at + RUN]
            eng._events = run
            eng.process_columns(RecordColumns(run), run, None)
    return kept


def _objects(passes: list[tuple]) -> list:
    from streambandit.engine.array_partition import ArrayPartitionEngine
    from streambandit.wire import Action
    from streambandit.wire.batch_encode import encode_actions_timed, encode_joined_timed

    got = []
    for stand_in, cols, events, _, columns in passes:
        per_record: list[list] = [[] for _ in events]
        ArrayPartitionEngine._outputs(stand_in, cols, *columns, per_record)
        actions, joined = [], []
        for outs in per_record:
            for o in outs:
                (actions if type(o) is Action else joined).append(o)
        values, decided = encode_actions_timed(actions)
        keys = [a.model_key.encode() for a in actions]
        j_values, delays = encode_joined_timed(joined)
        j_keys = [j.model_key.encode() for j in joined]
        got.append((values, keys, decided, j_values, j_keys, delays, len(joined) - len(delays)))
    return got


def _columns(passes: list[tuple]) -> list:
    from streambandit.engine.pass_outputs import encode_outputs

    return [
        tuple(encode_outputs(cols, stand_in.pending.ids.arena, keys, *columns)[:7])
        for stand_in, cols, _, keys, columns in passes
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--contexts", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--policies", nargs="+", default=["oful", "glb_omd"])
    args = ap.parse_args()
    for policy in args.policies:
        warm = _passes(policy, 300)
        assert _objects(warm) == _columns(warm)
        passes = _passes(policy, args.contexts)
        outputs = sum(len(p[4][0]) for p in passes)
        assert _objects(passes) == _columns(passes)
        times: dict[str, list[float]] = {"objects": [], "columns": []}
        for _ in range(args.repeats):
            for name, fn in (("objects", _objects), ("columns", _columns)):
                t = time.thread_time()
                fn(passes)
                times[name].append(time.thread_time() - t)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(
            f"{policy}: {len(passes)} passes, {outputs} outputs; per output "
            f"objects {med['objects'] / outputs * 1e6:.3f} us, "
            f"columns {med['columns'] / outputs * 1e6:.3f} us; "
            f"columns/objects {med['columns'] / med['objects']:.3f}"
        )


if __name__ == "__main__":
    main()
