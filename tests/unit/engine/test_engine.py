"""The partition engine: joins on event time, aggregation, bounded buffers, refusals with reasons."""

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.config.models import parse_models_config
from streambandit.engine.partition import Action, Context, Joined, PartitionEngine, Rejected, Reward
from streambandit.sim.ads import AdTraffic

D = 3


def engine(
    aggregation="first",
    window=100,
    default=0.0,
    policy="oful",
    epsilon=0.0,
    dim=D,
    hyper=None,
    **kw,
):
    cfg = parse_models_config(
        {
            "models": [
                {
                    "match": "m*",
                    "policy": policy,
                    "dim": dim,
                    "reward_window_ms": window,
                    "default_reward": default,
                    "aggregation": aggregation,
                    "epsilon": epsilon,
                    "hyper": hyper or {},
                }
            ]
        }
    )
    return PartitionEngine(cfg, **kw)


def ctx(eid, ts, key="m1", k=3, dim=D, seed=0):
    feats = np.random.default_rng([seed, int(ts)]).standard_normal((k, dim)) / 2
    return Context(eid, key, ts, tuple(f"a{i}" for i in range(k)), feats)


def kinds(out):
    return [type(o).__name__ for o in out]


def test_a_reward_inside_the_window_is_joined_and_applied_once():
    e = engine()
    [a] = e.on_context(ctx("e1", 10))
    assert isinstance(a, Action) and a.model_version == 0 and a.propensity == 1.0
    [j] = e.on_reward(Reward("e1", "m1", 50, 1.0))
    assert (
        isinstance(j, Joined)
        and j.reward == 1.0
        and j.reward_observed
        and j.model_version_before == 0
    )
    assert np.array_equal(j.features, a.features)
    assert e.models["m1"].n_updates == 1
    [r] = e.on_reward(Reward("e1", "m1", 60, 1.0))
    assert isinstance(r, Rejected) and r.reason == "duplicate_reward"
    assert e.models["m1"].n_updates == 1


def test_no_reward_gives_the_default_after_the_window_and_a_later_reward_is_late():
    e = engine(window=100, default=0.25)
    e.on_context(ctx("e1", 10))
    assert e.advance_to(109) == []  # window [10, 110) still open
    [j] = e.advance_to(110)
    assert j.reward == 0.25 and not j.reward_observed and j.join_timestamp_ms == 110
    [r] = e.on_reward(Reward("e1", "m1", 120, 1.0))
    assert r.reason == "late_reward"
    assert e.models["m1"].n_updates == 1


def test_the_window_closes_on_event_time_carried_by_other_records():
    e = engine(window=100)
    e.on_context(ctx("e1", 10))
    out = e.on_context(ctx("e2", 500))  # e1's window closed before e2 is decided
    assert kinds(out) == ["Joined", "Action"]
    assert out[1].model_version == 1  # e2 was decided by the updated model


@pytest.mark.parametrize("aggregation, expected", [("sum", 3.5), ("last", 2.0)])
def test_sum_and_last_aggregate_until_the_window_closes(aggregation, expected):
    e = engine(aggregation=aggregation)
    e.on_context(ctx("e1", 10))
    assert e.on_reward(Reward("e1", "m1", 20, 1.5)) == []
    assert e.on_reward(Reward("e1", "m1", 30, 2.0)) == []
    [j] = e.advance_to(110)
    assert j.reward == expected and j.reward_observed


def test_an_early_reward_waits_for_its_context():
    e = engine()
    assert e.on_reward(Reward("e1", "m1", 5, 1.0)) == []
    out = e.on_context(ctx("e1", 10))
    assert kinds(out) == ["Action", "Joined"] and out[1].reward == 1.0


def test_an_early_reward_whose_context_never_comes_is_dead_lettered():
    e = engine(window=100)
    e.on_reward(Reward("e9", "m1", 5, 1.0), source="raw-bytes")
    [r] = e.advance_to(105)
    assert r.reason == "unknown_event" and r.source == "raw-bytes"


@pytest.mark.parametrize(
    "event, reason",
    [
        (ctx("e1", 10, key="other"), "unknown_model"),
        (ctx("e1", 10, dim=D + 1), "bad_dimension"),
        (Reward("e1", "other", 10, 1.0), "unknown_model"),
    ],
)
def test_refusals_carry_a_reason_and_leave_state_alone(event, reason):
    e = engine()
    out = (
        e.on_context(event, source="src")
        if isinstance(event, Context)
        else e.on_reward(event, source="src")
    )
    assert [(o.reason, o.source) for o in out] == [(reason, "src")]
    assert e.models == {} and e.pending == {}


def test_duplicate_context_and_out_of_range_and_mismatched_rewards():
    e = engine(policy="glb_omd", hyper={"link": "logistic"})
    e.on_context(ctx("e1", 10))
    [dup] = e.on_context(ctx("e1", 11))
    assert dup.reason == "duplicate_event"
    [bad] = e.on_reward(Reward("e1", "m1", 12, 3.0))
    assert bad.reason == "reward_out_of_range" and "[0, 1]" in bad.detail
    [mis] = e.on_reward(Reward("e1", "m2", 12, 1.0))
    assert mis.reason == "model_key_mismatch"
    [ok] = e.on_reward(Reward("e1", "m1", 13, 1.0))  # the good reward around them still joins
    assert isinstance(ok, Joined)


def test_bounded_pending_evicts_the_oldest_with_a_joined_record():
    e = engine(max_pending=2, default=0.0)
    e.on_context(ctx("e1", 1))
    e.on_context(ctx("e2", 2))
    out = e.on_context(ctx("e3", 3))
    assert (
        kinds(out) == ["Action", "Joined"]
        and out[1].event_id == "e1"
        and not out[1].reward_observed
    )
    assert list(e.pending) == ["e2", "e3"] and e.counters["evicted_pending"] == 1


def test_bounded_early_rewards_dead_letter_the_oldest():
    e = engine(max_early_rewards=2)
    e.on_reward(Reward("x1", "m1", 1, 1.0), "s1")
    e.on_reward(Reward("x2", "m1", 2, 1.0), "s2")
    [r] = e.on_reward(Reward("x3", "m1", 3, 1.0), "s3")
    assert r.reason == "unknown_event" and r.source == "s1"


def test_early_reward_bound_holds_under_a_hostile_mix_of_rewards():
    """Rewards for unknown ids (several per id), contexts that claim some, and time that expires
    others: the engine's running count of held rewards equals a count of what it holds after every
    record, and the store never holds more than its bound (the oldest is dead-lettered at the
    bound, not before)."""
    rng = np.random.default_rng(7)
    bound = 5
    e = engine(max_early_rewards=bound, window=50, aggregation="sum")
    t, evicted = 0, 0
    for i in range(600):
        t += int(rng.integers(0, 4))
        ev = f"x{int(rng.integers(0, 12))}"
        if rng.random() < 0.7:
            e.advance_to(t)  # what the reward's own time expires, first
            held_before = sum(map(len, e.early.values()))
            becomes_early = ev not in e.pending and ev not in e.recent
            out = e.on_reward(Reward(ev, "m1", t, 1.0), f"s{i}")
            dead = [o for o in out if isinstance(o, Rejected) and "evicted" in o.detail]
            assert len(dead) == (1 if becomes_early and held_before >= bound else 0)
            evicted += len(dead)
        else:
            arms = rng.normal(size=(2, D)) / 2
            e.on_context(
                Context(ev + f"-{i}" if rng.random() < 0.5 else ev, "m1", t, ["a", "b"], arms)
            )
        held = sum(map(len, e.early.values()))
        assert e._n_early == held <= bound
    assert evicted > 0 and e.counters["evicted_early"] == evicted
    restored = PartitionEngine.restore(e.config, e.snapshot(), max_early_rewards=bound)
    assert restored._n_early == sum(map(len, restored.early.values())) == e._n_early


def test_engine_model_equals_a_policy_fed_the_joined_sequence_and_learns():
    """The joined records are the exact update sequence: replaying them into a fresh policy gives
    the engine's model to the bit. And on the simulated ad traffic the learner beats random."""
    traffic = AdTraffic(dim=8, k=5, seed=3)
    hyper = {"link": "logistic", "S": 8.0, "beta_scale": 0.1}
    e = engine(policy="glb_omd", hyper=hyper, dim=8, window=50, epsilon=0.05)
    rng = np.random.default_rng(0)
    joined, chosen_rate, random_rate = [], [], []
    for t in range(3000):
        req = traffic.request(rng)
        out = e.on_context(Context(f"e{t}", "m1", 10 * t, req.ad_ids, req.features))
        a = next(o for o in out if isinstance(o, Action))
        joined += [o for o in out if isinstance(o, Joined)]
        chosen_rate.append(req.click_rates[a.arm_index])
        random_rate.append(req.click_rates.mean())
        if rng.random() < req.click_rates[a.arm_index]:
            joined += e.on_reward(Reward(f"e{t}", "m1", 10 * t + int(rng.integers(1, 40)), 1.0))
    joined += e.advance_to(10**9)
    fresh = make_policy("glb_omd", dim=8, **hyper)
    for j in joined:
        fresh.update(j.features, j.reward)
    mine, theirs = e.models["m1"].state_dict(), fresh.state_dict()
    assert all(
        np.array_equal(mine[k], theirs[k])
        if isinstance(mine[k], np.ndarray)
        else mine[k] == theirs[k]
        for k in mine
    )
    assert len(joined) == 3000 and not e.pending
    assert np.mean(chosen_rate[1500:]) > 1.5 * np.mean(random_rate[1500:])


def test_the_update_count_follows_every_applied_update_and_only_those():
    """``engine.updates`` (the worker's snapshot trigger) equals the models' total n_updates for an
    engine built from nothing, through joins with rewards, joins with the default, a refused
    reward and recovery from the joined log."""
    e = engine(window=50)
    joined = []
    for i in range(30):
        out = e.on_context(ctx(f"e{i}", 10 * i, key=f"m{i % 3}"))
        if i % 2:
            out += e.on_reward(Reward(f"e{i}", f"m{i % 3}", 10 * i + 1, 1.0))
        out += e.on_reward(
            Reward("nobody", "m1", 10 * i + 2, 0.5)
        )  # no such decision: never applied
        joined += [o for o in out if isinstance(o, Joined)]
    joined += [o for o in e.advance_to(10_000) if isinstance(o, Joined)]
    assert e.updates == sum(m.n_updates for m in e.models.values()) == len(joined) == 30
    fresh = engine(window=50)
    fresh.recover_from_logs(joined, [], [], set(), set(), 10_000)
    assert fresh.updates == 30


def test_a_client_inventing_model_keys_never_grows_a_partition_past_the_workers_max_models():
    from streambandit.config.app import parse_worker_config

    raw = {
        "kafka": {"bootstrap.servers": "unused:9092"},
        "worker": {"max_models": 3},
        "models": [
            {
                "match": "m*",
                "policy": "glb_omd",
                "dim": D,
                "reward_window_ms": 100,
                "default_reward": 0.0,
            }
        ],
    }
    cfg, _ = parse_worker_config(raw)
    e = PartitionEngine(cfg.models, **cfg.engine_limits())
    refused = []
    for i in range(10):
        out = e.on_context(ctx(f"e{i}", 10 + i, key=f"m{i}"))
        refused += [o.reason for o in out if isinstance(o, Rejected)]
    assert sorted(e.models) == ["m0", "m1", "m2"] and refused == ["too_many_models"] * 7
    assert kinds(e.on_context(ctx("again", 30, key="m1"))) == [
        "Action"
    ]  # known keys are still served
    restored = PartitionEngine.restore(
        cfg.models, e.snapshot(), **cfg.engine_limits()
    )  # a restart keeps the bound
    [r] = restored.on_context(ctx("new", 40, key="m9"))
    assert isinstance(r, Rejected) and r.reason == "too_many_models" and len(restored.models) == 3
    assert parse_worker_config(raw | {"worker": {}})[0].engine_limits()["max_models"] == 1_000_000
    with pytest.raises(ValueError, match="max_models must be >= 1"):
        parse_worker_config(raw | {"worker": {"max_models": 0}})


def test_windows_close_in_deadline_then_decision_order_whatever_the_event_time_order():
    """Decisions in event times out of order, under two windows: every advance closes exactly the
    decisions whose deadline (event time + window) it passed, in (deadline, decision order)
    order, the order of one priority queue of them all; a restored engine closes the rest the
    same."""
    cfg = parse_models_config(
        {
            "models": [
                {
                    "match": f"{p}*",
                    "policy": "oful",
                    "dim": D,
                    "reward_window_ms": w,
                    "default_reward": 0.0,
                }
                for p, w in (("s", 30), ("l", 100))
            ]
        }
    )
    rng = np.random.default_rng(11)
    e = PartitionEngine(cfg)
    deadlines = {}
    for i in range(400):
        ts = int(rng.integers(0, 30))  # below every deadline: nothing closes while deciding
        key = "s1" if rng.random() < 0.5 else "l1"
        e.on_context(ctx(f"e{i}", ts, key=key))
        deadlines[f"e{i}"] = (ts + (30 if key == "s1" else 100), i)
    restored = PartitionEngine.restore(cfg, e.snapshot())
    closed = set()
    for t in [*range(30, 130, 7), 130]:
        out = e.advance_to(t)
        expected = sorted(
            (d for eid, d in deadlines.items() if d[0] <= t and eid not in closed),
        )
        assert [o.event_id for o in out] == [f"e{i}" for _, i in expected]
        closed |= {o.event_id for o in out}
        again = restored.advance_to(t)
        assert [(o.event_id, o.model_version_before) for o in again] == [
            (o.event_id, o.model_version_before) for o in out
        ]
    assert len(closed) == 400 and not e.pending and not restored.pending


def test_a_deadline_closes_only_the_decision_that_set_it():
    # e1 is joined early (aggregation "first") and forgotten (max_recent 1), then decided again
    # with the same event time: its first decision's deadline, still queued, is not the second's.
    e = engine(aggregation="first", window=100, max_recent=1)
    e.on_context(ctx("e1", 0))
    e.on_reward(Reward("e1", "m1", 1, 1.0))
    e.on_context(ctx("e2", 0))
    e.on_reward(Reward("e2", "m1", 1, 1.0))  # e1 leaves the recent ids
    e.on_context(ctx("x", 0))
    [again] = e.on_context(ctx("e1", 0))
    assert isinstance(again, Action)
    closed = e.advance_to(100)
    assert [j.event_id for j in closed] == ["x", "e1"]  # decision order, each once
