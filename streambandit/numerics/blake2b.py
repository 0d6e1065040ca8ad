"""BLAKE2b with a 16-byte digest and no key, compiled: ``hashlib.blake2b(msg, digest_size=16)``.

An exploring model's draw is seeded by a 128-bit hash of the event (``event_draw.event_seed``);
a worker hashes every exploring context, and through ``hashlib`` that is a Python call or two per
context, a larger part of the engine's per-event cost than the draw itself (``python -m
bench.worker_path``, the exploring row). Here the same hash runs inside a compiled loop over a
run's records. RFC 7693 is the definition; section numbers below are its.
tests/unit/numerics/test_blake2b.py holds it to ``hashlib`` on messages around the block edges.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from streambandit.numerics.jit import CACHE

__all__ = ["blake2b_16"]

# Section 2.6: the initialisation vector (SHA-512's).
_IV = np.array(
    [
        0x6A09E667F3BCC908,
        0xBB67AE8584CAA73B,
        0x3C6EF372FE94F82B,
        0xA54FF53A5F1D36F1,
        0x510E527FADE682D1,
        0x9B05688C2B3E6C1F,
        0x1F83D9ABFB41BD6B,
        0x5BE0CD19137E2179,
    ],
    dtype=np.uint64,
)
# Section 2.7: the message schedule; rounds 10 and 11 use rows 0 and 1 again.
_SIGMA = np.array(
    [
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
        [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
        [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
        [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
        [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
        [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
        [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
        [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
        [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
        [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
    ],
    dtype=np.int64,
)
# The G calls of a round (section 3.2): the four columns, then the four diagonals.
_LANES = np.array(
    [
        [0, 4, 8, 12],
        [1, 5, 9, 13],
        [2, 6, 10, 14],
        [3, 7, 11, 15],
        [0, 5, 10, 15],
        [1, 6, 11, 12],
        [2, 7, 8, 13],
        [3, 4, 9, 14],
    ],
    dtype=np.int64,
)
_BLOCK = 128
# Section 2.5, parameter block word 0 with digest length 16, no key, fanout and depth 1.
_PARAM0 = np.uint64(0x01010000 ^ 16)
_ONES = np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(cache=CACHE, nogil=True, inline="always")
def _rotr(x, n):
    return (x >> np.uint64(n)) | (x << np.uint64(64 - n))


@njit(cache=CACHE, nogil=True)
def _compress(h, m, v, t, last):
    """Section 3.2, F: ``h`` updated in place with the block's words ``m``, ``t`` bytes hashed so
    far (messages here are far below 2^64 bytes: the counter's high word stays 0)."""
    for i in range(8):
        v[i] = h[i]
        v[i + 8] = _IV[i]
    v[12] ^= t
    if last:
        v[14] ^= _ONES
    for r in range(12):
        s = _SIGMA[r % 10]
        for g in range(8):
            a, b, c, d = _LANES[g, 0], _LANES[g, 1], _LANES[g, 2], _LANES[g, 3]
            # Section 3.1, G, with the rotation constants R1..R4 = 32, 24, 16, 63.
            v[a] = v[a] + v[b] + m[s[2 * g]]
            v[d] = _rotr(v[d] ^ v[a], 32)
            v[c] = v[c] + v[d]
            v[b] = _rotr(v[b] ^ v[c], 24)
            v[a] = v[a] + v[b] + m[s[2 * g + 1]]
            v[d] = _rotr(v[d] ^ v[a], 16)
            v[c] = v[c] + v[d]
            v[b] = _rotr(v[b] ^ v[c], 63)
    for i in range(8):
        h[i] ^= v[i] ^ v[i + 8]


@njit(cache=CACHE, nogil=True)
def blake2b_16(msg, n, out):
    """``out[:16]`` = BLAKE2b-128 of ``msg[:n]`` (uint8 arrays), section 3.3."""
    h = _IV.copy()
    h[0] ^= _PARAM0
    m = np.zeros(16, dtype=np.uint64)
    v = np.empty(16, dtype=np.uint64)
    blocks = max(1, (n + _BLOCK - 1) // _BLOCK)  # the empty message is one block of zeros
    for blk in range(blocks):
        start = blk * _BLOCK
        for j in range(16):  # the block's words, little-endian, zeros past the message
            w = np.uint64(0)
            for k in range(8):
                at = start + 8 * j + k
                if at < n:
                    w |= np.uint64(msg[at]) << np.uint64(8 * k)
            m[j] = w
        last = blk == blocks - 1
        _compress(h, m, v, np.uint64(n if last else start + _BLOCK), last)
    for i in range(16):
        out[i] = np.uint8((h[i // 8] >> np.uint64(8 * (i % 8))) & np.uint64(0xFF))
