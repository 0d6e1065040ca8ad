"""Model states a column at a time (policies/state_blocks.py) and their place in a snapshot
(format version 3): the oracle is each model's own ``state_dict()`` / ``load_state_dict()``."""

from __future__ import annotations

import io
import struct
import zlib

import fastavro
import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.policies.state_blocks import ModelStates, model_states
from streambandit.wire import (
    Context,
    Reward,
    SnapshotError,
    pack_snapshot,
    schemas,
    snapshot,
    unpack_snapshot,
)
from streambandit.wire.avro import header

D, K = 4, 3
HEAD = {
    "partition": 0,
    "created_ms": 1,
    "contexts_offset": 0,
    "rewards_offset": 0,
    "actions_offset": 0,
    "joined_offset": 0,
    "dead_letter_offset": 0,
}


def config(*entries):
    return parse_models_config(
        {
            "models": [
                {"dim": D, "reward_window_ms": 50, "default_reward": 0.0, **e} for e in entries
            ]
        }
    )


def fed(cfg, n, seed=0, prefix="m"):
    """An engine with ``n`` models, some updated several times."""
    e = PartitionEngine(cfg)
    rng = np.random.default_rng(seed)
    for i in range(3 * n):
        key = f"{prefix}{rng.integers(n) if i >= n else i}"
        x = rng.standard_normal((K, D)) / 3
        e.on_context(Context(f"e{i}", key, 10 * i, ("a", "b", "c"), x))
        e.on_reward(Reward(f"e{i}", key, 10 * i + 1, float(rng.random() < 0.5)))
    return e


def equal_states(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        type(a[k]) is type(b[k])
        and (
            (a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes())
            if isinstance(a[k], np.ndarray)
            else a[k] == b[k]
        )
        for k in a
    )


def round_trip(cfg, e, models=None, into=None):
    data = pack_snapshot(HEAD | {"engine": e.snapshot(models)})
    return PartitionEngine.restore(into or cfg, unpack_snapshot(data)["engine"]), data


@pytest.mark.parametrize("policy", ["oful", "glb_omd", "hvt_ucb"])
def test_a_block_restores_every_model_to_the_bit_and_they_continue_alike(policy):
    cfg = config({"match": "m*", "policy": policy})
    e = fed(cfg, 2500)  # more than one chunk of rows (1,024)
    # Free some rows, so the restore takes rows from the free list as well as new chunks.
    spare = fed(cfg, 300, seed=9, prefix="spare")
    del spare
    states = e.snapshot()["models"]
    assert isinstance(states, ModelStates) and len(states.blocks) == 1 and not states.records
    r, _ = round_trip(cfg, e)
    assert set(r.models) == set(e.models)
    rng = np.random.default_rng(5)
    for key, m in e.models.items():
        assert equal_states(
            states[key], m.state_dict()
        )  # the block's row is the model's state_dict
        assert equal_states(r.models[key].state_dict(), m.state_dict())
    for key in list(e.models)[::97]:  # restored models decide and learn as the originals do
        x = rng.standard_normal((K, D)) / 3
        a, b = e.models[key], r.models[key]
        assert a.select(x) == b.select(x) and a.scores(x).tobytes() == b.scores(x).tobytes()
        a.update(x[0], 1.0)
        b.update(x[0], 1.0)
        assert equal_states(a.state_dict(), b.state_dict())


def test_blocks_and_records_together_and_an_increment():
    cfg = config(
        {"match": "s*", "policy": "soful"},
        {"match": "o*", "policy": "oful", "hyper": {"lam": 2.0}},
        {"match": "g*", "policy": "glb_omd"},
    )
    e = PartitionEngine(cfg)
    for prefix in "sog":
        e.models.update(fed(cfg, 40, prefix=prefix).models)
    states = e.snapshot()["models"]
    assert sorted(b.header["policy"] for b in states.blocks) == ["glb_omd", "oful"]
    assert sorted(states.records) == sorted(k for k in e.models if k.startswith("s"))
    r, _ = round_trip(cfg, e)
    for key, m in e.models.items():
        assert equal_states(r.models[key].state_dict(), m.state_dict())
    some = ["o3", "g7", "s1"]
    inc, _ = round_trip(cfg, e, models=some)
    assert set(inc.models) == set(some)


def test_a_block_into_a_changed_configuration_is_refused_as_load_state_dict_refuses():
    e = fed(config({"match": "m*", "policy": "oful"}), 20)
    with pytest.raises(ValueError, match="state configuration does not match this policy"):
        round_trip(None, e, into=config({"match": "m*", "policy": "oful", "hyper": {"lam": 3.0}}))
    with pytest.raises(ValueError, match="state is for policy 'oful', not 'glb_omd'"):
        round_trip(None, e, into=config({"match": "m*", "policy": "glb_omd"}))
    with pytest.raises(ValueError, match="no entry for it"):
        round_trip(None, e, into=config({"match": "x*", "policy": "oful"}))
    # Now in two entries of the same learner: each part restored under its own.
    two = config({"match": "m1*", "policy": "oful"}, {"match": "m*", "policy": "oful"})
    r, _ = round_trip(None, e, into=two)
    for key, m in e.models.items():
        assert equal_states(r.models[key].state_dict(), m.state_dict())
    # Now a learner without blocks: one load_state_dict each, with its errors.
    with pytest.raises(ValueError, match="state is for policy 'oful', not 'soful'"):
        round_trip(None, e, into=config({"match": "m*", "policy": "soful"}))


def test_a_column_that_does_not_fit_its_buffers_is_refused():
    buffers = memoryview(bytes(64))
    ok = {"name": "theta", "dtype": "<f8", "shape": [2, 4], "offset": 0, "length": 64}
    assert snapshot._column(ok, buffers).shape == (2, 4)
    for bad in (
        {"offset": 8},
        {"length": 56},
        {"shape": [3, 4], "length": 96},
        {"dtype": "|O"},
        {"shape": [-2, -4]},
        {"offset": -8},
    ):
        with pytest.raises(ValueError, match="does not fit"):
            snapshot._column(ok | bad, buffers)


def test_a_key_twice_in_a_snapshot_is_refused():
    e = fed(config({"match": "m*", "policy": "oful"}), 5)
    states = e.snapshot()["models"]
    twice = ModelStates({"m1": e.models["m1"].state_dict()}, states.blocks)
    with pytest.raises(SnapshotError, match="appears twice"):
        unpack_snapshot(pack_snapshot(HEAD | {"engine": e.snapshot() | {"models": twice}}))


def test_block_columns_are_8_aligned_raw_and_covered_by_the_checksum():
    e = fed(config({"match": "m*", "policy": "oful"}), 50)
    data = pack_snapshot(HEAD | {"engine": e.snapshot()})
    (length,) = struct.unpack("<Q", data[8:16])
    record = zlib.decompress(data[16 : 16 + length]) if data[3] & 1 else data[16 : 16 + length]
    d = fastavro.schemaless_reader(io.BytesIO(record), schemas.READERS[6], schemas.READERS[6])
    start = -(-(16 + length) // 8) * 8
    [block] = d["model_blocks"]
    theta = next(r for r in block["arrays"] if r["name"] == "theta")
    assert (start + theta["offset"]) % 8 == 0 and theta["shape"] == [50, D]
    raw = np.frombuffer(data, "<f8", 50 * D, start + theta["offset"]).reshape(50, D)
    assert all(raw[j].tobytes() == e.models[k].theta.tobytes() for j, k in enumerate(block["keys"]))
    broken = bytearray(data)
    broken[start + theta["offset"] + 3] ^= 1
    with pytest.raises(SnapshotError, match="checksum"):
        unpack_snapshot(bytes(broken))


def test_a_version_2_snapshot_is_still_read():
    """Version 2: header, flags, CRC32, the record; every model a record of its own."""
    cfg = config({"match": "m*", "policy": "glb_omd"})
    e = fed(cfg, 6)
    s = e.snapshot()
    models = [
        {
            "model_key": k,
            "arrays": [
                {
                    "name": n,
                    "dtype": v.dtype.newbyteorder("<").str,
                    "shape": list(v.shape),
                    "data": v.astype(v.dtype.newbyteorder("<")).tobytes(),
                }
                for n, v in m.state_dict().items()
                if isinstance(v, np.ndarray)
            ],
            "scalars": [
                {"name": n, "value": v}
                for n, v in m.state_dict().items()
                if not isinstance(v, np.ndarray)
            ],
        }
        for k, m in e.models.items()
    ]
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        schemas.WRITERS[(6, 2)],
        HEAD
        | {
            "chain": 0,
            "seq": 0,
            "watermark_ms": s["watermark_ms"],
            "models": models,
            "pending": [
                {**p, "features": p["features"].astype("<f8").tobytes()} for p in s["pending"]
            ],
            "early": [],
            "recent": [{"event_id": k, "observed": bool(v)} for k, v in s["recent"]],
            "counters": {},
        },
    )
    body = buf.getvalue()
    old = header(6, 2) + b"\x00" + struct.pack("<I", zlib.crc32(body)) + body
    r = PartitionEngine.restore(cfg, unpack_snapshot(old)["engine"])
    for key, m in e.models.items():
        assert equal_states(r.models[key].state_dict(), m.state_dict())


def test_model_states_of_no_models_and_of_a_subset():
    e = fed(config({"match": "m*", "policy": "oful"}), 10)
    assert len(model_states(e.models, [])) == 0
    sub = model_states(e.models, ["m3", "m1"])
    assert list(sub) == ["m3", "m1"] and equal_states(sub["m1"], e.models["m1"].state_dict())


@pytest.mark.parametrize("policy", ["oful", "glb_omd", "hvt_ucb"])
def test_a_mapped_snapshot_file_becomes_the_rows_and_the_file_stays_as_written(policy, tmp_path):
    from streambandit.policies.linear_ucb import THETA
    from streambandit.stream.snapshots import DirectoryStore, load_latest

    # A seed no other test's models have: a store of its own, whatever the suite left alive.
    cfg = config({"match": "m*", "policy": policy, "seed": 90210})
    e = fed(cfg, 2500)
    store = DirectoryStore(tmp_path)
    data = pack_snapshot(HEAD | {"chain": 0, "seq": 0, "engine": e.snapshot()})
    store.save(0, data)
    snap = load_latest(store, 0)
    [block] = snap["engine"]["models"].blocks
    assert block.adoptable
    rows = next(iter(e.models.values()))._store
    # The rows the store has spare are filled first (copies); the models beyond them take the
    # mapped file's pages as their rows, but for a last part-chunk, which is copied.
    adopted = len(e.models) - rows.spare
    assert adopted > rows.rows_per_chunk
    r = PartitionEngine.restore(cfg, snap["engine"])
    assert block.handed_over
    shared = sum(
        np.shares_memory(r.models[k]._chunk[THETA], block.arrays["theta"]) for k in e.models
    )
    assert shared == adopted - adopted % rows.rows_per_chunk
    rng = np.random.default_rng(3)
    for key, m in e.models.items():
        assert equal_states(r.models[key].state_dict(), m.state_dict())
    for key in list(e.models)[::7]:  # they decide and learn as the originals, in their own pages
        x = rng.standard_normal((K, D)) / 3
        a, b = e.models[key], r.models[key]
        assert a.scores(x).tobytes() == b.scores(x).tobytes()
        a.update(x[1], 0.5)
        b.update(x[1], 0.5)
        assert equal_states(a.state_dict(), b.state_dict())
    assert (tmp_path / "p0.snap").read_bytes() == data  # copy-on-write: the file is never written
    with pytest.raises(ValueError, match="handed over"):  # the block now holds the models' changes
        PartitionEngine.restore(cfg, snap["engine"])
    # A new save replaces the file while these models still use the old one's pages.
    store.save(
        0, pack_snapshot(HEAD | {"chain": 0, "seq": 0, "engine": fed(cfg, 10, seed=4).snapshot()})
    )
    for key in list(e.models)[::7]:
        assert equal_states(r.models[key].state_dict(), e.models[key].state_dict())


def test_a_partition_restored_again_and_again_reuses_the_rows_it_freed(tmp_path):
    """A partition that moves away and back (or is reloaded) while the worker keeps other
    models of its configuration: its restore fills the freed rows, and the store stays its size."""
    from streambandit.stream.snapshots import DirectoryStore, load_latest

    cfg = config({"match": "m*", "policy": "glb_omd"})
    e = fed(cfg, 3000)
    store = DirectoryStore(tmp_path)
    store.save(0, pack_snapshot(HEAD | {"chain": 0, "seq": 0, "engine": e.snapshot()}))
    rows = next(iter(e.models.values()))._store
    sizes = []
    for _ in range(4):
        r = PartitionEngine.restore(cfg, load_latest(store, 0)["engine"])
        assert all(
            equal_states(r.models[k].state_dict(), m.state_dict())
            for k, m in list(e.models.items())[::50]
        )
        sizes.append(rows.capacity)
        del r  # revoked: its rows go back to the store, which e keeps alive
    assert sizes[1:] == sizes[:1] * 3


def test_bytes_and_read_only_buffers_are_copied_not_adopted():
    cfg = config({"match": "m*", "policy": "oful"})
    data = pack_snapshot(HEAD | {"engine": fed(cfg, 30).snapshot()})
    for given in (data, memoryview(data), bytearray(data)):
        [block] = unpack_snapshot(given)["engine"]["models"].blocks
        assert not block.adoptable
    snap = unpack_snapshot(data)
    a, b = (PartitionEngine.restore(cfg, snap["engine"]) for _ in range(2))  # restorable twice
    a.models["m1"].update(np.ones(D) / 3, 1.0)
    assert not equal_states(a.models["m1"].state_dict(), b.models["m1"].state_dict())
