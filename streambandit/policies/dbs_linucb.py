"""DBSLinUCB: LinUCB on a Dyadic Block Sketch of the chosen arms (and the sketched confidence radii).

Wen, Yin, Zhang, Zhao, Zhang, Wei, "Revisiting Matrix Sketching in Linear Bandits: Achieving
Sublinear Regret via Dyadic Block Sketching" (arXiv:2410.10258v2), Algorithm 5, eqs. (5), (6), (18)
and Theorem 6. The sketch
itself is :mod:`streambandit.sketch.dyadic_block`.

Only the covariance is sketched: ``b = sum r_s x_s`` is kept exactly and
``theta = A_hat^-1 b`` (eq. 5). Rewards are applied with their arm, in arrival order.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from streambandit.numerics import kernels, rowwise
from streambandit.policies.base import Policy, check_in_range, check_positive, register
from streambandit.sketch.dyadic_block import RANK_TESTS, DyadicBlockSketch

__all__ = ["DBSLinUCB", "radius_fd", "radius_rfd", "check_int", "check_choice"]


def check_int(name: str, value: Any, lo: int) -> int:
    """``int(value)`` if it is an integer >= lo (bools rejected), else a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def check_choice(name: str, value: Any, choices: tuple) -> Any:
    if value not in choices or type(value) is not type(choices[0]):
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def radius_fd(
    *,
    shrink: float,
    lam: float,
    noise_sd: float,
    S: float,
    L: float,
    delta: float,
    dim: int,
    rank: int,
    t: int,
) -> float:
    """Eq. (18) (Theorem 2, FD sketches), with the tracked total shrink E_t in place of eps:

        R sqrt(1 + E/lam) sqrt(2 ln(1/delta) + d ln(1 + E/lam) + m ln(1 + t L^2 / (m lam)))
          + H sqrt(lam) (1 + E/lam)

    ``m`` is the rank bound of the sketched part: 2 l_Bt for DBS, d after its exact switch.
    """
    e = shrink / lam
    logs = (
        2.0 * math.log(1.0 / delta)
        + dim * math.log1p(e)
        + rank * math.log1p(t * L * L / (rank * lam))
    )
    return noise_sd * math.sqrt(1.0 + e) * math.sqrt(logs) + S * math.sqrt(lam) * (1.0 + e)


def radius_rfd(
    *,
    shrink: float,
    h: float,
    lam: float,
    noise_sd: float,
    S: float,
    L: float,
    delta: float,
    dim: int,
    rank: int,
    t: int,
) -> float:
    """Theorem 6 (robust FD sketches):

        R sqrt(2 ln(1/delta) + d ln(1 + E/lam) + m ln(1 + t L^2/(m lam) + h/lam)) + H sqrt(lam + E)

    with ``h = E - sum_i l_i sigma_i / (2 l_Bt)`` computed by the caller (``m`` as in :func:`radius_fd`).
    """
    logs = (
        2.0 * math.log(1.0 / delta)
        + dim * math.log1p(shrink / lam)
        + rank * math.log1p(t * L * L / (rank * lam) + h / lam)
    )
    return noise_sd * math.sqrt(logs) + S * math.sqrt(lam + shrink)


def _sketch_field(name: str) -> property:
    """A state entry held by ``self.sketch``. Its setter does nothing: :meth:`load_state_dict`
    replaces the whole sketch at once, after checking the pieces fit together."""
    return property(lambda self: self.sketch.state()[name], lambda self, value: None)


@register
class DBSLinUCB(Policy):
    """LinUCB on a Dyadic Block Sketch (Alg. 5): ``score = x'theta + beta ||x||_{A_hat^-1}`` (eq. 6).

    Hyper-parameters (defaults: the paper's experiments):
      l0: sketch size of the first block (default 50). Block i has 2^i l0 rows. With
        ``l0 > d/3`` the cap Bmax = floor(log2(d/l0 + 1)) is <= 1 and the policy is OFUL from the
        first round; a full-rank stream of unit rows reaches the cap after about
        ``(Bmax - 1) eps l0`` rounds, from when on it is OFUL too.
      epsilon: error budget, ``||X'X - S'S|| <= 2 epsilon`` (default 8); squared-norm units, so it
        assumes rows of norm about 1.
      sketch: ``"rfd"`` (robust FD with the full-shrink alpha; default: better
        bound and conditioning) or ``"fd"``.
      fast: the 2l-buffer Algorithm 4 (default) or the plain Algorithm 1.
      rank_test: ``"b1"`` (default) or ``"d2"``, where willExcessSketch is skipped (App. B.1 / D.2).
      lam: ridge lambda (default 1.0).
      beta: a constant radius (the paper's experiments tune one in {1e-4, ..., 1}; they do not say
        which won). ``None`` (default) uses eq. (18) (FD) or Theorem 6 (robust FD) with the tracked
        shrink, times ``beta_scale``.
      noise_sd, S, L, delta: R, H (bound on ||theta*||), the arm-norm bound and the confidence of
        the theory radius (defaults 1.0, 1.0, 1.0, 0.05).
      beta_scale: multiplier on the theory radius (default 1.0: the radius itself). The FD radius
        grows like ``(1 + E/lambda)^(3/2)``; when it over-explores, lower this or pass ``beta``.

    Memory per model (float64, what :meth:`state_nbytes` reports): while sketching at most
    ``8 (2d + r_f d + c d + (r_f + c')^2 + q d + 2B)`` bytes, with ``c = 2 l_B`` (``l_B`` plain) the
    active block's buffer, ``r_f <= min(d, sum_{i<B} l_i)`` frozen rows, ``c'`` the largest buffer so
    far (M's storage is reused across blocks), ``q <= l_B`` basis rows (only while the active block's
    rank fits its sketch: never on a full-rank stream) and B closed blocks; buffers grow by doubling,
    so a block that got few rows holds little. After the switch to exact updates
    ``8 (d^2 + 2d + 2B)``: ``oful``'s state plus 16 bytes per block.

    An example at d = 8 with l0 = 2: the cap is Bmax = floor(log2(8/2 + 1)) = 2 blocks, which this
    full-rank stream reaches within a few dozen rows, and from then on the learner updates exactly
    (``fallback``); a saved state restores the same scores (booleans and integers, so the example
    reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> theta_star = np.r_[0.6, -0.3, 0.2, np.zeros(5)]
    >>> p = make_policy("dbs_linucb", dim=8, l0=2, beta=0.1)
    >>> for _ in range(300):
    ...     arms = rng.normal(size=(5, 8)) / np.sqrt(8)
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(arms[i] @ theta_star + rng.normal(0, 0.1)))
    >>> bool(p.fallback), p.select(np.eye(8)[:2])
    (True, 0)
    >>> q = make_policy("dbs_linucb", dim=8, l0=2, beta=0.1)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(np.eye(8)), p.scores(np.eye(8))))
    True
    """

    name = "dbs_linucb"
    _state_arrays = ("b", "theta", *DyadicBlockSketch.ARRAYS)
    _state_arrays_resizable = DyadicBlockSketch.ARRAYS
    _state_scalars = ("n_updates", *DyadicBlockSketch.SCALARS)

    block_shrink = _sketch_field("block_shrink")
    block_mass = _sketch_field("block_mass")
    frozen = _sketch_field("frozen")
    active = _sketch_field("active")
    minv = _sketch_field("minv")
    basis = _sketch_field("basis")
    vinv = _sketch_field("vinv")
    active_shrink = _sketch_field("active_shrink")
    active_mass = _sketch_field("active_mass")
    active_rows = _sketch_field("active_rows")
    active_excess = _sketch_field("active_excess")
    fallback = _sketch_field("fallback")

    def __init__(
        self,
        dim: int,
        *,
        l0: int = 50,
        epsilon: float = 8.0,
        sketch: str = "rfd",
        fast: bool = True,
        rank_test: str = "b1",
        lam: float = 1.0,
        beta: float | None = None,
        noise_sd: float = 1.0,
        S: float = 1.0,
        L: float = 1.0,
        delta: float = 0.05,
        beta_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__(dim, seed=seed)
        if not isinstance(fast, bool):
            raise ValueError(f"fast must be a bool, got {fast!r}")
        self._config.update(
            l0=check_int("l0", l0, 1),
            epsilon=check_positive("epsilon", epsilon),
            sketch=check_choice("sketch", sketch, ("rfd", "fd")),
            fast=fast,
            rank_test=check_choice("rank_test", rank_test, RANK_TESTS),
            lam=check_positive("lam", lam),
            beta=None if beta is None else check_in_range("beta", beta, 0.0, math.inf),
            noise_sd=check_in_range("noise_sd", noise_sd, 0.0, math.inf),
            S=check_in_range("S", S, 0.0, math.inf),
            L=check_positive("L", L),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
        )
        c = self._config
        self.sketch = DyadicBlockSketch(
            self.dim,
            c["l0"],
            c["epsilon"],
            c["lam"],
            robust=c["sketch"] == "rfd",
            fast=fast,
            rank_test=c["rank_test"],
        )
        self.b = np.zeros(self.dim)
        self.theta = np.zeros(self.dim)
        self._incoming: DyadicBlockSketch | None = None

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        # At d = 4 (the contract suite's dimension) and l0 = 1 the cap is 2 blocks: a small budget
        # closes block 0 within a few rows and switches to exact updates; a large one keeps one
        # shrinking FD block for ~50 rows; l0 = 2 is OFUL from the start.
        return [
            {"l0": 1, "epsilon": 0.5, "beta": 0.5},
            {"l0": 1, "epsilon": 50.0, "sketch": "fd"},
            {"l0": 1, "epsilon": 6.0, "fast": False, "rank_test": "d2", "lam": 0.5},
            {"l0": 2},
        ]

    # -- decisions ----------------------------------------------------------------------------

    def beta(self) -> float:
        """The confidence radius used by the next decision (Alg. 5 line 4)."""
        c = self._config
        if c["beta"] is not None:
            return c["beta"]
        sk = self.sketch
        shrink = sk.shrink_total
        # Rank bound of the sketched part: 2 l_Bt (eq. 18), d after the exact switch.
        rank = self.dim if sk.fallback else min(2 * sk.active_ell, self.dim)
        common = dict(
            lam=c["lam"],
            noise_sd=c["noise_sd"],
            S=c["S"],
            L=c["L"],
            delta=c["delta"],
            dim=self.dim,
            rank=rank,
            t=self.n_updates,
        )
        if c["sketch"] == "fd":
            return c["beta_scale"] * radius_fd(shrink=shrink, **common)
        # Theorem 6: h_t = E_t - sum_i l_i sigma_i / (2 l_Bt), all blocks including the active one.
        ells = np.array([sk.block_ell(i) for i in range(sk.n_closed)], dtype=float)
        weighted = float(ells @ sk.block_shrink) + (
            0.0 if sk.fallback else sk.active_ell * sk.cov.fd.shrink_total
        )
        h = shrink - weighted / rank
        return c["beta_scale"] * radius_rfd(shrink=shrink, h=h, **common)

    def scores(self, arms: np.ndarray) -> np.ndarray:
        a = self._check_arms(arms)
        sk = self.sketch
        if sk.fallback:  # exact mode: OFUL's compiled scoring, so the scores are OFUL's to the bit
            out = np.empty(a.shape[0])
            kernels.ucb_scores(a, self.theta, sk.vinv, self.beta(), out)
            return out
        return rowwise.matvec(a, self.theta) + self.beta() * np.sqrt(
            sk.cov.quad_forms(a)
        )  # eq. (6)

    def _update(self, x: np.ndarray, reward: float) -> None:
        self.sketch.update(x)  # Alg. 5 line 7
        self.b += reward * x
        self.theta = self.sketch.solve(self.b)  # Alg. 5 lines 8-9, eq. (5)

    # -- state --------------------------------------------------------------------------------

    def _check_loaded_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        self._incoming = self.sketch.restored({**arrays, **scalars})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._incoming = None
        super().load_state_dict(state)
        self.sketch, self._incoming = self._incoming, None

    def state_nbytes(self) -> int:
        """Bytes held per model: b, theta and the sketch's buffers (their allocated size)."""
        return int(self.b.nbytes + self.theta.nbytes + self.sketch.nbytes)
