"""streambandit: streaming contextual bandits on Kafka.

>>> from streambandit import make_policy, POLICIES
>>> sorted(POLICIES)
['bkb', 'bkb_stream', 'cbscfd', 'dbs_linucb', 'glb_omd', 'hvt_ucb', 'oful', 'soful']
>>> p = make_policy("oful", dim=2)
>>> p.update([1.0, 0.0], 0.1)
>>> p.select([[1.0, 0.0], [0.0, 1.0]])  # optimism: the unexplored direction has the larger bonus
1
"""

from streambandit.policies import POLICIES, Policy, make_policy

__all__ = [
    "POLICIES",
    "Policy",
    "make_policy",
    "Decider",
    "Ranking",
    "DecisionError",
    "__version__",
]
__version__ = "0.1.0"

_DECIDER = ("Decider", "Ranking", "DecisionError")


def __getattr__(name: str):
    # The in-process rank/reward API (serving/decider.py), imported on first use: the engine and the
    # record codecs it brings stay out of a plain ``import streambandit``.
    if name in _DECIDER:
        from streambandit.serving import decider

        return getattr(decider, name)
    raise AttributeError(f"module 'streambandit' has no attribute {name!r}")
