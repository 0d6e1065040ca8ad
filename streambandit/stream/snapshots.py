"""Where partition snapshots are kept: a directory (the embedded demo) or a compacted topic.

A worker reads and writes only its own consumer group's snapshots (``scoped``): two groups with
different configurations may share the input topics, the snapshot topic or the directory, and
never load each other's state. Both keep the latest two snapshots per partition, so that a corrupt
latest one falls back to the
previous (and, when both are unusable, recovery replays the joined log from the start: never a
silently fresh model).

``TopicStore`` layout (one compacted topic, co-partitioned with the inputs): snapshot ``p`` lives
in partition ``p`` of the topic, in two alternating slots. A save writes the chunks of one slot,
keys ``{group}/p{p}/s{slot}/{i}`` (the group percent-encoded), each value a fixed little-endian
header (magic, format version,
generation, chunk index, chunk count, CRC32 of the whole snapshot) followed by at most
``max_chunk_bytes`` of it, then tombstones the slot's chunks beyond the new count, then writes the
partition's head record, key ``{group}/p{p}/head``: for each slot the generation of its usable
snapshot, the offset where that snapshot's chunk 0 is, and how many chunk keys it may have live.
A slot counts only when all its chunks carry one generation and the whole passes its CRC: a save
that died halfway leaves its slot incomplete, and the other slot, untouched by that save, is still
there.

Reading: the last value of each key wins (what compaction keeps too). A reader does not read the
partition from its start: it finds the newest head (reading back from the end, where it normally
is the last record) and reads from the offset of the newest snapshot's chunk 0 to the end. That is
one snapshot, whether the broker compacted the older ones away (Apache Kafka) or keeps every one
ever written (the embedded broker). What it reads is a suffix of the log, and a suffix decides
every slot whose chunk 0 it holds: saves go one after another, each writing chunk 0 first, so a
slot's chunks of its newest save all lie after that chunk 0, and any save newer than the head's
lies in the suffix too. The older slot is read (from its own recorded offset) only when the newest
is unusable or the caller asks for the next candidate. A partition with no head (written before
heads existed) is read whole.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import logging
import mmap
import os
import re
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterable, Iterator, Protocol
from urllib.parse import quote

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from streambandit.atomic import write_atomically
from streambandit.config.app import DEFAULT_MAX_CHUNK_BYTES
from streambandit.config.kafka import RANGE_READS, for_client, reader_settings
from streambandit.engine.chains import compose
from streambandit.errors import StreambanditError
from streambandit.stream.kafka_checks import kafka_logger, wait_until_served
from streambandit.stream.logs import read_range
from streambandit.wire import Snapshot, SnapshotError, unpack_snapshot

__all__ = [
    "SnapshotStore",
    "DirectoryStore",
    "TopicStore",
    "SnapshotStoreError",
    "load_latest",
    "usable_snapshots",
    "create_snapshot_topic",
    "chunk_key",
    "head_key",
    "pack_chunk",
    "snapshot_topic_config",
    "ReadStats",
]

log = logging.getLogger("streambandit")


class SnapshotStore(Protocol):
    #: Whether the store keeps increments (engine/chains.py); a store that does not gets bases only.
    supports_increments: bool
    #: Whether a forked child may save to it (its saves use nothing but files). Either way the
    #: writer takes large snapshots in a child (stream/snapshot_writer.py); when False the child
    #: sends the packed bytes back and the writer's thread saves them.
    fork_safe: bool

    def save(self, partition: int, data: bytes) -> None:
        """Store a base snapshot of ``partition``; the store keeps it and the one before it,
        with the increments of both, and may drop older ones."""
        ...

    def candidates(self, partition: int) -> Iterable[bytes]:
        """Stored base snapshots of a partition, newest first. A store may read each only when
        it is asked for the next (a recovery stops at the first usable one)."""
        ...

    def save_increment(self, partition: int, chain: int, seq: int, data: bytes) -> None:
        """Store increment ``seq`` of ``chain`` (the base it continues)."""
        ...

    def increments(self, partition: int, chain: int) -> list[bytes]:
        """The stored increments of ``chain``, in no particular order."""
        ...

    def scoped(self, group: str) -> "SnapshotStore":
        """The same store, holding only ``group``'s snapshots."""
        ...


def _scope_name(group: str) -> str:
    """A group id as one path segment or key prefix: percent-encoded, so no group's prefix
    can be another's ("a/b" and "a" differ, and neither can climb out of a directory)."""
    if not group:
        raise ValueError("a snapshot scope needs a non-empty group id")
    return quote(group, safe="")


class DirectoryStore:
    """``DIR/p<partition>.snap`` (latest base) and ``.prev``, increments in
    ``DIR/p<partition>.inc/<chain>-<seq>``; writes are atomic (write, fsync, rename). A worker's
    store is ``scoped`` to its group: ``DIR/<group>/p<partition>.snap``."""

    supports_increments = True
    fork_safe = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def scoped(self, group: str) -> "DirectoryStore":
        return DirectoryStore(self.path / _scope_name(group))

    def _file(self, partition: int, suffix: str) -> Path:
        return self.path / f"p{partition}.{suffix}"

    def save(self, partition: int, data: bytes) -> None:
        latest, prev, tmp = (self._file(partition, s) for s in ("snap", "prev", "tmp"))
        write_atomically(tmp, latest, data, keep=prev)
        # Increments older than the base now kept as the previous one belong to bases no longer
        # kept (a rename keeps a file's mtime; each increment is written after its base).
        if prev.exists():
            cutoff = prev.stat().st_mtime_ns
            for f in self._increment_dir(partition).glob("*-*"):
                if f.stat().st_mtime_ns < cutoff:
                    f.unlink(missing_ok=True)

    def _increment_dir(self, partition: int) -> Path:
        return self.path / f"p{partition}.inc"

    def save_increment(self, partition: int, chain: int, seq: int, data: bytes) -> None:
        d = self._increment_dir(partition)
        d.mkdir(exist_ok=True)
        write_atomically(d / f"{chain}-{seq}.tmp", d / f"{chain}-{seq}", data)

    def increments(self, partition: int, chain: int) -> list[bytes]:
        d = self._increment_dir(partition)
        return (
            [f.read_bytes() for f in sorted(d.glob(f"{chain}-*")) if not f.name.endswith(".tmp")]
            if d.exists()
            else []
        )

    def candidates(self, partition: int) -> Iterator[bytes | mmap.mmap]:
        # One at a time: a base can be hundreds of MB, and the previous one is read only when
        # the newest is unusable. Each is mapped copy-on-write, not read: the restore makes the
        # mapped pages the models' rows (unpack_snapshot), so a handoff neither copies the file
        # nor has the kernel zero a new page per row. The file itself is never written (a save
        # replaces it by a rename, and an old file a worker still maps stays readable until it
        # lets go, holding its disk space until then). Nothing may rewrite a snapshot file in
        # place (docs/operations.md): the mapped models would see it.
        for suffix in ("snap", "prev"):
            try:
                with open(self._file(partition, suffix), "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else b""
            except FileNotFoundError:
                continue
            yield data


class SnapshotStoreError(StreambanditError, RuntimeError):
    """The snapshot store cannot be used (its topic is missing) or a save did not reach it."""


# magic, format version, generation, chunk index, chunk count, CRC32 of the whole snapshot
_CHUNK = struct.Struct("<2sBQIII")
_CHUNK_MAGIC = b"SC"
_CHUNK_VERSION = 1
_SLOTS = 2
_KEY = re.compile(rb"(?:([^/]+)/)?p(\d+)/s(\d+)/(\d+)")
# magic, format version, the slot written last, then per slot: generation of its usable snapshot
# (-1: none), offset of its chunk 0 (-1: not known), chunk keys that may be live (0..span-1)
_HEAD = struct.Struct("<2sBB" + "qqI" * _SLOTS)
_HEAD_MAGIC = b"SH"
_LEADER_MOVING = frozenset(
    (
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
    )
)
_HEAD_VERSION = 1


# glibc's malloc_trim (absent elsewhere, e.g. musl): free heap memory back to the OS. ctypes
# releases the GIL for the call. After a snapshot of at least _TRIM_AFTER_BYTES.
_malloc_trim = (
    getattr(ctypes.CDLL(None), "malloc_trim", None) if sys.platform.startswith("linux") else None
)
_TRIM_AFTER_BYTES = 64 << 20


def chunk_key(partition: int, slot: int, index: int, scope: str = "") -> bytes:
    """The record key of chunk ``index`` of ``slot`` of ``partition``'s snapshots, under the
    group ``scope`` (as ``_scope_name`` writes it; empty: an unscoped store's)."""
    return (f"{scope}/" if scope else "").encode() + f"p{partition}/s{slot}/{index}".encode()


def head_key(partition: int, scope: str = "") -> bytes:
    """The record key of ``partition``'s head record (module docstring), under ``scope``."""
    return (f"{scope}/" if scope else "").encode() + f"p{partition}/head".encode()


def pack_chunk(generation: int, index: int, count: int, crc: int, payload: bytes) -> bytes:
    """A chunk record's value: the fixed header, then its slice of the snapshot."""
    return _CHUNK.pack(_CHUNK_MAGIC, _CHUNK_VERSION, generation, index, count, crc) + payload


@dataclasses.dataclass(frozen=True)
class _Chunk:
    generation: int
    index: int
    count: int
    crc: int
    payload: memoryview  # of the record's value: not copied


def _unpack_chunk(value: bytes) -> _Chunk | None:
    if len(value) < _CHUNK.size:
        return None
    magic, version, generation, index, count, crc = _CHUNK.unpack_from(value)
    if magic != _CHUNK_MAGIC or version != _CHUNK_VERSION:
        return None
    return _Chunk(generation, index, count, crc, memoryview(value)[_CHUNK.size :])


@dataclasses.dataclass
class _Slot:
    """What a writer must know of one slot: whether it holds a usable snapshot, which chunk keys
    are live (a save into it tombstones those beyond its own count), and where its chunk 0 is."""

    generation: int = -1  # of the usable snapshot; -1: none
    max_generation: int = 0  # highest generation of any chunk, usable or not
    indices: frozenset[int] = frozenset()
    start: int = -1  # offset of its newest chunk 0; -1: none, or not known
    # False: its newest save began before what the reader read, and the fields above are the head
    # record's account of it (not yet checked: ``data`` is None, even when it is usable).
    read: bool = True


@dataclasses.dataclass(frozen=True)
class _Head:
    newest: int
    slots: tuple[tuple[int, int, int], ...]  # (generation, start, span) per slot


def _pack_head(newest: int, slots: list[_Slot]) -> bytes:
    fields: list[int] = []
    for s in slots:
        fields += [s.generation, s.start, max(s.indices, default=-1) + 1]
    return _HEAD.pack(_HEAD_MAGIC, _HEAD_VERSION, newest, *fields)


def _unpack_head(value: bytes | None) -> _Head | None:
    if value is None or len(value) != _HEAD.size:
        return None
    magic, version, newest, *fields = _HEAD.unpack(value)
    if magic != _HEAD_MAGIC or version != _HEAD_VERSION or newest >= _SLOTS:
        return None
    slots = tuple(tuple(fields[i : i + 3]) for i in range(0, len(fields), 3))
    return _Head(newest, slots)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class ReadStats:
    """What one range read of the snapshot topic took: offsets ``first``..``end`` (exclusive), its
    ``records`` (any group's or partition's sharing it) and their ``bytes`` (keys and values)."""

    first: int
    end: int
    records: int
    bytes: int


@dataclasses.dataclass
class _Look:
    tp: int
    lo: int
    hi: int
    first: int  # where the reading began
    head: _Head | None
    metas: list[_Slot]
    datas: list[mmap.mmap | bytes | None]
    touched: set[int]  # the slots any key of which was read


def _newest_first(metas: list[_Slot], datas: list[Any]) -> list[int]:
    return sorted(
        (s for s in range(_SLOTS) if datas[s] is not None), key=lambda s: -metas[s].generation
    )


def _assemble(
    partition: int, slot: int, values: dict[int, bytes]
) -> tuple[_Slot, mmap.mmap | None]:
    """The slot's snapshot when all its chunks belong to one save and the whole passes its CRC,
    in a private anonymous mapping: what unpack_snapshot lets a restore take as the models' rows
    (a copy fewer of a snapshot that can be hundreds of MB, as from a directory store)."""
    chunks = {i: _unpack_chunk(v) for i, v in values.items()}
    meta = _Slot(
        max_generation=max((c.generation for c in chunks.values() if c), default=0),
        indices=frozenset(values),
    )
    if not values:
        return meta, None
    first = chunks.get(0)
    if first is None or first.count == 0:
        problem = "chunk 0 missing or unreadable"
    else:
        parts = [chunks.get(i) for i in range(first.count)]
        same = all(
            c is not None
            and (c.generation, c.index, c.count, c.crc)
            == (first.generation, i, first.count, first.crc)
            for i, c in enumerate(parts)
        )
        crc = 0
        if same:
            for c in parts:
                crc = zlib.crc32(c.payload, crc)  # type: ignore[union-attr]
        if not same:
            problem = "incomplete (a save did not finish, or chunks of different saves)"
        elif crc != first.crc:
            problem = "checksum mismatch (corrupt chunk)"
        else:
            meta.generation = first.generation
            return meta, _joined(c.payload for c in parts)  # type: ignore[union-attr]
    log.error(
        "snapshot slot unusable partition=%d slot=%d generation=%d reason=%s; using the other slot",
        partition,
        slot,
        meta.max_generation,
        problem,
    )
    return meta, None


def _joined(parts: Iterable[memoryview]) -> mmap.mmap | bytes:
    """``parts`` one after the other in private (copy-on-write, never shared with a forked child)
    anonymous memory."""
    parts = list(parts)
    size = sum(len(p) for p in parts)
    if not size:
        return b""
    out = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    at = 0
    for p in parts:
        out[at : at + len(p)] = p
        at += len(p)
    return out


class TopicStore:
    """Snapshots in a compacted Kafka topic (layout in the module docstring).

    The topic must exist (see :func:`create_snapshot_topic`): a worker never creates it, so a typo
    in its name is an error at start, not a new empty topic and fresh models. Saves go through an
    idempotent, non-transactional producer and are flushed before ``save`` returns; the worker
    saves between transactions, and the positions inside a snapshot say what it covers.

    A store remembers, per partition, which slot holds the newest usable snapshot, and reads it
    afresh in ``candidates`` (called at every assignment, before the new owner's first save), so
    a partition moving between workers continues the generation count of its previous owner.

    It keeps bases only (no increments): every snapshot a worker writes to it is whole.
    """

    supports_increments = False
    fork_safe = False  # its saves go through a Kafka producer, whose threads a child has not

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        kafka: dict[str, Any] | None = None,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
        timeout_s: float = 30.0,
    ) -> None:
        if max_chunk_bytes < 1:
            raise ValueError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
        self.topic = topic
        self.max_chunk_bytes = max_chunk_bytes
        self.timeout_s = timeout_s
        # The [kafka] table as the worker has it: common settings, and [kafka.consumer] /
        # [kafka.producer] sub-tables, each for its own client here too.
        user = {k: v for k, v in (kafka or {}).items() if k != "transactional.id"}
        # It reads ranges of records that are there (config.kafka.RANGE_READS); the worker's own
        # settings, if any, win.
        # librdkafka's lines through the worker's logger, repeats held back (kafka_checks): a
        # broker that is away is otherwise a line on stderr per reconnect attempt of each client.
        quiet = {"logger": kafka_logger()}
        self._reader = Consumer(RANGE_READS | reader_settings(bootstrap_servers, user) | quiet)
        try:
            self.partitions = self._partition_count()
        except Exception:
            self._reader.close()
            raise
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "linger.ms": 0,
                **{
                    k: v for k, v in for_client("producer", user).items() if k != "transactional.id"
                },
                "enable.idempotence": True,
                "acks": "all",
                # One record per produce batch. Tansu 0.6 answers ListOffsets with the first offset
                # of the last batch + 1, so the records after the first of a multi-record batch lie
                # beyond the "high watermark" a reader stops at. Chunks are too large to gain from
                # batching anyway.
                "batch.num.messages": 1,
                "message.max.bytes": max(1_000_000, max_chunk_bytes + _CHUNK.size + 1024),
                **quiet,
            }
        )
        self._slots: dict[int, list[_Slot]] = {}
        self._warned: set[int] = set()
        self._scope = ""
        #: The ranges the last ``candidates`` or save read (what a handoff costs: tests, benchmarks).
        self.last_read: list[ReadStats] = []
        self._check_compacted(bootstrap_servers, user | quiet)

    def scoped(self, group: str) -> "TopicStore":
        """This store's clients, reading and writing only ``group``'s snapshots."""
        view = copy.copy(self)
        view._scope = _scope_name(group)
        view._slots = {}  # slot state is per scope: another group's slots are not this one's
        return view

    def _partition_count(self) -> int:
        # All topics, not this one by name: a metadata request for one topic may auto-create it.
        md = self._reader.list_topics(timeout=self.timeout_s)
        t = md.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            raise SnapshotStoreError(
                f"snapshot topic {self.topic!r} does not exist; create it compacted with as many partitions as the "
                f"input topics (streambandit.stream.snapshots.create_snapshot_topic, or kafka-topics.sh --create "
                f"--topic {self.topic} --partitions N --config cleanup.policy=compact)"
            )
        return len(t.partitions)

    def _check_compacted(self, bootstrap_servers: str, user: dict[str, Any]) -> None:
        """Warn (only) when the topic is not compacted: it still works, but grows without bound.
        Best effort: the cluster may not let this client describe configurations."""
        try:
            admin = AdminClient(
                {"bootstrap.servers": bootstrap_servers, **for_client("admin", user)}
                | {"logger": kafka_logger()}
            )
            res = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
            policy = (
                admin.describe_configs([res])[res].result(self.timeout_s)["cleanup.policy"].value
            )
        except (KafkaException, KeyError, TimeoutError) as exc:
            log.info("snapshot topic config not checked topic=%s error=%s", self.topic, exc)
            return
        if "compact" not in (policy or ""):
            log.warning(
                "snapshot topic not compacted topic=%s cleanup.policy=%s; it will grow without bound",
                self.topic,
                policy,
            )

    def _topic_partition(self, partition: int) -> int:
        if partition < self.partitions:
            return partition
        if partition not in self._warned:
            self._warned.add(partition)
            log.warning(
                "snapshot topic has fewer partitions than the inputs topic=%s partitions=%d partition=%d; "
                "sharing partition %d",
                self.topic,
                self.partitions,
                partition,
                partition % self.partitions,
            )
        return partition % self.partitions

    # -- reading -------------------------------------------------------------------------------

    def _read(self, tp: int, begin: int, end: int) -> list[Any]:
        msgs = read_range(self._reader, self.topic, tp, begin, end, timeout_s=self.timeout_s)
        self.last_read.append(
            ReadStats(
                begin,
                end,
                len(msgs),
                sum(len(m.key() or b"") + len(m.value() or b"") for m in msgs),
            )
        )
        return msgs

    def _watermarks(self, tp: int) -> tuple[int, int]:
        """The partition's first and next offsets, asked again while its leader moves: a topic
        created a moment ago, or a broker that just failed, answers NOT_LEADER_FOR_PARTITION
        until the new leader serves it, and librdkafka does not retry a ListOffsets."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                lo, hi = self._reader.get_watermark_offsets(
                    TopicPartition(self.topic, tp), timeout=self.timeout_s, cached=False
                )
                return int(lo), int(hi)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if (
                    not isinstance(err, KafkaError)
                    or err.code() not in _LEADER_MOVING
                    or time.monotonic() >= deadline
                ):
                    raise
                time.sleep(0.1)

    def _newest_head(self, partition: int, tp: int, lo: int, hi: int) -> tuple[_Head | None, list]:
        """The partition's newest head record, and the records read back from ``hi`` to find it
        (all of them from ``lo`` when there is none). The head is normally the last record: the
        first read is of one record, and each further one reaches eight times as far back."""
        key = head_key(partition, self._scope)
        msgs: list[Any] = []
        end, window = hi, 1
        while end > lo:
            begin = max(lo, end - window)
            got = self._read(tp, begin, end)
            msgs = got + msgs
            for msg in reversed(got):
                if msg.key() == key and (head := _unpack_head(msg.value())) is not None:
                    start = head.slots[head.newest][1]
                    if lo <= start < msg.offset():
                        if start < begin:
                            return head, self._read(tp, start, begin) + msgs
                        return head, [m for m in msgs if m.offset() >= start]
            end, window = begin, window * 8
        return None, msgs

    def _view(
        self,
        partition: int,
        msgs: list[Any],
        head: _Head | None,
        only: Iterable[int] = range(_SLOTS),
    ) -> tuple[list[_Slot], list[mmap.mmap | bytes | None], set[int]]:
        """Each slot of ``only`` as ``msgs`` (a suffix of the partition, in offset order) show it:
        the last value of each key wins. With no ``head`` the suffix is the whole partition; with
        one, a slot whose chunk 0 the suffix does not hold is taken as the head describes it.
        The other slots are left as a fresh ``_Slot``."""
        seen: dict[tuple[int, int], tuple[int, bytes | None]] = {}
        for msg in msgs:
            m = _KEY.fullmatch(msg.key() or b"")
            if (
                m is None
                or (m[1] or b"").decode() != self._scope
                or int(m[2]) != partition
                or int(m[3]) >= _SLOTS
            ):
                continue  # another group's, another partition sharing this one, or not ours
            seen[(int(m[3]), int(m[4]))] = (msg.offset(), msg.value())
        metas, datas = [], []
        for s in range(_SLOTS):
            if s not in only:
                metas.append(_Slot())
                datas.append(None)
                continue
            keys = {i: ov for (slot, i), ov in seen.items() if slot == s}
            live = {i: v for i, (_, v) in keys.items() if v is not None}
            data = None
            if head is None or 0 in live:
                meta, data = _assemble(partition, s, live)
                meta.start = keys[0][0] if 0 in live else -1
            else:
                generation, start, _ = head.slots[s]
                chunks = (_unpack_chunk(v) for v in live.values())
                meta = _Slot(
                    generation=generation,
                    max_generation=max([0] + [c.generation for c in chunks if c]),
                    start=start,
                    read=False,
                )
            if head is not None:
                # Keys the suffix does not reach may still be live (the span the head recorded).
                generation, _, span = head.slots[s]
                meta.indices = frozenset(live) | {i for i in range(span) if i not in keys}
                meta.max_generation = max(meta.max_generation, generation)
            metas.append(meta)
            datas.append(data)
        return metas, datas, {slot for slot, _ in seen}

    def _look(self, partition: int) -> _Look:
        """The slots as a reader finds them from the newest head on (module docstring)."""
        tp = self._topic_partition(partition)
        lo, hi = self._watermarks(tp)
        self.last_read = []
        head, msgs = self._newest_head(partition, tp, lo, hi)
        first = head.slots[head.newest][1] if head is not None else lo
        metas, datas, touched = self._view(partition, msgs, head)
        return _Look(tp, lo, hi, first, head, metas, datas, touched)

    def candidates(self, partition: int) -> Iterator[mmap.mmap | bytes]:
        look = self._look(partition)
        self._slots[partition] = look.metas
        given = set()
        for s in _newest_first(look.metas, look.datas):
            given.add((s, look.metas[s].generation))
            data, look.datas[s] = look.datas[s], None
            yield data  # type: ignore[misc]
        # Asked for more: the slots whose newest save began before what was read, from their
        # chunk 0 on. Up to where the first read began, unless that read met a key of theirs
        # (a save never writes a slot's other chunks without its chunk 0 first: not expected).
        behind = [s for s, m in enumerate(look.metas) if not m.read and m.generation >= 0]
        if not behind:
            return
        start = max(look.lo, min(look.metas[s].start for s in behind))
        end = look.hi if look.touched & set(behind) else look.first
        msgs = self._read(look.tp, start, end)
        metas, datas, _ = self._view(partition, msgs, look.head, only=behind)
        del msgs
        for s in behind:
            look.metas[s] = metas[s]
        self._slots[partition] = look.metas
        for s in _newest_first(metas, datas):
            if (s, metas[s].generation) not in given:
                data, datas[s] = datas[s], None
                yield data  # type: ignore[misc]

    # -- writing -------------------------------------------------------------------------------

    def save(self, partition: int, data: bytes) -> None:
        slots = self._slots.pop(partition, None) or self._look(partition).metas
        # Overwrite the slot that does not hold the newest usable snapshot: a save that dies
        # halfway then costs at most the older of the two.
        newest = max(range(_SLOTS), key=lambda s: slots[s].generation)
        slot = 1 - newest if slots[newest].generation >= 0 else 0
        generation = max(s.max_generation for s in slots) + 1
        size = self.max_chunk_bytes
        count = max(1, -(-len(data) // size))
        crc = zlib.crc32(data)
        tp = self._topic_partition(partition)
        errors: list[KafkaError] = []
        first: list[int] = []

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                errors.append(err)

        def delivered_first(err: KafkaError | None, msg: Any) -> None:
            delivered(err, msg)
            if err is None:
                first.append(msg.offset())

        for i in range(count):
            self._produce(
                tp,
                chunk_key(partition, slot, i, self._scope),
                pack_chunk(generation, i, count, crc, data[i * size : (i + 1) * size]),
                delivered_first if i == 0 else delivered,
            )
        # Chunks of an earlier, larger save into this slot: ignored by readers (the count says so),
        # and tombstoned so that compaction removes them.
        stale = sorted(i for i in slots[slot].indices if i >= count)
        for i in stale:
            self._produce(tp, chunk_key(partition, slot, i, self._scope), None, delivered)
        self._flush(partition, errors)
        slots[slot] = _Slot(
            generation=generation,
            max_generation=generation,
            indices=frozenset(range(count)),
            start=first[0],
        )
        # Only now, with every chunk stored: a reader starts from the offset a head names.
        self._produce(tp, head_key(partition, self._scope), _pack_head(slot, slots), delivered)
        self._flush(partition, errors)
        self._slots[partition] = slots
        if len(data) >= _TRIM_AFTER_BYTES and _malloc_trim is not None:
            # The producer copied every chunk, and the allocator keeps the freed copies: the
            # worker would stay larger by the snapshot's size, and every later fork would copy
            # page tables for it too (bench.snapshots, fork-topic). Give them back to the OS.
            _malloc_trim(0)
        log.debug(
            "snapshot stored partition=%d topic=%s slot=%d generation=%d chunks=%d tombstones=%d bytes=%d "
            "offset=%d",
            partition,
            self.topic,
            slot,
            generation,
            count,
            len(stale),
            len(data),
            first[0],
        )

    def _flush(self, partition: int, errors: list[KafkaError]) -> None:
        left = self._producer.flush(self.timeout_s)
        if left or errors:
            raise SnapshotStoreError(
                f"snapshot of partition {partition} not stored in {self.topic!r}: "
                f"{errors[0] if errors else f'{left} record(s) undelivered after {self.timeout_s} s'}"
            ) from (KafkaException(errors[0]) if errors else None)

    def save_increment(self, partition: int, chain: int, seq: int, data: bytes) -> None:
        raise SnapshotStoreError(
            "a snapshot topic keeps whole snapshots only (supports_increments is False)"
        )

    def increments(self, partition: int, chain: int) -> list[bytes]:
        return []

    def _produce(self, tp: int, key: bytes, value: bytes | None, on_delivery: Any) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic, key=key, value=value, partition=tp, on_delivery=on_delivery
                )
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)

    def close(self) -> None:
        try:
            self._producer.flush(self.timeout_s)
        finally:
            self._reader.close()

    def __enter__(self) -> "TopicStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def snapshot_topic_config(max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES) -> dict[str, str]:
    """The topic settings ``streambandit topics create`` gives the snapshot topic.

    A reader reads from the newest snapshot on (the head record), so what compaction leaves behind
    costs disk, not handoff time: these settings make a superseded snapshot go soon. Compaction
    keeps the last record of every key, and every key is a slot's chunk (or the head), so what it
    leaves is each slot's newest save, the same the reader assembles from the whole log.
    """
    config = {
        "cleanup.policy": "compact",
        # The broker's clock, not the writer's, stamps the records: segment.ms and
        # max.compaction.lag.ms count from when a record arrived, whatever a worker's clock says.
        "message.timestamp.type": "LogAppendTime",
        # Compaction never touches the active segment. A worker writes a snapshot of each of its
        # partitions every snapshot_interval_s (30 s by default): a segment that rolls after a
        # minute holds about two of them, and the snapshots before are compactable.
        "segment.ms": "60000",
        # A partition that snapshots seldom leaves too little superseded data to reach the
        # cleaner's dirty ratio (min.cleanable.dirty.ratio, 0.5 by default); this bounds how long
        # a superseded snapshot stays anyway.
        "max.compaction.lag.ms": "600000",
        # Tombstones only drop the chunks of a larger earlier save beyond the new chunk count,
        # which readers ignore anyway (chunk 0 says how many there are): an hour is plenty.
        "delete.retention.ms": "3600000",
    }
    if max_chunk_bytes + _CHUNK.size + 1024 > 1_000_000:
        config["max.message.bytes"] = str(max_chunk_bytes + _CHUNK.size + 1024)
    return config


def create_snapshot_topic(
    bootstrap_servers: str,
    topic: str,
    partitions: int,
    *,
    replication_factor: int = -1,
    kafka: dict[str, Any] | None = None,
    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    config: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> bool:
    """Create the snapshot topic with ``partitions`` (= the inputs' partition count) and
    :func:`snapshot_topic_config`, ``config`` laid over it. Returns False when it already exists
    (left as it is). ``replication_factor=-1``: the cluster's default."""
    admin = AdminClient(
        {"bootstrap.servers": bootstrap_servers, **for_client("admin", kafka)}
        | {"logger": kafka_logger()}
    )
    fut = admin.create_topics(
        [
            NewTopic(
                topic,
                num_partitions=partitions,
                replication_factor=replication_factor,
                config=snapshot_topic_config(max_chunk_bytes) | (config or {}),
            )
        ]
    )[topic]
    try:
        fut.result(timeout_s)
    except KafkaException as exc:
        if (
            exc.args
            and isinstance(exc.args[0], KafkaError)
            and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
        ):
            return False
        raise SnapshotStoreError(f"could not create snapshot topic {topic!r}: {exc}") from exc
    if not wait_until_served(admin, [topic], timeout_s):
        raise SnapshotStoreError(
            f"snapshot topic {topic!r} was created but had no leader for each partition within "
            f"{timeout_s:.0f} s"
        )
    log.info("snapshot topic created topic=%s partitions=%d", topic, partitions)
    return True


def usable_snapshots(store: SnapshotStore, partition: int) -> Iterator[Snapshot]:
    """The snapshots of ``partition`` that pass their checksum, newest first, each base with the
    increments of its chain laid over it (engine/chains.py). A damaged one is reported (logged)
    and skipped; a damaged increment ends its chain there."""
    for i, data in enumerate(store.candidates(partition)):
        try:
            snap = unpack_snapshot(data)
        except SnapshotError as exc:
            log.error(
                "snapshot unusable partition=%d candidate=%d error=%s; trying an older one",
                partition,
                i,
                exc,
            )
            continue
        head = snap.header
        if head.partition != partition or head.seq != 0:
            log.error(
                "snapshot for partition=%d is labelled partition=%d seq=%d; skipped",
                partition,
                head.partition,
                head.seq,
            )
            continue
        increments = []
        for data in store.increments(partition, head.chain) if head.chain else []:
            try:
                increments.append(unpack_snapshot(data))
            except SnapshotError as exc:
                log.error(
                    "snapshot increment unusable partition=%d chain=%d error=%s",
                    partition,
                    head.chain,
                    exc,
                )
        yield compose(snap, increments)


def load_latest(store: SnapshotStore, partition: int) -> Snapshot | None:
    """The newest usable snapshot of ``partition``, or None."""
    return next(usable_snapshots(store, partition), None)
