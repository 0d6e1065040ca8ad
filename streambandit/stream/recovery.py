"""A partition rebuilt from its snapshot and the logs written after it (docs/design.md, exact
recovery).

Load the newest snapshot that fits, re-apply the joined records written after it (the exact update
sequence), rebuild the open decisions from the actions written after it minus those joined, and
the rewards already received for still-open windows from the rewards partition up to the committed
offset; then processing continues from the committed input offsets. The pure part, applying those
records to the engine, is ``PartitionEngine.recover_from_logs``; this module reads them.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

from streambandit import reasons
from streambandit.config.worker import WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.chains import ChainPosition
from streambandit.engine.column_merge import ColumnMerger
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.engine.partition import RecoveryError
from streambandit.stream.batch import PartitionState
from streambandit.stream.errors import WorkerError
from streambandit.stream.logs import LogReader, committed_view
from streambandit.stream.snapshots import SnapshotStore, usable_snapshots
from streambandit.wire import (
    Context,
    DecodeError,
    InputRef,
    ReplicaDecision,
    Reward,
    Snapshot,
    Tick,
    decode,
)

__all__ = ["recover_partition"]

log = logging.getLogger("streambandit")

_REFUSED_BEFORE_THE_ENGINE = frozenset(
    (
        reasons.WRONG_TOPIC,
        reasons.KEY_MISMATCH,
        reasons.EVENT_TIME_AHEAD,
        reasons.ID_TOO_LONG,
        reasons.FOREIGN_TICK,
    )
)


def recover_partition(
    p: int,
    config: WorkerConfig,
    store: SnapshotStore,
    reader: LogReader,
    committed_offsets: Callable[[], dict[int, int]],
    metrics: Any,
    open_wait_s: float = 0.0,
) -> PartitionState:
    """Partition ``p`` from its newest snapshot that fits the configuration and the logs;
    ``committed_offsets()`` gives the group's committed offset per input source.

    First every output log of the partition is settled (no transaction open on it: a worker
    killed inside one, or a fenced one, could still move both the logs and the committed offsets);
    while one is still open after ``open_wait_s`` it raises ``TransactionOpen`` (stream/logs.py),
    and the caller tries again later. Then the committed offsets are read, then the logs up to their settled ends. A
    snapshot that does not fit (a changed policy or hyper-parameter, logs that do not continue
    it, offsets ahead of the committed ones) is reported and the next older one tried, and last
    the whole joined log from offset 0. Never silently fresh models: if even the log does not fit, the
    worker stops."""
    t = config.topics
    ends = {
        topic: reader.settle(topic, p, wait_s=open_wait_s)
        for topic in (t.actions, t.joined, t.dead_letter)
    }
    committed = committed_offsets()
    # One snapshot at a time: the older one is read (and unpacked) only when the newer does not fit.
    for snap in itertools.chain(usable_snapshots(store, p), [None]):
        try:
            return _recover_from(p, snap, config, reader, ends, committed, metrics)
        except (ValueError, RecoveryError) as exc:
            if snap is None:
                raise WorkerError(
                    f"partition {p}: the joined log does not fit the model configuration "
                    f"({exc}); restore the configuration the log was written with"
                ) from exc
            metrics["snapshot_fallbacks"] += 1
            log.error(
                "snapshot does not fit partition=%d created_ms=%d error=%s; falling back to an older one "
                "or the joined log",
                p,
                snap.header.created_ms,
                exc,
            )
    raise AssertionError("unreachable")


def _recover_from(
    p: int,
    snap: Snapshot | None,
    config: WorkerConfig,
    reader: LogReader,
    ends: dict[str, int],
    committed: dict[int, int],
    metrics: Any,
) -> PartitionState:
    c, t = config, config.topics
    limits = c.engine_limits()
    if snap is None:
        engine = ArrayPartitionEngine(c.models, **limits)
        start = {"contexts": 0, "rewards": 0, t.actions: 0, t.joined: 0, t.dead_letter: 0}
    else:
        engine = ArrayPartitionEngine.restore(c.models, snap.engine, **limits)
        h = snap.header
        start = {
            "contexts": h.contexts_offset,
            "rewards": h.rewards_offset,
            t.actions: h.actions_offset,
            t.joined: h.joined_offset,
            t.dead_letter: h.dead_letter_offset,
        }
    if committed[CONTEXTS] < start["contexts"] or committed[REWARDS] < start["rewards"]:
        # Its state holds input the group never committed (the group's offsets were moved back,
        # or a commit was lost): an older snapshot, or the joined log, is used instead.
        raise RecoveryError(
            f"snapshot is ahead of the committed offsets (contexts {start['contexts']}, rewards "
            f"{start['rewards']}; committed {committed[CONTEXTS]}, {committed[REWARDS]})"
        )

    for topic, end in ends.items():
        if end < start[topic]:
            raise RecoveryError(
                f"{topic}[{p}] ends at offset {end}, before the snapshot's position {start[topic]}"
            )

    def events_of(topic: str, begin: int, end: int | None = None) -> list[tuple[Any, Any]]:
        out = []
        for m in reader.read(topic, p, begin, ends[topic] if end is None else end):
            try:
                out.append((decode(m.value()), m))
            except DecodeError:
                out.append((None, m))
        return out

    def committed_records(topic: str) -> list[Any]:
        read = [e for e, _ in events_of(topic, start[topic]) if e is not None]
        kept = committed_view(read, committed)
        # Records of batches that never committed: only a broker whose read_committed readers see
        # aborted transactions (Tansu, docs/notes/tansu.md) delivers any; on Apache Kafka, 0.
        metrics["recovery_uncommitted_skipped"] += len(read) - len(kept)
        return kept

    joined = committed_records(t.joined)
    actions = committed_records(t.actions)
    dead = committed_records(t.dead_letter)
    inputs = events_of(t.rewards, start["rewards"], committed[REWARDS])
    contexts = events_of(c.first_input, start["contexts"], committed[CONTEXTS])
    rewards = [
        (e, InputRef(REWARDS, p, m.offset(), m.key(), m.value(), m.timestamp()[1]))
        for e, m in inputs
        if isinstance(e, Reward)
    ]
    dead_lettered = {
        InputRef(CONTEXTS if d.source_topic == c.first_input else REWARDS, p, d.source_offset)
        for d in dead
        if d.source_offset >= 0
    }
    closed = {
        decode(d.value).event_id for d in dead if d.reason == reasons.UPDATE_FAILED and d.value
    }
    # The watermark the live engine reached: the largest event time of an input it advanced to.
    # Inputs refused before the engine saw their time (a wrong topic or key, an event time too far
    # ahead, an id too long) did not move it.
    unseen = {
        (d.source_topic, d.source_offset) for d in dead if d.reason in _REFUSED_BEFORE_THE_ENGINE
    }
    stamps = [
        e.timestamp_ms
        for e, m in inputs + contexts
        if isinstance(e, (Context, ReplicaDecision, Reward, Tick))
        and (m.topic(), m.offset()) not in unseen
    ]
    engine.recover_from_logs(
        joined, actions, rewards, dead_lettered, closed, max(stamps, default=-(2**63))
    )
    metrics["recovered_joined"] += len(joined)
    return PartitionState(
        engine=engine,
        merger=ColumnMerger(c.merge_wait_ms),
        next_offset=dict(committed),
        committed_offset=dict(committed),
        chain=ChainPosition(snap.header.chain, snap.header.seq)
        if snap is not None and snap.header.chain
        else None,
    )
