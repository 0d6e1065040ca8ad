"""Bad input on the real broker (docs/design.md, invariant 8): every kind of bad record goes to the dead-letter
topic with its reason code, its original bytes and its source position; the worker keeps running
and the good records around it are processed as if it were not there.

One stream holds every case, each between good records; one worker processes it; the committed
outputs are read once (module fixture) and each test checks one case.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import uuid

import fastavro
import numpy as np
import pytest

from streambandit import reasons
from streambandit.config.worker import Topics
from streambandit.wire import Context, Reward, codec, encode, schemas

from .helpers import Sent, Tail, caught_up, outputs, producer, send_tracked, start_worker, wait_for

pytestmark = pytest.mark.integration

DIM = 3
WINDOW_MS = 5000
MODELS = {
    "models": [
        {
            "match": "bad-m",
            "policy": "glb_omd",
            "dim": DIM,
            "reward_window_ms": WINDOW_MS,
            "default_reward": 0.0,
            "aggregation": "first",
            "hyper": {"link": "logistic"},
        },
        {
            "match": "bad-p",
            "policy": "glb_omd",
            "dim": DIM,
            "reward_window_ms": WINDOW_MS,
            "default_reward": 0.0,
            "aggregation": "first",
            "hyper": {"link": "poisson"},
        },
    ]
}
GROUP = "g-bad-input"
KEY = b"bad-m"


def _context_v3_without_timestamp() -> bytes:
    """A context written by a writer whose schema (id 1, version 3) lacks the required timestamp_ms."""
    schema = json.loads((schemas.SCHEMA_DIR / "context.avsc").read_text())
    v3 = copy.deepcopy(schema)
    v3["fields"] = [f for f in v3["fields"] if f["name"] != "timestamp_ms"]
    schemas.register_writer_schema(
        "context", 3, v3
    )  # the reader knows the writer; resolution must fail
    buf = io.BytesIO()
    buf.write(bytes((0x5B, 1, 3)))
    fastavro.schemaless_writer(
        buf,
        fastavro.parse_schema(v3),
        {
            "event_id": "mf",
            "model_key": "bad-m",
            "arm_ids": ["a"],
            "features": np.zeros(DIM).tobytes(),
        },
    )
    return buf.getvalue()


def _raw_context(event_id: str, ts: int, arms: list[tuple[str, np.ndarray]]) -> bytes:
    """Context bytes written field by field (no validation): any feature bytes, any arm count. In the
    version 1 layout (one record per arm), which can express arms of different dimensions."""
    return codec.write(
        1,
        {
            "event_id": event_id,
            "model_key": "bad-m",
            "timestamp_ms": ts,
            "arms": [
                {"arm_id": a, "features": np.asarray(x, dtype="<f8").tobytes()} for a, x in arms
            ],
        },
        version=1,
    )


@dataclasses.dataclass
class Bad:
    case: str
    reason: str
    sent: Sent
    before: str  # the good event id produced just before it (same model key)
    after: str  # ... and just after it


class Stream:
    """Builds the input: good events (context + reward) with bad records between them."""

    def __init__(self, prod, topics: Topics, t0: int) -> None:
        self.prod, self.topics, self.t = prod, topics, t0
        self.rng = np.random.default_rng(7)
        self.good: dict[str, float] = {}  # event id -> the reward sent for it
        self.good_ctx: dict[str, Context] = {}
        self.sent: list[Sent] = []
        self.bad: list[Bad] = []
        self._open: list[
            tuple[str, str, Sent]
        ] = []  # bad records waiting for their next good neighbour
        self._last_good: str | None = None

    def step(self, dt: int = 100) -> int:
        self.t += dt
        return self.t

    def send(self, topic: str, key: bytes | None, value: bytes) -> Sent:
        s = send_tracked(self.prod, topic, key, value)
        self.sent.append(s)
        return s

    def context(self, event_id: str, key: str = "bad-m", ts: int | None = None) -> Context:
        ctx = Context(
            event_id,
            key,
            self.step() if ts is None else ts,
            ("a", "b", "c"),
            self.rng.standard_normal((3, DIM)) / 3,
        )
        self.send(self.topics.contexts, key.encode(), encode(ctx))
        return ctx

    def reward(
        self, event_id: str, value: float, key: str = "bad-m", ts: int | None = None
    ) -> Sent:
        stamp = self.step(1) if ts is None else ts
        return self.send(
            self.topics.rewards, key.encode(), encode(Reward(event_id, key, stamp, value))
        )

    def good_event(self, event_id: str, value: float | None = None) -> None:
        """A context and, right after it in event time, its reward: joined when the reward comes."""
        ctx = self.context(event_id)
        v = float(len(self.good) % 2) if value is None else value
        self.reward(event_id, v)
        self._good(event_id, ctx, v)

    def _good(self, event_id: str, ctx: Context, value: float) -> None:
        self.good[event_id], self.good_ctx[event_id] = value, ctx
        for case, reason, s in self._open:
            self.bad.append(Bad(case, reason, s, self._last_good, event_id))
        self._open.clear()
        self._last_good = event_id

    def bad_record(
        self, case: str, reason: str, topic: str, value: bytes, key: bytes | None = KEY
    ) -> Sent:
        s = self.send(topic, key, value)
        self._open.append((case, reason, s))
        return s


@pytest.fixture(scope="module")
def run(broker, tmp_path_factory):
    tag = uuid.uuid4().hex[:8]
    topics = Topics(
        contexts=f"contexts-{tag}",
        rewards=f"rewards-{tag}",
        actions=f"actions-{tag}",
        joined=f"joined-{tag}",
        dead_letter=f"dead-letter-{tag}",
    )
    broker.create_topics(topics.all(), partitions=2)
    prod = producer(broker)
    st = Stream(prod, topics, t0=1_700_000_000_000)
    C, R = topics.contexts, topics.rewards
    n = iter(range(1000))

    def good():
        st.good_event(f"g{next(n)}")

    good()
    # Bytes that are not a record of ours.
    st.bad_record("not_a_record", reasons.MALFORMED, C, b'{"event_id": "json, not avro"}')
    good()
    st.bad_record("truncated_avro", reasons.MALFORMED, C, bytes((0x5B, 1, 1)) + b"\x02")
    good()
    # A header naming a schema this reader does not know (an id, then a version).
    body = encode(Context("us", "bad-m", st.t, ("a",), np.zeros((1, DIM))))[3:]
    st.bad_record("unknown_schema_id", reasons.UNKNOWN_SCHEMA, C, bytes((0x5B, 99, 1)) + body)
    good()
    st.bad_record("unknown_schema_version", reasons.UNKNOWN_SCHEMA, C, bytes((0x5B, 1, 9)) + body)
    good()
    st.bad_record("missing_field", reasons.MISSING_FIELD, C, _context_v3_without_timestamp())
    good()
    st.bad_record(
        "nan_features",
        reasons.NON_FINITE_FEATURES,
        C,
        _raw_context("nan", st.step(), [("a", [0.1, 0.2, 0.3]), ("b", [0.1, math.nan, 0.3])]),
    )
    good()
    st.bad_record(
        "inf_features",
        reasons.NON_FINITE_FEATURES,
        C,
        _raw_context("inf", st.step(), [("a", [math.inf, 0.2, 0.3])]),
    )
    good()
    # Finite but huge: taken, it would make every later score of the model NaN.
    st.bad_record(
        "huge_features",
        reasons.FEATURE_OUT_OF_RANGE,
        C,
        _raw_context("huge", st.step(), [("a", [0.1, 0.2, 0.3]), ("b", [1e200, 0.2, 0.3])]),
    )
    good()
    st.bad_record(
        "wrong_dimension",
        reasons.BAD_DIMENSION,
        C,
        _raw_context(
            "dim4", st.step(), [("a", np.full(DIM + 1, 0.1)), ("b", np.full(DIM + 1, 0.2))]
        ),
    )
    good()
    st.bad_record(
        "ragged_arms",
        reasons.BAD_DIMENSION,
        C,
        _raw_context("ragged", st.step(), [("a", np.full(DIM, 0.1)), ("b", np.full(DIM - 1, 0.2))]),
    )
    good()
    st.bad_record("empty_arms", reasons.EMPTY_ARMS, C, _raw_context("empty", st.step(), []))
    good()
    # Two candidates with one id: the action names its arm by id, and export refused such a log.
    st.bad_record(
        "duplicate_arm_id",
        reasons.DUPLICATE_ARM_ID,
        C,
        _raw_context("dupid", st.step(), [("a", [0.1, 0.2, 0.3]), ("a", [0.3, 0.2, 0.1])]),
    )
    good()
    # A duplicate context event id: decided once; the duplicate (other features, later) refused.
    first = st.context("dup")
    dup = Context("dup", "bad-m", st.step(), ("x", "y"), np.full((2, DIM), 0.5))
    st.bad_record("duplicate_event", reasons.DUPLICATE_EVENT, C, encode(dup))
    st.reward("dup", 1.0)
    st._good("dup", first, 1.0)
    good()
    # A reward for an event that never had a context: held, then refused when its window has passed.
    st.bad_record(
        "unknown_event", reasons.UNKNOWN_EVENT, R, encode(Reward("ghost", "bad-m", st.step(), 1.0))
    )
    good()
    # A reward outside the logistic link's range [0, 1], then a good one for the same event.
    ctx = st.context("oor")
    st.bad_record(
        "out_of_range_logistic",
        reasons.REWARD_OUT_OF_RANGE,
        R,
        encode(Reward("oor", "bad-m", st.step(1), 2.0)),
    )
    st.reward("oor", 1.0)
    st._good("oor", ctx, 1.0)
    good()
    # A NaN reward, then a good one for the same event.
    ctx = st.context("nanr")
    st.bad_record(
        "nan_reward",
        reasons.NON_FINITE_REWARD,
        R,
        encode(Reward("nanr", "bad-m", st.step(1), math.nan)),
    )
    st.reward("nanr", 0.0)
    st._good("nanr", ctx, 0.0)
    good()
    # A context and a reward for a model key no configuration matches.
    st.bad_record(
        "unknown_model_context",
        reasons.UNKNOWN_MODEL,
        C,
        encode(Context("nobody-1", "nobody", st.step(), ("a",), np.zeros((1, DIM)))),
        key=b"nobody",
    )
    good()
    st.bad_record(
        "unknown_model_reward",
        reasons.UNKNOWN_MODEL,
        R,
        encode(Reward("nobody-2", "nobody", st.step(), 1.0)),
        key=b"nobody",
    )
    good()
    # A negative count for the Poisson model, then a good one (its neighbours are the bad-m events).
    pctx = Context(
        "pois", "bad-p", st.step(), ("a", "b", "c"), st.rng.standard_normal((3, DIM)) / 3
    )
    st.send(C, b"bad-p", encode(pctx))
    st.bad_record(
        "out_of_range_poisson",
        reasons.REWARD_OUT_OF_RANGE,
        R,
        encode(Reward("pois", "bad-p", st.step(1), -1.0)),
        key=b"bad-p",
    )
    # Finite but huge: it crashed the compiled Poisson update, and every restart that replayed it.
    st.bad_record(
        "huge_reward_poisson",
        reasons.REWARD_OUT_OF_RANGE,
        R,
        encode(Reward("pois", "bad-p", st.step(1), 1e200)),
        key=b"bad-p",
    )
    st.send(R, b"bad-p", encode(Reward("pois", "bad-p", st.step(1), 3.0)))
    good()
    # Valid records that do not belong where they are: a reward on the contexts topic, and a
    # context whose message key is not its model key.
    st.bad_record(
        "wrong_topic", reasons.WRONG_TOPIC, C, encode(Reward("wt", "bad-m", st.step(), 1.0))
    )
    good()
    st.bad_record(
        "key_mismatch",
        reasons.KEY_MISMATCH,
        C,
        encode(Context("km", "bad-m", st.step(), ("a",), np.zeros((1, DIM)))),
        key=b"bad-p",
    )
    good()
    # No message key: it lands on a random partition and would build a second copy of the model.
    st.bad_record(
        "null_key",
        reasons.KEY_MISMATCH,
        C,
        encode(Context("nk", "bad-m", st.step(), ("a",), np.zeros((1, DIM)))),
        key=None,
    )
    good()
    for _ in range(5):
        good()
    # Event time moves past every window (the ghost's included); joined at its own reward.
    st.step(3 * WINDOW_MS)
    good()
    prod.flush(30)
    assert not st._open and all(s.offset is not None for s in st.sent)

    # Ticks off: only the records above move event time (the window test covers ticks). A long
    # merge wait: the merge order is the event-time order however the two topics' fetches interleave.
    w, t = start_worker(
        broker,
        topics,
        tmp_path_factory.mktemp("bad-input"),
        GROUP,
        MODELS,
        idle_tick_ms=600_000,
        merge_wait_ms=1000,
    )
    try:
        assert wait_for(
            lambda: caught_up(broker, topics, GROUP, st.sent), timeout_s=60, interval_s=0.5
        ), "the worker did not get through the stream"
        out = outputs(broker, topics, GROUP)
        metrics = dict(w.metrics)
        yield {
            "stream": st,
            "out": out,
            "metrics": metrics,
            "worker": w,
            "thread": t,
            "topics": topics,
            "prod": prod,
        }
    finally:
        w.stop()
        t.join(30)


CASES = [
    "not_a_record",
    "truncated_avro",
    "unknown_schema_id",
    "unknown_schema_version",
    "missing_field",
    "nan_features",
    "inf_features",
    "huge_features",
    "wrong_dimension",
    "ragged_arms",
    "empty_arms",
    "duplicate_event",
    "unknown_event",
    "out_of_range_logistic",
    "out_of_range_poisson",
    "huge_reward_poisson",
    "nan_reward",
    "unknown_model_context",
    "unknown_model_reward",
    "wrong_topic",
    "key_mismatch",
    "null_key",
    "duplicate_arm_id",
]


def test_every_case_is_in_the_stream(run):
    assert sorted(b.case for b in run["stream"].bad) == sorted(CASES)


@pytest.mark.parametrize("case", CASES)
def test_bad_record_is_dead_lettered_once_with_its_reason_and_original_bytes(run, case):
    bad = next(b for b in run["stream"].bad if b.case == case)
    s = bad.sent
    dls = [
        d
        for d in run["out"]["dead_letter"]
        if (d.source_topic, d.source_partition, d.source_offset) == (s.topic, s.partition, s.offset)
    ]
    assert len(dls) == 1, dls
    [d] = dls
    assert d.reason == bad.reason, d.detail
    assert d.value == s.value and d.key == s.key
    assert d.detail  # says what was wrong
    # No output of any kind carries the bad record's event.
    refused = {
        "ghost",
        "nobody-1",
        "nobody-2",
        "wt",
        "km",
        "mf",
        "nan",
        "inf",
        "huge",
        "nk",
        "dupid",
        "dim4",
        "ragged",
        "empty",
    }
    assert not any(a.event_id in refused for a in run["out"]["actions"] + run["out"]["joined"])


@pytest.mark.parametrize("case", CASES)
def test_good_neighbours_of_a_bad_record_are_decided_and_joined(run, case):
    bad = next(b for b in run["stream"].bad if b.case == case)
    actions = {a.event_id: a for a in run["out"]["actions"]}
    joined = {j.event_id: j for j in run["out"]["joined"]}
    st = run["stream"]
    for event_id in (bad.before, bad.after):
        ctx = st.good_ctx[event_id]
        a = actions[event_id]
        assert a.decision_timestamp_ms == ctx.timestamp_ms
        assert (
            a.features.tobytes() == ctx.features[a.arm_index].tobytes()
            and a.arm_id == ctx.arm_ids[a.arm_index]
        )
        j = joined[event_id]
        assert j.reward_observed and j.reward == st.good[event_id]


def test_dead_letters_are_exactly_the_bad_records(run):
    got = sorted(
        (d.source_topic, d.source_partition, d.source_offset, d.reason)
        for d in run["out"]["dead_letter"]
    )
    want = sorted(
        (b.sent.topic, b.sent.partition, b.sent.offset, b.reason) for b in run["stream"].bad
    )
    assert got == want


def test_every_good_event_is_decided_once_and_joined_with_its_reward(run):
    st, out = run["stream"], run["out"]
    ids = [a.event_id for a in out["actions"]]
    assert sorted(ids) == sorted(list(st.good) + ["pois"]) and len(ids) == len(set(ids))
    joined = {j.event_id: j for j in out["joined"]}
    assert set(joined) == set(st.good) | {"pois"}
    assert all(joined[e].reward_observed and joined[e].reward == v for e, v in st.good.items())
    # Per model, the joined records are its update sequence: versions 0, 1, 2, ... with no gap, so
    # no refused reward was applied on the side.
    for key in ("bad-m", "bad-p"):
        versions = [j.model_version_before for j in out["joined"] if j.model_key == key]
        assert versions == list(range(len(versions)))


def test_duplicate_context_is_answered_by_the_first_decision(run):
    st, out = run["stream"], run["out"]
    first = st.good_ctx["dup"]
    [a] = [
        a for a in out["actions"] if a.event_id == "dup"
    ]  # the view keeps the last one: it must be the first
    assert a.decision_timestamp_ms == first.timestamp_ms and a.arm_id in first.arm_ids
    assert a.features.tobytes() == first.features[a.arm_index].tobytes()
    [j] = [j for j in out["joined"] if j.event_id == "dup"]
    assert j.features.tobytes() == a.features.tobytes()


def test_refused_rewards_leave_the_decision_open_for_the_good_reward(run):
    joined = {j.event_id: j for j in run["out"]["joined"]}
    assert joined["oor"].reward == 1.0 and joined["oor"].reward_observed  # not 2.0
    assert joined["nanr"].reward == 0.0 and joined["nanr"].reward_observed  # not NaN
    assert joined["pois"].reward == 3.0 and joined["pois"].reward_observed  # not -1


def test_unknown_event_is_refused_only_when_its_window_has_passed(run):
    st = run["stream"]
    ghost = next(b for b in st.bad if b.case == "unknown_event").sent
    [d] = [d for d in run["out"]["dead_letter"] if d.reason == reasons.UNKNOWN_EVENT]
    # Event time, not arrival, refuses it: the stream after the ghost spans less than a window
    # until the last good context jumps past it; that context's record is the trigger.
    ghost_ts = codec.decode(ghost.value).timestamp_ms
    by_time = sorted(st.good_ctx.values(), key=lambda c: c.timestamp_ms)
    last, before_last = by_time[-1], by_time[-2]
    assert before_last.timestamp_ms + 1 < ghost_ts + WINDOW_MS <= last.timestamp_ms
    trigger = next(
        s for s in st.sent if s.topic == run["topics"].contexts and s.value == encode(last)
    )
    assert (d.trigger_source, d.trigger_offset) == (0, trigger.offset)


def test_dead_letter_counters_are_in_the_metrics(run):
    want: dict[str, int] = {}
    for b in run["stream"].bad:
        want[f"dead_letter.{b.reason}"] = want.get(f"dead_letter.{b.reason}", 0) + 1
    got = {k: v for k, v in run["metrics"].items() if k.startswith("dead_letter.")}
    assert got == want


def test_the_worker_keeps_running_after_the_bad_records(run, broker):
    st, out, topics = run["stream"], run["out"], run["topics"]
    # Everything after the last bad record was decided and joined with its reward.
    start = st.good_ctx[st.bad[-1].after].timestamp_ms
    later = [e for e, c in st.good_ctx.items() if c.timestamp_ms >= start]
    assert len(later) >= 6
    joined = {j.event_id: j for j in out["joined"]}
    assert all(joined[e].reward_observed and joined[e].reward == st.good[e] for e in later)
    # And it is still up: a new event now is decided and joined.
    t = run["thread"]
    assert t.is_alive()
    ctx = Context("after-all", "bad-m", st.t + 10_000, ("a", "b"), np.full((2, DIM), 0.1))
    prod = run["prod"]
    prod.produce(topics.contexts, key=KEY, value=encode(ctx))
    prod.produce(
        topics.rewards, key=KEY, value=encode(Reward("after-all", "bad-m", st.t + 10_001, 1.0))
    )
    prod.flush(30)
    tail = Tail(broker, topics.joined)
    try:
        seen: list = []
        assert wait_for(
            lambda: seen.extend(tail.read()) or any(j.event_id == "after-all" for j in seen),
            timeout_s=30,
        )
    finally:
        tail.close()
    [j] = [j for j in seen if j.event_id == "after-all"]
    assert j.reward_observed and j.reward == 1.0
    assert t.is_alive()
