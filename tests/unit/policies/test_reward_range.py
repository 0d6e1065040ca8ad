"""Policy.reward_range is validate_reward's rule as two numbers, for every learner and link."""

import math

import pytest

from streambandit import POLICIES, make_policy
from streambandit.policies.base import MAX_ABS_REWARD

VALUES = [0.0, -0.0, 1.0, 0.5, -1e-300, 1.0 + 1e-15, -1.0, 2.0, MAX_ABS_REWARD,
          -MAX_ABS_REWARD, MAX_ABS_REWARD * 1.0000001, math.inf, -math.inf, math.nan]  # fmt: skip


def learners():
    for name in sorted(POLICIES):
        yield name, {}
    for link in ("logistic", "poisson", "gaussian"):
        yield "glb_omd", {"link": link}


@pytest.mark.parametrize("name,hyper", list(learners()))
def test_reward_range_accepts_exactly_what_validate_reward_accepts(name, hyper):
    policy = make_policy(name, dim=2, **hyper)
    lo, hi = policy.reward_range()
    for r in VALUES:
        try:
            policy.validate_reward(r)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == (lo <= r <= hi), (name, hyper, r)
