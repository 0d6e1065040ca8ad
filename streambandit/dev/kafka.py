"""Apache Kafka on this machine, for development and the tests: the real broker, where the embedded
one (``streambandit.dev.tansu``) is only Kafka-compatible. Its jars come from Maven Central once,
checked against ``kafka-jars.lock`` (``streambandit.dev.kafka_jars``); it runs on Java 17+.

One node by default: a combined broker and controller (KRaft) on free loopback ports. With
``nodes=3``, three combined nodes form a cluster on one machine (replication factor 3,
``min.insync.replicas`` 2), whose nodes can be killed, stopped and restarted one at a time, or all
together on the same log directories, for broker-failure tests.

The interface is the embedded broker's (``start``/``stop``, a context manager,
``bootstrap_servers``, ``admin()``, ``create_topics``, ``log_tail``, ``wait``), so the fixtures
and ``streambandit broker`` take either.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from streambandit.dev.kafka_jars import JarLock, classpath, java_binary, read_lock
from streambandit.dev.kafka_security import ADMIN, Security
from streambandit.dev.kafka_security import KINDS as SECURITY_KINDS
from streambandit.dev.tansu import BrokerError, port_in_use
from streambandit.stream.kafka_checks import wait_until_served

__all__ = [
    "ApacheKafka",
    "server_properties",
    "render_properties",
    "new_cluster_id",
    "coordinator_partition",
    "INTERNAL_PARTITIONS",
]

log = logging.getLogger("streambandit")

HOST = "127.0.0.1"
# Fewer than the default 50: every node loads and elects each of them at every start, and a
# coordinator moves with its partition, which the failure tests want to find (coordinator_partition).
INTERNAL_PARTITIONS = 8


@dataclass(frozen=True)
class NodeAddress:
    node_id: int
    port: int  # clients
    controller_port: int


def server_properties(
    node: NodeAddress, voters: list[NodeAddress], data_dir: Path
) -> dict[str, str]:
    """The configuration of one combined broker+controller node of a cluster of ``len(voters)``."""
    rf = min(len(voters), 3)
    min_isr = max(1, rf - 1)  # one replica may be down and acks=all writes still go through
    return {
        "process.roles": "broker,controller",
        "node.id": str(node.node_id),
        # Static voters: a node's identity is its id and address, and a restarted node rejoins
        # without the dynamic quorum's add/remove steps.
        "controller.quorum.voters": ",".join(
            f"{v.node_id}@{HOST}:{v.controller_port}" for v in voters
        ),
        "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data_dir),
        # Topics exist because someone created them, as in production: a typo is an error, not a
        # new topic with the default partition count.
        "auto.create.topics.enable": "false",
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # A group's first member is assigned at once, not after 3 s of waiting for more.
        "group.initial.rebalance.delay.ms": "0",
        # The consumer group protocol (KIP-848), timed as the worker times the classic one
        # (config/kafka.py): a member learns of a change at its next heartbeat, so a partition a
        # leaving member hands over waits up to one heartbeat (5 s by default); a member that
        # stops answering keeps its partitions one session (45 s by default, and at least that).
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.min.session.timeout.ms": "6000",
        "group.consumer.session.timeout.ms": "6000",
        # A transaction left open by a killed producer is aborted within a second of its timeout
        # (default: checked every 10 s), so a test's recovery waits for the timeout alone.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        # A killed node is fenced, and leaves the ISRs, within seconds rather than the default 9 s
        # (heartbeat 2 s): an acks=all write waits for the ISR until then.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "4000",
        "replica.lag.time.max.ms": "10000",
        # Thread pools sized for a development machine of two cores shared with the tests.
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.replica.fetchers": "1",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        # The compaction buffer is 128 MB by default, a quarter of the small heap.
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    }


def render_properties(props: dict[str, str]) -> str:
    def escape(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{escape(k)}={escape(v)}\n" for k, v in props.items())


LOG4J2 = """\
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.filePattern = ${sys:kafka.logs.dir}/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
"""


def new_cluster_id() -> str:
    """A cluster id as Kafka's ``Uuid.randomUuid()`` prints it: 16 random bytes, URL-safe base64
    without padding, not starting with '-' (the tools would read it as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _java_string_hash(s: str) -> int:
    h = 0
    raw = s.encode("utf-16-be")
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, partitions: int = INTERNAL_PARTITIONS) -> int:
    """The partition of ``__transaction_state`` (for a transactional id) or ``__consumer_offsets``
    (for a group id) whose leader coordinates ``key``: Kafka's ``Utils.abs(key.hashCode()) % n``."""
    h = _java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass
class _Node:
    address: NodeAddress
    home: Path
    proc: subprocess.Popen | None = None
    out: object = field(default=None, repr=False)  # the JVM's stdout/stderr file while it runs

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def server_log(self) -> Path:
        return self.home / "logs" / "server.log"

    @property
    def jvm_log(self) -> Path:
        return self.home / "jvm.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class ApacheKafka:
    """Apache Kafka of ``nodes`` combined broker+controller nodes on loopback ports, started by
    ``start()`` (or ``with``) and stopped by ``stop()``.

    ``port``: the first node's client port (node *i* gets ``port + i - 1``); free ports when None.
    ``data_dir``: the nodes' log directories and logs, kept across stops (a later instance on the
    same directory finds its topics); a temporary directory, removed by ``stop()``, when None.

    >>> with ApacheKafka() as kafka:                           # doctest: +SKIP
    ...     kafka.create_topics(["contexts"], partitions=4)
    ...     print(kafka.bootstrap_servers)

    The nodes' JVMs die with the thread that started them (Linux), so that no broker outlives a
    test run that was killed: start and restart them from a thread that lives as long as they do.
    """

    def __init__(
        self,
        *,
        nodes: int = 1,
        port: int | None = None,
        data_dir: str | Path | None = None,
        start_timeout_s: float = 120.0,
        heap_mb: int = 512,
        lock: JarLock | None = None,
        cache_dir: str | Path | None = None,
        security: str | None = None,
    ):
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if security is not None and security not in SECURITY_KINDS:
            raise ValueError(f"security {security!r}: one of {', '.join(SECURITY_KINDS)} or None")
        if security is not None and nodes != 1:
            raise ValueError("a secured Apache Kafka has one node")
        self.security_kind = security
        self.security: Security | None = None  # made with the data directory, at start()
        self.node_count = nodes
        self._lock = lock
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._start_timeout_s = start_timeout_s
        self._heap_mb = heap_mb
        self.replication_factor = min(nodes, 3)
        self.min_insync_replicas = max(1, self.replication_factor - 1)
        if port is not None:
            busy = [p for p in range(port, port + nodes) if port_in_use(p, HOST)]
            if busy:
                raise BrokerError(
                    f"port {busy[0]} on {HOST} is in use (another broker?): choose another --port"
                )
        taken = set(range(port, port + nodes)) if port is not None else set()

        def another() -> int:  # a port no other listener of this cluster was given
            while (p := _free_port()) in taken:
                pass
            taken.add(p)
            return p

        self._addresses = [
            NodeAddress(i, port + i - 1 if port is not None else another(), another())
            for i in range(1, nodes + 1)
        ]
        self.port = self._addresses[0].port
        self.bootstrap_servers = ",".join(f"{HOST}:{a.port}" for a in self._addresses)
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self._nodes: dict[int, _Node] = {}
        self._java: str | None = None
        self._classpath: str | None = None
        self.cluster_id: str | None = None
        self.version = (lock or read_lock()).kafka_version
        self.last_start_s: float | None = None  # how long the last start() took, jar fetch included

    # -- the embedded broker's interface ------------------------------------------------------------

    @property
    def log_path(self) -> Path | None:
        """The first node's log (each node's is ``node_dir(i)/logs/server.log``); None before the
        first start chose a temporary directory."""
        return None if self.data_dir is None else self.data_dir / "node-1" / "logs" / "server.log"

    def start(self) -> "ApacheKafka":
        if any(n.running() for n in self._nodes.values()):
            return self
        began = time.monotonic()
        self._java = java_binary()
        self._classpath = os.pathsep.join(str(p) for p in classpath(self._lock, self._cache_dir))
        if self.data_dir is None:
            self.data_dir = Path(tempfile.mkdtemp(prefix="streambandit-kafka-"))
        if self.security_kind is not None and self.security is None:
            self.security = Security(self.security_kind, self.data_dir / "security")
            self.security.bootstrap_servers = self.bootstrap_servers
        try:
            self._prepare()
            for node in self._nodes.values():
                self._launch(node)
            log.info(
                "Apache Kafka %s starting: %d node(s), bootstrap=%s, data=%s",
                self.version,
                self.node_count,
                self.bootstrap_servers,
                self.data_dir,
            )
            self._wait_brokers(set(self._nodes), self._start_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.last_start_s = time.monotonic() - began
        log.info(
            "Apache Kafka ready in %.1f s bootstrap=%s", self.last_start_s, self.bootstrap_servers
        )
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``timeout_s``); a temporary data directory
        is removed. Safe to call twice."""
        self._stop_nodes(list(self._nodes.values()), timeout_s)
        if self._owns_dir and self.data_dir is not None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.data_dir = None
            self.security = None
            self._nodes = {}
            self.cluster_id = None

    def wait(self) -> int:
        """Block until a node exits by itself (its exit code; the others are stopped).
        KeyboardInterrupt stops them all and goes on up."""
        assert self._nodes, "not started"
        try:
            while True:
                for node in self._nodes.values():
                    if node.proc is not None and node.proc.poll() is not None:
                        code = node.proc.returncode
                        self.stop()
                        return code
                time.sleep(0.5)
        except KeyboardInterrupt:
            self.stop()
            raise

    def client_settings(self, principal: str | None = None) -> dict[str, str]:
        """librdkafka settings that reach this broker as ``principal`` (the admin, a super user,
        when None): ``bootstrap.servers`` and, on a secured broker, the principal's credentials."""
        own = {"bootstrap.servers": self.bootstrap_servers}
        if self.security is None:
            if principal is not None:
                raise BrokerError("this Apache Kafka is not secured: it has no principals")
            return own
        return own | self.security.client_settings(principal or ADMIN)

    def admin(self) -> AdminClient:
        return AdminClient(self.client_settings())

    def create_topics(
        self, names: list[str], partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create topics (existing ones are left as they are), replicated on every node up to three,
        and wait until each partition's leader serves it."""
        admin = self.admin()
        existing = set(admin.list_topics(timeout=10).topics)
        new = [
            NewTopic(
                n,
                num_partitions=partitions,
                replication_factor=self.replication_factor,
                config=config or {},
            )
            for n in names
            if n not in existing
        ]
        if new:
            for name, fut in admin.create_topics(new).items():
                try:
                    fut.result(timeout=30)
                except KafkaException as exc:
                    if "TOPIC_ALREADY_EXISTS" not in str(exc):
                        raise BrokerError(f"could not create topic {name!r}: {exc}") from exc
        deadline = time.monotonic() + 30
        topics = wait_until_served(admin, names, 30)
        if topics is None:
            raise BrokerError(f"topics {names} did not get leaders within 30 s")
        # The metadata names a leader before that node has taken the partition on: a ListOffsets
        # then answers NOT_LEADER_FOR_PARTITION, which clients that do not retry it take as fatal.
        # Created means served here, as on a cluster whose topics were made long before.
        probe = Consumer(
            {
                **self.client_settings(),
                "group.id": "streambandit-dev-probe",
                "enable.auto.commit": False,
            }
        )
        pending = [TopicPartition(n, p) for n in names for p in topics[n].partitions]
        last = ""
        try:
            while pending and time.monotonic() < deadline:
                try:
                    probe.get_watermark_offsets(pending[0], timeout=5, cached=False)
                    pending.pop(0)
                except KafkaException as exc:
                    last = str(exc)
                    time.sleep(0.1)
        finally:
            probe.close()
        if pending:
            raise BrokerError(
                f"{pending[0].topic}[{pending[0].partition}] was not served within 30 s of its creation "
                f"({last})"
            )

    def log_tail(self, lines: int = 30, node_id: int | None = None) -> str:
        """The last lines of a node's log (of every node, each under its id, when None)."""
        ids = [node_id] if node_id is not None else sorted(self._nodes) or [1]
        parts = []
        for i in ids:
            node = self._nodes.get(i)
            if node is None:
                continue
            text = ""
            for path in (
                node.server_log,
                node.jvm_log,
            ):  # the JVM's own output when log4j never started
                try:
                    text = "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
                except OSError:
                    continue
                if text.strip():
                    break
            text = text or "(no log)"
            parts.append(text if len(ids) == 1 else f"--- node {i} ({node.server_log})\n{text}")
        return "\n".join(parts) or "(no broker log)"

    def __enter__(self) -> "ApacheKafka":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- nodes one at a time, and the cluster as a whole --------------------------------------------

    @property
    def node_ids(self) -> list[int]:
        return [a.node_id for a in self._addresses]

    def node_dir(self, node_id: int) -> Path:
        return self._node(node_id).home

    def node_address(self, node_id: int) -> str:
        return f"{HOST}:{self._node(node_id).address.port}"

    def running_nodes(self) -> list[int]:
        return [i for i, n in sorted(self._nodes.items()) if n.running()]

    def kill(self, node_id: int) -> None:
        """SIGKILL one node: no controlled shutdown, its replicas fall out of the ISRs once the
        controller fences it (``broker.session.timeout.ms``)."""
        node = self._node(node_id)
        if node.running():
            node.proc.kill()
        self._reap(node)

    def stop_node(self, node_id: int, timeout_s: float = 30.0) -> None:
        """A clean stop of one node (SIGTERM: controlled shutdown moves its leaderships first)."""
        self._stop_nodes([self._node(node_id)], timeout_s)

    def start_node(self, node_id: int, timeout_s: float | None = None) -> None:
        """Start a stopped or killed node on its directories and ports, and wait until it is
        registered with the controller again."""
        node = self._node(node_id)
        if node.running():
            return
        self._launch(node)
        self._wait_brokers({node_id}, timeout_s or self._start_timeout_s, stop_on_failure=False)

    def restart_node(self, node_id: int, kill: bool = False) -> None:
        (self.kill if kill else self.stop_node)(node_id)
        self.start_node(node_id)

    def restart(self, kill: bool = False) -> None:
        """Stop every node (or kill them all) and start them again on the same log directories
        and ports: what was committed before is there after."""
        nodes = list(self._nodes.values())
        if kill:
            for node in nodes:
                if node.running():
                    node.proc.kill()
                self._reap(node)
        else:
            self._stop_nodes(nodes, 60.0)
        for node in nodes:
            self._launch(node)
        self._wait_brokers(set(self._nodes), self._start_timeout_s, stop_on_failure=False)

    # -- where things are ---------------------------------------------------------------------------

    def alive_brokers(self, timeout_s: float = 5.0) -> set[int]:
        """The brokers the controller has registered and not fenced, as the metadata lists them."""
        return set(self.admin().list_topics(timeout=timeout_s).brokers)

    def leader(self, topic: str, partition: int = 0, timeout_s: float = 5.0) -> int:
        """The node leading ``topic[partition]`` (-1 while it has none)."""
        md = self.admin().list_topics(topic, timeout=timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            raise BrokerError(f"no partition {topic}[{partition}] on this cluster")
        return int(t.partitions[partition].leader)

    def in_sync_replicas(self, topic: str, partition: int = 0, timeout_s: float = 5.0) -> list[int]:
        md = self.admin().list_topics(topic, timeout=timeout_s)
        t = md.topics.get(topic)
        if t is None or t.error is not None or partition not in t.partitions:
            raise BrokerError(f"no partition {topic}[{partition}] on this cluster")
        return sorted(t.partitions[partition].isrs)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node coordinating ``transactional_id``'s transactions (once a producer with that id
        has initialised: ``__transaction_state`` is created then)."""
        return self.leader("__transaction_state", coordinator_partition(transactional_id))

    def group_coordinator(self, group_id: str) -> int:
        """The node coordinating consumer group ``group_id`` (once some group has committed or
        joined: ``__consumer_offsets`` is created then)."""
        return self.leader("__consumer_offsets", coordinator_partition(group_id))

    def wait_in_sync(self, timeout_s: float = 60.0) -> None:
        """Until every partition, internal ones included, has all its replicas in sync: after a
        node restarts, before the next failure of a test."""
        deadline = time.monotonic() + timeout_s
        admin = self.admin()
        lagging: list[str] = []
        while time.monotonic() < deadline:
            md = admin.list_topics(timeout=5)
            lagging = [
                f"{t.topic}[{p.id}]"
                for t in md.topics.values()
                for p in t.partitions.values()
                if sorted(p.isrs) != sorted(p.replicas) or p.leader < 0
            ]
            if not lagging:
                return
            time.sleep(0.2)
        raise BrokerError(
            f"{len(lagging)} partitions still not in sync after {timeout_s:.0f} s, e.g. {lagging[:3]}"
        )

    # -- internals ----------------------------------------------------------------------------------

    def _node(self, node_id: int) -> _Node:
        node = self._nodes.get(node_id)
        if node is None:
            raise BrokerError(
                f"no node {node_id}: the nodes are {self.node_ids}"
                if node_id not in self.node_ids
                else "Apache Kafka is not started"
            )
        return node

    def _prepare(self) -> None:
        """Each node's directories and configuration; storage formatted where it is not yet (a
        data directory from an earlier run keeps its cluster id and topics)."""
        assert self.data_dir is not None
        homes = {a.node_id: self.data_dir / f"node-{a.node_id}" for a in self._addresses}
        stray = sorted(p.name for p in self.data_dir.glob("node-*") if p not in homes.values())
        if stray:
            raise BrokerError(
                f"{self.data_dir} holds a cluster of other nodes ({', '.join(stray)}): start it with as "
                f"many nodes, or use another data directory"
            )
        formatted = [h for h in homes.values() if _cluster_id_of(h / "data") is not None]
        if formatted and len(formatted) != len(homes):
            raise BrokerError(
                f"{self.data_dir} holds a cluster of {len(formatted)} node(s), not {len(homes)}: start it "
                f"with as many nodes, or use another data directory"
            )
        ids = {_cluster_id_of(h / "data") for h in homes.values()} - {None}
        if len(ids) > 1:
            raise BrokerError(
                f"the nodes under {self.data_dir} belong to different clusters: {sorted(ids)}"
            )
        self.cluster_id = ids.pop() if ids else new_cluster_id()
        formats = []
        for a in self._addresses:
            node = _Node(a, homes[a.node_id])
            self._nodes[a.node_id] = node
            (node.home / "logs").mkdir(parents=True, exist_ok=True)
            props = server_properties(a, self._addresses, node.data)
            if self.security is not None:
                props |= self.security.server_properties(a.port, a.controller_port, HOST)
            (node.home / "server.properties").write_text(render_properties(props))
            (node.home / "log4j2.properties").write_text(LOG4J2)
            if _cluster_id_of(node.data) is None:
                formats.append(
                    (
                        node,
                        subprocess.Popen(
                            self._java_command(node, "kafka.tools.StorageTool", heap_mb=128)
                            + [
                                "format",
                                "-t",
                                self.cluster_id,
                                "-c",
                                str(node.home / "server.properties"),
                                *(self.security.format_arguments() if self.security else []),
                            ],
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True,
                        ),
                    )
                )
        for node, proc in formats:  # formatted side by side: each is a JVM start of its own
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                reason = [ln for ln in out.splitlines() if ln.strip()][-1:] or [
                    f"exit code {proc.returncode}"
                ]
                raise BrokerError(
                    f"formatting node {node.address.node_id}'s storage failed: {reason[0]}"
                )

    def _java_command(self, node: _Node, main: str, heap_mb: int) -> list[str]:
        assert self._java is not None and self._classpath is not None
        # The JVM dies with the thread that started it, so a test run that is killed (or the
        # suite's hang guard, which ends the process without cleanup) leaves no broker behind.
        guard = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        return guard + [
            self._java,
            f"-Xms{min(heap_mb, 256)}m",
            f"-Xmx{heap_mb}m",
            # One collector thread and no concurrent phases: two cores are shared with the tests.
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node.home / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node.home / 'logs'}",
            "-cp",
            self._classpath,
            main,
        ]

    def _launch(self, node: _Node) -> None:
        node.out = open(node.jvm_log, "ab")
        node.proc = subprocess.Popen(
            self._java_command(node, "kafka.Kafka", self._heap_mb)
            + [str(node.home / "server.properties")],
            stdin=subprocess.DEVNULL,
            stdout=node.out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_brokers(self, ids: set[int], timeout_s: float, stop_on_failure: bool = True) -> None:
        """Until the metadata lists every node of ``ids`` as a live broker; a node that exits, or
        a timeout, is an error carrying the log's tail."""
        deadline = time.monotonic() + timeout_s
        admin = None  # made once a port accepts: a client refused at first logs errors to stderr
        last = "no answer"
        while time.monotonic() < deadline:
            for i in ids:
                node = self._nodes[i]
                if node.proc is not None and node.proc.poll() is not None:
                    code, tail = node.proc.returncode, self.log_tail(node_id=i)
                    self._reap(node)
                    if stop_on_failure:
                        self.stop()
                    raise BrokerError(
                        f"Apache Kafka node {i} exited with code {code} while starting: "
                        f"{_reason(tail)}\n{tail}"
                    )
            try:
                if admin is None:
                    up = [n.address.port for n in self._nodes.values() if n.running()]
                    for port in up:
                        socket.create_connection((HOST, port), timeout=1.0).close()
                    admin = AdminClient(
                        self.client_settings()
                        | {"bootstrap.servers": ",".join(f"{HOST}:{p}" for p in up)}
                    )
                brokers = set(admin.list_topics(timeout=1.0).brokers)
                if ids <= brokers:
                    return
                last = f"brokers registered: {sorted(brokers)}"
            except (KafkaException, OSError) as exc:
                last = str(exc)  # the message only: a traceback would keep the admin client alive
            time.sleep(0.1)
        tail = self.log_tail()
        if stop_on_failure:
            self.stop()
        raise BrokerError(
            f"Apache Kafka node(s) {sorted(ids)} did not answer within {timeout_s:.0f} s ({last}):\n{tail}"
        )

    def _stop_nodes(self, nodes: list[_Node], timeout_s: float) -> None:
        running = [n for n in nodes if n.running()]
        for node in running:
            node.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node in running:
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning(
                    "Apache Kafka node %d did not stop within %.0f s of SIGTERM: killed",
                    node.address.node_id,
                    timeout_s,
                )
                node.proc.kill()
        for node in nodes:
            self._reap(node)

    @staticmethod
    def _reap(node: _Node) -> None:
        if node.proc is not None:
            node.proc.wait()
            node.proc = None
        if node.out is not None:
            node.out.close()
            node.out = None


def _cluster_id_of(data: Path) -> str | None:
    try:
        text = (data / "meta.properties").read_text()
    except OSError:
        return None
    m = re.search(r"^cluster\.id=(\S+)", text, re.M)
    return m.group(1) if m else None


def _reason(tail: str) -> str:
    """The line of a failed start's log that says why: the last ERROR, else the last line."""
    lines = [ln for ln in tail.splitlines() if ln.strip()]
    errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln or ln.startswith("Error")]
    return (errors or lines or ["no log"])[-1].strip()
