"""SOFUL: LinUCB on a fixed-size Frequent Directions sketch of the chosen arms.

Kuzborskij, Cella, Cesa-Bianchi, "Efficient Linear Bandits through Matrix Sketching", AISTATS 2019,
as restated and run by Wen et al., "Revisiting Matrix Sketching in Linear Bandits ... Dyadic Block
Sketching" (arXiv:2410.10258v2), Sec. 2.3 and App. F. The sketch is the buffered FD of Remark 1 (the
paper's "efficient implementation", used by every sketch method in its experiments).

``A_hat = lam I + S'S``; ``theta = A_hat^-1 b`` with ``b = sum r x`` exact; queries by Woodbury
(eq. 5) in O(d l). Its regret bound holds only while the spectral error Delta_T = o(T^(1/3)): on a
stream whose spectrum does not fit in l directions the error grows linearly and so does the regret
(Lemma 2, Observation 1) -- the failure Dyadic Block Sketching (``dbs_linucb``) removes.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from streambandit.numerics import rowwise
from streambandit.policies.base import Policy, check_in_range, check_positive, register
from streambandit.policies.dbs_linucb import check_int, radius_fd
from streambandit.sketch.woodbury import SketchedCovariance

__all__ = ["SOFUL"]


@register
class SOFUL(Policy):
    """LinUCB on an FD sketch of fixed size l: ``score = x'theta + beta ||x||_{A_hat^-1}``.

    Hyper-parameters:
      sketch_size: l (default 50, the paper's small synthetic setting; it also ran 450). Capped at d,
        where the sketch is exact.
      lam: ridge lambda (default 1.0).
      beta: a constant radius (the paper's experiments tune one in {1e-4, ..., 1}). ``None``
        (default) uses the single-sketch case of eq. (18) with the tracked shrink, times
        ``beta_scale``; it grows like ``(1 + shrink/lambda)^(3/2)``, i.e. without bound when l is too
        small for the stream -- the theory's verdict, and why the experiments use a constant.
      noise_sd, S, L, delta: R, H, the arm-norm bound and the confidence of the theory radius.
      beta_scale: multiplier on the theory radius (default 1.0).

    Memory per model (float64, what :meth:`state_nbytes` reports): ``8 (2d + 2l d + 4 l^2)`` bytes
    once 2l rows have arrived (the buffers grow by doubling up to that size): b and theta, the
    2l x d FD buffer and M (2l x 2l).

    An example at d = 20 with a sketch of l = 4 rows: the model holds less than ``oful``'s
    d^2 + 2d + 2 numbers, still prefers the direction theta* favours, and a saved state restores
    the same scores (booleans and integers, so the example reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> theta_star = np.r_[0.6, -0.3, 0.2, np.zeros(17)]
    >>> p = make_policy("soful", dim=20, sketch_size=4, beta=0.1)
    >>> for _ in range(300):
    ...     arms = rng.normal(size=(5, 20)) / np.sqrt(20)
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(arms[i] @ theta_star + rng.normal(0, 0.1)))
    >>> p.state_nbytes(), make_policy("oful", dim=20).state_nbytes()
    (2112, 3520)
    >>> p.select(np.eye(20)[:2])
    0
    >>> q = make_policy("soful", dim=20, sketch_size=4, beta=0.1)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(np.eye(20)), p.scores(np.eye(20))))
    True
    """

    name = "soful"
    robust: ClassVar[bool] = False
    _state_arrays = ("b", "theta", "rows", "minv")
    _state_arrays_resizable = ("rows", "minv")
    _state_scalars = ("n_updates", "shrink_total")

    # Held by self.sketch; load_state_dict replaces the sketch as a whole (the setters do nothing).
    rows = property(lambda self: self.sketch.fd.rows, lambda self, value: None)
    minv = property(lambda self: self.sketch.minv, lambda self, value: None)
    shrink_total = property(lambda self: self.sketch.fd.shrink_total, lambda self, value: None)

    def __init__(
        self,
        dim: int,
        *,
        sketch_size: int = 50,
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
        self._config.update(
            sketch_size=check_int("sketch_size", sketch_size, 1),
            lam=check_positive("lam", lam),
            beta=None if beta is None else check_in_range("beta", beta, 0.0, math.inf),
            noise_sd=check_in_range("noise_sd", noise_sd, 0.0, math.inf),
            S=check_in_range("S", S, 0.0, math.inf),
            L=check_positive("L", L),
            delta=check_in_range("delta", delta, 0.0, 1.0, lo_open=True),
            beta_scale=check_in_range("beta_scale", beta_scale, 0.0, math.inf),
        )
        self.ell = min(self._config["sketch_size"], self.dim)
        self.sketch = SketchedCovariance(
            self.dim, self.ell, self._config["lam"], robust=self.robust, fast=True
        )
        self.b = np.zeros(self.dim)
        self.theta = np.zeros(self.dim)
        self._incoming: SketchedCovariance | None = None

    @classmethod
    def _test_params(cls) -> list[dict[str, Any]]:
        # At d = 4: l = 1 shrinks every other row, l = 2 every second pair, the default is exact.
        return [{"sketch_size": 1}, {"sketch_size": 2, "beta": 0.3, "lam": 0.5}, {}]

    # -- decisions ----------------------------------------------------------------------------

    def beta(self) -> float:
        """The confidence radius used by the next decision."""
        c = self._config
        if c["beta"] is not None:
            return c["beta"]
        return c["beta_scale"] * self._radius()

    def _radius(self) -> float:
        # Eq. (18) with one block: the 2l-row buffer bounds the sketch's rank by 2l.
        c = self._config
        return radius_fd(
            shrink=self.sketch.shrink_total,
            lam=c["lam"],
            noise_sd=c["noise_sd"],
            S=c["S"],
            L=c["L"],
            delta=c["delta"],
            dim=self.dim,
            rank=min(2 * self.ell, self.dim),
            t=self.n_updates,
        )

    def scores(self, arms: np.ndarray) -> np.ndarray:
        a = self._check_arms(arms)
        return rowwise.matvec(a, self.theta) + self.beta() * np.sqrt(self.sketch.quad_forms(a))

    def _update(self, x: np.ndarray, reward: float) -> None:
        self.sketch.update(x)
        self.b += reward * x
        self.theta = self.sketch.solve(self.b)  # eq. (5)

    # -- state --------------------------------------------------------------------------------

    def _check_loaded_state(self, arrays: dict[str, np.ndarray], scalars: dict[str, Any]) -> None:
        self._incoming = self.sketch.restore(
            np.zeros((0, self.dim)),
            arrays["rows"],
            arrays["minv"],
            0.0,
            scalars["shrink_total"],
            self.ell,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._incoming = None
        super().load_state_dict(state)
        self.sketch, self._incoming = self._incoming, None

    def state_nbytes(self) -> int:
        """Bytes held per model: b, theta, the FD buffer and M (their allocated size)."""
        return int(self.b.nbytes + self.theta.nbytes + self.sketch.nbytes)
