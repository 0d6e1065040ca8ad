"""The row store of the compiled learners (streambandit/policies/rows.py): rows are recycled
fully re-initialised, never shared by two live models or by a model and its copy, and a model on
a row computes bit for bit what it computed with arrays of its own."""

from __future__ import annotations

import copy
import gc
import math
import pickle

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.numerics import kernels
from streambandit.policies import rows
from tests.unit.numerics.test_kernels import stream
from tests.unit.policies.test_policy_contract import assert_same_state

D = 4
CASES = [
    ("oful", {}),
    ("oful", {"beta": 0.7, "lam": 2.0}),
    ("glb_omd", {"link": "logistic"}),
    ("glb_omd", {"link": "gaussian", "S": 0.5}),  # small S: the projection runs often
    ("hvt_ucb", {}),
    ("hvt_ucb", {"epsilon": 0.5, "nu": 2.0, "S": 0.3, "beta_scale": 1.0}),
]


class ArrayModel:
    """The learners as they were before the row store: arrays of their own, driven through the
    same one-event kernels with the radius computed the way the policies computed it in Python."""

    def __init__(self, policy):
        self.name, self.n = policy.name, 0
        c, k = policy.config(), policy._store.consts
        self.c, self.k = c, k
        if self.name == "oful":
            self.theta, self.b, self.inv = np.zeros(D), np.zeros(D), np.eye(D) / c["lam"]
            self.logdet = 0.0
        else:
            self.theta, self.inv, self.m = np.zeros(D), np.eye(D) / c["lam"], np.eye(D) * c["lam"]

    def beta(self) -> float:
        if self.name == "oful":
            return kernels.oful_beta(*self.k["_beta_args"], self.logdet)
        if self.name == "glb_omd":
            return kernels.glb_omd_beta(
                self.c["beta_scale"],
                self.k["_beta_const"],
                self.k["_beta_log_coef"],
                self.k["_beta_t_coef"],
                self.n,
            )
        return self.c["beta_scale"] * (
            self.k["_beta_coef"] * max(self.n, 1) ** self.k["_p"] + self.k["_beta_const"]
        )

    def select(self, arms) -> int:
        return kernels.ucb_argmax(arms, self.theta, self.inv, self.beta())

    def update(self, x, r) -> None:
        work = np.empty(D)
        if self.name == "oful":
            self.logdet += kernels.oful_update(self.inv, self.b, self.theta, x, r, work)
        elif self.name == "glb_omd":
            assert (
                kernels.glb_omd_update(
                    self.theta, self.m, self.inv, x, r, *self.k["_step_args"], work
                )
                == kernels.OK
            )
        else:
            kernels.hvt_ucb_update(
                self.theta, self.m, self.inv, x, r, self.n, self.k["_step_params"], work
            )
        self.n += 1

    def state(self) -> dict:
        if self.name == "oful":
            return {
                "n_updates": self.n,
                "logdet": self.logdet,
                "vinv": self.inv,
                "b": self.b,
                "theta": self.theta,
            }
        second = "h" if self.name == "glb_omd" else "v"
        return {"n_updates": self.n, "theta": self.theta, second: self.m, f"{second}inv": self.inv}


def assert_state_is(policy, expected: dict) -> None:
    got = policy.state_dict()
    for k, v in expected.items():
        if isinstance(v, np.ndarray):
            assert got[k].tobytes() == v.tobytes(), k
        else:
            assert got[k] == v and type(got[k]) is type(v), k


def initial_state(name: str, lam: float) -> dict:
    if name == "oful":
        return {
            "n_updates": 0,
            "logdet": 0.0,
            "vinv": np.eye(D) / lam,
            "b": np.zeros(D),
            "theta": np.zeros(D),
        }
    second = "h" if name == "glb_omd" else "v"
    return {
        "n_updates": 0,
        "theta": np.zeros(D),
        second: np.eye(D) * lam,
        f"{second}inv": np.eye(D) / lam,
    }


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 5 rows, so that a few dozen models span several chunks. The tests using it pass
    seed=SEED: a configuration no other test's live model has, so its store is built here."""
    monkeypatch.setattr(rows, "CHUNK_ROWS", 5)


SEED = 7919


def where(p) -> tuple[int, int]:
    return id(p._chunk), p._i


@pytest.mark.parametrize("name, params", CASES)
def test_many_models_across_chunks_are_bitwise_the_per_model_array_learners(
    name, params, small_chunks
):
    link = params.get("link", "gaussian")
    models = [make_policy(name, dim=D, seed=SEED, **params) for _ in range(23)]
    assert models[0]._store.rows_per_chunk == 5 and len(models[0]._store.chunks) == 5
    refs = [ArrayModel(m) for m in models]
    streams = [stream(seed, 40, 5, D, link) for seed in range(len(models))]
    for t in range(40):  # interleaved, so a kernel writing a neighbouring row would show
        for m, ref, (arms, rewards) in zip(models, refs, streams):
            i = m.select(arms[t])
            assert i == ref.select(arms[t])
            m.update(arms[t, i], rewards[t, i])
            ref.update(arms[t, i], rewards[t, i])
    for m, ref in zip(models, refs):
        assert_state_is(m, ref.state())
    assert len({where(m) for m in models}) == len(models)


@pytest.mark.parametrize("name, params", CASES)
def test_a_freed_row_is_handed_out_again_fully_reinitialised(name, params, small_chunks):
    arms, rewards = stream(1, 30, 5, D, params.get("link", "gaussian"))
    keep = [make_policy(name, dim=D, seed=SEED, **params) for _ in range(7)]
    dead = make_policy(name, dim=D, seed=SEED, **params)
    dead.play(arms, rewards)
    spot, store = where(dead), dead._store
    live = store.live
    del dead
    gc.collect()
    assert store.live == live - 1
    reborn = make_policy(name, dim=D, seed=SEED, **params)
    assert where(reborn) == spot  # the freed row itself, not a fresh one
    assert_state_is(reborn, initial_state(name, reborn.config()["lam"]))
    # and it learns from there exactly as a model on a never-used row
    fresh = make_policy(name, dim=D, seed=SEED, **params)
    assert where(fresh) != spot
    assert reborn.play(arms, rewards).tolist() == fresh.play(arms, rewards).tolist()
    assert_same_state(reborn.state_dict(), fresh.state_dict())
    assert all(k.n_updates == 0 for k in keep)


def test_live_models_never_share_a_row_under_churn(small_chunks):
    rng = np.random.default_rng(0)
    live: dict[int, object] = {}
    for step in range(400):
        if live and rng.random() < 0.45:
            del live[int(rng.choice(list(live)))]
        else:
            p = make_policy("oful", dim=D, seed=SEED)
            p.update(np.full(D, 0.1), float(step))  # each model's b carries its own birth step
            live[step] = p
        spots = [where(p) for p in live.values()]
        assert len(set(spots)) == len(spots)
    for step, p in live.items():
        assert p.n_updates == 1 and np.array_equal(p.b, np.full(D, 0.1) * float(step))
    store = next(iter(live.values()))._store
    assert store.live == len(live) and store.capacity < 400  # freed rows were reused


@pytest.mark.parametrize("name, params", CASES)
@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_a_copy_gets_its_own_row(name, params, how):
    arms, rewards = stream(2, 40, 5, D, params.get("link", "gaussian"))
    p = make_policy(name, dim=D, **params)
    p.play(arms[:20], rewards[:20])
    q = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda m: pickle.loads(pickle.dumps(m)),
    }[how](p)
    assert type(q) is type(p) and where(q) != where(p)
    assert_same_state(q.state_dict(), p.state_dict())
    before = p.state_dict()
    q.play(arms[20:], rewards[20:])
    assert_same_state(p.state_dict(), before)  # the original did not move with its copy
    assert q.n_updates == 40 and p.n_updates == 20


def test_a_view_of_the_state_keeps_its_row(small_chunks):
    p = make_policy("oful", dim=D, seed=SEED)
    p.update(np.full(D, 0.5), 1.0)
    theta, spot = p.theta, where(p)
    expected = theta.copy()
    del p
    gc.collect()
    q = make_policy("oful", dim=D, seed=SEED)  # the view holds the model, so its row is not free
    assert where(q) != spot
    q.update(np.full(D, 0.5), -3.0)
    assert np.array_equal(theta, expected)
    theta[0] = 7.0  # and writes through, as the model's own array did
    del theta
    gc.collect()
    assert where(make_policy("oful", dim=D, seed=SEED)) == spot


def test_state_setters_copy_into_the_row():
    p = make_policy("oful", dim=D)
    q = make_policy("oful", dim=D)
    v = np.arange(D, dtype=float)
    p.b = v
    v[0] = 99.0
    assert p.b.tolist() == [0.0, 1.0, 2.0, 3.0] and q.b.tolist() == [0.0] * D
    p.logdet, p.n_updates = 1.5, 3
    assert (p.logdet, p.n_updates, q.logdet, q.n_updates) == (1.5, 3, 0.0, 0)
    assert type(p.logdet) is float and type(p.n_updates) is int


def test_one_store_per_configuration_living_as_long_as_its_models():
    a, b = make_policy("oful", dim=D, lam=3.25), make_policy("oful", dim=D, lam=3.25)
    c, e = make_policy("oful", dim=D, lam=3.5), make_policy("oful", dim=D + 1, lam=3.25)
    assert a._store is b._store and a._config is b._config
    assert c._store is not a._store and e._store is not a._store
    assert make_policy("glb_omd", dim=D)._store is not make_policy("hvt_ucb", dim=D)._store
    key = next(k for k, s in rows._STORES.items() if s is a._store)
    del a, b
    gc.collect()
    assert key not in rows._STORES


def test_rows_per_chunk_shrinks_for_large_rows(monkeypatch):
    monkeypatch.setattr(rows, "CHUNK_BYTES", 10_000)
    p = make_policy("oful", dim=30, lam=1.75, seed=SEED)  # a row is 30 * 32 * 8 + 16 = 7,696 bytes
    assert p._store.rows_per_chunk == 1 and p._chunk[1].shape == (1, 30, 30)
    assert math.isclose(p.beta(), make_policy("oful", dim=30, lam=1.75, seed=SEED).beta())


@pytest.mark.filterwarnings("error")  # an exception in __del__ would surface as a warning
def test_a_failed_constructor_takes_no_row():
    with pytest.raises(ValueError, match="lam"):
        make_policy("oful", dim=D, lam=-1.0)
    gc.collect()


@pytest.mark.parametrize("n", [3, 5, 12])  # less than a chunk, exactly one, two and a tail
def test_adopted_columns_become_rows_and_the_store_keeps_count(small_chunks, n):
    p = make_policy("oful", dim=D, seed=SEED)
    store = p._store
    half_filled = [
        make_policy("oful", dim=D, seed=SEED) for _ in range(2)
    ]  # the bump chunk part used
    before_live, before_cap = store.live, store.capacity
    rng = np.random.default_rng(n)
    columns = tuple(rng.standard_normal((n, *a.shape)).astype(a.dtype) for a in store.initial)
    want = [c.copy() for c in columns]
    got = store.adopt(columns)
    assert len(got) == n and len(set((id(c), i) for c, i in got)) == n
    assert store.live == before_live + n
    full = n - n % store.rows_per_chunk
    for j, (chunk, i) in enumerate(got):
        for column, w, src in zip(chunk, want, columns):
            assert column[i].tobytes() == w[j].tobytes()
            assert np.shares_memory(column, src) == (
                j < full
            )  # full chunks are views; the tail a copy
    # Rows handed out after: the bump chunk's unused rows, then the tail's, never an adopted one.
    taken = {(id(c[0]), i) for c, i in got} | {(id(q._chunk[0]), q._i) for q in (p, *half_filled)}
    later = [make_policy("oful", dim=D, seed=SEED) for _ in range(store.capacity - store.live + 3)]
    spots = [(id(q._chunk[0]), q._i) for q in later]
    assert not taken & set(spots) and len(set(spots)) == len(spots)
    assert store.capacity > before_cap and store.live == before_live + n + len(later)


def test_columns_that_do_not_fit_the_store_are_not_adopted(small_chunks):
    store = make_policy("oful", dim=D, seed=SEED)._store
    good = [np.zeros((4, *a.shape), a.dtype) for a in store.initial]
    for bad in (
        good[:-1],
        [good[0][:, :1], *good[1:]],
        [good[0].astype(np.float32), *good[1:]],
        [np.asfortranarray(np.zeros((4, D, D))) if a.ndim == 3 else a for a in good],
    ):
        with pytest.raises(ValueError, match="do not match"):
            store.adopt(tuple(bad))
    readonly = [a.copy() for a in good]
    readonly[0].flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        store.adopt(tuple(readonly))


@pytest.mark.parametrize("name,params", CASES)
def test_every_constant_of_the_store_is_a_property_of_the_model(name, params):
    # The constants are class properties (linear_ucb.py: no __getattr__): one the learner puts in
    # its store but not in _const_names would be unreachable as an attribute.
    p = make_policy(name, dim=D, **params)
    assert set(type(p)._const_names) == set(p._store.consts)
    for key, value in p._store.consts.items():
        assert getattr(p, key) is value
    with pytest.raises(AttributeError):
        p.no_such_constant  # noqa: B018
