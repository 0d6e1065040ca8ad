"""What travels on the topics and into snapshots: the records, their Avro codec, the batch codecs
of the worker's hot path, and the snapshot format. No pickle anywhere.

- ``records``: the typed records (Context, Reward, Tick, Action, Joined, DeadLetter, InputRef);
- ``schemas``: the Avro schemas by id and version (``schemas/*.avsc``; docs/schemas.md);
- ``avro``: hand-written Avro binary for the records written once per event;
- ``codec``: one record to bytes and back (``encode``, ``decode``, ``DecodeError``);
- ``batch_decode`` / ``batch_encode``: a poll batch decoded, and a batch's outputs encoded, in one
  compiled pass each (the same records and bytes as ``codec``);
- ``snapshot``: a partition's snapshot to bytes and back (``pack_snapshot``, ``unpack_snapshot``);
- ``snapshot_header``: a snapshot as typed values (``SnapshotHeader``, ``Snapshot``).
"""

from streambandit.wire.codec import (
    DecodeError,
    decode,
    encode,
    encode_action,
    encode_context_v1,
    encode_joined,
    features_from_bytes,
    features_to_bytes,
)
from streambandit.wire.records import (
    NO_TRIGGER,
    Action,
    Context,
    DeadLetter,
    InputRef,
    Joined,
    ReplicaDecision,
    Reward,
    Tick,
    Trigger,
)
from streambandit.wire.schemas import register_writer_schema
from streambandit.wire.snapshot import SnapshotError, pack_snapshot, unpack_snapshot
from streambandit.wire.snapshot_header import Snapshot, SnapshotHeader

__all__ = [
    "Context",
    "Reward",
    "Tick",
    "Action",
    "Joined",
    "DeadLetter",
    "ReplicaDecision",
    "InputRef",
    "Trigger",
    "NO_TRIGGER",
    "DecodeError",
    "SnapshotError",
    "Snapshot",
    "SnapshotHeader",
    "encode",
    "decode",
    "pack_snapshot",
    "unpack_snapshot",
    "features_to_bytes",
    "features_from_bytes",
    "encode_context_v1",
    "encode_action",
    "encode_joined",
    "register_writer_schema",
]
