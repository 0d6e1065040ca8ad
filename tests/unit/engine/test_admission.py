"""One admission rule (engine/admission.py): the engine, the Decider and a replica refuse the same
hostile inputs with the same reason codes, and each of them refuses through the rule's functions,
not through a check of its own.

The engine is given the records a worker would decode from each call (its Kafka timestamp the
callers' clock); the replica is a real ``Replica`` that was never started (no broker: ready by
hand, its produce captured), so its own ``rank`` and ``reward`` run.
"""

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.engine import admission
from streambandit.engine.admission import DecisionError, Refusal
from streambandit.engine.partition import PartitionEngine, Rejected
from streambandit.serving.decider import Decider
from streambandit.serving.replica import Replica
from streambandit.wire import Context, InputRef, Reward

CLOCK = 50_000
AHEAD_MS, ID_BYTES, MAX_MODELS = 1_000, 64, 3
MODELS = {
    "models": [
        {
            "match": "ads-*",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 60_000,
            "default_reward": 0.0,
            "epsilon": 0.2,
        },
        {
            "match": "clicks-*",
            "policy": "glb_omd",
            "dim": 3,
            "reward_window_ms": 60_000,
            "default_reward": 0.0,
            "hyper": {"link": "logistic"},
        },
        {
            "match": "counts-*",
            "policy": "glb_omd",
            "dim": 3,
            "reward_window_ms": 60_000,
            "default_reward": 0.0,
            "hyper": {"link": "poisson"},
        },
    ]
}
CONFIG = parse_models_config(MODELS)
ARMS = ("a", "b")
X = np.array([[0.5, 0.0, 0.1], [0.0, 0.5, 0.2]])
# Open decisions of each model before a hostile call; MAX_MODELS models are then held.
OPEN = (("e1", "ads-1"), ("c1", "clicks-1"), ("p1", "counts-1"))


class EngineCaller:
    """The partition engine, fed the records of the calls."""

    def __init__(self) -> None:
        self.engine = PartitionEngine(
            CONFIG, max_id_bytes=ID_BYTES, max_event_time_ahead_ms=AHEAD_MS, max_models=MAX_MODELS
        )
        self.offset = 0

    def _ref(self, source: int) -> InputRef:
        self.offset += 1
        return InputRef(source, 0, self.offset, timestamp_ms=CLOCK)

    def _raise_refusal(self, out: list, ref: InputRef) -> None:
        for o in out:
            if isinstance(o, Rejected) and o.source is ref:
                raise DecisionError(o.reason, o.detail)

    def rank(self, event_id, model_key, arm_ids, features, timestamp_ms=CLOCK):
        ref = self._ref(0)
        context = Context(
            event_id,
            model_key,
            timestamp_ms,
            tuple(arm_ids),
            np.asarray(features, dtype=np.float64),
        )
        self._raise_refusal(self.engine.on_context(context, ref), ref)

    def reward(self, event_id, value, model_key, timestamp_ms=CLOCK):
        ref = self._ref(1)
        self._raise_refusal(
            self.engine.on_reward(Reward(event_id, model_key, timestamp_ms, value), ref), ref
        )

    def close(self) -> None:
        pass


class DeciderCaller:
    def __init__(self) -> None:
        self.decider = Decider(
            MODELS,
            clock=lambda: CLOCK,
            max_id_bytes=ID_BYTES,
            max_event_time_ahead_ms=AHEAD_MS,
            max_models=MAX_MODELS,
        )

    def rank(self, event_id, model_key, arm_ids, features, timestamp_ms=CLOCK):
        self.decider.rank(event_id, model_key, list(arm_ids), features, timestamp_ms=timestamp_ms)

    def reward(self, event_id, value, model_key, timestamp_ms=CLOCK):
        self.decider.reward(event_id, value, model_key=model_key, timestamp_ms=timestamp_ms)

    def close(self) -> None:
        pass


class ReplicaCaller:
    """A replica that never started: no broker to follow, ready by hand, what it logs kept here."""

    def __init__(self) -> None:
        config = WorkerConfig(
            bootstrap_servers="127.0.0.1:9",
            models=CONFIG,
            max_id_bytes=ID_BYTES,
            max_event_time_ahead_ms=AHEAD_MS,
        )
        self.replica = Replica(config, None, clock=lambda: CLOCK, max_models=MAX_MODELS)
        self.replica.ready.set()
        self.logged: list = []
        self.replica._produce = lambda topic, key, value: self.logged.append((topic, key, value))

    def rank(self, event_id, model_key, arm_ids, features, timestamp_ms=CLOCK):
        self.replica.rank(event_id, model_key, list(arm_ids), features, timestamp_ms=timestamp_ms)

    def reward(self, event_id, value, model_key, timestamp_ms=CLOCK):
        self.replica.reward(event_id, value, model_key=model_key, timestamp_ms=timestamp_ms)

    def close(self) -> None:
        self.replica.close()


CALLERS = {"engine": EngineCaller, "decider": DeciderCaller, "replica": ReplicaCaller}


@pytest.fixture
def callers():
    """The three, each with the decisions of OPEN made (MAX_MODELS models held)."""
    made = {name: cls() for name, cls in CALLERS.items()}
    try:
        for c in made.values():
            for event_id, key in OPEN:
                c.rank(event_id, key, ARMS, X, timestamp_ms=CLOCK - 100)
        yield made
    finally:
        for c in made.values():
            c.close()


def rank(event_id="h1", model_key="ads-1", arm_ids=ARMS, features=X, timestamp_ms=CLOCK):
    return lambda c: c.rank(
        event_id, model_key, arm_ids, np.asarray(features, dtype=np.float64), timestamp_ms
    )


def reward(event_id="e1", value=1.0, model_key="ads-1", timestamp_ms=CLOCK):
    return lambda c: c.reward(event_id, value, model_key, timestamp_ms)


def with_value(value, i=0, j=0):
    x = X.copy()
    x[i, j] = value
    return x


HOSTILE = {
    "NaN feature": (rank(features=with_value(np.nan)), "non_finite_features"),
    "infinite feature": (rank(features=with_value(np.inf, 1, 2)), "non_finite_features"),
    "negative infinite feature": (rank(features=with_value(-np.inf)), "non_finite_features"),
    "huge feature": (rank(features=with_value(1e300)), "feature_out_of_range"),
    "negative feature past the bound": (
        rank(features=with_value(-2e6, 1, 1)),
        "feature_out_of_range",
    ),
    "not the model's dimension": (rank(features=np.zeros((2, 4))), "bad_dimension"),
    "more feature rows than arms": (rank(features=np.zeros((3, 3))), "bad_dimension"),
    "fewer feature rows than arms": (rank(arm_ids=("a", "b", "c")), "bad_dimension"),
    "rows of no features": (rank(features=np.zeros((2, 0))), "bad_dimension"),
    "no arms": (rank(arm_ids=(), features=np.zeros((0, 3))), "empty_arms"),
    "an arm id twice": (rank(arm_ids=("a", "a")), "duplicate_arm_id"),
    "event id past max_id_bytes": (rank(event_id="e" * (ID_BYTES + 1)), "id_too_long"),
    "event id past max_id_bytes in UTF-8 only": (
        rank(event_id="é" * (ID_BYTES // 2 + 1)),
        "id_too_long",
    ),
    "model key past max_id_bytes": (rank(model_key="ads-" + "k" * ID_BYTES), "id_too_long"),
    "chosen arm's id past max_id_bytes": (
        rank(arm_ids=("a" * (ID_BYTES + 1),), features=X[:1]),
        "id_too_long",
    ),
    "event time far ahead": (rank(timestamp_ms=CLOCK + AHEAD_MS + 1), "event_time_ahead"),
    "unknown model key": (rank(model_key="nobody"), "unknown_model"),
    "event id decided before": (rank(event_id="e1"), "duplicate_event"),
    "a model past max_models": (rank(model_key="ads-new"), "too_many_models"),
    "NaN reward": (reward(value=float("nan")), "non_finite_reward"),
    "infinite reward": (reward(value=float("-inf")), "non_finite_reward"),
    "huge reward": (reward(value=1e300), "reward_out_of_range"),
    "reward outside [0, 1] for the logistic link": (
        reward("c1", 2.0, "clicks-1"),
        "reward_out_of_range",
    ),
    "negative reward for the Poisson link": (reward("p1", -1.0, "counts-1"), "reward_out_of_range"),
    "reward time far ahead": (reward(timestamp_ms=CLOCK + AHEAD_MS + 1), "event_time_ahead"),
    "reward's event id past max_id_bytes": (reward(event_id="r" * (ID_BYTES + 1)), "id_too_long"),
    "reward of an unknown model key": (reward(event_id="x1", model_key="nobody"), "unknown_model"),
}


@pytest.mark.parametrize("call, reason", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_engine_the_decider_and_a_replica_refuse_the_same_input_with_the_same_reason(
    callers, call, reason
):
    got = {}
    for name, c in callers.items():
        with pytest.raises(DecisionError) as err:
            call(c)
        got[name] = err.value.reason
    assert got == dict.fromkeys(CALLERS, reason)
    # Nothing decided or logged for it: the replica logged only the decisions of OPEN.
    assert len(callers["replica"].logged) == len(OPEN)
    assert {k: m.n_updates for k, m in callers["decider"].decider.models.items()} == dict.fromkeys(
        (key for _, key in OPEN), 0
    )


# A call's form, which a record off a topic has by construction: the Decider's and the replica's.
MALFORMED_CALLS = {
    "negative timestamp": (rank(timestamp_ms=-5), "bad_timestamp"),
    "timestamp not an integer": (rank(timestamp_ms=1.5), "bad_timestamp"),
    "empty event id": (rank(event_id=""), "malformed"),
    "model key not a string": (rank(model_key=7), "malformed"),
    "arm id not a string": (rank(arm_ids=("a", 2)), "malformed"),
    "reward not a number": (reward(value="lots"), "non_finite_reward"),
}


@pytest.mark.parametrize("call, reason", MALFORMED_CALLS.values(), ids=MALFORMED_CALLS.keys())
def test_the_decider_and_a_replica_refuse_a_malformed_call_alike(callers, call, reason):
    for name in ("decider", "replica"):
        with pytest.raises(DecisionError) as err:
            call(callers[name])
        assert err.value.reason == reason, name


def test_a_features_argument_that_is_not_numbers_is_refused_alike(callers):
    for name in ("decider", "replica"):
        with pytest.raises(DecisionError) as err:
            callers[name].rank("h1", "ads-1", ARMS, [["x", 0, 0], [0, 0, 0]])
        assert err.value.reason == "bad_dimension", name


# Each function of the rule, replaced by one that refuses everything with its own name as the
# reason, and a call that reaches it (with the functions that would refuse it first made to pass):
# the three refuse with that name, so each asks the rule and none decides by a check of its own.
RULE_CALLS = {
    "record_refusal": (rank(), ()),
    "id_refusal": (rank(), ()),
    "arms_refusal": (rank(), ()),
    "event_time_refusal": (rank(timestamp_ms=CLOCK + AHEAD_MS + 1), ()),
    "context_refusal": (rank(), ()),
    "unknown_model_refusal": (rank(model_key="nobody"), ()),
    "decided_before": (rank(), ()),
    "model_room_refusal": (rank(model_key="ads-new"), ()),
    "feature_values_refusal": (rank(features=with_value(1e300)), ()),
    "learner_refusal": (rank(features=with_value(1e300)), ("feature_values_refusal",)),
    "reward_value_refusal": (reward(), ()),
    "reward_refusal": (reward(), ()),
}


@pytest.mark.parametrize(
    "function, call, passing", [(f, *v) for f, v in RULE_CALLS.items()], ids=RULE_CALLS.keys()
)
def test_each_of_the_three_refuses_through_the_rule(callers, monkeypatch, function, call, passing):
    monkeypatch.setattr(admission, function, lambda *args: Refusal(function, "the rule, replaced"))
    for other in passing:
        monkeypatch.setattr(admission, other, lambda *args: None)
    for name, c in callers.items():
        with pytest.raises(DecisionError) as err:
            call(c)
        assert err.value.reason == function, name


def test_a_good_call_passes_all_three(callers):
    """The table's refusals are the inputs', not the callers': the same calls, well formed, pass."""
    for c in callers.values():
        rank()(c)
        reward("c1", 1.0, "clicks-1")(c)
        reward("p1", 3.0, "counts-1")(c)
    assert len(callers["replica"].logged) == len(OPEN) + 3
