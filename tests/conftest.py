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


def pytest_addoption(parser):
    # Here rather than in tests/integration/conftest.py: pytest reads options only from the
    # conftest files it loads before collecting, and a plain `pytest` does not load that one yet.
    group = parser.getgroup("streambandit brokers")
    group.addoption(
        "--broker",
        choices=("tansu", "kafka", "both"),
        default=os.environ.get("STREAMBANDIT_TEST_BROKER"),
        help="the brokers the integration tests run on: the embedded Tansu, Apache Kafka (needs Java "
        "17+, and Maven until its jars are cached), or both; a test marked brokers('tansu') runs on Tansu alone. "
        "Default: both where java and mvn are present, else tansu "
        "(env STREAMBANDIT_TEST_BROKER)",
    )
    group.addoption(
        "--require-kafka",
        action="store_true",
        default=os.environ.get("STREAMBANDIT_REQUIRE_KAFKA", "") not in ("", "0"),
        help="the Apache Kafka tier must run: without java or mvn, or without its jars, its tests fail "
        "instead of being skipped (env STREAMBANDIT_REQUIRE_KAFKA=1; CI sets it)",
    )
    group.addoption(
        "--only-broker-tests",
        action="store_true",
        help="only the integration tests that run on a broker of the chosen tiers; the tests that "
        "start their own broker or none are deselected (tests/run_tiers.py runs the Apache Kafka "
        "tier so, beside the rest)",
    )


@pytest.fixture(autouse=True)
def _hang_guard():
    faulthandler.dump_traceback_later(HANG_LIMIT_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
