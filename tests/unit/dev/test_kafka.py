"""Apache Kafka's configuration and jar lock, without a broker: the properties each node gets, the
lock's reading, the cache that fetches once and refuses a jar whose checksum differs, and one line
for a missing java or mvn."""

import hashlib
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from streambandit.dev import kafka_jars
from streambandit.dev.kafka import (
    ApacheKafka,
    NodeAddress,
    coordinator_partition,
    new_cluster_id,
    render_properties,
    server_properties,
)
from streambandit.dev.kafka_jars import (
    LOCK_PATH,
    JavaToolMissing,
    check_prerequisites,
    classpath,
    format_lock,
    java_major,
    parse_lock,
)
from streambandit.dev.tansu import BrokerError
from streambandit.errors import StreambanditError

NODES = [NodeAddress(1, 9092, 19092), NodeAddress(2, 9093, 19093), NodeAddress(3, 9094, 19094)]


def test_a_single_node_is_broker_and_controller_with_everything_replicated_once():
    p = server_properties(NODES[0], NODES[:1], Path("/data/node-1/data"))
    assert p["process.roles"] == "broker,controller" and p["node.id"] == "1"
    assert p["controller.quorum.voters"] == "1@127.0.0.1:19092"
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:19092"
    assert p["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert p["log.dirs"] == "/data/node-1/data"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
        "min.insync.replicas",
        "transaction.state.log.min.isr",
    ):
        assert p[key] == "1", key
    assert (
        p["auto.create.topics.enable"] == "false" and p["group.initial.rebalance.delay.ms"] == "0"
    )
    assert int(p["transaction.abort.timed.out.transaction.cleanup.interval.ms"]) < 10_000
    assert int(p["broker.heartbeat.interval.ms"]) < int(p["broker.session.timeout.ms"])


def test_three_nodes_replicate_three_times_and_need_two_in_sync():
    props = [server_properties(n, NODES, Path(f"/d/{n.node_id}")) for n in NODES]
    assert {p["controller.quorum.voters"] for p in props} == {
        "1@127.0.0.1:19092,2@127.0.0.1:19093,3@127.0.0.1:19094"
    }
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert props[2]["listeners"] == "PLAINTEXT://127.0.0.1:9094,CONTROLLER://127.0.0.1:19094"
    for p in props:
        assert p["default.replication.factor"] == p["offsets.topic.replication.factor"] == "3"
        assert p["transaction.state.log.replication.factor"] == "3"
        assert p["min.insync.replicas"] == p["transaction.state.log.min.isr"] == "2"


def test_properties_are_written_one_per_line_with_backslashes_escaped():
    text = render_properties({"log.dirs": r"C:\kafka\data", "node.id": "1"})
    assert text == "log.dirs=C:\\\\kafka\\\\data\nnode.id=1\n"


def test_a_cluster_id_is_kafkas_uuid_text():
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(
        len(i) == 22
        and not i.startswith("-")
        and set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        for i in ids
    )


def test_the_coordinator_partition_is_javas_string_hash_modulo_the_partitions():
    # "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE, which
    # Kafka's Utils.abs maps to 0; "Aa" and "BB" collide in Java.
    assert coordinator_partition("hello", 50) == 99162322 % 50
    assert coordinator_partition("polygenelubricants", 8) == 0
    assert coordinator_partition("Aa", 7) == coordinator_partition("BB", 7) == 2112 % 7
    # A negative hash (32-bit overflow), and one over UTF-16 code units (a surrogate pair), as
    # Java 17 computes them.
    assert coordinator_partition("zzzzzzzz", 50) == 1910022912 % 50
    assert coordinator_partition("\u00e9\u20ac\U0001f600", 50) == 16752006 % 50


def _cluster_on_free_ports(nodes: int) -> tuple[ApacheKafka, int]:
    """A cluster given a port that is free here, with the ports after it (a fixed port may be
    any other process's on a shared machine)."""
    import socket

    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 2 * nodes >= 65536:
            continue
        try:
            return ApacheKafka(nodes=nodes, port=port), port
        except BrokerError:  # one of the following ports is taken
            continue
    raise AssertionError("no free run of ports found")


def test_the_nodes_get_consecutive_ports_from_a_given_one_and_all_are_in_the_bootstrap_list():
    k, port = _cluster_on_free_ports(3)
    assert k.bootstrap_servers == ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    assert (k.replication_factor, k.min_insync_replicas) == (3, 2)
    assert k.node_ids == [1, 2, 3]
    assert k.version == kafka_jars.read_lock().kafka_version


def test_a_port_in_use_is_one_line(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BrokerError, match=rf"^port {port} on 127.0.0.1 is in use"):
            ApacheKafka(port=port)


def test_a_node_asked_for_before_the_start_is_a_clear_error():
    k = ApacheKafka()
    with pytest.raises(BrokerError, match="not started"):
        k.kill(1)
    with pytest.raises(BrokerError, match=r"no node 4: the nodes are \[1\]"):
        k.kill(4)


# -- the jar lock --------------------------------------------------------------------------------


def test_the_repositorys_lock_pins_a_kafka_4_broker_and_its_log_binding():
    lock = kafka_jars.read_lock(LOCK_PATH)
    assert lock.kafka_version.split(".")[0] == "4"
    coords = {(j.group, j.artifact): j.version for j in lock.jars}
    for module in (
        "kafka-clients",
        "kafka-server",
        "kafka-storage",
        "kafka-metadata",
        "kafka-raft",
        "kafka-group-coordinator",
        "kafka-transaction-coordinator",
        "kafka-share-coordinator",
    ):
        assert coords[("org.apache.kafka", module)] == lock.kafka_version, module
    log4j = coords[("org.apache.logging.log4j", "log4j-api")]
    assert (
        coords[("org.apache.logging.log4j", "log4j-core")]
        == coords[kafka_jars.LOG_BINDING]
        == log4j
    )


def test_a_lock_reads_back_what_format_lock_wrote():
    jars = [
        kafka_jars.Jar("org.apache.kafka", "kafka_2.13", "4.9.0", "a" * 64),
        kafka_jars.Jar("com.example", "x-y.z", "1.0-rc1", "b" * 64),
    ]
    lock = parse_lock(format_lock(jars, "two jars\n\nfor a test"))
    assert sorted(lock.jars, key=lambda j: j.artifact) == sorted(jars, key=lambda j: j.artifact)
    assert lock.kafka_version == "4.9.0"
    assert [j.file_name for j in lock.jars] == [
        "com.example.x-y.z-1.0-rc1.jar",
        "org.apache.kafka.kafka_2.13-4.9.0.jar",
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "org.apache.kafka:kafka_2.13:4.0.0 abc\n",
            "line 1: expected 'group:artifact:version sha256'",
        ),
        (
            "# only a comment\ncom.example:x:1 " + "0" * 64 + "\n",
            "has no org.apache.kafka:kafka_2.13 line",
        ),
        (
            f"org.apache.kafka:kafka_2.13:4.0.0 {'0' * 64}\norg.apache.kafka:kafka_2.13:4.1.0 {'1' * 64}\n",
            "names org.apache.kafka:kafka_2.13 more than once",
        ),
    ],
)
def test_a_bad_lock_is_one_line_naming_what_is_wrong(text, message):
    with pytest.raises(BrokerError, match=message) as err:
        parse_lock(text, source="the lock")
    assert "\n" not in str(err.value) and isinstance(err.value, StreambanditError)


@pytest.mark.parametrize(
    "output, major",
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_412"', 8),
        ("no version here", None),
    ],
)
def test_the_java_major_version_is_read_from_java_version(output, major):
    assert java_major(output) == major


# -- the cache, with stand-ins for java and mvn on PATH --------------------------------------------


def script(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """A PATH with no java or mvn (the machine's may be in /usr/bin), to put stand-ins on, and an
    empty jar cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mkdir = shutil.which("mkdir")
    assert mkdir is not None
    (bin_dir / "mkdir").symlink_to(mkdir)  # the one tool the stand-ins run that is no shell builtin
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("STREAMBANDIT_KAFKA_CACHE", str(tmp_path / "cache"))
    return bin_dir


JAVA_17 = "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2\n"
# A stand-in for `mvn ... copy-dependencies -DoutputDirectory=DIR`: writes $JAR_BYTES as the one
# jar of the test's lock, or fails as Maven does when it cannot reach the repository.
MVN = """
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${a#-DoutputDirectory=}";; esac; done
if [ -n "$MVN_FAILS" ]; then echo "[INFO] Scanning"; echo "[ERROR] $MVN_FAILS"; echo "[ERROR] "; exit 1; fi
mkdir -p "$out" && printf '%s' "$JAR_BYTES" > "$out/org.apache.kafka.kafka_2.13-4.9.0.jar"
echo called >> "$CALLS"
"""


def one_jar_lock(content: bytes):
    return parse_lock(f"org.apache.kafka:kafka_2.13:4.9.0 {hashlib.sha256(content).hexdigest()}\n")


def test_no_java_on_path_is_one_line(tools):
    with pytest.raises(
        JavaToolMissing, match=r"^Apache Kafka needs Java 17 or newer and there is no java on PATH"
    ):
        kafka_jars.java_binary()


def test_an_old_java_is_one_line(tools):
    script(tools, "java", "echo 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    with pytest.raises(
        JavaToolMissing, match=r"needs Java 17 or newer; .*java is 'openjdk version \"11.0.2\""
    ):
        kafka_jars.java_binary()


def test_no_mvn_is_one_line_until_the_jars_are_cached(tools, tmp_path, monkeypatch):
    script(tools, "java", JAVA_17)
    lock = one_jar_lock(b"jar")
    with pytest.raises(JavaToolMissing, match="no mvn on PATH"):
        check_prerequisites(lock)
    with pytest.raises(JavaToolMissing, match="no mvn on PATH"):
        classpath(lock)
    script(tools, "mvn", MVN)
    monkeypatch.setenv("JAR_BYTES", "jar")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    classpath(lock)
    (tools / "mvn").unlink()
    check_prerequisites(lock)  # cached: Maven is no longer needed
    assert classpath(lock)[0].read_bytes() == b"jar"


def test_the_jars_are_fetched_once_and_checked(tools, tmp_path, monkeypatch):
    script(tools, "mvn", MVN)
    monkeypatch.setenv("JAR_BYTES", "the broker")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    lock = one_jar_lock(b"the broker")
    first = classpath(lock)
    assert classpath(lock) == first
    assert first == [
        tmp_path / "cache" / "4.9.0" / "jars" / "org.apache.kafka.kafka_2.13-4.9.0.jar"
    ]
    assert (tmp_path / "calls").read_text().count("called") == 1
    # Another lock for the same version (a relock) is fetched anew, not served the old copy.
    monkeypatch.setenv("JAR_BYTES", "relocked")
    assert classpath(one_jar_lock(b"relocked"))[0].read_bytes() == b"relocked"
    assert (tmp_path / "calls").read_text().count("called") == 2


def test_a_jar_whose_checksum_differs_from_the_lock_is_refused_and_not_cached(
    tools, tmp_path, monkeypatch
):
    script(tools, "mvn", MVN)
    monkeypatch.setenv("JAR_BYTES", "tampered")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    with pytest.raises(
        BrokerError,
        match=r"^org.apache.kafka:kafka_2.13:4.9.0 from Maven has SHA-256 [0-9a-f]{64}, "
        r"the lock says [0-9a-f]{64}: refusing to run it$",
    ):
        classpath(one_jar_lock(b"the broker"))
    assert not (tmp_path / "cache" / "4.9.0" / "jars").exists()
    assert [p.name for p in (tmp_path / "cache" / "4.9.0").iterdir()] == [".resolving"]


def test_a_maven_failure_is_one_line_with_its_first_error(tools, tmp_path, monkeypatch):
    script(tools, "mvn", MVN)
    monkeypatch.setenv("MVN_FAILS", "Failed to execute goal: Could not transfer artifact")
    with pytest.raises(
        BrokerError,
        match=r"^Maven could not fetch Apache Kafka's jars \(is Maven Central reachable\?\): "
        r"Failed to execute goal: Could not transfer artifact$",
    ):
        classpath(one_jar_lock(b"x"))


# -- the command ---------------------------------------------------------------------------------


def broker_command(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streambandit", "broker", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_broker_command_without_java_is_one_line_and_no_trace(tools):
    out = broker_command("--kafka", "--port", "0")
    assert out.returncode == 1
    assert out.stderr == (
        "streambandit: error: Apache Kafka needs Java 17 or newer and there is no java on PATH "
        "(Debian: apt-get install default-jre-headless)\n"
    )


def test_the_broker_command_without_mvn_or_cached_jars_is_one_line(tools):
    script(tools, "java", JAVA_17)
    out = broker_command("--kafka", "--port", "0")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (
        "streambandit: error: Apache Kafka's jars are fetched with Maven the first "
        "time, and there is no mvn on PATH (Debian: apt-get install maven)"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "3"], "--nodes and --data-dir are for Apache Kafka: add --kafka"),
        (["--data-dir", "x"], "--nodes and --data-dir are for Apache Kafka: add --kafka"),
        (["--kafka", "--nodes", "0"], "--nodes must be >= 1, got 0"),
    ],
)
def test_the_broker_commands_kafka_options_are_checked(args, message):
    out = broker_command(*args)
    assert (out.returncode, out.stderr) == (2, f"streambandit: error: {message}\n")
