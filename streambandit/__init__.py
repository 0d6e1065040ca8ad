"""streambandit: streaming contextual bandits on Kafka.

>>> from streambandit import make_policy, POLICIES
>>> sorted(POLICIES)[:3]
['glb_omd', 'hvt_ucb', 'oful']
"""

from streambandit.policies import POLICIES, Policy, make_policy

__all__ = ["POLICIES", "Policy", "make_policy", "__version__"]
__version__ = "0.1.0"
