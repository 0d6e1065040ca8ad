"""The compiled exploration draw gives numpy's bits: the oracle is numpy's own PCG64 and Generator."""

import numpy as np
import pytest

from streambandit.engine.decision import choose, event_rng
from streambandit.engine.pass_outputs import model_key_bytes
from streambandit.numerics.event_draw import (
    event_seed,
    event_seeds_into,
    explore_draw,
    seed_state,
)

MASK = (1 << 64) - 1


def _seeds(n: int, rs: np.random.Generator):
    """128-bit seeds of every size: full, below 2^96 and 2^64 (high words 0), tiny, and the ends."""
    yield from (0, 1, (1 << 128) - 1, 1 << 127, (1 << 64) - 1, 1 << 64)
    for i in range(n):
        words = [int(w) for w in rs.integers(0, 1 << 32, 4, dtype=np.uint64)]
        seed = sum(w << (32 * j) for j, w in enumerate(words))
        yield seed >> (32 * (i % 4))  # 128, 96, 64 and 32 significant bits in turn


def test_the_seeded_state_is_numpys_pcg64_state():
    for seed in _seeds(2000, np.random.default_rng(0)):
        s_hi, s_lo, i_hi, i_lo = seed_state(np.uint64(seed & MASK), np.uint64(seed >> 64))
        want = np.random.PCG64(seed).state["state"]
        assert (int(s_hi) << 64 | int(s_lo), int(i_hi) << 64 | int(i_lo)) == (
            want["state"],
            want["inc"],
        ), seed


@pytest.mark.parametrize("k", [1, 2, 3, 10, 80, 1000, 2**31 + 1, 2**32 - 1, 2**32])
def test_the_draws_are_numpys_random_then_integers(k):
    # k = 2^31 + 1 rejects about half of the 32-bit words, so the buffered high half is used.
    rs = np.random.default_rng(k)
    for seed in _seeds(600, rs):
        epsilon = float(rs.choice([0.0, 1.0, rs.uniform()]))
        gen = np.random.Generator(np.random.PCG64(seed))
        explored = bool(gen.random() < epsilon)
        index = int(gen.integers(k)) if explored else -1
        assert explore_draw(seed.to_bytes(16, "little"), epsilon, k) == (explored, index), seed


def test_choose_explores_as_the_events_numpy_generator_does():
    rs = np.random.default_rng(3)
    for i in range(3000):
        key, event, seed = f"m-{i % 5}", f"event-{i}", int(rs.integers(0, 1 << 40))
        scores, epsilon = rs.standard_normal(int(rs.integers(1, 30))), float(rs.uniform(0.01, 1.0))
        rng = event_rng(key, event, seed)
        explored = bool(rng.random() < epsilon)
        index = int(rng.integers(scores.shape[0])) if explored else int(scores.argmax())
        d = choose(scores, epsilon=epsilon, model_key=key, event_id=event, seed=seed)
        assert (d.explored, d.index) == (explored, index)


def test_the_event_seed_depends_on_each_part():
    seeds = {event_seed(k, e, s) for k in ("a", "b") for e in ("x", "y") for s in (0, 1)}
    assert len(seeds) == 8 and all(len(s) == 16 for s in seeds)
    # The separator keeps ("a", "bc") and ("ab", "c") apart.
    assert event_seed("a", "bc", 0) != event_seed("ab", "c", 0)


def test_the_seeds_of_many_events_in_one_call_are_event_seed_s():
    """The compiled hash of a run's events (ArrayPartitionEngine._digests): each seeded row is
    event_seed of its key, id and the key's seed; ids long enough to cross BLAKE2b's 128-byte
    blocks; the rows not asked for are left as they were."""
    rng = np.random.default_rng(5)
    keys, seeds = ["ads-1", "ключ", "", "k" * 150], [0, 2**40, 7, 123456789]
    ids = [
        "é🙂" * int(rng.integers(0, 60)) + str(i) if i % 3 else "x" * int(rng.integers(100, 300))
        for i in range(300)
    ]
    key_of = rng.integers(0, len(keys), len(ids))
    raw = [e.encode() for e in ids]
    starts = np.cumsum([0] + [len(b) for b in raw[:-1]])
    rows = np.flatnonzero(rng.random(len(ids)) < 0.8)
    out = np.full((len(ids), 16), 9, dtype=np.uint8)
    kb, sb = model_key_bytes(keys), model_key_bytes([str(s) for s in seeds])
    event_seeds_into(
        out,
        rows,
        key_of,
        np.frombuffer(b"".join(raw), dtype=np.uint8),
        starts,
        np.array([len(b) for b in raw]),
        kb.buf,
        kb.ends,
        sb.buf,
        sb.ends,
    )
    for i in range(len(ids)):
        k = int(key_of[i])
        want = event_seed(keys[k], ids[i], seeds[k]) if i in set(rows.tolist()) else bytes([9] * 16)
        assert out[i].tobytes() == want, i
