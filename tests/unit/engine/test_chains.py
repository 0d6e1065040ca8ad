"""Snapshot chains (engine/chains.py): a base with increments laid over it is the full snapshot
of the moment of its last increment, to the bit; a chain that breaks is used up to the break;
the directory store keeps the increments of the two bases it keeps and drops older ones."""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.chains import ChainPosition, compose, next_chain_id, plan_snapshot
from streambandit.engine.partition import PartitionEngine
from streambandit.stream.snapshots import DirectoryStore, load_latest, usable_snapshots
from streambandit.wire import Context, InputRef, Reward, pack_snapshot, unpack_snapshot

CONFIG = parse_models_config(
    {
        "models": [
            {
                "match": "g-*",
                "policy": "glb_omd",
                "dim": 4,
                "reward_window_ms": 50,
                "default_reward": 0.0,
                "aggregation": "sum",
                "hyper": {"link": "poisson"},
            },
            {
                "match": "o-*",
                "policy": "oful",
                "dim": 4,
                "reward_window_ms": 30,
                "default_reward": 0.5,
            },
        ]
    }
)


class Stream:
    """Contexts and rewards for many models, a few of them busy: what an increment is for."""

    def __init__(self, seed=0):
        self.rng, self.i = np.random.default_rng(seed), 0

    def feed(self, engine, n, keys):
        for _ in range(n):
            i, self.i = self.i, self.i + 1
            key = keys[int(self.rng.integers(len(keys)))]
            engine.on_context(
                Context(
                    f"e{i}", key, 10 * i, ("a", "b", "c"), self.rng.standard_normal((3, 4)) / 3
                ),
                InputRef(0, 0, i),
            )
            if self.rng.random() < 0.7:
                engine.on_reward(
                    Reward(f"e{i}", key, 10 * i + 4, float(self.rng.integers(0, 3))),
                    InputRef(1, 0, i),
                )


def take(engine, seq, chain, offset, models=None):
    """A snapshot as the worker packs one (positions growing with ``offset``), unpacked again."""
    snap = {
        "partition": 0,
        "created_ms": offset,
        "contexts_offset": offset,
        "rewards_offset": offset,
        "actions_offset": offset,
        "joined_offset": offset,
        "dead_letter_offset": 0,
        "chain": chain,
        "seq": seq,
        "engine": engine.snapshot(models),
    }
    return unpack_snapshot(pack_snapshot(snap))


def restored_equal(a: dict, b: dict, **limits) -> None:
    """Two snapshots restore to engines in the same state, to the bit."""
    ea, eb = (
        PartitionEngine.restore(CONFIG, a["engine"], **limits),
        PartitionEngine.restore(CONFIG, b["engine"], **limits),
    )
    assert sorted(ea.models) == sorted(eb.models)
    for key in ea.models:
        sa, sb = ea.models[key].state_dict(), eb.models[key].state_dict()
        assert sa.keys() == sb.keys(), key
        for k in sa:
            assert (
                (sa[k].tobytes() == sb[k].tobytes())
                if isinstance(sa[k], np.ndarray)
                else sa[k] == sb[k]
            ), (key, k)
    assert list(ea.pending) == list(eb.pending) and ea.early.keys() == eb.early.keys()
    assert list(ea.recent.items()) == list(eb.recent.items()) and ea.watermark_ms == eb.watermark_ms


KEYS = [f"g-{i}" for i in range(60)] + [f"o-{i}" for i in range(60)]


def test_a_base_with_increments_is_the_full_snapshot_of_its_last_increment():
    engine, stream = PartitionEngine(CONFIG), Stream()
    stream.feed(engine, 2000, KEYS)
    engine.take_changed()
    base = take(engine, 0, 7, 1)
    increments = []
    for seq in range(1, 4):
        stream.feed(
            engine, 150, KEYS[seq * 10 : seq * 10 + 12] + ["g-new-%d" % seq]
        )  # a few busy models, one new
        changed = engine.take_changed()
        assert (
            0 < len(changed) < len(KEYS) // 4
        )  # the busy ones, and those whose windows closed meanwhile
        increments.append(take(engine, seq, 7, 1 + seq, sorted(changed)))
        assert len(increments[-1]["engine"]["models"]) == len(changed)  # only what changed
    full = take(engine, 0, 99, 4)
    composed = compose(base, list(reversed(increments)))  # order of arrival does not matter
    assert (composed["chain"], composed["seq"], composed["contexts_offset"]) == (7, 3, 4)
    restored_equal(composed, full)
    # And continuing from it goes on exactly like the engine that never stopped.
    again = PartitionEngine.restore(CONFIG, composed["engine"])
    stream_a, stream_b = Stream(5), Stream(5)
    stream_a.i = stream_b.i = stream.i
    stream_a.feed(engine, 300, KEYS)
    stream_b.feed(again, 300, KEYS)
    restored_equal(take(engine, 0, 1, 9), take(again, 0, 1, 9))


def test_recent_ids_in_increments_are_those_joined_since_and_the_oldest_leave_as_live():
    engine, stream = PartitionEngine(CONFIG, max_recent=120), Stream(6)
    stream.feed(engine, 100, KEYS)
    engine.take_changed()
    base = take(engine, 0, 1, 1)
    increments = []
    for seq in (1, 2, 3):
        stream.feed(
            engine, 70, KEYS
        )  # more joins than max_recent over the chain: the oldest are evicted
        increments.append(take(engine, seq, 1, 1 + seq, sorted(engine.take_changed())))
        assert 0 < len(increments[-1]["engine"]["recent"]) <= 70
    assert len(engine.recent) == 120
    composed = compose(base, increments)
    assert len(composed["engine"]["recent"]) > 120
    restored_equal(composed, take(engine, 0, 0, 4), max_recent=120)
    assert list(
        PartitionEngine.restore(CONFIG, composed["engine"], max_recent=120).recent.items()
    ) == list(engine.recent.items())


def test_an_increment_holds_the_models_changed_since_the_previous_one_only():
    engine, stream = PartitionEngine(CONFIG), Stream(1)
    stream.feed(engine, 500, KEYS)
    assert engine.take_changed() == set(engine.models)
    assert engine.take_changed() == set()
    open_before = {
        p.action.model_key for p in engine.pending.values()
    }  # their windows close as time moves
    stream.feed(engine, 40, ["o-3"])
    changed = engine.take_changed()
    assert (
        "o-3" in changed
        and changed <= open_before | {"o-3"}
        and len(changed) < len(engine.models) // 4
    )
    restored = PartitionEngine.restore(CONFIG, take(engine, 0, 1, 1)["engine"])
    assert restored.changed == set()  # a restored engine starts with nothing changed


def test_a_chain_is_used_up_to_its_first_gap_or_backward_step():
    engine, stream = PartitionEngine(CONFIG), Stream(2)
    stream.feed(engine, 300, KEYS)
    engine.take_changed()
    base = take(engine, 0, 3, 10)
    snaps = []
    for seq in (1, 2, 3):
        stream.feed(engine, 50, KEYS)
        snaps.append(
            (
                take(engine, seq, 3, 10 + seq, sorted(engine.take_changed())),
                take(engine, 0, 0, 10 + seq),
            )
        )
    (i1, f1), (i2, f2), (i3, f3) = snaps
    restored_equal(compose(base, [i1, i3]), f1)  # increment 2 missing: 3 cannot be used
    assert compose(base, [i1, i3])["seq"] == 1
    other_chain = dict(i1, chain=4)
    assert compose(base, [other_chain]) is base
    backwards = dict(i2, joined_offset=0)
    assert compose(base, [i1, backwards, i3])["seq"] == 1
    with pytest.raises(ValueError, match="increment"):
        compose(i1, [])


@pytest.mark.parametrize(
    "position, changed, models, expected",
    [
        (None, 0, 10, "base"),  # nothing to continue
        (ChainPosition(5, 0), 1, 1000, "increment"),
        (ChainPosition(5, 31), 1, 1000, "increment"),
        (ChainPosition(5, 32), 1, 1000, "base"),  # the chain is long enough
        (ChainPosition(5, 3), 500, 1000, "base"),  # half the models changed
        (ChainPosition(5, 3), 0, 0, "increment"),
    ],
)
def test_plan_snapshot(position, changed, models, expected):
    assert plan_snapshot(position, changed, models, base_every=32) == expected


def test_chain_ids_grow_even_against_the_clock():
    assert next_chain_id(1_000, 5) == 1_000
    assert next_chain_id(1_000, 1_000) == 1_001
    assert next_chain_id(1_000, 2_000) == 2_001


def test_the_directory_store_composes_chains_and_keeps_those_of_its_two_bases(tmp_path):
    store = DirectoryStore(tmp_path)
    engine, stream = PartitionEngine(CONFIG), Stream(3)
    offset = 0

    def chain(chain_id, increments):
        nonlocal offset
        stream.feed(engine, 200, KEYS)
        engine.take_changed()
        offset += 1
        store.save(0, pack_snapshot({**take(engine, 0, chain_id, offset), "created_ms": offset}))
        for seq in range(1, increments + 1):
            stream.feed(engine, 30, KEYS[:5])
            offset += 1
            snap = take(engine, seq, chain_id, offset, sorted(engine.take_changed()))
            store.save_increment(0, chain_id, seq, pack_snapshot(snap))
        return take(engine, 0, 0, offset)

    chain(100, 2)
    second = chain(200, 3)
    assert len(store.increments(0, 100)) == 2 and len(store.increments(0, 200)) == 3
    restored_equal(load_latest(store, 0), second)
    third = chain(300, 1)
    assert store.increments(0, 100) == []  # its base is no longer kept
    assert len(store.increments(0, 200)) == 3 and len(store.increments(0, 300)) == 1
    latest, previous = list(usable_snapshots(store, 0))
    restored_equal(latest, third)
    restored_equal(previous, second)
    assert (latest["chain"], latest["seq"], previous["chain"], previous["seq"]) == (300, 1, 200, 3)


def test_a_damaged_increment_ends_its_chain_there(tmp_path):
    store = DirectoryStore(tmp_path)
    engine, stream = PartitionEngine(CONFIG), Stream(4)
    stream.feed(engine, 200, KEYS)
    engine.take_changed()
    store.save(0, pack_snapshot(take(engine, 0, 50, 1)))
    fulls = []
    for seq in (1, 2):
        stream.feed(engine, 30, KEYS[:5])
        store.save_increment(
            0, 50, seq, pack_snapshot(take(engine, seq, 50, 1 + seq, sorted(engine.take_changed())))
        )
        fulls.append(take(engine, 0, 0, 1 + seq))
    f = tmp_path / "p0.inc" / "50-2"
    f.write_bytes(f.read_bytes()[:-3] + b"xyz")
    got = load_latest(store, 0)
    assert got["seq"] == 1
    restored_equal(got, fulls[0])


def test_an_empty_or_cut_base_file_is_skipped_for_the_previous_one(tmp_path):
    store = DirectoryStore(tmp_path)
    engine, stream = PartitionEngine(CONFIG), Stream(5)
    stream.feed(engine, 100, KEYS)
    store.save(0, pack_snapshot(take(engine, 0, 0, 1)))
    want = take(engine, 0, 0, 1)
    stream.feed(engine, 50, KEYS)
    store.save(0, pack_snapshot(take(engine, 0, 0, 2)))
    newest = tmp_path / "p0.snap"
    for damaged in (
        b"",
        newest.read_bytes()[:100],
    ):  # a file system that lost the write, a torn copy
        newest.write_bytes(damaged)
        restored_equal(load_latest(store, 0), want)
