"""Adapters that run one learner over a prefix of a :class:`~streambandit.benchmarks.stream.Stream`.

Every adapter has the same three steps, so the timing code treats them alike:

  ``prepare(stream, n)``  turn the stream into the library's own input format (VW text lines,
                          River dicts, numpy views); not timed, like reading the data from disk;
  ``new()``               a fresh, untrained learner; not timed, but inside the memory window;
  ``run(learner, data)``  decide + update for events 0..n-1 with the reward of the chosen arm
                          revealed after each decision; timed; returns the chosen arms (n,) int64.
  ``close(learner)``      release native resources (VW's workspace); not timed.

The peer libraries (vowpalwabbit, mabwiser, river) are benchmark-only dependencies: they are
imported inside the adapters, and :func:`missing` says which one is absent instead of failing.
The naive numpy OFUL has no dependency; it is what a user writes first (keep V, invert it every
round) and doubles as an oracle for streambandit's ``oful`` (same choices, see the tests).
"""

from __future__ import annotations

import importlib.util
import math
import random
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from streambandit.benchmarks.stream import Stream

__all__ = ["Adapter", "adapters", "NaiveOFUL", "missing", "oful_params", "glb_omd_params"]

INSTALL_HINT = "not installed (pip install 'streambandit[bench]')"
# The row of streambandit's oful built from the dimension alone: what a user gets untuned.
DEFAULTS_KEY = "oful_defaults"


def missing(module: str | None) -> str | None:
    """None if ``module`` can be imported (or no module is needed), else the reason it cannot."""
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"{module} {INSTALL_HINT}"


# -- hyper-parameters, from the stream's known model -------------------------------------------


def oful_params(noise_sd: float) -> dict[str, Any]:
    """streambandit ``oful`` told what the stream is: R = noise_sd, S = ||theta*|| = 1, lam = 1,
    the Abbasi-Yadkori theory radius (beta=None, beta_scale=1), no tuning."""
    return {"lam": 1.0, "noise_sd": noise_sd, "S": 1.0, "delta": 0.05, "beta_scale": 1.0}


def glb_omd_params(noise_sd: float) -> dict[str, Any]:
    """streambandit ``glb_omd`` with the Gaussian link (the stream is linear-Gaussian): S = 1,
    dispersion g(tau) = sigma^2, everything else at the paper's defaults (lam = d, eq. (5) radius)."""
    return {"link": "gaussian", "S": 1.0, "dispersion": noise_sd**2}


# -- the naive numpy OFUL ----------------------------------------------------------------------


class NaiveOFUL:
    """OFUL as a user writes it first: keep V and b, call ``np.linalg.inv(V)`` every round.

    Same rule as streambandit's ``oful`` (Abbasi-Yadkori et al. 2011): score = x'theta +
    beta_t ||x||_{V^-1}, theta = V^-1 b, with either a constant ``beta`` or the Theorem 2 radius
    ``noise_sd sqrt(2 log(1/delta) + log det V - d log lam) + sqrt(lam) S`` times ``beta_scale``.
    log det V is kept
    with the determinant lemma from the inverse the decision already computed, so the naive loop
    pays one inversion per round and no more (its cost is not inflated by an extra slogdet).
    """

    def __init__(
        self,
        dim: int,
        *,
        lam: float = 1.0,
        beta: float | None = None,
        noise_sd: float = 1.0,
        S: float = 1.0,
        delta: float = 0.05,
        beta_scale: float = 1.0,
    ) -> None:
        self.v = lam * np.eye(dim)
        self.b = np.zeros(dim)
        self.beta_const = beta
        self.beta_scale = beta_scale
        self.noise_sd = noise_sd
        self.two_log_inv_delta = 2.0 * math.log(1.0 / delta)
        self.sqrt_lam_s = math.sqrt(lam) * S
        self.logdet = 0.0  # log det V - d log lam
        self._vinv: np.ndarray | None = None

    def beta(self) -> float:
        if self.beta_const is not None:
            return self.beta_const
        radius = self.noise_sd * math.sqrt(self.two_log_inv_delta + self.logdet) + self.sqrt_lam_s
        return self.beta_scale * radius

    def select(self, arms: np.ndarray) -> int:
        vinv = np.linalg.inv(self.v)
        self._vinv = vinv
        theta = vinv @ self.b
        bonus = np.sqrt(np.maximum(np.einsum("kd,de,ke->k", arms, vinv, arms), 0.0))
        return int(np.argmax(arms @ theta + self.beta() * bonus))

    def update(self, x: np.ndarray, reward: float) -> None:
        vinv = self._vinv if self._vinv is not None else np.linalg.inv(self.v)
        self.logdet += math.log1p(float(x @ vinv @ x))  # det(V + xx') = det(V)(1 + x'V^-1 x)
        self._vinv = None
        self.v += np.outer(x, x)
        self.b += reward * x


# -- the adapter record ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Adapter:
    """One row of the benchmark: how to build and run a learner, and what it was configured with."""

    key: str
    label: str
    module: str | None  # the optional library it needs, None for streambandit / numpy
    config: str  # one line for the report: what the learner was configured with
    prepare: Callable[[Stream, int], Any]
    new: Callable[[], Any]
    run: Callable[[Any, Any], np.ndarray]
    close: Callable[[Any], None] = lambda learner: None
    # "stream": decide + update every event; "batch": score with no update after training on the
    # stream (``train`` is run untimed first); decisions/s is the figure.
    kind: str = "stream"
    train: Callable[[Any, Any], None] | None = None
    slow: bool = False  # time on the first n_slow events only


def _np_prepare(stream: Stream, n: int) -> tuple[np.ndarray, np.ndarray]:
    return stream.arms[:n], stream.rewards[:n]


def _loop(policy: Any, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The per-call path: ``select`` then ``update`` with the chosen arm's reward, event by event."""
    arms, rewards = data
    chosen = np.empty(arms.shape[0], dtype=np.int64)
    for t in range(arms.shape[0]):
        a = arms[t]
        i = policy.select(a)
        policy.update(a[i], rewards[t, i])
        chosen[t] = i
    return chosen


def _play(policy: Any, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The compiled path ``policy.play(arms, rewards)`` when the policy has it, else the loop."""
    if hasattr(policy, "play"):
        return np.asarray(policy.play(*data), dtype=np.int64)
    return _loop(policy, data)


def _select_batch(policy: Any, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Score every context against the current state with no update (``select_batch`` or a loop)."""
    arms = data[0]
    if hasattr(policy, "select_batch"):
        return np.asarray(policy.select_batch(arms), dtype=np.int64)
    return np.fromiter((policy.select(a) for a in arms), dtype=np.int64, count=arms.shape[0])


def has_method(name: str, method: str, dim: int = 2) -> bool:
    """Whether streambandit's policy ``name`` has ``method`` (play, select_batch) in this build."""
    from streambandit import make_policy

    return hasattr(make_policy(name, dim=dim), method)


# -- streambandit ------------------------------------------------------------------------------


def _streambandit(name: str, params: dict[str, Any], dim: int) -> dict[str, Adapter]:
    from streambandit import make_policy

    def new() -> Any:
        return make_policy(name, dim=dim, seed=0, **params)

    conf = ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()
    )
    return {
        f"{name}_play": Adapter(
            key=f"{name}_play",
            label=f"streambandit {name}, play()",
            module=None,
            config=f"{name}: {conf}; `play(arms, rewards)` over the whole stream in one call",
            prepare=_np_prepare,
            new=new,
            run=_play,
        ),
        f"{name}_call": Adapter(
            key=f"{name}_call",
            label=f"streambandit {name}, select + update per call",
            module=None,
            config=f"{name}: {conf}; `select(arms)` then `update(x, r)` from a Python loop",
            prepare=_np_prepare,
            new=new,
            run=_loop,
        ),
        f"{name}_batch": Adapter(
            key=f"{name}_batch",
            label=f"streambandit {name}, select_batch() (no update)",
            module=None,
            config=f"{name}: {conf}; trained by play() on the stream, then `select_batch` scores all n contexts",
            prepare=_np_prepare,
            new=new,
            run=_select_batch,
            kind="batch",
            train=_play,
        ),
    }


def _streambandit_defaults(dim: int) -> Adapter:
    from streambandit import make_policy

    c = make_policy("oful", dim=dim).config()
    return Adapter(
        key=DEFAULTS_KEY,
        label="streambandit oful, defaults",
        module=None,
        config=f'`make_policy("oful", dim={dim})` and nothing else (so beta_scale={c["beta_scale"]:g}, '
        f"noise_sd={c['noise_sd']:g}, S={c['S']:g}, lam={c['lam']:g}); `play(arms, rewards)` over "
        "the whole stream in one call",
        prepare=_np_prepare,
        new=lambda: make_policy("oful", dim=dim),
        run=_play,
    )


# -- naive numpy OFUL --------------------------------------------------------------------------


def _naive(noise_sd: float, dim: int) -> Adapter:
    p = oful_params(noise_sd)
    return Adapter(
        key="naive_oful",
        label="naive numpy OFUL (np.linalg.inv every round)",
        module=None,
        config="the same rule and radius as streambandit oful; V kept, `np.linalg.inv(V)` every round",
        prepare=_np_prepare,
        new=lambda: NaiveOFUL(dim, **p),
        run=_loop,
    )


# -- Vowpal Wabbit -----------------------------------------------------------------------------

VW_EXPLORATIONS = {"vw_squarecb": "--squarecb", "vw_epsilon": "--epsilon 0.05"}


def vw_action_lines(arms: np.ndarray) -> list[str]:
    """One ADF example in VW text: a line per action, ``|a f0:v0 f1:v1 ...``, no shared line
    (the stream has no shared context: every feature belongs to an arm)."""
    return ["|a " + " ".join(f"f{j}:{v:.7g}" for j, v in enumerate(row)) for row in arms.tolist()]


def _vw(key: str, seed: int) -> Adapter:
    args = f"--cb_explore_adf {VW_EXPLORATIONS[key]} --quiet --random_seed {seed}"

    def prepare(stream: Stream, n: int) -> tuple[list[list[str]], np.ndarray]:
        return [vw_action_lines(a) for a in stream.arms[:n]], stream.rewards[:n]

    def new() -> Any:
        import vowpalwabbit

        return vowpalwabbit.Workspace(args)

    def run(ws: Any, data: tuple[list[list[str]], np.ndarray]) -> np.ndarray:
        texts, rewards = data
        rng = random.Random(seed)
        chosen = np.empty(len(texts), dtype=np.int64)
        for t, lines in enumerate(texts):
            pmf = ws.predict(lines)  # parse + predict: the pmf over actions, in action order
            u = rng.random() * sum(pmf)
            i, acc = len(pmf) - 1, 0.0
            for k, p in enumerate(pmf):
                acc += p
                if u < acc:
                    i = k
                    break
            labelled = list(lines)
            labelled[i] = (
                f"0:{-rewards[t, i]:.7g}:{pmf[i]:.7g} {lines[i]}"  # action:cost:probability
            )
            ws.learn(labelled)  # parse + learn
            chosen[t] = i
        return chosen

    def close(ws: Any) -> None:
        ws.finish()

    return Adapter(
        key=key,
        label=f"Vowpal Wabbit cb_explore_adf {VW_EXPLORATIONS[key]}",
        module="vowpalwabbit",
        config=f'`Workspace("{args}")`, defaults otherwise (cb_type mtr, -b 18); text prepared '
        "beforehand, timed: predict(text) -> pmf, sample with a seeded RNG, learn(text with "
        "`0:cost:prob` on the chosen action, cost = -reward)",
        prepare=prepare,
        new=new,
        run=run,
        close=close,
    )


# -- MABWiser ----------------------------------------------------------------------------------


def _mabwiser(n_arms: int, dim: int, seed: int) -> Adapter:
    def prepare(stream: Stream, n: int) -> tuple[np.ndarray, np.ndarray]:
        return stream.arms[:n].reshape(n, n_arms * dim), stream.rewards[:n]

    def new() -> Any:
        from mabwiser.mab import MAB, LearningPolicy

        return MAB(
            arms=list(range(n_arms)),
            learning_policy=LearningPolicy.LinUCB(alpha=1.0, l2_lambda=1.0),
            seed=seed,
        )

    def run(mab: Any, data: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        contexts, rewards = data
        chosen = np.empty(contexts.shape[0], dtype=np.int64)
        # MABWiser cannot predict before fit: the first event plays arm 0 and fits on it.
        mab.fit([0], [rewards[0, 0]], contexts[:1])
        chosen[0] = 0
        for t in range(1, contexts.shape[0]):
            ctx = contexts[t : t + 1]
            i = mab.predict(ctx)
            mab.partial_fit([i], [rewards[t, i]], ctx)
            chosen[t] = i
        return chosen

    return Adapter(
        key="mabwiser_linucb",
        label="MABWiser LinUCB (disjoint, concatenated arms as context)",
        module="mabwiser",
        slow=True,
        config=f"`MAB(arms=range({n_arms}), LearningPolicy.LinUCB(alpha=1, l2_lambda=1), seed={seed})`; "
        f"context = the {n_arms} arm vectors concatenated ({n_arms * dim} numbers); first event "
        "fit() on arm 0, then predict + partial_fit per event",
        prepare=prepare,
        new=new,
        run=run,
    )


# -- River -------------------------------------------------------------------------------------


def _river_disjoint(n_arms: int, dim: int, seed: int) -> Adapter:
    keys = [f"a{k}_f{j}" for k in range(n_arms) for j in range(dim)]

    def prepare(stream: Stream, n: int) -> tuple[list[dict[str, float]], np.ndarray]:
        flat = stream.arms[:n].reshape(n, n_arms * dim).tolist()
        return [dict(zip(keys, row)) for row in flat], stream.rewards[:n]

    def new() -> Any:
        from river import bandit

        return bandit.LinUCBDisjoint(alpha=1.0, beta=1.0, seed=seed)

    def run(policy: Any, data: tuple[list[dict[str, float]], np.ndarray]) -> np.ndarray:
        contexts, rewards = data
        arm_ids = list(range(n_arms))
        chosen = np.empty(len(contexts), dtype=np.int64)
        for t, ctx in enumerate(contexts):
            i = policy.pull(arm_ids, context=ctx)
            policy.update(i, ctx, rewards[t, i])
            chosen[t] = i
        return chosen

    return Adapter(
        key="river_linucb",
        label="River bandit.LinUCBDisjoint (concatenated arms as context)",
        module="river",
        slow=True,
        config=f"`bandit.LinUCBDisjoint(alpha=1, beta=1, seed={seed})`; context = dict of the "
        f"{n_arms} arm vectors concatenated ({n_arms * dim} keys, dicts built beforehand); pull + update per event",
        prepare=prepare,
        new=new,
        run=run,
    )


def _river_shared(dim: int) -> Adapter:
    keys = [f"f{j}" for j in range(dim)]

    def prepare(stream: Stream, n: int) -> tuple[list[list[dict[str, float]]], np.ndarray]:
        return [
            [dict(zip(keys, row)) for row in a] for a in stream.arms[:n].tolist()
        ], stream.rewards[:n]

    def new() -> Any:
        from river import linear_model

        return linear_model.BayesianLinearRegression(alpha=1.0, beta=1.0)

    def run(model: Any, data: tuple[list[list[dict[str, float]]], np.ndarray]) -> np.ndarray:
        contexts, rewards = data
        chosen = np.empty(len(contexts), dtype=np.int64)
        for t, arms in enumerate(contexts):
            best, i = -math.inf, 0
            for k, x in enumerate(arms):
                dist = model.predict_one(x, with_dist=True)
                ucb = dist.mu + dist.sigma  # the bound River's own LinUCBDisjoint uses
                if ucb > best:
                    best, i = ucb, k
            model.learn_one(arms[i], rewards[t, i])
            chosen[t] = i
        return chosen

    return Adapter(
        key="river_shared",
        label="River BayesianLinearRegression, shared model, UCB by hand",
        module="river",
        slow=True,
        config="one `linear_model.BayesianLinearRegression(alpha=1, beta=1)` on each arm's own "
        "features; score mu + sigma of `predict_one(x, with_dist=True)` per arm (the bound "
        "LinUCBDisjoint uses), `learn_one` on the chosen arm; dicts built beforehand",
        prepare=prepare,
        new=new,
        run=run,
    )


# -- the registry ------------------------------------------------------------------------------


def adapters(*, dim: int, n_arms: int, noise_sd: float, seed: int = 0) -> dict[str, Adapter]:
    """Every row of the benchmark, keyed, in report order (streambandit ``oful_play`` first: the
    reference every ratio is taken against)."""
    rows: dict[str, Adapter] = {}
    rows.update(_streambandit("oful", oful_params(noise_sd), dim))
    rows[DEFAULTS_KEY] = _streambandit_defaults(dim)
    rows.update(_streambandit("glb_omd", glb_omd_params(noise_sd), dim))
    rows["naive_oful"] = _naive(noise_sd, dim)
    for key in VW_EXPLORATIONS:
        rows[key] = _vw(key, seed)
    rows["mabwiser_linucb"] = _mabwiser(n_arms, dim, seed)
    rows["river_linucb"] = _river_disjoint(n_arms, dim, seed)
    rows["river_shared"] = _river_shared(dim)
    return rows
