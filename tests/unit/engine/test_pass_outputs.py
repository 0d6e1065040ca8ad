"""engine/pass_outputs.py against the objects path: for every compiled pass of a stream, the bytes,
message keys, decision times, reward delays and defaults that wire/batch_encode.py gives of the
Actions and Joined records ArrayPartitionEngine._outputs makes, in the same order."""

import dataclasses

import numpy as np
import pytest

from streambandit.engine import compiled_pass as cp
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.pass_outputs import encode_outputs, model_key_bytes
from streambandit.engine.record_columns import RecordColumns
from streambandit.wire import Action, Context, Reward
from streambandit.wire.batch_encode import encode_actions_timed, encode_joined_timed

from .test_compiled_pass import clean_records, config, records
from .test_engine_recovery import LIMITS


class ByObjects(ArrayPartitionEngine):
    """Each pass's outputs as the objects _outputs appends to the records' lists."""

    def _run_compiled(self, cols, start, per_record):
        before = [len(outs) for outs in per_record]
        result = super()._run_compiled(cols, start, per_record)
        made = [(rec, o) for rec, outs in enumerate(per_record) for o in outs[before[rec] :]]
        self.passes.append(made)
        return result


class ByColumns(ArrayPartitionEngine):
    """Each pass's output columns encoded at once (the next pass may reserve the arena again)."""

    def _run_compiled(self, cols, start, per_record):
        result = super()._run_compiled(cols, start, per_record)
        keys = model_key_bytes(self.model_keys)
        self.passes.append(encode_outputs(cols, self.pending.ids.arena, keys, *self.last_pass))
        return result


def unicode(stream: list) -> list:
    """The stream with ids, model keys and arm ids that are not ASCII (2-, 3- and 4-byte UTF-8);
    the model keys still match the config's patterns."""

    out = []
    for ev, src in stream:
        if isinstance(ev, (Context, Reward)):
            ev = dataclasses.replace(
                ev, event_id=f"é{ev.event_id}✓", model_key=f"{ev.model_key}ä€😀"
            )
        if isinstance(ev, Context):
            ev = dataclasses.replace(ev, arm_ids=tuple(f"{a}·𝔞" for a in ev.arm_ids))
        out.append((ev, src))
    return out


def expected(made: list) -> tuple:
    actions = [o for _, o in made if isinstance(o, Action)]
    joined = [o for _, o in made if not isinstance(o, Action)]
    a_bytes, decided = encode_actions_timed(actions)
    j_bytes, delays = encode_joined_timed(joined)
    order = [(cp.O_ACTION if isinstance(o, Action) else cp.O_JOINED, rec) for rec, o in made]
    return (
        a_bytes,
        [a.model_key.encode() for a in actions],
        decided,
        j_bytes,
        [j.model_key.encode() for j in joined],
        delays,
        sum(not j.reward_observed for j in joined),
        order,
    )


def got(enc) -> tuple:
    order = list(zip(enc.kinds.tolist(), enc.records.tolist()))
    return (*enc[:7], order)


STREAMS = {
    "hostile": lambda seed: records(seed),
    "hostile-unicode": lambda seed: unicode(records(seed)),
    "clean-unicode": lambda seed: unicode(clean_records(600)),
}


@pytest.mark.parametrize("stream", sorted(STREAMS))
@pytest.mark.parametrize("seed,max_pending", [(0, 4), (1, 30), (2, 100_000)])
def test_every_pass_encodes_as_the_objects_it_would_make(stream, seed, max_pending):
    cfg = config(0.0)  # oful (first-*), glb_omd (sum-*), hvt_ucb (last-*), all in the pass
    limits = {**LIMITS, "max_pending": max_pending, "max_id_bytes": 64, "max_models": 8,
              "max_event_time_ahead_ms": 60_000}  # fmt: skip
    objects, columns = ByObjects(cfg, **limits), ByColumns(cfg, **limits)
    objects.passes, columns.passes = [], []
    events = STREAMS[stream](seed)
    rng = np.random.default_rng(seed)
    at = 0
    while at < len(events):
        run = events[at : at + int(rng.integers(1, 120))]
        objects.process(run)
        columns.process_columns(RecordColumns(run), run, None)
        at += len(run)
    assert len(columns.passes) == len(objects.passes)
    for p, (made, enc) in enumerate(zip(objects.passes, columns.passes)):
        assert got(enc) == expected(made), p
    # What the comparison covered: actions and joined records (observed and defaulted) out of
    # the pass, evictions where max_pending is small, every learner, keys that are not ASCII.
    made = [o for ps in objects.passes for _, o in ps]
    assert sum(isinstance(o, Action) for o in made) > 100
    assert sum(len(e.delays) for e in columns.passes) > 10
    assert sum(e.defaults for e in columns.passes) > 10
    assert {o.model_key.split("-")[0] for o in made} == {"sum", "first", "last"}
    if max_pending < 10:
        assert objects.counters["evicted_pending"] > 0
    if "unicode" in stream:
        assert all(not o.model_key.isascii() and not o.event_id.isascii() for o in made)


def test_model_key_bytes():
    keys = model_key_bytes(["a", "ä€", "", "😀x"])
    assert keys.each == [b"a", "ä€".encode(), b"", "😀x".encode()]
    assert keys.ends.tolist() == [1, 6, 6, 11]
    assert keys.buf.tobytes() == "aä€😀x".encode()
    empty = model_key_bytes([])
    assert empty.each == [] and len(empty.ends) == 0
