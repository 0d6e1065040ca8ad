"""An event's exploration draw, compiled: the bits numpy's ``Generator(PCG64(seed))`` gives.

``decision.choose`` explores with ``rng.random() < epsilon`` and, when it explores, picks
``rng.integers(k)``, where ``rng`` is numpy's PCG64 seeded from a 128-bit hash of the event
(docs/design.md, determinism). Building that generator costs tens of microseconds (the seed goes
through ``SeedSequence``, then a ``Generator`` object is made), more than a whole OFUL decision
at small d, and every decision of every worker and replay pays it. The two draws need none of
that machinery: this module computes the same seeding, the same PCG64 steps and the same two
conversions in one compiled call, so every decision ever logged keeps its draw
(tests/unit/numerics/test_event_draw.py checks it against numpy itself over many seeds).

What numpy does, in the order computed here (numpy/random/bit_generator.pyx, _pcg64.pyx,
pcg64.h, distributions.c):

1. ``SeedSequence(seed)``: the integer's 32-bit words, least significant first, are hashed into
   a pool of 4 words (``mix_entropy``; a missing high word hashes as 0, so a seed below 2^96
   needs no special case), and ``generate_state(4, uint64)`` hashes the pool into 8 words read
   as 4 little-endian uint64 ``v``.
2. ``PCG64``: state and increment are the 128-bit ``v0:v1`` and ``v2:v3``;
   ``inc = (seq << 1) | 1``, ``state = 0``, one step, ``state += seed``, one step.
3. A draw steps (``state = state * M + inc`` mod 2^128) and outputs the XSL-RR of the state:
   ``rotr64(hi ^ lo, state >> 122)``.
4. ``random()``: ``(u64 >> 11) * 2^-53``. ``integers(k)`` for ``k <= 2^32``: Lemire's method on
   32-bit words, taken from the low then the high half of a 64-bit output (PCG64 buffers the
   high half), with rejection below ``(2^32 - k) mod k``.

All arithmetic is on uint64: 128-bit values are (hi, lo) pairs and 32-bit values are masked.
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import njit

from streambandit.numerics.blake2b import blake2b_16
from streambandit.numerics.jit import CACHE

__all__ = ["event_seed", "event_seeds_into", "explore_draw", "seed_state"]

_M32 = np.uint64(0xFFFFFFFF)
_INIT_A = np.uint64(0x43B0D7E5)
_MULT_A = np.uint64(0x931E8875)
_INIT_B = np.uint64(0x8B51F9DD)
_MULT_B = np.uint64(0x58F38DED)
_MIX_L = np.uint64(0xCA01F9DD)
_MIX_R = np.uint64(0x4973F715)
_XSHIFT = np.uint64(16)
# PCG's default 128-bit multiplier, as (hi, lo).
_PCG_M_HI = np.uint64(2549297995355413924)
_PCG_M_LO = np.uint64(4865540595714422341)


def event_seed(model_key: str, event_id: str, seed: int) -> bytes:
    """The event's 128-bit seed: blake2b of key, id and seed (not ``hash()``, which Python salts
    per process), 16 bytes, the integer's little-endian bytes (numba reads them as they are)."""
    # Encoded as one string: the same bytes as the parts encoded and joined by a zero byte.
    # A copy of an empty hash object rather than a new one: blake2b's constructor parses its
    # keyword parameters on every call, which costs more than the copy (once per decision).
    h = _EMPTY_DIGEST16.copy()
    h.update(f"{model_key}\x00{event_id}\x00{int(seed)}".encode())
    return h.digest()


_EMPTY_DIGEST16 = hashlib.blake2b(digest_size=16)  # copied, never updated itself


@njit(cache=CACHE, nogil=True, inline="always")
def _span(ends, k):
    """Where item ``k`` of a buffer of items laid end to end lies (``ends``: each one's end)."""
    return (ends[k - 1] if k > 0 else 0), ends[k]


@njit(cache=CACHE, nogil=True)
def event_seeds_into(
    out, rows, keys, id_buf, id_start, id_len, key_buf, key_ends, seed_buf, seed_ends
):
    """:func:`event_seed` of many events in one call, from their UTF-8 bytes (a string's encoding
    is its parts' encodings joined, so the digest is the same). For each ``i`` in ``rows``:
    ``out[i]`` is the seed of the event whose id is ``id_buf[id_start[i]:][:id_len[i]]``, of the
    model key numbered ``k = keys[i]``; the keys' bytes lie end to end in ``key_buf`` (``key_ends``
    their ends, as ``pass_outputs.model_key_bytes`` lays them) and their seeds' decimal digits
    likewise in ``seed_buf``."""
    longest = 0
    for i in rows:
        k0, k1 = _span(key_ends, keys[i])
        s0, s1 = _span(seed_ends, keys[i])
        longest = max(longest, k1 - k0 + id_len[i] + s1 - s0 + 2)
    msg = np.empty(longest, dtype=np.uint8)
    for i in rows:  # key, a zero byte, id, a zero byte, seed: event_seed's message
        k0, k1 = _span(key_ends, keys[i])
        s0, s1 = _span(seed_ends, keys[i])
        n = 0
        for j in range(k0, k1):
            msg[n] = key_buf[j]
            n += 1
        msg[n] = 0
        n += 1
        for j in range(id_start[i], id_start[i] + id_len[i]):
            msg[n] = id_buf[j]
            n += 1
        msg[n] = 0
        n += 1
        for j in range(s0, s1):
            msg[n] = seed_buf[j]
            n += 1
        blake2b_16(msg, n, out[i])


@njit(cache=CACHE, nogil=True, inline="always")
def _word(digest, at):
    """The little-endian uint64 at byte ``at`` of ``digest``."""
    v = np.uint64(0)
    for i in range(8):
        v |= np.uint64(digest[at + i]) << np.uint64(8 * i)
    return v


@njit(cache=CACHE, nogil=True, inline="always")
def _hashmix(value, hc):
    """SeedSequence's hashmix; returns (value, the next hash constant)."""
    value = (value ^ hc) & _M32
    hc = (hc * _MULT_A) & _M32
    value = (value * hc) & _M32
    return value ^ (value >> _XSHIFT), hc


@njit(cache=CACHE, nogil=True, inline="always")
def _mix(x, y):
    result = (_MIX_L * x - _MIX_R * y) & _M32
    return result ^ (result >> _XSHIFT)


@njit(cache=CACHE, nogil=True, inline="always")
def _mul64(a, b):
    """The full 128-bit product of two uint64, as (hi, lo)."""
    a_lo, a_hi = a & _M32, a >> np.uint64(32)
    b_lo, b_hi = b & _M32, b >> np.uint64(32)
    ll = a_lo * b_lo
    lh = a_lo * b_hi
    hl = a_hi * b_lo
    hh = a_hi * b_hi
    mid = (ll >> np.uint64(32)) + (lh & _M32) + (hl & _M32)
    lo = (ll & _M32) | ((mid & _M32) << np.uint64(32))
    hi = hh + (lh >> np.uint64(32)) + (hl >> np.uint64(32)) + (mid >> np.uint64(32))
    return hi, lo


@njit(cache=CACHE, nogil=True, inline="always")
def _step(s_hi, s_lo, i_hi, i_lo):
    """PCG's LCG step, state * M + inc mod 2^128."""
    hi, lo = _mul64(s_lo, _PCG_M_LO)
    hi = hi + s_lo * _PCG_M_HI + s_hi * _PCG_M_LO
    lo2 = lo + i_lo
    hi = hi + i_hi + (np.uint64(1) if lo2 < lo else np.uint64(0))
    return hi, lo2


@njit(cache=CACHE, nogil=True, inline="always")
def _output(s_hi, s_lo):
    """XSL-RR: the 64-bit output of a 128-bit state."""
    value = s_hi ^ s_lo
    rot = s_hi >> np.uint64(58)
    return (value >> rot) | (value << ((np.uint64(64) - rot) & np.uint64(63)))


@njit(cache=CACHE, nogil=True)
def seed_state(seed_lo, seed_hi):
    """numpy's PCG64 state for the 128-bit seed ``seed_hi:seed_lo``: (state hi, lo, inc hi, lo)."""
    words = np.empty(4, dtype=np.uint64)
    words[0] = seed_lo & _M32
    words[1] = seed_lo >> np.uint64(32)
    words[2] = seed_hi & _M32
    words[3] = seed_hi >> np.uint64(32)
    pool = np.empty(4, dtype=np.uint64)
    hc = _INIT_A
    for i in range(4):  # mix_entropy
        pool[i], hc = _hashmix(words[i], hc)
    for i_src in range(4):
        for i_dst in range(4):
            if i_src != i_dst:
                h, hc = _hashmix(pool[i_src], hc)
                pool[i_dst] = _mix(pool[i_dst], h)
    state = np.empty(8, dtype=np.uint64)
    hc = _INIT_B
    for i in range(8):  # generate_state(4, uint64)
        v = (pool[i % 4] ^ hc) & _M32
        hc = (hc * _MULT_B) & _M32
        v = (v * hc) & _M32
        state[i] = v ^ (v >> _XSHIFT)
    v0 = state[0] | (state[1] << np.uint64(32))
    v1 = state[2] | (state[3] << np.uint64(32))
    v2 = state[4] | (state[5] << np.uint64(32))
    v3 = state[6] | (state[7] << np.uint64(32))
    # pcg_setseq_128_srandom_r(initstate = v0:v1, initseq = v2:v3)
    i_hi = (v2 << np.uint64(1)) | (v3 >> np.uint64(63))
    i_lo = (v3 << np.uint64(1)) | np.uint64(1)
    s_hi, s_lo = _step(np.uint64(0), np.uint64(0), i_hi, i_lo)
    lo = s_lo + v1
    s_hi = s_hi + v0 + (np.uint64(1) if lo < s_lo else np.uint64(0))
    s_hi, s_lo = _step(s_hi, lo, i_hi, i_lo)
    return s_hi, s_lo, i_hi, i_lo


@njit(cache=CACHE, nogil=True)
def explore_draw(digest, epsilon, k):
    """``rng.random() < epsilon`` and, if so, ``rng.integers(k)`` (else -1), for numpy's
    ``Generator(PCG64(int.from_bytes(digest, "little")))``, ``digest`` 16 bytes as
    :func:`event_seed` gives them. ``1 <= k <= 2^32``."""
    s_hi, s_lo, i_hi, i_lo = seed_state(_word(digest, 0), _word(digest, 8))
    s_hi, s_lo = _step(s_hi, s_lo, i_hi, i_lo)
    u = (_output(s_hi, s_lo) >> np.uint64(11)) * (1.0 / 9007199254740992.0)
    if not u < epsilon:
        return False, np.int64(-1)
    rng = np.uint64(k - 1)
    if rng == 0:
        return True, np.int64(0)
    # buffered_bounded_lemire_uint32 over pcg64_next32: low half first, then the buffered high.
    excl = rng + np.uint64(1)
    have_high = False
    high = np.uint64(0)
    threshold = ((_M32 - rng) & _M32) % excl
    while True:
        if have_high:
            word = high
            have_high = False
        else:
            s_hi, s_lo = _step(s_hi, s_lo, i_hi, i_lo)
            out = _output(s_hi, s_lo)
            word, high, have_high = out & _M32, out >> np.uint64(32), True
        m = word * excl
        if (m & _M32) >= threshold:
            return True, np.int64(m >> np.uint64(32))
