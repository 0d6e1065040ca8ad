"""The Avro schemas of the records and the snapshot, by id and version (``schemas/*.avsc``).

Every record starts with a 3-byte header (magic, schema id, schema version) that names its writer
schema; a reader resolves it against its own current schema, so a record written by a newer
producer with an added (defaulted) field is still read. The evolution rules are in docs/schemas.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import fastavro

__all__ = [
    "SCHEMA_DIR",
    "IDS",
    "VERSIONS",
    "READERS",
    "WRITERS",
    "LEGACY",
    "register_writer_schema",
]

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"

IDS = {
    "context": 1,
    "reward": 2,
    "action": 3,
    "joined": 4,
    "dead_letter": 5,
    "snapshot": 6,
    "tick": 7,
    "decision": 8,
}
# The version this code writes, per schema id (header byte 2). Context version 2 carries all the
# arms' features in one packed block (one frombuffer per record instead of one per arm); version 1
# (``context.v1.avsc``: an array of {arm_id, features} records) is still read.
# Tick version 2 adds the writer's group id; version 1 (``tick.v1.avsc``) resolves to it with an
# empty group, which no worker applies. Snapshot version 2 adds ``chain`` and ``seq`` (a base or an
# increment); version 1 (``snapshot.v1.avsc``) resolves to a base of chain 0. Snapshot version 3
# adds ``model_blocks``, columns of many models' states stored after the record (wire/snapshot.py);
# version 2 (``snapshot.v2.avsc``) resolves to it with no blocks.
VERSIONS = {_id: 1 for _id in IDS.values()} | {1: 2, 6: 3, 7: 2}


def _load(name: str) -> dict:
    return fastavro.parse_schema(json.loads((SCHEMA_DIR / f"{name}.avsc").read_text()))


READERS: dict[int, dict] = {
    _id: _load(_name) for _name, _id in IDS.items()
}  # schema id -> current schema
WRITERS: dict[tuple[int, int], dict] = {(_id, VERSIONS[_id]): READERS[_id] for _id in IDS.values()}
# Writer versions whose layout cannot be resolved into the current reader schema by Avro's rules:
# read with their own schema, then converted by the decoder.
LEGACY: dict[tuple[int, int], dict] = {(1, 1): _load("context.v1")}
WRITERS.update(LEGACY)
WRITERS[(7, 1)] = _load("tick.v1")
WRITERS[(6, 1)] = _load("snapshot.v1")
WRITERS[(6, 2)] = _load("snapshot.v2")


def register_writer_schema(name: str, version: int, schema: dict) -> None:
    """Make records written with another version of a schema readable (e.g. an older release's,
    or a newer one that added defaulted fields)."""
    WRITERS[(IDS[name], version)] = fastavro.parse_schema(schema)
