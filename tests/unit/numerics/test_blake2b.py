"""The compiled BLAKE2b-128 against hashlib's, on messages of every length around the block
edges (0, one byte, 127/128/129, two blocks and a bit) and on random ones."""

import hashlib

import numpy as np
import pytest

from streambandit.numerics.blake2b import blake2b_16

EDGES = [0, 1, 7, 8, 9, 63, 64, 111, 112, 127, 128, 129, 255, 256, 257, 300]


def _ours(msg: bytes) -> bytes:
    out = np.zeros(16, dtype=np.uint8)
    buf = np.frombuffer(msg + b"\xff" * 40, dtype=np.uint8)  # bytes past n must not count
    blake2b_16(buf, len(msg), out)
    return out.tobytes()


@pytest.mark.parametrize("n", EDGES)
def test_the_digest_is_hashlib_s_at_the_block_edges(n):
    msg = bytes((7 * i + 3) % 256 for i in range(n))
    assert _ours(msg) == hashlib.blake2b(msg, digest_size=16).digest()


def test_the_digest_is_hashlib_s_on_random_messages():
    rng = np.random.default_rng(0)
    for _ in range(200):
        msg = rng.integers(0, 256, int(rng.integers(0, 400)), dtype=np.uint8).tobytes()
        assert _ours(msg) == hashlib.blake2b(msg, digest_size=16).digest()
