"""Test-wide setup: BLAS on one thread, as the CLI runs it (streambandit/cli/commands.py).

Bit-exact replay needs the same floating-point reduction order every run, and the workers the
integration tests start in-process must behave as deployed ones do; on a 2-core machine a
multi-threaded BLAS also makes the many small eigh/solve calls of the learners ~10x slower.
Set before any test module imports numpy.
"""

import faulthandler
import os

import pytest

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# A test that hangs ends the run with every thread's stack instead of holding CI until its own
# limit: the longest test (tests/integration/test_restarts.py, twenty stops) takes a few minutes.
HANG_LIMIT_S = 600


@pytest.fixture(autouse=True)
def _hang_guard():
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
