"""What a columnar worker would gain on decoding: contexts decoded one by one (what the worker does
now) against a whole poll batch parsed by one compiled pass into columns.

    python bench/probe_batch_decode.py          # writes bench/results/batch_decode.{md,json}

A probe for issue 7's open throughput target (bench/results/e2e.md: decoding is ~7 us of the
worker's ~34 us of CPU per event). The batch reader here parses the version-2 context layout
(docs/schemas.md) of N records laid end to end into: timestamps (n,), features (n, K, d) and the
byte spans of the ids; making Python strings of the event ids and model keys (which a worker's
dicts need) is timed separately. It is a measurement, not the worker's code: it trusts its input
(no checks of K, d or finiteness), which a real reader must not.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.pin_one_thread()

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from streambandit import events  # noqa: E402
from streambandit.events import Context  # noqa: E402

N, K, D, REPEATS = 20_000, 10, 20, 7


@njit(cache=True)
def _varint(buf, pos):
    shift, acc = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        acc |= (b & 0x7F) << shift
        if not b & 0x80:
            return (acc >> 1) ^ -(acc & 1), pos
        shift += 7


@njit(cache=True)
def parse_contexts(buf, starts, k_arms, dim, ts, feats, id_spans, key_spans):
    """Parse records ``buf[starts[i]:]`` (3-byte header + Avro context v2) into the columns."""
    for i in range(starts.shape[0]):
        pos = starts[i] + 3
        n, pos = _varint(buf, pos)  # event_id
        id_spans[i, 0], id_spans[i, 1] = pos, pos + n
        pos += n
        n, pos = _varint(buf, pos)  # model_key
        key_spans[i, 0], key_spans[i, 1] = pos, pos + n
        pos += n
        ts[i], pos = _varint(buf, pos)
        while True:  # arm_ids: blocks of strings, skipped here (a worker needs only the chosen one)
            count, pos = _varint(buf, pos)
            if count == 0:
                break
            if count < 0:
                count = -count
                _, pos = _varint(buf, pos)
            for _ in range(count):
                n, pos = _varint(buf, pos)
                pos += n
        n, pos = _varint(buf, pos)  # features: K * d little-endian float64
        vals = buf[pos:pos + n].view(np.float64)  # little-endian on this machine, as the format is
        flat = feats[i].reshape(k_arms * dim)
        for j in range(k_arms * dim):
            flat[j] = vals[j]


def records() -> list[bytes]:
    rng = np.random.default_rng(0)
    arm_ids = tuple(f"ad-{j}" for j in range(K))
    return [events.encode(Context(f"req-{i}", f"placement-{i % 4}", 1_700_000_000_000 + i, arm_ids,
                                  rng.standard_normal((K, D)) / np.sqrt(D))) for i in range(N)]


def main() -> None:
    recs = records()
    buf = np.frombuffer(b"".join(recs), dtype=np.uint8)
    starts = np.cumsum([0] + [len(r) for r in recs[:-1]]).astype(np.int64)
    ts = np.empty(N, np.int64)
    feats = np.empty((N, K, D))
    id_spans = np.empty((N, 2), np.int64)
    key_spans = np.empty((N, 2), np.int64)
    parse_contexts(buf, starts[:2], K, D, ts, feats, id_spans, key_spans)  # compile

    one, batch, strings = [], [], []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        decoded = [events.decode(r) for r in recs]
        one.append((time.perf_counter() - t0) / N)
        t0 = time.perf_counter()
        raw = b"".join(recs)  # the poll batch's message values, laid end to end
        buf = np.frombuffer(raw, dtype=np.uint8)
        lengths = np.fromiter(map(len, recs), dtype=np.int64, count=N)
        starts = np.zeros(N, np.int64)
        np.cumsum(lengths[:-1], out=starts[1:])
        parse_contexts(buf, starts, K, D, ts, feats, id_spans, key_spans)
        batch.append((time.perf_counter() - t0) / N)
        t0 = time.perf_counter()
        ids = [raw[a:b].decode() for a, b in id_spans.tolist()]
        keys = [raw[a:b].decode() for a, b in key_spans.tolist()]
        strings.append((time.perf_counter() - t0) / N)
    # The columns are the one-by-one decode's values, to the bit.
    assert all(d.event_id == i and d.model_key == k and d.timestamp_ms == t and d.features.tobytes() == f.tobytes()
               for d, i, k, t, f in zip(decoded, ids, keys, ts.tolist(), feats))

    us = {name: 1e6 * statistics.median(v) for name, v in (("one_by_one", one), ("batch", batch), ("strings", strings))}
    res = {"machine": common.machine(), "n": N, "K": K, "d": D, "repeats": REPEATS, "us_per_record": us}
    md = "\n".join([
        "# Decoding contexts: one by one against one compiled pass over a poll batch",
        "",
        f"Command: `python bench/probe_batch_decode.py`. Machine: {res['machine']['cpu']}, "
        f"{res['machine']['cores']} cores, Python {res['machine']['python']}, commit {res['machine']['commit']}, "
        f"{res['machine']['date']}. {N:,} context records (version 2: K = {K}, d = {D}), median of {REPEATS} runs.",
        "",
        "| path | us per record |",
        "|---|---:|",
        f"| `events.decode` per record (the worker today; with its checks) | {us['one_by_one']:.2f} |",
        f"| join the batch's values + one compiled pass into columns (timestamps, (n, K, d) features, id spans; "
        f"no checks) | {us['batch']:.2f} |",
        f"| + Python strings of the event id and model key | {us['strings']:.2f} |",
        "",
        "The columns equal the one-by-one decode's values to the bit (asserted). The batch reader trusts its "
        "input; a real one must check K, d and finiteness and dead-letter a bad record, which the compiled pass "
        "can do per record at little cost.",
        "",
    ])
    common.write("batch_decode", res, md)
    print(md)


if __name__ == "__main__":
    main()
