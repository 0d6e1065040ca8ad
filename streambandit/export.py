"""The worker's own logs as logged bandit feedback: one :class:`LoggedDecision` per joined record.

The one module that joins the two sides: it reads the runtime's topics (``stream``) into replay's
input (``replay``), so that neither of those packages imports the other
(``tests/unit/test_layering.py``). ``streambandit export`` runs it.

A joined record holds the chosen arm's features, the reward and the propensity; replay also needs
the candidate arms (from the context) and when the live model decided (the action's
``model_version``). Per partition this reads contexts[p], actions[p] and joined[p] up to the
group's committed positions, keeps what committed transactions wrote (``committed_view``), and
yields the joined events in the joined log's order, which is each model's update order.
"""

from __future__ import annotations

from typing import Iterator

from confluent_kafka import Consumer, TopicPartition

from streambandit.config.kafka import reader_settings
from streambandit.config.worker import Topics
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.replay.logged import LoggedDecision
from streambandit.stream.authorization import refusal_line
from streambandit.stream.errors import NotAuthorized
from streambandit.stream.kafka_checks import check_groups_described, kafka_logger
from streambandit.stream.logs import committed_view, group_committed, read_range
from streambandit.wire import Action, Context, DecodeError, Joined, ReplicaDecision, decode

__all__ = ["read_logged_decisions"]

_TO_EOF = 2**62  # read a partition to its end (the embedded broker's high watermark can be low)


def read_logged_decisions(
    bootstrap_servers: str,
    topics: Topics,
    group_id: str,
    *,
    partitions: list[int] | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
    kafka: dict | None = None,
    learn_only: bool = False,
) -> Iterator[LoggedDecision]:
    """The joined events of ``group_id``'s worker, partition by partition, in update order; a
    learn-only group's contexts are the decisions replicas logged (``decisions``).

    ``from_ms``/``to_ms`` keep decisions whose event time lies in ``[from_ms, to_ms)``; a replay
    that must reproduce live models needs every joined record from the start of the log.
    """
    # librdkafka's lines through ours (JSON with --log-format json, credentials masked), not
    # its own on stderr.
    settings = reader_settings(bootstrap_servers, kafka) | {"logger": kafka_logger()}
    reader = Consumer(settings)
    group = Consumer({**settings, "group.id": group_id})

    def refused(error: object, **what: object) -> None:
        """NotAuthorized for a refused ACL: without it the export is silently empty, or waits."""
        line = refusal_line(error, kafka or {}, bootstrap_servers, **what)
        if line is not None:
            raise NotAuthorized(line) from None

    try:
        # A topic the principal may not Describe is never fetched from, and its read waits
        # out its whole timeout: looked up first.
        for name in (topics.first_input(learn_only), topics.actions, topics.joined):
            found = reader.list_topics(name, timeout=10).topics[name]
            if found.error is not None:
                refused(found.error, topics=[name], describing=True)
        joined = reader.list_topics(topics.joined, timeout=10).topics[topics.joined]
        if partitions is None:
            partitions = sorted(joined.partitions)
        # The group's committed offsets are asked for next: refused at once here, where the
        # offsets request would wait out its timeout.
        check_groups_described(bootstrap_servers, kafka, [group_id])
        for p in partitions:
            first = topics.first_input(learn_only)
            got = group_committed(
                group, [TopicPartition(first, p), TopicPartition(topics.rewards, p)]
            )
            for tp in got:  # the group's offsets of a topic it may not Describe: none, silently
                if tp.error is not None:
                    needs = "Describe" if tp.topic == topics.rewards else "Read"
                    refused(tp.error, topics=[tp.topic], describing=True, topic_operation=needs)
            committed = {CONTEXTS: max(got[0].offset, 0), REWARDS: max(got[1].offset, 0)}
            try:
                yield from _partition(reader, topics, p, committed, from_ms, to_ms, learn_only)
            except ReadFailed as exc:
                refused(
                    exc.__cause__,
                    topics=[exc.topic],
                    group=settings["group.id"],
                    group_operation="Describe",
                )
                raise
    finally:
        reader.close()
        group.close()


class ReadFailed(RuntimeError):
    """A read of ``topic`` failed; its cause is librdkafka's error."""

    def __init__(self, topic: str, message: str) -> None:
        super().__init__(message)
        self.topic = topic


def _partition(
    reader: Consumer,
    topics: Topics,
    p: int,
    committed: dict[int, int],
    from_ms: int | None,
    to_ms: int | None,
    learn_only: bool,
) -> Iterator[LoggedDecision]:
    def decoded(topic: str, end: int, kind: type) -> list:
        out = []
        try:
            msgs = read_range(reader, topic, p, 0, end)
        except RuntimeError as exc:
            raise ReadFailed(topic, str(exc)) from exc.__cause__
        for m in msgs:
            try:
                ev = decode(m.value())
            except DecodeError:
                continue  # not ours to replay: the worker dead-lettered it
            if isinstance(ev, kind):
                out.append(ev)
        return out

    contexts: dict[str, Context | ReplicaDecision] = {}
    for c in decoded(
        topics.first_input(learn_only),
        committed[CONTEXTS],
        ReplicaDecision if learn_only else Context,
    ):
        contexts.setdefault(
            c.event_id, c
        )  # a duplicate event id was answered by the first decision
    actions = {
        a.event_id: a for a in committed_view(decoded(topics.actions, _TO_EOF, Action), committed)
    }
    for j in committed_view(decoded(topics.joined, _TO_EOF, Joined), committed):
        ctx, action = contexts.get(j.event_id), actions.get(j.event_id)
        if ctx is None or action is None:
            raise ValueError(
                f"partition {p}: joined event {j.event_id!r} has no committed context or action"
            )
        if (from_ms is not None and ctx.timestamp_ms < from_ms) or (
            to_ms is not None and ctx.timestamp_ms >= to_ms
        ):
            continue
        yield LoggedDecision(
            timestamp_ms=ctx.timestamp_ms,
            event_id=j.event_id,
            model_key=j.model_key,
            arm_ids=ctx.arm_ids,
            features=ctx.features,
            action=action.arm_index,
            propensity=j.propensity,
            reward=j.reward,
            decision_version=action.model_version,
        )
