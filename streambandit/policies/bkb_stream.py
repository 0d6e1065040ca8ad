"""BKB on a stream: a bounded, one-pass kernel bandit with a flat cost per update.

``bkb`` (policies/bkb.py) is Calandriello et al.'s Fig. 1 to the letter: every update redraws the
dictionary over every distinct pulled point and refits, so when each context brings new arm
vectors its state and its time per update grow with t. ``bkb_stream`` keeps what a stream can
afford, O(m_max^2) whatever t:

- **Dictionary grown online by posterior variance** (the sampling of Fig. 1, one point at a time
  as in the streaming rule the paper cites in Sec. 3.2, SQUEAK / KORS): the pulled point ``x``
  joins with probability ``p = min(1, qbar sigma~_t^2(x))`` under the model before the pull, while
  the dictionary has fewer than ``m_max`` points.
- **Model as sufficient statistics in the Nystrom embedding** (sketch/online_nystrom.py): eq. (4)
  from ``G = sum z z'``, ``b = sum z y`` and ``(G + lam I)^-1`` with ``z = L^-1 k_D(x)``, ``L`` the
  Cholesky root of K_DD; a pull is a rank-one update, a joining point one forward solve, O(m^2)
  each. No pulled point is kept beyond the dictionary.
- **Resparsification on the accumulated variance** (BBKB, Calandriello et al. 2020: resparsify
  when the variance accumulated since the last one passes a constant): when the dictionary is
  full, the variances of the pulls that were drawn to join but found no room accumulate; past
  ``resparsify_at`` (and at least ``min_gap`` updates since the last one, so that its O(m^3) cost
  is amortised over O(m) updates) every dictionary point's variance is recomputed and the point
  stays with probability ``min(1, p_new / p_old)`` (SQUEAK's rule), freeing room for new
  directions. Randomness comes from a generator seeded by (seed, update number), as in ``bkb``.
- **beta~**: the practical rule of ``bkb`` and the authors' code,
  ``sqrt(lam) F + xi sqrt(log(t) S + log(1/delta))``, with ``S = sum_s sigma~_t^2(x_s)`` computed
  without the pulls: ``Tr(V^-1 G) = m - lam Tr(V^-1)`` (exactly the sum over the pulls in the
  dictionary's span) plus the variance outside the span of the pulls that never joined, as it was
  at their pull.

With ``qbar = inf`` and ``m_max`` above the number of distinct pulls, every pull is in the span
and the model is exact GP-UCB's (tests/unit/policies/test_bkb_stream.py checks it against the exact
posterior). With a smaller budget it is an approximation without the paper's guarantee: each
joining point's statistics take the earlier pulls by their projection on the dictionary.

Memory per model (m <= m_max dictionary points): the state is ``8 (m d + 3 m^2 + 2 m + 5)`` bytes
(:meth:`BKBStream.state_nbytes`). ``python -m bench.bkb_stream`` measures the time per update and
per decision and the state's bytes at t = 1k, 10k and 100k with new arm vectors every round.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.numerics import rowwise
from streambandit.policies.base import Policy, check_in_range, check_positive, register
from streambandit.sketch import online_nystrom as onl
from streambandit.sketch.nystrom import Kernel

# A point joins only if its kernel row leaves a residual above this share of k(x, x): below it, it
# lies (to rounding) in the span and would make K_DD^-1 ill-conditioned for nothing.
MIN_RESIDUAL = 1e-9
# Tags the generators of the joining draw and of resparsification (a seed shares no draws).
_JOIN_STREAM, _RESPARSIFY_STREAM = 0x5B4B, 0x5B4C
MAX_M = 4096  # the largest dictionary budget: its three m x m matrices are 400 MB


@register
class BKBStream(Policy):
    """Streaming BKB (module docstring): ``score = mu~(x) + beta~ sigma~(x)`` on a dictionary of at
    most ``m_max`` points, O(m_max^2) state and time per update.

    Hyper-parameters (those shared with ``bkb`` mean the same):
      kernel, bandwidth, lam, noise_sd, F, delta, beta, beta_scale: as ``bkb``.
      qbar: oversampling of the joining draw, ``p = min(1, qbar sigma~^2)`` (default 4.0; ``inf``:
        every pull outside the span joins while there is room).
      m_max: the dictionary's budget (default 256).
      resparsify_at: accumulated variance of the pulls refused for lack of room that triggers a
        resparsification (default 1.0).
      min_gap: fewest updates between two resparsifications (default ``m_max // 4``, at least 1).

    An example where every round brings 10 new arms of [-1, 1]^2 and the mean reward is a bump at
    (0.5, -0.5): the dictionary stays within ``m_max``, the learner prefers the bump's centre to a
    far point, and a saved state restores the same scores (booleans and integers, so the example
    reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> centre = np.array([0.5, -0.5])
    >>> p = make_policy("bkb_stream", dim=2, bandwidth=0.5, lam=0.01, beta=0.5, m_max=16)
    >>> for _ in range(500):
    ...     arms = rng.uniform(-1.0, 1.0, size=(10, 2))
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(np.exp(-np.sum((arms[i] - centre) ** 2)) + rng.normal(0, 0.1)))
    >>> p.n_updates, p.dictionary_size <= 16
    (500, True)
    >>> p.select(np.array([[0.5, -0.5], [-0.8, 0.8]]))
    0
    >>> q = make_policy("bkb_stream", dim=2, bandwidth=0.5, lam=0.01, beta=0.5, m_max=16)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(centre[None]), p.scores(centre[None])))
    True
    """

    name = "bkb_stream"
    _state_arrays = ("dictionary", "chol", "gram", "bz", "vinv", "incl")
    _state_arrays_resizable = _state_arrays
    _state_scalars = (
        "n_updates",
        "missed_s2",
        "refused_s2",
        "since_resparsify",
        "resparsifications",
    )

    def __init__(
        self,
        dim: int,
        *,
        kernel: str = "rbf",
        bandwidth: float = 1.0,
        lam: float = 1.0,
        qbar: float = 4.0,
        noise_sd: float = 1.0,
        F: float = 1.0,
        delta: float = 0.1,
        beta: float | None = None,
        beta_scale: float = 1.0,
        m_max: int = 256,
        resparsify_at: float = 1.0,
        min_gap: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        q = float(qbar)
        if not q > 0.0:
            raise ValueError(
                f"qbar must be > 0 (inf: every pull joins while there is room), got {qbar!r}"
            )
        if (
            isinstance(m_max, bool)
            or not isinstance(m_max, (int, np.integer))
            or not 1 <= m_max <= MAX_M
        ):
            raise ValueError(f"m_max must be an integer in [1, {MAX_M}], got {m_max!r}")
        gap = max(int(m_max) // 4, 1) if min_gap is None else min_gap
        if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or gap < 1:
            raise ValueError(f"min_gap must be an integer >= 1, got {min_gap!r}")
        self._config.update(
            kernel=str(kernel),
            bandwidth=check_positive("bandwidth", bandwidth),
            lam=check_positive("lam", lam),
            qbar=q,
            noise_sd=check_in_range("noise_sd", noise_sd, 0.0, math.inf),
            F=check_in_range("F", F, 0.0, math.inf),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            beta=None if beta is None else check_in_range("beta", beta, 0.0, math.inf),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
            m_max=int(m_max),
            resparsify_at=check_positive("resparsify_at", resparsify_at),
            min_gap=int(gap),
        )
        self._kernel = Kernel(self._config["kernel"], self._config["bandwidth"])
        self.dictionary = np.zeros((0, dim))
        self.chol = np.zeros((0, 0))
        self.gram = np.zeros((0, 0))
        self.bz = np.zeros(0)
        self.vinv = np.zeros((0, 0))
        self.incl = np.zeros(0)  # each point's probability of being in the dictionary (SQUEAK's p~)
        self.missed_s2 = 0.0  # variance of the pulls never taken into the dictionary, at their pull
        # variance of the pulls drawn to join but refused for room, since the last resparsification
        self.refused_s2 = 0.0
        self.since_resparsify = 0
        self.resparsifications = 0
        self._refresh()

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        # A tiny budget and gap, so that the dictionary fills, and resparsifies, within a few updates.
        return [
            {
                "bandwidth": 0.5,
                "lam": 0.1,
                "qbar": 2.0,
                "m_max": 4,
                "resparsify_at": 0.05,
                "min_gap": 2,
            },
            {"kernel": "linear", "lam": 0.5, "beta": 0.3, "m_max": 3},
            {"qbar": math.inf, "m_max": 64, "beta_scale": 0.5},
        ]

    # -- diagnostics --------------------------------------------------------------------------

    @property
    def dictionary_size(self) -> int:
        return self.dictionary.shape[0]

    @property
    def n_points(self) -> int:
        """Points held: the dictionary alone (no pulled point is kept)."""
        return self.dictionary_size

    @property
    def pulled_variance_sum(self) -> float:
        """S in beta~ (module docstring)."""
        return self._ssum

    def posterior(self, arms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """eq. (4): ``(mu~, sigma~^2)`` of every arm, sigma~^2 on the 1/lambda scale."""
        return self._posterior(self._check_arms(arms))

    def beta(self) -> float:
        c = self._config
        if c["beta"] is not None:
            return c["beta"]
        width = math.sqrt(
            max(math.log(max(self.n_updates, 1)) * self._ssum + math.log(1.0 / c["delta"]), 0.0)
        )
        return c["beta_scale"] * (math.sqrt(c["lam"]) * c["F"] + c["noise_sd"] * width)

    # -- decisions and updates ----------------------------------------------------------------

    def scores(self, arms: np.ndarray) -> np.ndarray:
        mu, s2 = self._posterior(self._check_arms(arms))
        return mu + self.beta() * np.sqrt(s2)

    def _posterior(self, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lam = self._config["lam"]
        kdiag = self._kernel.diag(a)
        if self.dictionary_size == 0:
            return np.zeros(a.shape[0]), kdiag / lam
        z = onl.forward_solve_rows(
            self._upper, self._kernel(a, self.dictionary)
        )  # (K, m), row by row
        mu = rowwise.matvec(z, self._w)
        resid = kdiag - rowwise.rowdot(z, z)  # outside the dictionary's span (DTC): 0 in it
        s2 = np.maximum(resid, 0.0) / lam + rowwise.rowdot(rowwise.matmul(z, self.vinv), z)
        return mu, np.maximum(s2, 0.0)

    def _update(self, x: np.ndarray, reward: float) -> None:
        c = self._config
        lam = c["lam"]
        xr = x[None, :]
        kxx = float(self._kernel.diag(xr)[0])
        m = self.dictionary_size
        z = (
            onl.forward_solve(self._upper, self._kernel(xr, self.dictionary)[0])
            if m
            else np.zeros(0)
        )
        # sigma~_t^2(x) under the model before this pull (eq. 4).
        resid = kxx - onl.dot(z, z) if m else kxx
        s2 = max(resid, 0.0) / lam + (onl.quad(self.vinv, z)[0] if m else 0.0)
        p = 1.0 if math.isinf(c["qbar"]) else min(1.0, c["qbar"] * s2)
        drawn = _rng(c["seed"], _JOIN_STREAM, self.n_updates).random() < p
        joined = drawn and m < c["m_max"] and resid > MIN_RESIDUAL * kxx
        if joined:
            self.chol, self.gram, self.bz, self.vinv = onl.join(
                self.chol, self.gram, self.bz, self.vinv, z, resid, lam
            )
            self.dictionary = np.vstack([self.dictionary, xr])
            self.incl = np.append(self.incl, p)
            z = np.append(z, math.sqrt(resid))  # its own new coordinate
        else:
            self.missed_s2 += max(resid, 0.0) / lam  # the part of this pull outside the span
            if drawn and m >= c["m_max"]:
                self.refused_s2 += s2
        if self.dictionary_size:
            onl.observe(self.gram, self.bz, self.vinv, z, reward)
        self.since_resparsify += 1
        if self.refused_s2 >= c["resparsify_at"] and self.since_resparsify >= c["min_gap"]:
            self._resparsify()
        self._refresh()

    def _resparsify(self) -> None:
        """Each dictionary point stays with probability ``min(1, p_new / p_old)``, ``p_new`` from its
        variance under the current model (SQUEAK's rule); then the model moves to the kept
        points' basis (online_nystrom.shrink). O(m^2 d + m^3), once per ``min_gap`` updates at most."""
        c = self._config
        # A dictionary point's embedding is its row of L (L^-1 K_DD = L'), its residual 0.
        s2 = np.maximum(
            ((self.chol @ self.vinv) * self.chol).sum(axis=1), 0.0
        )  # BLAS: O(m^3), on schedule
        p_new = np.ones_like(s2) if math.isinf(c["qbar"]) else np.minimum(1.0, c["qbar"] * s2)
        u = _rng(c["seed"], _RESPARSIFY_STREAM, self.n_updates).random(s2.shape[0])
        stay = u * self.incl < p_new  # u < p_new / p_old without dividing
        if not stay.any():  # never empty: keep the point most likely to stay
            stay[int(np.argmax(p_new / self.incl))] = True
        kept = np.flatnonzero(stay)
        if len(kept) < len(stay):
            points = np.ascontiguousarray(self.dictionary[kept])
            self.chol, self.gram, self.bz, self.vinv = onl.shrink(
                self._kernel(points, points), self.chol, self.gram, self.bz, kept, c["lam"]
            )
            self.dictionary = points
        self.incl = np.minimum(self.incl, p_new)[kept]
        self.refused_s2 = 0.0
        self.since_resparsify = 0
        self.resparsifications += 1

    def _refresh(self) -> None:
        """What scoring reads, a function of the state: ``w = V^-1 b``, L' (the forward solves
        read it by rows) and S of beta~."""
        m = self.dictionary_size
        self._upper = np.ascontiguousarray(self.chol.T)
        if m:
            self._w = onl.sym_matvec(self.vinv, self.bz)
            # Tr(V^-1 G) = Tr(V^-1 (V - lam I)) = m - lam Tr(V^-1): the pulls' variances in the span.
            self._ssum = float(m - self._config["lam"] * onl.trace(self.vinv)) + self.missed_s2
        else:
            self._w = np.zeros(0)
            self._ssum = self.missed_s2

    # -- state --------------------------------------------------------------------------------

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._refresh()

    def _check_loaded_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        m = arrays["dictionary"].shape[0]
        if arrays["dictionary"].shape[1] != self.dim:
            raise ValueError(
                f"state array 'dictionary' has shape {arrays['dictionary'].shape}, expected (m, {self.dim})"
            )
        if m > self._config["m_max"]:
            raise ValueError(
                f"state has {m} dictionary points, more than m_max = {self._config['m_max']}"
            )
        for k in ("chol", "gram", "vinv"):
            if arrays[k].shape != (m, m):
                raise ValueError(
                    f"state array {k!r} has shape {arrays[k].shape}, expected ({m}, {m})"
                )
        for k in ("bz", "incl"):
            if arrays[k].shape != (m,):
                raise ValueError(f"state array {k!r} has shape {arrays[k].shape}, expected ({m},)")
        if not all(np.isfinite(v).all() for v in arrays.values()):
            raise ValueError("state arrays must be finite")
        if m and not ((arrays["incl"] > 0.0) & (arrays["incl"] <= 1.0)).all():
            raise ValueError("state array 'incl' must hold probabilities in (0, 1]")
        if m and not (np.diag(arrays["chol"]) > 0.0).all():
            raise ValueError("state array 'chol' must have a positive diagonal (a Cholesky root)")
        for k in ("missed_s2", "refused_s2"):
            if not (math.isfinite(scalars[k]) and scalars[k] >= 0.0):
                raise ValueError(f"state scalar {k!r} must be finite and >= 0, got {scalars[k]!r}")
        for k in ("since_resparsify", "resparsifications"):
            if scalars[k] < 0:
                raise ValueError(f"state scalar {k!r} must be >= 0, got {scalars[k]!r}")

    def state_nbytes(self) -> int:
        """The state arrays and the five 8-byte scalars: ``8 (m d + 3 m^2 + 2 m + 5)`` bytes."""
        return super().state_nbytes() + 8 * len(self._state_scalars)

    def cache_nbytes(self) -> int:
        """Bytes derived from the state and held beside it (``w``)."""
        return int(self._w.nbytes)


def _rng(seed: int, stream: int, step: int) -> np.random.Generator:
    """The generator of update ``step``'s draw: a function of the configured seed, the draw's
    stream and the step only (docs/design.md, determinism), so replay redraws the same."""
    return np.random.default_rng(
        np.random.SeedSequence([seed & 0xFFFF_FFFF_FFFF_FFFF, step, stream])
    )
