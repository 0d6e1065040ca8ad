"""Simulated ad traffic: requests with K candidate ads and a hidden logistic click model.

Used by ``streambandit demo`` (live through Kafka, with delayed clicks) and by tests. Each request
has a user vector; each candidate ad has an embedding; the arm's feature vector is their
element-wise product (what a factorisation-style ranker would feed a linear model), normalised,
plus a constant coordinate that carries the base click rate. Clicks follow
``P(click) = sigmoid(x' theta*)`` with a base rate of a few percent, like display ads.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["AdTraffic", "AdRequest", "ad_hyper"]

_BIAS_FEATURE = 0.5  # the constant coordinate of every arm

# The learners' settings for this traffic, used by the demo, `simulate-ads` and the benchmarks.
# With the default traffic (a 3% base rate, a logit of -3.5, and a spread of 3 logits) the click
# model's ||theta*|| is just under 8, so S = 8 bounds it. GLB-OMD's theory radius explores for
# far longer than a demo runs;
# a tenth of it learns within seconds (`streambandit simulate-ads` against
# `streambandit simulate-ads --beta-scale 1` compares the two).
_AD_HYPER: dict[str, dict] = {"glb_omd": {"link": "logistic", "S": 8.0, "beta_scale": 0.1}}


def ad_hyper(policy: str) -> dict:
    """The hyper-parameters ``policy`` runs with on simulated ad traffic (a fresh dict; empty
    for a learner whose defaults suit it)."""
    return dict(_AD_HYPER.get(policy, {}))


@dataclasses.dataclass(frozen=True)
class AdRequest:
    """One ad request: candidate ad ids, their (K, dim) features and their true click rates."""

    ad_ids: tuple[str, ...]
    features: np.ndarray
    click_rates: np.ndarray


class AdTraffic:
    """A catalogue of ads and a click model; ``request(rng)`` draws one ad request.

    ``dim`` is the arm feature dimension (including the constant coordinate); ``base_ctr`` the
    click rate of an average ad; ``spread`` the logit range user-ad affinity adds around it.
    """

    def __init__(
        self,
        dim: int = 20,
        n_ads: int = 200,
        k: int = 10,
        base_ctr: float = 0.03,
        spread: float = 3.0,
        seed: int = 0,
    ):
        if dim < 2:
            raise ValueError("dim must be >= 2 (one coordinate is the constant)")
        if not 1 <= k <= n_ads:
            raise ValueError(f"k must be in [1, n_ads], got k={k}, n_ads={n_ads}")
        rng = np.random.default_rng([seed, 99])
        self.dim, self.k = dim, k
        self.ad_ids = tuple(f"ad-{i:04d}" for i in range(n_ads))
        self._ads = rng.standard_normal((n_ads, dim - 1))
        w = rng.standard_normal(dim - 1)
        scale = math.sqrt(1.0 - _BIAS_FEATURE**2)
        # theta* = [w; b]: ||w|| chosen so the affinity term spans about +-spread logits, b so that
        # an arm with zero affinity clicks at base_ctr.
        bias = math.log(base_ctr / (1 - base_ctr)) / _BIAS_FEATURE
        self.theta = np.concatenate([w / np.linalg.norm(w) * spread / scale, [bias]])

    def request(self, rng: np.random.Generator) -> AdRequest:
        user = rng.standard_normal(self.dim - 1)
        idx = rng.choice(len(self.ad_ids), size=self.k, replace=False)
        inter = self._ads[idx] * user
        inter /= np.linalg.norm(inter, axis=1, keepdims=True)
        feats = np.empty((self.k, self.dim))
        feats[:, :-1] = inter * math.sqrt(1.0 - _BIAS_FEATURE**2)
        feats[:, -1] = _BIAS_FEATURE
        rates = 1.0 / (1.0 + np.exp(-(feats @ self.theta)))
        return AdRequest(
            ad_ids=tuple(self.ad_ids[i] for i in idx), features=feats, click_rates=rates
        )

    def click(self, rng: np.random.Generator, rate: float) -> bool:
        return bool(rng.random() < rate)
