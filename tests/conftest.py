"""Test-wide setup: BLAS on one thread, as the CLI runs it (streambandit/cli.py).

Bit-exact replay needs the same floating-point reduction order every run, and the workers the
integration tests start in-process must behave as deployed ones do; on a 2-core machine a
multi-threaded BLAS also makes the many small eigh/solve calls of the learners ~10x slower.
Set before any test module imports numpy.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
