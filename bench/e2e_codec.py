"""Part 2 of ``python -m bench.e2e``: decode and encode per record, for the wire layouts a
context's features could take and for the worker's outputs, one at a time and a batch at once."""

from __future__ import annotations

import time

import numpy as np

from bench import harness, traffic
from streambandit.stream.batch import EMIT_EVERY
from streambandit.wire import codec as wire_codec
from streambandit.wire import encode, records
from streambandit.wire.batch_decode import decode_batch
from streambandit.wire.batch_encode import encode_actions, encode_joined_records


def codec(n: int = 20_000) -> dict:
    """Microseconds per record: context decode for three wire layouts of the features, and the
    worker's per-event encodes."""
    import io

    import fastavro

    c = traffic.backlog(1)[0][0]
    arrays = fastavro.parse_schema(
        {
            "type": "record",
            "name": "CtxArrays",
            "fields": [
                {"name": "event_id", "type": "string"},
                {"name": "model_key", "type": "string"},
                {"name": "timestamp_ms", "type": "long"},
                {
                    "name": "arms",
                    "type": {
                        "type": "array",
                        "items": {
                            "type": "record",
                            "name": "ArmArrays",
                            "fields": [
                                {"name": "arm_id", "type": "string"},
                                {"name": "features", "type": {"type": "array", "items": "double"}},
                            ],
                        },
                    },
                },
            ],
        }
    )
    buf = io.BytesIO()
    fastavro.schemaless_writer(
        buf,
        arrays,
        {
            "event_id": c.event_id,
            "model_key": c.model_key,
            "timestamp_ms": c.timestamp_ms,
            "arms": [
                {"arm_id": a, "features": [float(v) for v in x]}
                for a, x in zip(c.arm_ids, c.features)
            ],
        },
    )
    arrays_bytes = buf.getvalue()

    def decode_arrays() -> (
        None
    ):  # what a reader of a double-array layout must do, validation included
        d = fastavro.schemaless_reader(io.BytesIO(arrays_bytes), arrays, None)
        x = np.array([a["features"] for a in d["arms"]], dtype=np.float64)
        np.isfinite(x).all()

    def per(f) -> float:
        f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) / n * 1e6

    def batch_us(f, records: list, repeats: int = 7) -> float:
        """Microseconds per record of ``f(records)``, a call for a whole batch (median of the repeats)."""
        f(records)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(records)
            times.append((time.perf_counter() - t0) / len(records) * 1e6)
        return harness.median(times)

    v1, v2 = wire_codec.encode_context_v1(c), encode(c)
    action = records.Action(
        c.event_id,
        c.model_key,
        c.arm_ids[3],
        3,
        0.5,
        1.0,
        100,
        c.timestamp_ms,
        c.features[3],
        0,
        100,
    )
    joined = records.Joined(
        c.event_id,
        c.model_key,
        c.features[3],
        1.0,
        True,
        1.0,
        c.timestamp_ms,
        c.timestamp_ms + 5,
        100,
        1,
        77,
    )
    fa_action = {f: getattr(action, f) for f in action.__dataclass_fields__} | {
        "features": wire_codec.features_to_bytes(action.features)
    }
    # What the worker does: a poll batch of 2,000 different contexts decoded in one pass (batch_decode.py).
    batch = [encode(x) for x, _ in traffic.backlog(2000)]
    # What the worker does with its outputs: a hand-over's worth (batch.EMIT_EVERY records) of
    # actions and of joined records, each encoded in one compiled pass (batch_encode.py).
    ctxs = [x for x, _ in traffic.backlog(EMIT_EVERY)]
    actions = [
        records.Action(
            x.event_id,
            x.model_key,
            x.arm_ids[i % 10],
            i % 10,
            0.5,
            1.0,
            10_000 + i,
            x.timestamp_ms,
            x.features[i % 10].copy(),
            0,
            50_000 + i,
        )
        for i, x in enumerate(ctxs)
    ]
    joins = [
        records.Joined(
            a.event_id,
            a.model_key,
            a.features,
            1.0,
            i % 3 == 0,
            1.0,
            a.decision_timestamp_ms,
            a.decision_timestamp_ms + 100,
            a.model_version,
            1,
            20_000 + i,
        )
        for i, a in enumerate(actions)
    ]

    out = {
        "bytes": {
            "arrays_of_double": len(arrays_bytes) + 3,
            "v1_bytes_per_arm": len(v1),
            "v2_one_block": len(v2),
        },
        "decode_us": {
            "arrays_of_double": per(decode_arrays),
            "v1_bytes_per_arm": per(lambda: wire_codec.decode(v1)),
            "v2_one_block": per(lambda: wire_codec.decode(v2)),
            "v2_batch": batch_us(decode_batch, batch),
        },
        "encode_us": {
            "action_fastavro": per(lambda: wire_codec.write(3, fa_action)),
            "action": per(lambda: encode(action)),
            "joined": per(lambda: encode(joined)),
            "context_v2": per(lambda: encode(c)),
            "action_batch": batch_us(encode_actions, actions),
            "joined_batch": batch_us(encode_joined_records, joins),
        },
    }
    print(f"codec: {out}", flush=True)
    return out


def render(res: dict) -> list[str]:
    """Part 2 of the report."""
    lines: list[str] = []
    c = res["codec"]
    lines += [
        "## 2. Feature decoding: three wire layouts of a context (d = 20, K = 10)",
        "",
        "Microseconds per record, decode with validation (shape, finite) into a (K, d) float64 array.",
        "",
        "| layout | bytes | decode us |",
        "|---|---:|---:|",
        f"| fastavro `array<double>` per arm | {c['bytes']['arrays_of_double']:,} "
        f"| {c['decode_us']['arrays_of_double']:.1f} |",
        f"| packed little-endian float64 `bytes` per arm (context v1) | {c['bytes']['v1_bytes_per_arm']:,} | "
        f"{c['decode_us']['v1_bytes_per_arm']:.1f} |",
        f"| one packed block for all arms (context v2) | {c['bytes']['v2_one_block']:,} | "
        f"{c['decode_us']['v2_one_block']:.1f} |",
        *(
            [
                f"| context v2, a poll batch of 2,000 in one call (`batch_decode`) | "
                f"{c['bytes']['v2_one_block']:,} | {c['decode_us']['v2_batch']:.1f} |"
            ]
            if "v2_batch" in c["decode_us"]
            else []
        ),
        "",
        f"Encode per event: action {c['encode_us']['action']:.1f} us "
        f"(fastavro: {c['encode_us']['action_fastavro']:.1f} us), "
        f"joined {c['encode_us']['joined']:.1f} us; a context (the application's side) "
        f"{c['encode_us']['context_v2']:.1f} us. "
        + (
            f"A hand-over of {res['emit_every']} records in one call (`batch_encode`): action "
            f"{c['encode_us']['action_batch']:.2f} us, joined {c['encode_us']['joined_batch']:.2f} us per record."
            if "action_batch" in c["encode_us"]
            else ""
        ),
        "",
    ]
    return lines
