"""The per-call entry points of the row learners (streambandit/numerics/row_calls.py): from a
chunk's table they compute what the row kernels compute from the chunk's arrays, to the bit; they
are compiled for one signature and never compile another, whatever a caller passes; and a copied
chunk gets a table of its own arrays."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from streambandit import make_policy
from streambandit.numerics import kernels, row_calls

D, K = 5, 4
LEARNERS = [
    ("oful", {}, kernels.oful_update_row, row_calls.oful_update_at),
    ("glb_omd", {"link": "logistic"}, kernels.glb_omd_update_row, row_calls.glb_omd_update_at),
    ("hvt_ucb", {}, kernels.hvt_ucb_update_row, row_calls.hvt_ucb_update_at),
]


def arms_and_rewards(seed: int, n: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, K, D)) / np.sqrt(D), rng.random((n, K))


@pytest.mark.parametrize("name, params, update_row, update_at", LEARNERS)
def test_the_entry_points_compute_the_row_kernels_bits(name, params, update_row, update_at):
    # Two models of one configuration, driven alike: one through the entry points (its chunk's
    # table), the other through the row kernels (its chunk's arrays).
    at, row = make_policy(name, dim=D, **params), make_policy(name, dim=D, **params)
    kind, store = at._radius_kind, at._store
    arms, rewards = arms_and_rewards(0, 40)
    for t in range(len(arms)):
        a = arms[t]
        out_at, out_row = np.empty(K), np.empty(K)
        assert row_calls.ucb_scores_at(a, at._chunk.table, at._i, out_at) == kernels.OK
        assert (
            kernels.ucb_scores_row(a, *row._chunk, row._i, kind, store.params, out_row)
            == kernels.OK
        )
        assert out_at.tobytes() == out_row.tobytes()
        i = row_calls.ucb_select_at(a, at._chunk.table, at._i)
        assert i == kernels.ucb_select_row(a, *row._chunk, row._i, kind, store.params)
        best = row_calls.ucb_best_at(a, at._chunk.table, at._i)
        assert best == kernels.ucb_best_row(a, *row._chunk, row._i, kind, store.params)
        x = np.ascontiguousarray(a[i])
        assert update_at(at._chunk.table, at._i, x, rewards[t, i]) == kernels.OK
        assert update_row(*row._chunk, row._i, x, rewards[t, i], store.params) == kernels.OK
    mine, theirs = at.state_dict(), row.state_dict()
    assert mine.keys() == theirs.keys()
    for k, v in mine.items():
        assert np.asarray(v).tobytes() == np.asarray(theirs[k]).tobytes(), k
    assert at.n_updates == len(arms)


@pytest.mark.parametrize("name, params, update_row, update_at", LEARNERS)
def test_the_entry_points_refuse_bad_input_with_the_row_kernels_status(
    name, params, update_row, update_at
):
    p = make_policy(name, dim=D, **params)
    table, i = p._chunk.table, p._i
    before = p.state_dict()
    bad_arms = np.ones((K, D))
    bad_arms[1, 2] = np.nan
    assert row_calls.ucb_select_at(bad_arms, table, i) == kernels.BAD_ARMS
    assert row_calls.ucb_select_at(np.ones((K, D + 1)), table, i) == kernels.BAD_SHAPE
    assert row_calls.ucb_select_at(np.ones((0, D)), table, i) == kernels.NO_ARMS
    assert update_at(table, i, np.ones(D + 1), 0.5) == kernels.BAD_SHAPE
    assert update_at(table, i, np.full(D, np.inf), 0.5) == kernels.BAD_X
    assert update_at(table, i, np.ones(D) / D, np.nan) == kernels.BAD_REWARD
    after = p.state_dict()
    for k, v in before.items():
        assert np.asarray(v).tobytes() == np.asarray(after[k]).tobytes(), k


def test_odd_input_compiles_nothing_and_goes_through_the_checks():
    p = make_policy("oful", dim=D)
    arms = arms_and_rewards(1, 1)[0][0]
    want = p.select(arms), p.scores(arms).tobytes(), p.best(arms)
    read_only = arms.copy()
    read_only.flags.writeable = False
    odd = [
        read_only,
        np.asfortranarray(arms),
        arms.astype(">f8"),
        arms.tolist(),
        np.zeros((K, 2 * D))[:, ::2] + arms,  # strided
    ]
    for a in odd:
        assert (p.select(a), p.scores(a).tobytes(), p.best(a)) == want
    for dispatcher, _ in row_calls._SCORING:
        assert len(dispatcher.signatures) == 1, dispatcher
    p.update(arms[0].tolist(), 1)  # a list and an int: converted by the checks
    p.update(arms[0].astype(np.float32), 0.5)
    assert p.n_updates == 2
    assert len(row_calls.oful_update_at.signatures) == 1


def test_a_copied_chunk_has_a_table_of_its_own_arrays():
    p = make_policy("oful", dim=D)
    p.update(np.ones(D) / D, 1.0)
    chunk = p._chunk
    for other in (pickle.loads(pickle.dumps(chunk)), copy.deepcopy(chunk)):
        assert type(other) is type(chunk) and other.table != chunk.table
        table = other._table
        for column, entry in zip(other, range(row_calls.PARAMS)):
            assert table[entry] == column.__array_interface__["data"][0]
            assert not np.shares_memory(column, chunk[entry])
        arms = np.eye(D)
        assert row_calls.ucb_best_at(arms, other.table, p._i) == row_calls.ucb_best_at(
            arms, chunk.table, p._i
        )


def test_a_chunk_table_refuses_columns_the_kernels_cannot_read():
    p = make_policy("oful", dim=D)
    columns = tuple(p._chunk)
    params = p._store.params
    with pytest.raises(ValueError):
        row_calls.chunk_table((np.asfortranarray(columns[0]), *columns[1:]), params, 0)
    with pytest.raises(ValueError):
        row_calls.chunk_table((np.zeros(columns[0].shape, np.float32), *columns[1:]), params, 0)
    with pytest.raises(ValueError):
        row_calls.chunk_table((columns[0][:-1], *columns[1:]), params, 0)


class _NoRowKernels:
    """Stands for the kernels module where the policies fall back to the row kernels: any use of
    one fails the test."""

    OK, BAD_ARMS = kernels.OK, kernels.BAD_ARMS

    def __getattr__(self, name):
        raise AssertionError(f"the fallback called kernels.{name}")


@pytest.mark.parametrize("name, params, update_row, update_at", LEARNERS)
def test_the_engines_calls_take_the_entry_points(name, params, update_row, update_at, monkeypatch):
    # What the worker's engine passes (engine/partition.py): a context's features as the batch
    # decoder makes them (a view of one (contexts, K, d) array), the chosen arm's row copied, a
    # float reward. None of them may fall back to the checks in Python and the row kernels.
    from streambandit.policies import linear_ucb

    p, ref = make_policy(name, dim=D, **params), make_policy(name, dim=D, **params)
    arms, rewards = arms_and_rewards(2, 30)
    batch = list(np.ascontiguousarray(arms))
    want = []
    for a, r in zip(batch, rewards):
        i, score = ref.best(np.array(a))
        want.append((i, score))
        ref.update(np.array(a[i]), float(r[i]))
    monkeypatch.setattr(linear_ucb, "kernels", _NoRowKernels())
    monkeypatch.setattr(type(p), "_update", None)  # the fallback's update
    for a, r, w in zip(batch, rewards, want):
        best = p.best(a)
        assert type(best) is tuple and type(best[0]) is int and type(best[1]) is float
        assert best == w
        p.update(a[best[0]].copy(), float(r[best[0]]))
    for k, v in ref.state_dict().items():
        assert np.asarray(v).tobytes() == np.asarray(p.state_dict()[k]).tobytes(), k


def test_the_entry_points_hold_the_gil():
    # Releasing the GIL costs a per-call entry point as much as typing its arguments (row_calls.py).
    for dispatcher in (*(d for d, _ in row_calls._SCORING), *(u for *_, u in LEARNERS)):
        assert not dispatcher.targetoptions.get("nogil", False), dispatcher
