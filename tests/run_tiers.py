"""The whole suite as ``make test`` runs it: the Apache Kafka tier in a pytest process of its own,
beside a second one that runs everything else (the unit tests, the embedded broker's tier and the
tests that start their own broker).

The integration tests spend most of their time waiting on brokers, timeouts and worker processes,
not computing: a single pytest process keeps a 2-core machine's CPUs mostly idle (the CI log's
``time`` line shows the run's CPU time beside its wall time). Two processes, each with its own
brokers, its own temporary directory and its own output, finish in about the time of the longer.
The second process's output is printed whole when both have ended; the exit code is the first
failure's.

Where this machine cannot run Apache Kafka (no java or mvn) and CI does not require it, or where
``STREAMBANDIT_TEST_BROKER`` names the tiers, it is one plain ``python -m pytest -q``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _kafka_runs_here() -> bool:
    """Whether the Apache Kafka tier would run (tests/integration/conftest.py decides the same):
    java and mvn present, or required (its tests then fail with the reason, in its own process)."""
    from streambandit.dev.kafka_jars import check_prerequisites
    from streambandit.dev.tansu import BrokerError

    if os.environ.get("STREAMBANDIT_REQUIRE_KAFKA", "") not in ("", "0"):
        return True
    try:
        check_prerequisites()
    except BrokerError:
        return False
    return True


def main() -> int:
    pytest = [sys.executable, "-m", "pytest", "-q"]
    if os.environ.get("STREAMBANDIT_TEST_BROKER") or not _kafka_runs_here():
        return subprocess.call(pytest, cwd=ROOT)
    # A directory of this run's own: two runs at once (two checkouts) must not share one.
    base = Path(tempfile.mkdtemp(prefix="streambandit-kafka-tier-"))
    log_path = base / "pytest.log"
    with open(log_path, "w") as log:
        kafka = subprocess.Popen(
            [
                *pytest,
                "-p",
                "no:cacheprovider",
                "--broker=kafka",
                "--only-broker-tests",
                f"--basetemp={base / 'tmp'}",
                "tests/integration",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            # The Kafka tier is required (or not) in the other process; this one leaves it out.
            rest = subprocess.call(
                [*pytest, "--broker=tansu"],
                cwd=ROOT,
                env={**os.environ, "STREAMBANDIT_REQUIRE_KAFKA": "0"},
            )
            kafka_rc = kafka.wait()
        except BaseException:
            # SIGINT: pytest stops as on Ctrl-C and its fixtures stop their brokers.
            kafka.send_signal(signal.SIGINT)
            try:
                kafka.wait(60)
            except subprocess.TimeoutExpired:
                kafka.kill()
            raise
    print(f"\n===== the Apache Kafka tier (python -m pytest ... --broker=kafka, {log_path}) =====")
    sys.stdout.flush()
    sys.stdout.write(log_path.read_text())
    if rest == kafka_rc == 0:
        shutil.rmtree(base, ignore_errors=True)  # kept after a failure: the tests' logs are there
    return rest or kafka_rc


if __name__ == "__main__":
    sys.exit(main())
