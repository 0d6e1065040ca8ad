"""engine/id_table.py: the array hash table of event ids agrees with a dict (its keys, their
entries and the order they were added in), whatever the order of adds and removals, through
growth and arena compaction."""

import numpy as np
import pytest

from streambandit.engine.id_table import (
    IdTable,
    _rehash,
    fnv1a,
    table_add,
    table_find,
    table_remove,
)


def check_against(table: IdTable, oracle: dict[bytes, int]) -> None:
    """Every held key finds its entry and gives its bytes back; the slots hold exactly the held
    entries, each reachable from its home slot without crossing an empty slot."""
    assert len(table) == len(oracle)
    assert table.in_order() == list(oracle.values())  # a dict keeps the order of adding
    assert table.oldest() == next(iter(oracle.values()), -1)
    for key, entry in oracle.items():
        assert table.find(key) == entry
        assert table.key(entry) == key
    held = sorted(int(e) for e in table.slots if e >= 0)
    assert held == sorted(oracle.values())
    mask = len(table.slots) - 1
    for i, e in enumerate(table.slots):
        if e >= 0:
            j = int(table.entry_hash[e]) & mask
            while j != i:
                assert table.slots[j] >= 0, "a key is cut off from its home slot"
                j = (j + 1) & mask


def test_fnv1a_is_the_published_function():
    # FNV-1a 64 test vectors (the reference implementation's: "" and "a", "foobar").
    for text, expected in ((b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C),
                           (b"foobar", 0x85944171F73967E8)):  # fmt: skip
        buf = np.frombuffer(b"xx" + text, dtype=np.uint8)
        assert int(fnv1a(buf, 2, len(text))) == expected


@pytest.mark.parametrize("seed", range(6))
def test_random_adds_and_removals_agree_with_a_dict(seed):
    rng = np.random.default_rng(seed)
    table = IdTable(entries=1, arena_bytes=16)  # grows and compacts many times over
    oracle: dict[bytes, int] = {}
    # Few distinct keys, so that adds meet held keys and removals reopen probe chains.
    pool = [f"evt-{i}-{'x' * int(rng.integers(0, 40))}".encode() for i in range(300)]
    for step in range(6000):
        key = pool[int(rng.integers(len(pool)))]
        if rng.random() < 0.55:
            entry = table.add(key)
            if key in oracle:
                assert entry == oracle[key]
            else:
                assert entry not in oracle.values()
                oracle[key] = entry
        elif key in oracle:
            table.remove(oracle.pop(key))
        else:
            assert table.find(key) == -1
        if step % 500 == 0:
            check_against(table, oracle)
    check_against(table, oracle)
    for key in list(oracle):
        table.remove(oracle.pop(key))
    check_against(table, oracle)
    assert table.meta[0] == 0


def test_a_crowded_small_table_keeps_every_chain_whole():
    # Eight keys in 16 slots with every home slot forced to the same two: the longest chains
    # linear probing makes, and removals from their middles.
    table = IdTable(entries=8)
    keys = [f"k{i}".encode() for i in range(8)]
    oracle = {k: table.add(k) for k in keys}
    table.entry_hash[:] = np.where(np.arange(len(table.entry_hash)) % 2 == 0, 3, 15)
    _rehash(table.slots, table.entry_len, table.entry_hash)
    for k in (keys[3], keys[0], keys[6]):
        table.remove(oracle.pop(k))
        mask = len(table.slots) - 1
        for e in oracle.values():  # found by probing from the forced home
            i = int(table.entry_hash[e]) & mask
            while table.slots[i] != e:
                assert table.slots[i] >= 0
                i = (i + 1) & mask


def test_compiled_callers_use_the_arrays_after_reserving_room():
    # What the compiled engine does: reserve for a batch, then add and find ids from a buffer.
    ids = [f"id-{i}".encode() for i in range(50)]
    buf = np.frombuffer(b"".join(ids), dtype=np.uint8)
    starts = np.cumsum([0] + [len(k) for k in ids[:-1]])
    table = IdTable()
    table.reserve(len(ids), len(buf))
    arrays = (table.slots, table.entry_start, table.entry_len, table.entry_hash)
    for key, s in zip(ids, starts):
        h = np.uint64(fnv1a(buf, s, len(key)))  # compiled callers keep it a uint64
        assert table_find(*arrays, table.arena, buf, s, len(key), h) == -1
        links = (table.next_free, table.older, table.newer)
        e = table_add(*arrays, *links, table.arena, table.meta, buf, s, len(key), h)
        assert table_find(*arrays, table.arena, buf, s, len(key), h) == e
    assert [table.find(k) for k in ids] == list(range(50))
    table_remove(
        table.slots,
        table.entry_len,
        table.entry_hash,
        table.next_free,
        table.older,
        table.newer,
        table.meta,
        7,
    )
    assert table.find(ids[7]) == -1 and len(table) == 49
    with pytest.raises(KeyError):
        table.remove(7)
    # The freed entry is the next one given.
    assert table.add(b"new") == 7


def test_reserve_compacts_the_arena_before_growing_it():
    table = IdTable(entries=4, arena_bytes=64)
    for round_ in range(100):
        e = table.add(f"round-{round_:04d}".encode())  # 10 bytes each
        table.remove(e)
    assert len(table.arena) == 64  # removed keys' bytes reclaimed, not grown
    assert table.meta[2] <= 64
