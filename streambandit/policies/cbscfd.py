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
    """

    name = "cbscfd"
    robust: ClassVar[bool] = True

    def _radius(self) -> float:
        c = self._config
        alpha = self.sketch.shrink_total
        rank = min(2 * self.ell, self.dim)
        return radius_rfd(shrink=alpha, h=alpha - self.ell * alpha / rank, lam=c["lam"], noise_sd=c["noise_sd"],
                          S=c["S"], L=c["L"], delta=c["delta"], dim=self.dim, rank=rank, t=self.n_updates)
