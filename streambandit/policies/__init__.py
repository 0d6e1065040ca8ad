"""The learners, one module per paper, pure numpy/scipy with no I/O. Importing this package
registers every policy in :data:`POLICIES`."""

from streambandit.policies.base import POLICIES, Policy, make_policy
from streambandit.policies import glb_omd, hvt_ucb, oful  # noqa: F401  (registration)
from streambandit.policies import cbscfd, dbs_linucb, soful  # noqa: F401  (registration)
from streambandit.policies import bkb  # noqa: F401  (registration)

__all__ = ["POLICIES", "Policy", "make_policy"]
