"""A snapshot's header as a typed value (wire/snapshot_header.py): what is packed is what is
unpacked, field for field, and the header's fields are the first fields of the Avro record."""

import dataclasses
import io

import fastavro
import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.partition import PartitionEngine
from streambandit.wire import (
    Context,
    InputRef,
    Snapshot,
    SnapshotHeader,
    pack_snapshot,
    unpack_snapshot,
)
from streambandit.wire.snapshot import _SNAPSHOT_PARTS
from tests.unit.wire.test_events import _record

HEADER = SnapshotHeader(
    partition=3,
    created_ms=1_700_000_000_123,
    contexts_offset=2**40,
    rewards_offset=5,
    actions_offset=6,
    joined_offset=7,
    dead_letter_offset=8,
    chain=1_700_000_000_000,
    seq=4,
)


def _engine():
    cfg = parse_models_config(
        {
            "models": [
                {
                    "match": "*",
                    "policy": "oful",
                    "dim": 2,
                    "reward_window_ms": 50,
                    "default_reward": 0.0,
                }
            ]
        }
    )
    e = PartitionEngine(cfg)
    e.on_context(Context("e1", "m", 10, ("a", "b"), np.eye(2)), InputRef(0, 3, 0))
    return e


def test_the_header_unpacked_is_the_header_packed_and_leads_the_record():
    data = pack_snapshot(Snapshot(HEADER, _engine().snapshot()))
    back = unpack_snapshot(data)
    assert back.header == HEADER and back.engine["watermark_ms"] == 10
    head = fastavro.schemaless_reader(
        io.BytesIO(_record(data)), _SNAPSHOT_PARTS[0], _SNAPSHOT_PARTS[0]
    )
    assert head == dataclasses.asdict(HEADER) | {"watermark_ms": 10}
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.header.seq = 5


def test_a_snapshot_given_by_name_packs_to_the_same_bytes_and_reads_by_name():
    state = _engine().snapshot()
    by_name = dataclasses.asdict(HEADER) | {"engine": state}
    assert pack_snapshot(by_name) == pack_snapshot(Snapshot(HEADER, state))
    back = unpack_snapshot(pack_snapshot(by_name))
    assert {k: back[k] for k in back if k != "engine"} == dataclasses.asdict(HEADER)
    # A base of no chain unless told: chain and seq may be left out.
    base = {k: v for k, v in by_name.items() if k not in ("chain", "seq")}
    assert unpack_snapshot(pack_snapshot(base)).header == dataclasses.replace(
        HEADER, chain=0, seq=0
    )
