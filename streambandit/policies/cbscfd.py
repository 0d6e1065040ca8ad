"""CBSCFD: LinUCB on a fixed-size robust Frequent Directions (SCFD) sketch.

Chen, Luo, Zhang, Yu, Lian, "Efficient and Robust High-Dimensional Linear Contextual Bandits",
IJCAI 2020, as restated and run by Wen et al., "Revisiting Matrix Sketching in Linear Bandits ...
Dyadic Block Sketching" (arXiv:2410.10258v2), Algorithm 3, Lemmas 4-5 and Theorem 6.

Same as ``soful`` except that the sketch keeps alpha = the full accumulated shrink and
``A_hat = (lam + alpha) I + S'S``, an over-estimate of ``lam I + X'X`` (alpha += delta, not the
delta/2 of Luo et al.'s RFD). Its regret is linear when Delta_T = Omega(T) (Lemma 5,
Observation 2).
"""

from __future__ import annotations

from typing import ClassVar

from streambandit.policies.base import register
from streambandit.policies.dbs_linucb import radius_rfd
from streambandit.policies.soful import SOFUL

__all__ = ["CBSCFD"]


@register
class CBSCFD(SOFUL):
    """LinUCB on a robust FD sketch of fixed size l: ``A_hat = (lam + alpha) I + S'S``.

    Hyper-parameters are ``soful``'s; with ``beta=None`` the radius is Theorem 6 for one sketch
    (``h = alpha - l alpha / (2l) = alpha / 2``), times ``beta_scale``.

    Memory per model (float64, what :meth:`state_nbytes` reports): ``8 (2d + 2l d + 4 l^2)`` bytes,
    as ``soful`` (alpha is the scalar ``shrink_total``).

    An example at d = 20 with a sketch of l = 4 rows: the model holds less than ``oful``'s
    d^2 + 2d + 2 numbers, still prefers the direction theta* favours, and a saved state restores
    the same scores (booleans and integers, so the example reads the same on any machine):

    >>> import numpy as np
    >>> from streambandit import make_policy
    >>> rng = np.random.default_rng(0)
    >>> theta_star = np.r_[0.6, -0.3, 0.2, np.zeros(17)]
    >>> p = make_policy("cbscfd", dim=20, sketch_size=4, beta=0.1)
    >>> for _ in range(300):
    ...     arms = rng.normal(size=(5, 20)) / np.sqrt(20)
    ...     i = p.select(arms)
    ...     p.update(arms[i], float(arms[i] @ theta_star + rng.normal(0, 0.1)))
    >>> p.state_nbytes(), make_policy("oful", dim=20).state_nbytes()
    (2112, 3520)
    >>> p.select(np.eye(20)[:2])
    0
    >>> q = make_policy("cbscfd", dim=20, sketch_size=4, beta=0.1)
    >>> q.load_state_dict(p.state_dict())
    >>> bool(np.array_equal(q.scores(np.eye(20)), p.scores(np.eye(20))))
    True
    """

    name = "cbscfd"
    robust: ClassVar[bool] = True

    def _radius(self) -> float:
        c = self._config
        alpha = self.sketch.shrink_total
        rank = min(2 * self.ell, self.dim)
        return radius_rfd(
            shrink=alpha,
            h=alpha - self.ell * alpha / rank,
            lam=c["lam"],
            noise_sd=c["noise_sd"],
            S=c["S"],
            L=c["L"],
            delta=c["delta"],
            dim=self.dim,
            rank=rank,
            t=self.n_updates,
        )
