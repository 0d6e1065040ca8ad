"""Targets of a replay: several in one pass, frozen ones and ones started from saved states, external
ones given by their probabilities, estimates per model key, and slates (per slot and cascade)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from streambandit.config.models import parse_models_config
from streambandit.engine.decision import action_probabilities
from streambandit.replay.estimators import OffPolicyEvaluator
from streambandit.replay.logged import LogError, LoggedDecision
from streambandit.replay.runner import Target, replay, replay_targets
from streambandit.replay.states import read_model_states, write_model_states

K, D = 4, 3


def config(epsilon=0.1, seed=0, **hyper):
    return parse_models_config(
        {
            "models": [
                {
                    "match": "k-*",
                    "policy": "oful",
                    "dim": D,
                    "hyper": hyper,
                    "reward_window_ms": 1000,
                    "default_reward": 0.0,
                    "epsilon": epsilon,
                    "seed": seed,
                }
            ]
        }
    )


def uniform_log(n, seed=0, keys=("k-a", "k-b")):
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=D)
    out = []
    for t in range(n):
        x = rng.normal(size=(K, D))
        a = int(rng.integers(K))
        r = float(rng.random() < 1 / (1 + np.exp(-x[a] @ theta)))
        out.append(
            LoggedDecision(
                t, f"e{t}", keys[t % len(keys)], tuple(f"a{i}" for i in range(K)), x, a, 1 / K, r
            )
        )
    return out


def values(result):
    return {e.name: (e.value, e.ci_low, e.ci_high) for e in result.estimates}


def test_several_targets_in_one_pass_equal_each_alone():
    log = uniform_log(600)
    a, b = config(lam=1.0), config(lam=5.0, beta_scale=0.1)
    both = replay_targets(
        iter(log), [Target("a", a), Target("b", b, learn=False)]
    )  # one pass over an iterator
    assert list(both) == ["a", "b"]
    assert values(both["a"]) == values(replay(log, a))
    assert values(both["b"]) == values(replay(log, b, learn=False))
    assert both["a"].kind == "learning" and both["b"].kind == "frozen"


def test_a_frozen_target_never_learns_and_decides_as_its_loaded_state(tmp_path):
    log = uniform_log(400)
    trained = replay(log[:200], config(epsilon=0.0))
    assert all(s["n_updates"] > 0 for s in trained.models.values())
    path = tmp_path / "models.avro"
    assert write_model_states(path, trained.models) == 2
    states = read_model_states(path)
    frozen = replay(log[200:], config(epsilon=0.0), learn=False, states=states)
    # The oracle: each model rebuilt from its state, deciding every later row by its argmax.
    spec = config(epsilon=0.0).resolve("k-a")
    for d in log[200:]:
        policy = spec.build()
        policy.load_state_dict(states[d.model_key])
        assert frozen.decisions[d.event_id] == int(np.argmax(policy.scores(d.features)))
    for key, state in frozen.models.items():  # nothing learnt: the loaded states, to the bit
        assert state["n_updates"] == trained.models[key]["n_updates"]
        np.testing.assert_array_equal(state["theta"], trained.models[key]["theta"])


def test_a_state_of_another_configuration_is_refused_naming_the_model():
    trained = replay(uniform_log(50), config(lam=1.0)).models
    with pytest.raises(ValueError, match="the state of model 'k-a' does not fit"):
        replay(uniform_log(10), config(lam=2.0), states=trained)


def test_a_worker_snapshot_is_a_source_of_states(tmp_path):
    from streambandit.engine.partition import PartitionEngine
    from streambandit.wire import Context, InputRef, Reward
    from streambandit.wire.snapshot import pack_snapshot

    cfg = config(epsilon=0.0)
    engine = PartitionEngine(cfg)
    rng = np.random.default_rng(1)
    for i in range(60):
        engine.on_context(
            Context(
                f"e{i}", "k-a", 10 * i, tuple(f"a{j}" for j in range(K)), rng.normal(size=(K, D))
            ),
            InputRef(0, 0, i),
        )
        engine.on_reward(Reward(f"e{i}", "k-a", 10 * i + 1, 1.0), InputRef(1, 0, i))
    engine.advance_to(10**6)
    head = {
        "partition": 0,
        "created_ms": 1,
        "contexts_offset": 1,
        "rewards_offset": 1,
        "actions_offset": 1,
        "joined_offset": 1,
        "dead_letter_offset": 0,
        "chain": 1,
        "seq": 0,
    }
    snap = tmp_path / "p0.snap"
    snap.write_bytes(pack_snapshot(head | {"engine": engine.snapshot()}))
    states = read_model_states(snap)
    assert states["k-a"]["n_updates"] == engine.models["k-a"].n_updates > 0
    np.testing.assert_array_equal(
        states["k-a"]["theta"], engine.models["k-a"].state_dict()["theta"]
    )
    (tmp_path / "junk").write_bytes(b"not a snapshot")
    with pytest.raises(ValueError, match="neither a file of model states nor a worker snapshot"):
        read_model_states(tmp_path / "junk")


def with_external(log, name, probs_of):
    return [dataclasses.replace(d, external=((name, probs_of(d)),)) for d in log]


def test_an_external_target_with_a_frozen_models_probabilities_is_estimated_as_that_model():
    log = uniform_log(500)
    cfg = config(epsilon=0.3)
    states = replay(log[:100], cfg).models
    rest = log[100:]

    def probs(d):
        policy = cfg.resolve(d.model_key).build()
        policy.load_state_dict(states[d.model_key])
        return action_probabilities(policy.scores(d.features), 0.3)

    given = with_external(rest, "theirs", probs)
    out = replay_targets(given, [Target("ours", cfg, learn=False, states=states), Target("theirs")])
    ours, theirs = values(out["ours"]), values(out["theirs"])
    for name in ("ips", "snips", "dm", "dr"):
        np.testing.assert_allclose(theirs[name], ours[name], rtol=1e-12)
    # The same probabilities from a side file (event id -> probabilities) give the same estimates.
    side = {d.event_id: probs(d) for d in rest}
    from_file = replay_targets(rest, [Target("theirs", probs=side)])["theirs"]
    assert values(from_file) == values(out["theirs"])


def test_a_row_one_target_cannot_use_is_skipped_for_every_target():
    log = uniform_log(50)
    given = (
        with_external(log[:25], "x", lambda d: np.full(K, 1 / K)) + log[25:]
    )  # the rest lack x's probabilities
    with pytest.raises(LogError, match="no probabilities of target 'x'"):
        replay_targets(given, [Target("m", config()), Target("x")])
    counts = {}
    out = replay_targets(given, [Target("m", config()), Target("x")], skip_bad=True, counts=counts)
    assert counts["skipped_target"] == 25
    assert out["m"].events == out["x"].events == 25


def test_estimates_per_model_key_are_each_keys_own_log():
    log = uniform_log(600)
    cfg = config()
    result = replay(log, cfg)
    assert set(result.by_key) == {"k-a", "k-b"}
    for key in ("k-a", "k-b"):
        alone = replay(
            [d for d in log if d.model_key == key], cfg
        )  # a key's model sees only its own rows
        assert values(alone) == {
            e.name: (e.value, e.ci_low, e.ci_high) for e in result.by_key[key].estimates
        }
        assert result.by_key[key].events == alone.events


def slate_log(n_slates, seed=0, slots=3):
    """Slates of `slots` rows, the logging policy a uniformly random permutation, so the slot
    propensity of an arm given the ones above is 1 / (K - slot)."""
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n_slates):
        x = rng.normal(size=(K, D))
        perm = rng.permutation(K)
        for k in range(slots):
            a = int(perm[k])
            rows.append(
                LoggedDecision(
                    s,
                    f"s{s}-{k}",
                    "k-a",
                    tuple(f"a{i}" for i in range(K)),
                    x,
                    a,
                    1 / (K - k),
                    float(rng.random() < 0.3 + 0.1 * a),
                    position=k,
                    slate_id=f"s{s}",
                )
            )
    return rows


def test_the_cascade_estimator_is_the_product_of_the_slots_weights_brute_force():
    rows = slate_log(40)
    rng = np.random.default_rng(3)
    pis = [rng.dirichlet(np.ones(K)) for _ in rows]
    ev = OffPolicyEvaluator()
    for d, pi in zip(rows, pis):
        ev.add(
            action=d.action,
            propensity=d.propensity,
            reward=d.reward,
            target_probs=pi,
            predicted=np.zeros(K),
            slate_id=d.slate_id,
            position=d.position,
        )
    est = {e.name: e for e in ev.estimates()}
    # The oracle: per slate, sum_k r_k prod_{j<=k} pi_j(a_j) / p_j, over all rows.
    total = 0.0
    for s in range(40):
        w = 1.0
        for k in range(3):
            i = 3 * s + k
            w *= pis[i][rows[i].action] / rows[i].propensity
            total += w * rows[i].reward
    assert est["cascade"].value == pytest.approx(total / len(rows), rel=1e-12)
    assert est["cascade"].ci_low < est["cascade"].value < est["cascade"].ci_high
    # Per slot, the rows are independent decisions: ips is the plain mean of w r.
    ips = np.mean([pi[d.action] / d.propensity * d.reward for d, pi in zip(rows, pis)])
    assert est["ips"].value == pytest.approx(ips, rel=1e-12)


def test_a_target_decides_each_slot_by_its_ranking():
    rows = slate_log(30)
    result = replay(rows, config(epsilon=0.0), learn=False)
    policy = (
        config(epsilon=0.0).resolve("k-a").build()
    )  # frozen and fresh: the ranking is its prior's
    for d in rows:
        order = np.argsort(-policy.scores(d.features), kind="stable")
        assert result.decisions[d.event_id] == order[d.position]
    assert "cascade" in [e.name for e in result.estimates]


def test_without_slate_ids_there_is_no_cascade_estimate():
    assert "cascade" not in [e.name for e in replay(uniform_log(20), config()).estimates]


def test_a_hashing_dimension_past_the_bound_is_one_clear_error(tmp_path):
    from streambandit.replay.dsjson import read_dsjson
    from streambandit.replay.featurize import MAX_HASH_DIM
    from streambandit.replay.files import read_csv
    from streambandit.replay.obd import read_obd

    huge = 10**9  # would allocate terabytes per row before any dimension check
    with pytest.raises(ValueError, match=f"dim must be an integer in \\[1, {MAX_HASH_DIM}\\]"):
        list(read_dsjson(tmp_path / "none.json", dim=huge))
    with pytest.raises(ValueError, match="user_dim must be an integer"):
        read_obd(tmp_path, user_dim=huge)
    with pytest.raises(ValueError, match="hash_dim must be an integer"):
        list(read_csv(tmp_path / "none.csv", hash_dim=huge))


def test_estimates_per_model_key_take_the_bootstrap_of_the_pooled_ones():
    log = uniform_log(600)
    cfg = config()
    result = replay(log, cfg, bootstrap=200)
    assert {e.interval for e in result.estimates if e.name != "dm"} == {"bootstrap"}
    for key in ("k-a", "k-b"):
        alone = replay([d for d in log if d.model_key == key], cfg, bootstrap=200)
        share = result.by_key[key]
        assert {e.interval for e in share.estimates if e.name != "dm"} == {"bootstrap"}
        # The same replicates as the key's log replayed alone: the interval is the key's own.
        assert values(alone) == {e.name: (e.value, e.ci_low, e.ci_high) for e in share.estimates}
        assert share.logging_value == alone.logging_value
    without = replay(log, cfg).by_key["k-a"].estimates
    assert "bootstrap" not in {e.interval for e in without}


def slot_probs(rows, seed=5):
    """An external target's probabilities for each slate row, a side file's content."""
    rng = np.random.default_rng(seed)
    return {d.event_id: rng.dirichlet(np.ones(K)) for d in rows}


def test_estimates_per_position_are_each_slots_own_rows():
    rows = slate_log(200)
    probs = slot_probs(rows)
    out = replay_targets(rows, [Target("x", probs=probs)], bootstrap=200)["x"]
    assert sorted(out.by_position) == [0, 1, 2]
    for k in range(3):
        slot = [dataclasses.replace(d, slate_id="") for d in rows if d.position == k]
        alone = replay_targets(slot, [Target("x", probs=probs)], bootstrap=200)["x"]
        share = out.by_position[k]
        assert share.events == len(slot) == 200
        got = {e.name: e for e in share.estimates}
        assert "cascade" not in got  # a slot's rows are not slates
        # ips and snips read no reward model: the slot's log alone gives them, intervals and all.
        for name in ("ips", "snips"):
            assert got[name] == alone.estimate(name)
        assert got["ips"].interval == "bootstrap"
        brute = np.mean([probs[d.event_id][d.action] / d.propensity * d.reward for d in slot])
        assert got["ips"].value == pytest.approx(brute, rel=1e-12)
        assert share.logging_value == alone.logging_value
    assert replay(uniform_log(50), config()).by_position == {}  # no slates, no positions


def test_estimates_per_position_are_in_the_json_and_the_markdown(tmp_path):
    from streambandit.replay.report import to_json, to_markdown

    rows = slate_log(100)
    out = replay_targets(rows, [Target("x", probs=slot_probs(rows))])
    doc = to_json(out)["targets"][0]
    assert sorted(doc["by_position"]) == ["0", "1", "2"]
    share = out["x"].by_position[1]
    got = {e["name"]: e for e in doc["by_position"]["1"]["estimates"]}
    snips = next(e for e in share.estimates if e.name == "snips")
    assert (got["snips"]["value"], got["snips"]["ci_low"]) == (snips.value, snips.ci_low)
    assert doc["by_position"]["1"]["events"] == 100 and doc["positions_without_estimates"] == 0
    md = to_markdown(out)
    assert "Per position (0 is the top slot" in md
    line = next(x for x in md.splitlines() if x.startswith("| 1 | 100 |"))
    assert f"{snips.value:.4f} [{snips.ci_low:.4f}, {snips.ci_high:.4f}]" in line


def test_a_target_of_epsilon_one_is_uniform_and_estimated_as_the_uniform_policy():
    from streambandit.replay.report import to_markdown
    from streambandit.replay.runner import LEARNING_NOTE

    log = uniform_log(400)
    uniform = {d.event_id: np.full(K, 1 / K) for d in log}
    out = replay_targets(
        log,
        [
            Target("learns", config(epsilon=1.0)),
            Target("frozen", config(epsilon=1.0), learn=False),
            Target("given", probs=uniform),
            Target("greedy", config(epsilon=0.0)),
        ],
    )
    assert [r.kind for r in out.values()] == ["uniform", "uniform", "external", "learning"]
    for name in ("learns", "frozen"):
        assert LEARNING_NOTE not in out[name].warnings
        for est in ("ips", "snips"):  # read no reward model: exactly the uniform policy's
            assert out[name].estimate(est) == out["given"].estimate(est)
    assert LEARNING_NOTE in out["greedy"].warnings
    md = to_markdown(out)
    assert "| learns | uniform |" in md
    assert "uniform: a configuration whose every model has epsilon = 1" in md
    # A configuration with one model of epsilon < 1 is not uniform.
    mixed = parse_models_config(
        {
            "models": [
                {**spec, "match": m, "epsilon": e}
                for m, e in (("k-a", 1.0), ("k-*", 0.5))
                for spec in [
                    {"policy": "oful", "dim": D, "reward_window_ms": 1, "default_reward": 0.0}
                ]
            ]
        }
    )
    assert Target("m", mixed).kind == "learning"


def _everything(r):
    """A result's numbers and choices, to the bit (not its timing)."""
    fields = dataclasses.asdict(r)
    fields.pop("seconds")
    fields.pop("target")
    return repr(sorted((k, repr(v)) for k, v in fields.items()))


def test_targets_sharing_the_reward_models_get_each_alone_result_to_the_bit():
    """One pass of several targets, some holding records back (decision versions), has each
    target's whole result bit for bit as if it were replayed alone."""
    log = [
        dataclasses.replace(
            d,
            decision_version=max(0, t // 2 - 3) if t % 3 else -1,
            external=(("ext", np.full(K, 1.0 / K)),),
        )
        for t, d in enumerate(uniform_log(500, seed=3))
    ]
    targets = [
        Target("a", config(lam=1.0)),
        Target("b", config(lam=5.0), learn=False),
        Target("ext"),
        Target("c", config(lam=2.0, epsilon=0.3), learn=True),
    ]
    together = replay_targets(iter(log), targets, max_lag=5)
    for t in targets:
        alone = replay_targets(iter(log), [t], max_lag=5)[t.name]
        assert _everything(together[t.name]) == _everything(alone)


def test_rows_sharing_a_read_only_arm_array_replay_as_rows_with_their_own():
    """A reader may give rows of the same arms one read-only array (OBD's rows of the same user
    values): the runner scores it once per model state, to the same result."""
    rng = np.random.default_rng(4)
    shared = [rng.normal(size=(K, D)) for _ in range(3)]
    for x in shared:
        x.flags.writeable = False
    log = [
        dataclasses.replace(d, features=shared[t % 3], position=-1)
        for t, d in enumerate(uniform_log(400, seed=5))
    ]
    copies = [dataclasses.replace(d, features=d.features.copy()) for d in log]
    for epsilon in (0.0, 0.2):
        targets = [Target("a", config(epsilon=epsilon)), Target("b", config(), learn=False)]
        got = replay_targets(log, targets)
        want = replay_targets(copies, targets)
        assert got["a"].matched > 10
        for name in ("a", "b"):
            assert _everything(got[name]) == _everything(want[name])
