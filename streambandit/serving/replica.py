"""Decisions from a read-only replica of a learn-only worker group's models.

A :class:`Replica` decides in the application's process (or behind ``streambandit api
--replica-of``) with a copy of the models it keeps by following the learners' ``joined`` log, and
logs every decision on the ``decisions`` topic, every reward on ``rewards``. A worker with
``[worker] learn_only = true`` reads those two topics: it opens each logged decision as it would
open its own, joins the rewards, updates the models and writes ``actions``, ``joined`` and
snapshots (docs/design.md, decisions at the edge). The learning log stays the exact update
sequence: recovery, export and replay read it as they read a deciding worker's.

- **The copy.** At start, per partition of ``joined``: the newest snapshot of the learners'
  group (its models) and the committed joined records after it, read to an end where no
  transaction is open (``LogReader.settle``), each applied with ``update`` in log order, the
  update sequence the learner applied, so each model is the learner's at that point, to the bit.
  Then the replica follows ``joined`` as it grows. A replica is ready (it decides) only once every
  partition has been read to the end it found at start: a restarted replica never serves a model
  older than one it served before.
- **The check.** Every joined record names the model version it was applied to. A record that
  does not continue the copy (a gap, or a record seen twice: a broker that shows an aborted
  transaction's records, as the embedded one does, docs/notes/tansu.md) makes the replica read
  the partition again from its snapshot and the committed log, while it keeps serving the copy it
  has.
- **Staleness.** Every second (or a quarter of ``max_staleness_s``) the follower checks whether
  it has read everything the log held at its previous check (``serving/staleness.py``); the time
  since it last had is how far the copy may be behind the learners (``staleness_s``). Past
  ``max_staleness_s`` (None: no bound) the replica refuses to decide (``stale_replica``) and is
  not ready: a replica cut off from the broker does not serve an ever older model for good.
- **Freshness.** A reward reaches a replica's model after the learner's batch that joins it
  commits (its poll and commit, ``batch_max_records``) and this replica's next fetch
  (``fetch.wait.max.ms`` of ``[kafka.consumer]``): ``python -m bench.freshness`` measures it.
  Aggregations ``sum`` and ``last`` add the reward window, as in the worker.

Decisions and rewards are judged by the worker's admission rule (engine/admission.py: the same
checks, the same reason codes), except what needs the learner's state: a duplicate event id is
refused here only among this replica's recent decisions (``max_recent``); across replicas the
learner dead-letters it (``duplicate_event``), and a reward is refused by the learner, not here,
when it is late, a duplicate or for an unknown event. Thread-safe: ``rank`` and ``reward`` may be
called from many threads.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from streambandit import reasons
from streambandit.config.kafka import for_client, reader_settings
from streambandit.config.worker import WorkerConfig
from streambandit.engine import admission
from streambandit.engine.admission import (
    DecisionError,
    call_context,
    call_id,
    call_reward,
    call_time,
    raise_if,
)
from streambandit.engine.decision import decide
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.engine.partition import PartitionEngine
from streambandit.policies.base import Policy
from streambandit.serving.decider import Ranking
from streambandit.serving.staleness import Staleness
from streambandit.stream.authorization import refusal_line
from streambandit.stream.errors import NotAuthorized
from streambandit.stream.kafka_checks import check_groups_described, kafka_logger
from streambandit.stream.logs import LogReader, committed_view, group_committed
from streambandit.stream.snapshots import SnapshotStore, load_latest
from streambandit.wire import Context, DecodeError, Joined, ReplicaDecision, Reward, decode, encode

__all__ = ["Replica", "NOT_READY", "STALE_REPLICA"]

log = logging.getLogger("streambandit")

NOT_READY = (
    "not_ready"  # a rank before the replica has read the learners' log to where it stood at start
)
STALE_REPLICA = (
    "stale_replica"  # a rank while the copy may be more than max_staleness_s behind the learners
)
# Joined records applied per hold of the models' lock (about 10 us each for oful at d = 20,
# bench.decider's bare update): a rank waits for at most this many.
APPLY_CHUNK = 64


class Replica:
    """Rank and reward against a followed copy of a learn-only group's models (module docstring).

    ``config``: the learners' worker configuration (their group, topics, models and Kafka
    settings); ``store``: their snapshot store (None: the whole joined log is read at start).
    ``on_update``: called in the follower's thread with each joined record applied."""

    def __init__(
        self,
        config: WorkerConfig,
        store: SnapshotStore | None = None,
        *,
        max_models: int | None = None,
        max_recent: int = 100_000,
        clock: Callable[[], int] | None = None,
        on_update: Callable[[Joined], None] | None = None,
        poll_s: float = 0.05,
        max_staleness_s: float | None = None,
    ) -> None:
        if max_staleness_s is not None and not max_staleness_s > 0:
            raise ValueError(
                f"max_staleness_s must be > 0 (None: no bound), got {max_staleness_s!r}"
            )
        self.worker_config = config
        self.config = config.models  # what Decider.config is: the API reads specs from it
        self.store = store.scoped(config.group_id) if store is not None else None
        self.max_models, self.max_recent = max_models, max_recent
        self.models: dict[str, Policy] = {}
        self.on_update, self.poll_s = on_update, poll_s
        self.max_staleness_s = max_staleness_s
        self._check_s = min(1.0, max_staleness_s / 4) if max_staleness_s is not None else 1.0
        self._staleness = Staleness(time.monotonic())
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._lock = (
            threading.Lock()
        )  # models and the keys per partition: the follower writes, rank reads
        self._keys: dict[int, set[str]] = collections.defaultdict(
            set
        )  # partition -> its model keys
        self._recent: collections.OrderedDict[str, str] = (
            collections.OrderedDict()
        )  # event id -> model key
        self.counters: collections.Counter[str] = collections.Counter()
        self.ready = threading.Event()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        kafka = config.kafka
        quiet = {"logger": kafka_logger()}  # librdkafka's log lines through ours, repeats held back
        # A record the broker refuses to this principal (a missing Write ACL) is a decision or a
        # reward the learners never see: noted here, it stops the replica deciding (rank).
        self._refusals: list[str] = []
        self._producer = Producer(
            {
                "bootstrap.servers": config.bootstrap_servers,
                "linger.ms": 1,
                **for_client("producer", kafka),
                "partitioner": "murmur2_random",
                "enable.idempotence": True,
                "acks": "all",
                "on_delivery": functools.partial(_note_refusal, self._refusals, config),
            }
            | quiet
        )
        reader = reader_settings(config.bootstrap_servers, kafka) | quiet
        self._follow = Consumer(reader | {"enable.partition.eof": False})
        # The learners' committed input offsets (which joined records committed transactions
        # wrote): read with their group id, never joining the group (assign and committed only).
        self._group = Consumer(reader | {"group.id": config.group_id})
        self._reader = LogReader(reader, open_timeout_s=60.0)
        self._starts: dict[int, int] = {}  # partition -> the offset its following started from
        self._thread = threading.Thread(target=self._run, name="replica-follower", daemon=True)

    # -- life ----------------------------------------------------------------------------------

    def start(self, timeout_s: float | None = 120.0) -> "Replica":
        """Load the models and follow the log, in a thread; returns once ready (raises after
        ``timeout_s``), or at once with ``timeout_s`` None (``ready`` says when)."""
        self._thread.start()
        if timeout_s is None:
            return self
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.1):
            if isinstance(self._error, NotAuthorized):  # waiting longer would not change it
                raise self._error
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"replica not ready after {timeout_s:.0f} s: "
                    f"{self._error or 'still reading the log'}"
                )
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        self._producer.flush(10)
        for c in (self._follow, self._group):
            c.close()
        self._reader.close()

    def __enter__(self) -> "Replica":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def flush(self, timeout_s: float = 10.0) -> int:
        """Wait for the logged decisions and rewards to reach the broker; the number still queued."""
        return self._producer.flush(timeout_s)

    # -- decisions -----------------------------------------------------------------------------

    def rank(
        self,
        event_id: str,
        model_key: str,
        arms: Mapping[str, Sequence[float]] | Sequence[str],
        features: Any = None,
        *,
        timestamp_ms: int | None = None,
    ) -> Ranking:
        """As :meth:`Decider.rank`, with the replica's copy of the model; the decision is logged on
        the decisions topic for the learners."""
        self._check_refusals()
        if not self.ready.is_set() or self._error is not None:
            raise DecisionError(
                NOT_READY,
                "the replica is still reading the learners' log"
                if self._error is None
                else str(self._error)
                if isinstance(self._error, NotAuthorized)
                else f"the replica stopped following the learners' log: {self._error}",
            )
        if (
            self.max_staleness_s is not None
            and (behind := self.staleness_s()) > self.max_staleness_s
        ):
            raise DecisionError(
                STALE_REPLICA,
                f"the copy may be {behind:.1f} s behind the learners, more than "
                f"max_staleness_s = {self.max_staleness_s:g}",
            )
        context = call_context(event_id, model_key, arms, features, timestamp_ms, self._clock)
        arm_ids, x, ts = context.arm_ids, context.features, context.timestamp_ms
        raise_if(self._record_refusal(context))
        spec = self.config.resolve(model_key)
        raise_if(admission.context_refusal(model_key, arm_ids, x, spec))
        with self._lock:
            raise_if(admission.decided_before(event_id, self._recent))
            model = self.models.get(model_key)
            if model is None:
                raise_if(admission.model_room_refusal(model_key, self.models, self.max_models))
                model = spec.build()  # version 0, as the learners' is until its first update
            scored: list = []  # the decision's scores, computed once
            try:
                d = decide(
                    model,
                    x,
                    epsilon=spec.epsilon,
                    model_key=model_key,
                    event_id=event_id,
                    seed=spec.seed,
                    scores=scored,
                )
            except ValueError as exc:
                refused = admission.learner_refusal(exc, x)
                raise DecisionError(refused.reason, refused.detail) from None
            raise_if(
                admission.id_refusal(
                    "chosen arm's id", arm_ids[d.index], self.worker_config.max_id_bytes
                )
            )
            version, scores = model.n_updates, scored[0]
            self.models.setdefault(model_key, model)
            self._recent[event_id] = model_key
            if len(self._recent) > self.max_recent:
                self._recent.popitem(last=False)
        decision = ReplicaDecision(
            event_id, model_key, ts, arm_ids, x, d.index, d.score, d.propensity, version
        )
        self._produce(self.worker_config.topics.decisions, model_key, encode(decision))
        self.counters["decisions"] += 1
        return Ranking(
            event_id, model_key, arm_ids[d.index], d.index, d.propensity, d.score, scores, version
        )

    def reward(
        self,
        event_id: str,
        value: float,
        *,
        model_key: str | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Log a reward for the learners. ``model_key`` may be left out for a decision this
        replica made recently; the learners judge the rest (late, duplicate, unknown)."""
        ts = call_time(timestamp_ms, self._clock)
        call_id("event id", event_id)
        if model_key is None:
            with self._lock:
                model_key = self._recent.get(event_id)
            if model_key is None:
                raise DecisionError(
                    reasons.UNKNOWN_EVENT,
                    f"this replica made no recent decision {event_id!r}: give its model key",
                )
        call_id("model key", model_key)
        reward = Reward(event_id, model_key, ts, call_reward(value))
        raise_if(self._record_refusal(reward))
        spec = self.config.resolve(model_key)
        if spec is None:
            raise_if(admission.unknown_model_refusal(model_key))
        with self._lock:
            model = self.models.get(model_key)
        # A key this replica holds no model of yet: a fresh one of its configuration judges the
        # value as the learners' model will (the range is the link's, not the state's).
        raise_if(
            admission.reward_refusal(model if model is not None else spec.build(), reward.value)
        )
        self._produce(self.worker_config.topics.rewards, model_key, encode(reward))
        self.counters["rewards"] += 1

    def _record_refusal(self, ev: Context | Reward) -> admission.Refusal | None:
        """The admission rule's record checks, with the clock as the record's timestamp: the
        learners judge the logged record by the broker's, a moment later."""
        c = self.worker_config
        return admission.record_refusal(
            ev, int(self._clock()), c.max_event_time_ahead_ms, c.max_id_bytes
        )

    def _check_refusals(self) -> None:
        """A record the broker refused to this principal stops the deciding: each decision made
        from then on would be lost to the learners too (docs/security.md)."""
        self._producer.poll(0)  # serves the delivery reports
        if self._refusals and self._error is None:
            self._error = NotAuthorized(self._refusals[0])
            log.error("%s", self._refusals[0])

    def staleness_s(self) -> float:
        """How far behind the learners the copy may be: the time since it last held everything
        the joined log held (serving/staleness.py)."""
        return self._staleness.behind_s(time.monotonic())

    def is_ready(self) -> bool:
        """Whether the replica decides now: caught up at start, and within ``max_staleness_s``."""
        self._check_refusals()
        return (
            self.ready.is_set()
            and self._error is None
            and (self.max_staleness_s is None or self.staleness_s() <= self.max_staleness_s)
        )

    def version(self, model_key: str) -> int:
        """The copy's model version (its updates applied), 0 for a model not seen yet."""
        with self._lock:
            model = self.models.get(model_key)
            return 0 if model is None else model.n_updates

    # -- following the learners' log ------------------------------------------------------------

    def _run(self) -> None:
        try:
            joined = self.worker_config.topics.joined
            md = self._follow.list_topics(joined, timeout=30)
            if joined in md.topics and md.topics[joined].error is not None:
                line = refusal_line(
                    md.topics[joined].error,
                    self.worker_config.kafka or {},
                    self.worker_config.bootstrap_servers,
                    topics=[joined],
                    describing=True,
                )
                if line is not None:
                    raise NotAuthorized(line)
            if joined not in md.topics or md.topics[joined].error is not None:
                raise RuntimeError(f"topic {joined!r} does not exist")
            # The learners' committed offsets need Describe on their group, and reading joined
            # on the reader's: without, the offsets request waits out its timeout (the replica
            # would only be still reading), and a reader's range read fails only once there
            # is a record to read.
            check_groups_described(
                self.worker_config.bootstrap_servers,
                self.worker_config.kafka,
                [self.worker_config.group_id, self._reader.settings["group.id"]],
            )
            self._starts = {p: self._load(p) for p in sorted(md.topics[joined].partitions)}
            self._follow.assign([TopicPartition(joined, p, off) for p, off in self._starts.items()])
            self._staleness = Staleness(time.monotonic())
            self.ready.set()
            log.info("replica ready partitions=%d models=%d", len(self._starts), len(self.models))
            next_check = time.monotonic()
            while not self._stop.is_set():
                msgs = self._follow.consume(1000, self.poll_s)
                if msgs:
                    self._apply(msgs)
                if time.monotonic() >= next_check:
                    self._check_staleness()
                    next_check = time.monotonic() + self._check_s
        except BaseException as exc:  # the caller of start() sees it; rank keeps the copy it has
            self._error = exc
            log.exception("replica follower stopped: %s", exc)

    def _load(self, p: int) -> int:
        """Partition ``p``'s models from the newest snapshot and the committed joined records after
        it; swapped in whole. Returns the offset to follow from."""
        config, t = self.worker_config, self.worker_config.topics
        snap = load_latest(self.store, p) if self.store is not None else None
        models = (
            dict(PartitionEngine.restore(config.models, snap.engine).models)
            if snap is not None
            else {}
        )
        start = snap.header.joined_offset if snap is not None else 0
        end = self._reader.settle(t.joined, p)
        got = group_committed(
            self._group, [TopicPartition(config.first_input, p), TopicPartition(t.rewards, p)]
        )
        committed = {CONTEXTS: max(got[0].offset, 0), REWARDS: max(got[1].offset, 0)}
        records = [
            j
            for m in self._reader.read(t.joined, p, start, end)
            if isinstance(j := _decoded(m.value()), Joined)
        ]
        for j in committed_view(records, committed):
            model = models.get(j.model_key)
            if model is None:
                model = models[j.model_key] = self._spec(j.model_key).build()
            if model.n_updates != j.model_version_before:
                raise RuntimeError(
                    f"joined[{p}]: record {j.event_id!r} was applied to version {j.model_version_before} "
                    f"of {j.model_key!r}, the log reaches version {model.n_updates}"
                )
            model.update(j.features, j.reward)
        with self._lock:
            for key in self._keys.pop(p, set()) - set(models):
                self.models.pop(key, None)
            self.models.update(models)
            self._keys[p] = set(models)
        self.counters["loads"] += 1
        self.counters["loads_from_snapshot"] += snap is not None
        return end

    def _apply(self, msgs: list[Any]) -> None:
        diverged: set[int] = set()
        applied = []
        records = []  # decoded outside the lock: rank waits only for the updates themselves
        for m in msgs:
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("replica fetch error=%s", m.error())
                continue
            j = _decoded(m.value())
            if isinstance(j, Joined):
                records.append((m.partition(), j))
        for first in range(0, len(records), APPLY_CHUNK):
            with self._lock:  # a chunk at a time: a rank waits for at most APPLY_CHUNK updates
                for p, j in records[first : first + APPLY_CHUNK]:
                    if p in diverged:
                        continue
                    model = self.models.get(j.model_key)
                    if model is None and j.model_version_before == 0:
                        model = self.models[j.model_key] = self._spec(j.model_key).build()
                        self._keys[p].add(j.model_key)
                    elif model is not None and j.model_key not in self._keys[p]:
                        self._keys[p].add(
                            j.model_key
                        )  # a model this replica built for a rank, learned at last
                    if model is None or model.n_updates != j.model_version_before:
                        diverged.add(p)
                        continue
                    try:
                        model.update(j.features, j.reward)
                    except (
                        ValueError
                    ):  # the learner applied it; a copy that refuses it is not the learner's
                        diverged.add(p)
                        continue
                    applied.append(j)
        self.counters["applied"] += len(applied)
        if self.on_update is not None:
            for j in applied:
                self.on_update(j)
        for p in diverged:
            self.counters["reloads"] += 1
            log.warning(
                "replica joined[%d] does not continue the copy; reading the partition again", p
            )
            self._starts[p] = self._load(p)
            self._follow.seek(TopicPartition(self.worker_config.topics.joined, p, self._starts[p]))

    def _check_staleness(self) -> None:
        """Where the follower stands and where the log ends now (serving/staleness.py)."""
        joined = self.worker_config.topics.joined
        tps = [TopicPartition(joined, p) for p in self._starts]
        # position() is the offset after the last record read (past transaction markers), or
        # negative while none has been read since the assignment.
        positions = {
            tp.partition: tp.offset if tp.offset >= 0 else self._starts[tp.partition]
            for tp in self._follow.position(tps)
        }
        # Asked on another client: the follower's connection is held by its fetch, which a broker
        # may keep for all of fetch.wait.max.ms (docs/notes/tansu.md), and the query would wait.
        query = self._reader.committed
        try:
            ends = {
                tp.partition: int(query.get_watermark_offsets(tp, timeout=1.0, cached=False)[1])
                for tp in tps
            }
        except Exception as exc:  # the broker did not answer: no new ends, the staleness grows
            log.debug("replica staleness check: %s", exc)
            ends = None
        self._staleness.check(time.monotonic(), positions, ends)

    def _spec(self, model_key: str) -> Any:
        spec = self.config.resolve(model_key)
        if spec is None:
            raise RuntimeError(
                f"the joined log holds model {model_key!r} but the configuration has no entry for it"
            )
        return spec

    def _produce(self, topic: str, key: str, value: bytes) -> None:
        try:
            self._producer.produce(topic, value, key.encode())
        except BufferError:
            self._producer.poll(
                1.0
            )  # the local queue is full: let librdkafka send, then retry once
            self._producer.produce(topic, value, key.encode())
        self._producer.poll(0)


def _note_refusal(into: list[str], config: Any, err: Any, msg: Any) -> None:
    """The producer's delivery callback: the line of a record refused for lack of an ACL."""
    if err is None:
        return
    line = refusal_line(
        err, config.kafka or {}, config.bootstrap_servers, topics=[msg.topic()], writing=True
    )
    if line is not None:
        into.append(line)


def _decoded(value: bytes) -> Any:
    try:
        return decode(value)
    except DecodeError:
        return None
