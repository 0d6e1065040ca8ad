"""One record to bytes and back: a 3-byte header (magic 0x5B, schema id, schema version), then
the Avro binary (schemaless) encoding of the record under the writer schema the header names
(schemas.py). No pickle anywhere.

Feature vectors travel as packed little-endian float64 bytes: one ``np.frombuffer`` per record
instead of a Python float per element. Actions and joined records, written once per event, are
encoded by hand (avro.py: fastavro's bytes); the rest goes through fastavro.
"""

from __future__ import annotations

import dataclasses
import io
import math
import re
from typing import Any

import fastavro
import numpy as np

from streambandit import reasons
from streambandit.errors import StreambanditError
from streambandit.wire import avro
from streambandit.wire.avro import MAGIC
from streambandit.wire.records import (
    Action,
    Context,
    DeadLetter,
    Joined,
    ReplicaDecision,
    Reward,
    Tick,
)
from streambandit.wire.schemas import LEGACY, READERS, VERSIONS, WRITERS

__all__ = [
    "DecodeError",
    "encode",
    "decode",
    "write",
    "encode_action",
    "encode_joined",
    "action_body",
    "encode_context_v1",
    "features_to_bytes",
    "features_from_bytes",
    "ACTION_HEADER",
    "JOINED_HEADER",
]

ACTION_HEADER = avro.header(3, VERSIONS[3])
JOINED_HEADER = avro.header(4, VERSIONS[4])


class DecodeError(StreambanditError, ValueError):
    """A record that cannot be turned into an event; ``reason`` is a code from reasons.py."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def features_to_bytes(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype="<f8").tobytes()


def features_from_bytes(b: bytes) -> np.ndarray:
    if len(b) % 8:
        raise DecodeError(
            reasons.BAD_DIMENSION, f"features have {len(b)} bytes, not a multiple of 8"
        )
    return np.frombuffer(b, dtype="<f8").astype(np.float64)


# -- encode ------------------------------------------------------------------------------------


def write(schema_id: int, datum: dict, version: int | None = None) -> bytes:
    """Header + Avro body with the writer schema of ``version`` (the current one by default)."""
    version = VERSIONS[schema_id] if version is None else version
    buf = io.BytesIO()
    buf.write(avro.header(schema_id, version))
    fastavro.schemaless_writer(buf, WRITERS[(schema_id, version)], datum)
    return buf.getvalue()


def encode_action(a: Action) -> bytes:
    return ACTION_HEADER + action_body(
        a.event_id,
        a.model_key,
        a.arm_id,
        a.arm_index,
        a.score,
        a.propensity,
        a.model_version,
        a.decision_timestamp_ms,
        a.features,
        a.trigger_source,
        a.trigger_offset,
    )


def action_body(
    event_id: str,
    model_key: str,
    arm_id: str,
    arm_index: int,
    score: float,
    propensity: float,
    model_version: int,
    decision_timestamp_ms: int,
    features: np.ndarray,
    trigger_source: int,
    trigger_offset: int,
) -> bytes:
    """An Action's fields in Avro (no header): the action record, and the head of a snapshot's
    pending decision, which has the same fields first."""
    f = features_to_bytes(features)
    return b"".join(
        (
            avro.string(event_id),
            avro.name(model_key),
            avro.name(arm_id),
            avro.long(arm_index),
            avro.double(score),
            avro.double(propensity),
            avro.long(model_version),
            avro.long(decision_timestamp_ms),
            avro.long(len(f)),
            f,
            avro.long(trigger_source),
            avro.long(trigger_offset),
        )
    )


def encode_joined(j: Joined) -> bytes:
    f = features_to_bytes(j.features)
    return b"".join(
        (
            JOINED_HEADER,
            avro.string(j.event_id),
            avro.name(j.model_key),
            avro.long(len(f)),
            f,
            avro.double(j.reward),
            b"\x01" if j.reward_observed else b"\x00",
            avro.double(j.propensity),
            avro.long(j.decision_timestamp_ms),
            avro.long(j.join_timestamp_ms),
            avro.long(j.model_version_before),
            avro.long(j.trigger_source),
            avro.long(j.trigger_offset),
        )
    )


def encode(event: Any) -> bytes:
    """Serialise one record with its header (a context in the current version, 2)."""
    if isinstance(event, Action):
        return encode_action(event)
    if isinstance(event, Joined):
        return encode_joined(event)
    if isinstance(event, Context):
        return write(
            1,
            {
                "event_id": event.event_id,
                "model_key": event.model_key,
                "timestamp_ms": event.timestamp_ms,
                "arm_ids": list(event.arm_ids),
                "features": features_to_bytes(event.features),
            },
        )
    if isinstance(event, Reward):
        return write(
            2,
            {
                "event_id": event.event_id,
                "model_key": event.model_key,
                "timestamp_ms": event.timestamp_ms,
                "value": event.value,
            },
        )
    if isinstance(event, Tick):
        return write(7, {"timestamp_ms": event.timestamp_ms, "group_id": event.group_id})
    if isinstance(event, ReplicaDecision):
        return write(
            8,
            {
                "event_id": event.event_id,
                "model_key": event.model_key,
                "timestamp_ms": event.timestamp_ms,
                "arm_ids": list(event.arm_ids),
                "features": features_to_bytes(event.features),
                "arm_index": event.arm_index,
                "score": event.score,
                "propensity": event.propensity,
                "model_version": event.model_version,
            },
        )
    if isinstance(event, DeadLetter):
        return write(5, {f.name: getattr(event, f.name) for f in dataclasses.fields(event)})
    raise TypeError(f"cannot encode {type(event).__name__}")


def encode_context_v1(event: Context) -> bytes:
    """A context in the version 1 layout (one record per arm), as writers before version 2 wrote it."""
    arms = [
        {"arm_id": a, "features": features_to_bytes(x)}
        for a, x in zip(event.arm_ids, event.features)
    ]
    return write(
        1,
        {
            "event_id": event.event_id,
            "model_key": event.model_key,
            "timestamp_ms": event.timestamp_ms,
            "arms": arms,
        },
        version=1,
    )


# -- decode ------------------------------------------------------------------------------------


_ADDRESS = re.compile(r"<[^<>]* at 0x[0-9a-fA-F]+>")


def _read(data: bytes) -> tuple[int, int, dict]:
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) < 3:
        raise DecodeError(
            reasons.MALFORMED,
            f"record of {0 if data is None else len(data)} bytes is too short for a header",
        )
    if data[0] != MAGIC:
        raise DecodeError(
            reasons.MALFORMED, f"bad magic byte 0x{data[0]:02x} (expected 0x{MAGIC:02x})"
        )
    sid, ver = data[1], data[2]
    writer = WRITERS.get((sid, ver))
    if writer is None:
        raise DecodeError(
            reasons.UNKNOWN_SCHEMA, f"schema id {sid} version {ver} is not known to this reader"
        )
    # The current version and the legacy layouts are read with their own schema (no resolution:
    # faster, and a legacy layout is converted below); any other version resolves to the current.
    reader = None if (ver == VERSIONS.get(sid) or (sid, ver) in LEGACY) else READERS[sid]
    try:
        datum = fastavro.schemaless_reader(io.BytesIO(memoryview(data)[3:]), writer, reader)
    except (
        EOFError,
        ValueError,
        TypeError,
        UnicodeDecodeError,
        IndexError,
        KeyError,
        fastavro.read.SchemaResolutionError,
    ) as exc:
        code = (
            reasons.MISSING_FIELD
            if isinstance(exc, fastavro.read.SchemaResolutionError)
            else reasons.MALFORMED
        )
        # fastavro's messages can name the stream object ("<_io.BytesIO object at 0x...>"): drop
        # the address, or a dead letter's detail would differ between a run and its replay.
        raise DecodeError(
            code, f"Avro decode failed: {_ADDRESS.sub('the record', str(exc))}"
        ) from exc
    return sid, ver, datum


def _context_features(arm_ids: list, block: bytes) -> np.ndarray:
    k, n = len(arm_ids), len(block)
    if not k:
        raise DecodeError(reasons.EMPTY_ARMS, "the context has no candidate arms")
    if n == 0 or n % (8 * k):
        raise DecodeError(
            reasons.BAD_DIMENSION,
            f"{n} feature bytes do not hold {k} arms of one dimension (8 bytes per value)",
        )
    feats = np.frombuffer(block, dtype="<f8").reshape(k, n // (8 * k)).astype(np.float64)
    if not np.isfinite(feats).all():
        raise DecodeError(reasons.NON_FINITE_FEATURES, "features contain NaN or infinite values")
    return feats


def _decision(d: dict) -> ReplicaDecision:
    """A logged decision, checked as a context is, and its choice for what a decision rule can
    have produced: a learner must not open a decision on an arm that was not offered."""
    ids = d["arm_ids"]
    feats = _context_features(ids, d["features"])
    i, p, score, version = d["arm_index"], d["propensity"], d["score"], d["model_version"]
    if not 0 <= i < len(ids):
        raise DecodeError(reasons.BAD_DECISION, f"arm_index {i} is not one of the {len(ids)} arms")
    if not (math.isfinite(p) and 0.0 < p <= 1.0):
        raise DecodeError(reasons.BAD_DECISION, f"propensity {p!r} is not in (0, 1]")
    if not math.isfinite(score):
        raise DecodeError(reasons.BAD_DECISION, f"score {score!r} is not finite")
    if version < 0:
        raise DecodeError(reasons.BAD_DECISION, f"model_version {version} is negative")
    return ReplicaDecision(
        d["event_id"], d["model_key"], d["timestamp_ms"], tuple(ids), feats, i, score, p, version
    )


def decode(data: bytes) -> Context | Reward | Tick | Action | Joined | DeadLetter | ReplicaDecision:
    """Parse and validate one record. Raises :class:`DecodeError` with a reason code."""
    sid, ver, d = _read(data)
    if sid == 1:
        if ver == 1:  # one record per arm
            arms = d["arms"]
            if not arms:
                raise DecodeError(reasons.EMPTY_ARMS, "the context has no candidate arms")
            sizes = {len(a["features"]) for a in arms}
            if len(sizes) != 1 or 0 in sizes or min(sizes) % 8:
                raise DecodeError(
                    reasons.BAD_DIMENSION,
                    f"arms have feature sizes {sorted(sizes)} bytes "
                    f"(8 bytes per value, all arms of one dimension)",
                )
            ids = [a["arm_id"] for a in arms]
            return Context(
                d["event_id"],
                d["model_key"],
                d["timestamp_ms"],
                tuple(ids),
                _context_features(ids, b"".join(a["features"] for a in arms)),
            )
        ids = d["arm_ids"]
        return Context(
            d["event_id"],
            d["model_key"],
            d["timestamp_ms"],
            tuple(ids),
            _context_features(ids, d["features"]),
        )
    if sid == 2:
        if not math.isfinite(d["value"]):
            raise DecodeError(
                reasons.NON_FINITE_REWARD, f"reward value {d['value']!r} is not finite"
            )
        return Reward(d["event_id"], d["model_key"], d["timestamp_ms"], d["value"])
    if sid == 7:
        return Tick(d["timestamp_ms"], d["group_id"])
    if sid in (3, 4):
        d["features"] = features_from_bytes(d["features"])
        return (Action if sid == 3 else Joined)(**d)
    if sid == 5:
        return DeadLetter(**d)
    if sid == 8:
        return _decision(d)
    raise DecodeError(reasons.UNKNOWN_SCHEMA, f"schema id {sid} is not an event")
