"""The benchmark's stream generator and its adapters, on tiny streams (seconds in all).

The peers are optional (``streambandit[bench]``): their tests skip when the library is absent.
The naive numpy OFUL needs nothing and is an oracle for streambandit's ``oful``: the same rule
computed by re-inverting V must choose the same arms.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.benchmarks import inprocess, peers
from streambandit.benchmarks.stream import cumulative_regret, make_stream, oracle_choices, regret

N, D, K = 60, 4, 5


@pytest.fixture(scope="module")
def tiny():
    return make_stream(N, D, K, noise_sd=0.1, seed=3)


# -- the stream --------------------------------------------------------------------------------


def test_stream_shapes_and_model(tiny):
    assert (
        tiny.arms.shape == (N, K, D)
        and tiny.rewards.shape == (N, K)
        and tiny.mean_rewards.shape == (N, K)
    )
    assert (tiny.n, tiny.n_arms, tiny.dim) == (N, K, D)
    np.testing.assert_allclose(np.linalg.norm(tiny.arms, axis=2), 1.0)
    assert np.linalg.norm(tiny.theta) == pytest.approx(1.0)
    np.testing.assert_allclose(tiny.mean_rewards, tiny.arms @ tiny.theta)
    noise = tiny.rewards - tiny.mean_rewards
    assert 0.05 < noise.std() < 0.2  # sd 0.1 over 300 draws


def test_stream_is_deterministic_by_seed():
    a, b, c = (
        make_stream(20, 3, 4, seed=1),
        make_stream(20, 3, 4, seed=1),
        make_stream(20, 3, 4, seed=2),
    )
    for field in ("arms", "rewards", "mean_rewards", "theta"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.rewards, c.rewards)


def test_noise_free_stream_rewards_are_the_means():
    s = make_stream(10, 3, 4, noise_sd=0.0, seed=0)
    np.testing.assert_array_equal(s.rewards, s.mean_rewards)


def test_stream_rejects_bad_sizes():
    with pytest.raises(ValueError):
        make_stream(0, 3, 4)
    with pytest.raises(ValueError):
        make_stream(5, 3, 4, noise_sd=-1.0)


def test_oracle_regret_is_zero_and_other_choices_are_not(tiny):
    assert regret(tiny, oracle_choices(tiny)) == 0.0
    worst = tiny.mean_rewards.argmin(axis=1)
    cum = cumulative_regret(tiny, worst)
    assert (
        cum.shape == (N,)
        and np.all(np.diff(cum) > 0)
        and regret(tiny, worst) == pytest.approx(cum[-1])
    )
    # A prefix of choices is scored on the same prefix of the stream.
    assert regret(tiny, worst[:10]) == pytest.approx(cum[9])


def test_regret_rejects_out_of_range_choices(tiny):
    with pytest.raises(ValueError):
        regret(tiny, np.full(N, K))
    with pytest.raises(ValueError):
        regret(tiny, np.zeros(N + 1, dtype=np.int64))


# -- the adapters ------------------------------------------------------------------------------


def _run(key: str, stream, n: int | None = None) -> np.ndarray:
    a = peers.adapters(dim=stream.dim, n_arms=stream.n_arms, noise_sd=stream.noise_sd, seed=0)[key]
    data = a.prepare(stream, n or stream.n)
    learner = a.new()
    try:
        if a.train is not None:
            a.train(learner, data)
        chosen = a.run(learner, data)
    finally:
        a.close(learner)
    assert chosen.shape == (n or stream.n,) and chosen.dtype == np.int64
    assert chosen.min() >= 0 and chosen.max() < stream.n_arms
    return chosen


@pytest.mark.parametrize("beta", [0.5, None])
def test_naive_oful_chooses_as_streambandit_oful(tiny, beta):
    """Oracle check: re-inverting V every round gives the arms Sherman-Morrison gives."""
    params = {**peers.oful_params(tiny.noise_sd), "beta": beta}
    ours, naive = make_policy("oful", dim=D, seed=0, **params), peers.NaiveOFUL(D, **params)
    for t in range(N):
        a = tiny.arms[t]
        i, j = ours.select(a), naive.select(a)
        assert i == j, f"event {t}: oful chose {i}, naive OFUL {j}"
        assert ours.beta() == pytest.approx(naive.beta(), rel=1e-9)
        ours.update(a[i], tiny.rewards[t, i])
        naive.update(a[j], tiny.rewards[t, j])
    np.testing.assert_allclose(ours.theta, np.linalg.solve(naive.v, naive.b), rtol=1e-8, atol=1e-10)


def test_streambandit_paths_agree(tiny):
    """play() and the per-call loop are the same learner: the same choices."""
    for name in ("oful", "glb_omd"):
        np.testing.assert_array_equal(_run(f"{name}_play", tiny), _run(f"{name}_call", tiny))
    np.testing.assert_array_equal(_run("naive_oful", tiny), _run("oful_call", tiny))


def test_batch_scoring_scores_every_context(tiny):
    chosen = _run("oful_batch", tiny)
    # After training, select_batch is the frozen policy's select on every context.
    a = peers.adapters(dim=D, n_arms=K, noise_sd=tiny.noise_sd)["oful_batch"]
    p = a.new()
    a.train(p, a.prepare(tiny, N))
    np.testing.assert_array_equal(chosen, [p.select(x) for x in tiny.arms])


def test_oful_learns_on_the_default_model():
    s = make_stream(1500, 5, 5, noise_sd=0.1, seed=0)
    chosen = _run("oful_play", s)
    random_regret = float((s.mean_rewards.max(axis=1) - s.mean_rewards.mean(axis=1)).sum())
    assert regret(s, chosen) < 0.2 * random_regret


def test_vw_adapter(tiny):
    pytest.importorskip("vowpalwabbit")
    lines = peers.vw_action_lines(tiny.arms[0])
    assert len(lines) == K and all(line.startswith("|a f0:") for line in lines)
    for key in peers.VW_EXPLORATIONS:
        first = _run(key, tiny)
        np.testing.assert_array_equal(first, _run(key, tiny))  # seeded: the same run twice


def test_mabwiser_adapter(tiny):
    pytest.importorskip("mabwiser")
    chosen = _run("mabwiser_linucb", tiny, n=30)
    assert chosen[0] == 0


@pytest.mark.parametrize("key", ["river_linucb", "river_shared"])
def test_river_adapters(tiny, key):
    pytest.importorskip("river")
    _run(key, tiny, n=30)


def test_missing_library_is_a_reason_not_an_error():
    assert peers.missing(None) is None
    assert peers.missing("numpy") is None
    reason = peers.missing("surely_not_a_module_xyz")
    assert "not installed" in reason and "streambandit[bench]" in reason


def test_package_imports_without_the_peers():
    """The benchmark modules import with vowpalwabbit, mabwiser and river blocked."""
    code = (
        "import sys\n"
        "for m in ('vowpalwabbit', 'mabwiser', 'river'):\n"
        "    sys.modules[m] = None\n"
        "from streambandit.benchmarks import inprocess, peers, stream\n"
        "rows = peers.adapters(dim=3, n_arms=2, noise_sd=0.1)\n"
        "assert 'vw_squarecb' in rows\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_peers_are_rows_not_failures():
    """With the peers blocked, the run still succeeds and says how to install them."""
    code = (
        "import sys\n"
        "for m in ('vowpalwabbit', 'mabwiser', 'river'):\n"
        "    sys.modules[m] = None\n"
        "from streambandit.benchmarks import inprocess\n"
        "sys.exit(inprocess.main(['--n', '50', '--d', '3', '--K', '2', '--repeats', '1',\n"
        "                         '--only', 'vw_squarecb,mabwiser_linucb,river_linucb']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    for row in (
        "Vowpal Wabbit cb_explore_adf --squarecb",
        "MABWiser LinUCB",
        "River bandit.LinUCBDisjoint",
    ):
        line = next(x for x in out.splitlines() if x.startswith(f"| {row}"))
        assert "not installed (pip install 'streambandit[bench]')" in line
    assert "| streambandit oful, play() | 50 |" in out


# -- the report --------------------------------------------------------------------------------


def test_tiny_run_end_to_end(tmp_path):
    """Two rows in their own processes: the report, the JSON and the ratios hang together."""
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    code = inprocess.main(
        [
            "--n",
            "300",
            "--d",
            "4",
            "--K",
            "3",
            "--repeats",
            "1",
            "--only",
            "naive_oful",
            "--md",
            str(md),
            "--json",
            str(js),
        ]
    )
    assert code == 0
    import json

    result = json.loads(js.read_text())
    rows = {r["key"]: r for r in result["rows"]}
    assert set(rows) == {"oful_play", "naive_oful"}
    assert rows["oful_play"]["us_ratio"] == 1.0 and rows["oful_play"]["regret_ratio"] == 1.0
    # Same rule, same stream: the naive loop regrets exactly as much.
    assert rows["naive_oful"]["regret_ratio"] == pytest.approx(1.0)
    assert rows["naive_oful"]["peak_mib"] >= 0.0
    text = md.read_text()
    assert "| streambandit oful, play() | 300 |" in text and "naive numpy OFUL" in text


def test_bad_options_exit_nonzero():
    assert inprocess.main(["--n", "0"]) == 2
    assert inprocess.main(["--only", "no_such_row"]) == 2


def test_defaults_row_is_compared_with_each_peer_on_the_peers_own_events(tmp_path):
    """oful built from the dimension alone, against River on River's prefix: the target's figure
    is that ratio, recomputed here from the same stream."""
    pytest.importorskip("river")
    import json

    js = tmp_path / "r.json"
    argv = ["--n", "300", "--n-slow", "100", "--d", "4", "--K", "3", "--repeats", "1"]
    argv += [
        "--only",
        "oful_defaults,river_shared",
        "--json",
        str(js),
        "--md",
        str(tmp_path / "r.md"),
    ]
    assert inprocess.main(argv) == 0
    result = json.loads(js.read_text())
    rows = {r["key"]: r for r in result["rows"]}
    stream = make_stream(300, 4, 3, noise_sd=0.1, seed=0)
    chosen = make_policy("oful", dim=4).play(stream.arms, stream.rewards)
    expected = float(cumulative_regret(stream, chosen)[99])
    river = rows["river_shared"]
    assert river["n"] == 100 and river["defaults_regret_same_n"] == pytest.approx(expected)
    target = next(t for t in result["targets"] if t["target"].startswith("oful with defaults"))
    assert target["measured"] == pytest.approx(expected / river["regret"])
    assert target["met"] == (expected <= river["regret"])
    default_scale = make_policy("oful", dim=4).config()["beta_scale"]
    assert f"beta_scale={default_scale:g}" in rows["oful_defaults"]["config"]
