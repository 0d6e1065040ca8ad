"""Integration fixtures: real broker processes, one of each kind per test session.

Two tiers: the embedded broker (Tansu, ``tansu_broker``) and Apache Kafka (``kafka_broker``, one
combined node; ``kafka_cluster``, three nodes, per module). A test that asks for ``broker`` (itself
or through a fixture) runs once on each (ids ``[tansu]``, ``[kafka]``), on one broker of each kind
per session; ``@pytest.mark.brokers("tansu")`` keeps a test that is Tansu's by nature on Tansu
alone (give its reason beside the mark). ``--broker=tansu|kafka|both`` chooses the tiers
(tests/conftest.py); the others' tests are deselected.
"""

import gc
import shutil
from pathlib import Path

import pytest

from streambandit.dev.kafka import ApacheKafka
from streambandit.dev.kafka_jars import JavaToolMissing, check_prerequisites, classpath, read_lock
from streambandit.dev.tansu import BrokerError, EmbeddedBroker

HERE = Path(__file__).parent
KINDS = ("tansu", "kafka")
_KAFKA_FIXTURES = {"kafka_broker", "kafka_cluster", "kafka_tier", "kafka_sasl_ssl", "kafka_mtls"}
# At the session's end the brokers' state is thrown away: no clean stop is waited for (three nodes
# stopped one by one hold the last in a controlled shutdown that no quorum can finish).
SESSION_END_STOP_S = 2.0
TIERS = pytest.StashKey[tuple]()
KAFKA_MISSING = pytest.StashKey[str | None]()  # why this machine cannot run Apache Kafka, or None


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "brokers(*kinds): run the test on these brokers only (tansu, kafka); "
        "a test of the broker fixture without it runs on both",
    )
    chosen, required = config.getoption("--broker"), config.getoption("--require-kafka")
    if chosen == "tansu" and required:
        raise pytest.UsageError(
            "--require-kafka with --broker=tansu: the Apache Kafka tier cannot be both required "
            "and left out"
        )
    missing = None
    try:
        check_prerequisites()
    except BrokerError as exc:  # JavaToolMissing, or a lock that does not read
        missing = str(exc)
    if chosen is None:
        chosen = "both" if missing is None or required else "tansu"
    config.stash[TIERS] = {"tansu": ("tansu",), "kafka": ("kafka",), "both": KINDS}[chosen]
    config.stash[KAFKA_MISSING] = missing


_PARAMETRIZED = ("broker", "own_broker")  # the fixtures that take a broker kind as their param


def _marked_kinds(definition) -> tuple | None:
    marker = definition.get_closest_marker("brokers")
    if marker is None:
        return None
    unknown = set(marker.args) - set(KINDS)
    if unknown or not marker.args:
        raise pytest.UsageError(
            f"{definition.nodeid}: brokers() takes some of {KINDS}, got {marker.args}"
        )
    return marker.args


def pytest_generate_tests(metafunc):
    kinds = _marked_kinds(metafunc.definition) or KINDS
    for name in _PARAMETRIZED:
        if name in metafunc.fixturenames:
            metafunc.parametrize(name, list(kinds), indirect=True, ids=list(kinds))


def _kind(item) -> str | None:
    """The broker an integration test runs on; None for tests elsewhere (the hook sees them all).
    A test that asks for no broker fixture starts the embedded one itself (the demo, the broker
    command)."""
    if HERE not in item.path.parents:
        return None
    callspec = getattr(item, "callspec", None)
    for name in _PARAMETRIZED:
        if callspec is not None and name in callspec.params:
            return callspec.params[name]
    names = set(getattr(item, "fixturenames", ()))
    if names & _KAFKA_FIXTURES:
        return "kafka"
    if names & {"tansu_broker"}:
        return "tansu"
    # A test that starts a broker itself (a subprocess, the demo) says which by its mark.
    marked = _marked_kinds(item)
    return marked[0] if marked is not None and len(marked) == 1 else None


def pytest_collection_modifyitems(config, items):
    tiers = config.stash.get(TIERS, KINDS)
    only = config.getoption("--only-broker-tests")
    keep, drop = [], []
    for item in items:
        kind = _kind(item)
        out = kind not in tiers if kind is not None else only
        (drop if out else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_collectionfinish(config, start_path, items):
    tiers = config.stash.get(TIERS, None)
    if tiers is None:
        return None
    note = ""
    if "kafka" not in tiers and config.stash[KAFKA_MISSING]:
        note = f" (Apache Kafka tier off: {config.stash[KAFKA_MISSING]})"
    elif "kafka" in tiers:
        required = ", required" if config.getoption("--require-kafka") else ""
        note = f" (Apache Kafka {read_lock().kafka_version}{required})"
    return f"integration brokers: {', '.join(tiers)}{note}"


def _kafka_usable(config) -> None:
    """Skip the test (fail it, with --require-kafka) when this machine cannot run Apache Kafka:
    no java or mvn, or the jars cannot be fetched. A broker that then fails to start is an error."""
    required = config.getoption("--require-kafka")
    reason = config.stash[KAFKA_MISSING]
    if reason is None:
        try:
            classpath()
        except JavaToolMissing as exc:
            reason = str(exc)
        except BrokerError as exc:
            reason = f"cannot fetch its jars: {exc}"
    if reason is not None:
        config.stash[KAFKA_MISSING] = (
            reason  # every later test is told at once, without another fetch
        )
        (pytest.fail if required else pytest.skip)(f"Apache Kafka tier: {reason}")


@pytest.fixture
def kafka_tier(request):
    """For a test that starts Apache Kafka itself (``streambandit broker --kafka``): skipped, or
    failed, as the Apache Kafka fixtures are when this machine cannot run it."""
    _kafka_usable(request.config)


@pytest.fixture(scope="session")
def tansu_broker():
    with EmbeddedBroker() as b:
        yield b
        # Kafka clients the tests dropped are destroyed now, while the broker still answers:
        # destroyed after it stopped, they log lost connections after pytest's summary line.
        gc.collect()


@pytest.fixture(scope="session")
def kafka_broker(request):
    _kafka_usable(request.config)
    with ApacheKafka() as b:
        yield b
        gc.collect()
        b.stop(timeout_s=SESSION_END_STOP_S)


@pytest.fixture(scope="session")
def kafka_cluster(request):
    """Three combined nodes for the session's cluster tests (replication factor 3, min.insync 2):
    one start of three JVMs, not one per module. A test that kills or stops nodes restarts them
    and waits until they are in sync again before it ends, so that the next test starts from the
    whole cluster."""
    _kafka_usable(request.config)
    with ApacheKafka(nodes=3) as c:
        yield c
        gc.collect()
        c.stop(timeout_s=SESSION_END_STOP_S)


def _secured_kafka_usable(config) -> None:
    """As _kafka_usable, and openssl, which makes a secured broker's certificates."""
    _kafka_usable(config)
    if shutil.which("openssl") is None:
        (pytest.fail if config.getoption("--require-kafka") else pytest.skip)(
            "a secured Apache Kafka needs openssl for its certificates"
        )


@pytest.fixture(scope="module")
def kafka_sasl_ssl(request):
    """One combined node whose clients connect over SASL_SSL (SCRAM-SHA-512), the authorizer on
    and no access without an ACL (dev/kafka_security.py): for the module that tests it."""
    _secured_kafka_usable(request.config)
    with ApacheKafka(security="sasl_ssl") as b:
        yield b
        gc.collect()
        b.stop(timeout_s=SESSION_END_STOP_S)


@pytest.fixture(scope="module")
def kafka_mtls(request):
    """As ``kafka_sasl_ssl``, the clients known by their certificates (mutual TLS)."""
    _secured_kafka_usable(request.config)
    with ApacheKafka(security="mtls") as b:
        yield b
        gc.collect()
        b.stop(timeout_s=SESSION_END_STOP_S)


@pytest.fixture(scope="session")
def broker(request):
    """The test's broker, of the kind the test is parametrized with (pytest_generate_tests)."""
    return request.getfixturevalue(f"{request.param}_broker")


@pytest.fixture
def own_broker(request):
    """A started broker of the test's kind for this test alone, which the test may stop under its
    clients (stopped at the end in any case)."""
    if request.param == "kafka":
        _kafka_usable(request.config)
    with ApacheKafka() if request.param == "kafka" else EmbeddedBroker() as b:
        yield b


@pytest.fixture
def topics(broker):
    """A fresh, co-partitioned topic set (names unique to the test), with 2 partitions."""
    from .helpers import fresh_topics

    return fresh_topics(broker)
