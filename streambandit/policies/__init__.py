"""The learners, one module per paper, pure numpy/scipy with no I/O. Importing this package
registers every policy in :data:`POLICIES`."""

from streambandit.policies import (  # noqa: F401  (registration)
    bkb,
    bkb_stream,
    cbscfd,
    dbs_linucb,
    glb_omd,
    hvt_ucb,
    oful,
    soful,
)
from streambandit.policies.base import POLICIES, Policy, make_policy

__all__ = ["POLICIES", "Policy", "make_policy"]
