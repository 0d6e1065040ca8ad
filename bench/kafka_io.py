"""The benchmarks' side of a broker (the embedded one, or Apache Kafka where a benchmark takes a
broker kind): topics, a backlog produced, a ``streambandit serve`` subprocess with its
configuration, its log read, its group's progress."""

from __future__ import annotations

import collections
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench import traffic
from streambandit.config.worker import Topics
from streambandit.dev.kafka import ApacheKafka
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.wire import Context, Reward, encode

# The embedded broker holds a fetch for the whole fetch.wait.max.ms even when data is there
# (docs/notes/tansu.md), so every consumer of a benchmark on it shortens it.
FAST_FETCH = {"fetch.wait.max.ms": 10}

BROKERS = {"tansu": EmbeddedBroker, "kafka": ApacheKafka}
Broker = EmbeddedBroker | ApacheKafka


def fetch_settings(broker: Broker) -> dict:
    """The consumer settings a broker needs: Apache Kafka answers a fetch as soon as a record is
    there, so librdkafka's default stays; the embedded broker needs ``FAST_FETCH``."""
    return {} if isinstance(broker, ApacheKafka) else dict(FAST_FETCH)


def broker_pid(broker: Broker) -> int:
    """The broker's process (Apache Kafka: its first node), for its CPU time."""
    if isinstance(broker, ApacheKafka):
        return broker._node(broker.node_ids[0]).proc.pid  # noqa: SLF001 (benchmark only)
    return broker._proc.pid  # noqa: SLF001 (benchmark only)


def fresh_topics(broker: EmbeddedBroker, partitions: int = traffic.PARTITIONS) -> Topics:
    tag = uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"c-{tag}",
        rewards=f"r-{tag}",
        actions=f"a-{tag}",
        joined=f"j-{tag}",
        dead_letter=f"d-{tag}",
    )
    broker.create_topics(t.all(), partitions=partitions)
    return t


def produce_waiting(p: Producer, topic: str, key: bytes | None, value: bytes, **kwargs) -> None:
    """``p.produce``, waiting for deliveries while librdkafka's queue is full (a loop that offers
    more than the broker takes then offers what it can send instead of failing)."""
    while True:
        try:
            p.produce(topic, key=key, value=value, **kwargs)
            return
        except BufferError:
            p.poll(0.01)


def produce(broker: EmbeddedBroker, t: Topics, events: list[tuple[Context, Reward | None]]) -> dict:
    """Produce the events; returns per (topic, partition) the offset after the last record, from
    the delivery reports (the embedded broker reports too low a high watermark for batched,
    non-transactional writes: docs/notes/tansu.md)."""
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,
        }
    )
    ends: dict = {}

    def delivered(err, msg) -> None:
        if err is not None:
            raise RuntimeError(f"produce failed: {err}")
        key = (msg.topic(), msg.partition())
        ends[key] = max(ends.get(key, 0), msg.offset() + 1)

    def send(topic: str, key: str, value: bytes) -> None:
        produce_waiting(p, topic, key.encode(), value, on_delivery=delivered)

    n = 0
    for ctx, rew in events:
        send(t.contexts, ctx.model_key, encode(ctx))
        n += 1
        if rew is not None:
            send(t.rewards, rew.model_key, encode(rew))
            n += 1
        if n % 5000 == 0:
            p.poll(0)
    p.flush()
    return ends


def worker_toml(
    group: str,
    t: Topics,
    models_toml: str,
    worker: dict | None = None,
    consumer: dict | None = None,
    producer: dict | None = None,
    fetch: dict = FAST_FETCH,
) -> str:
    """A ``streambandit serve`` configuration: group, topics, models, and the settings given
    (``fetch``: the broker's own consumer settings, ``fetch_settings``)."""

    def table(name: str, values: dict) -> list[str]:
        quote = name.startswith("kafka")  # librdkafka's dotted names are quoted TOML keys
        return [
            f"[{name}]",
            *(
                (f'"{k}"' if quote else k) + f" = {traffic.toml_value(v)}"
                for k, v in values.items()
            ),
            "",
        ]

    lines = [
        *table("kafka.consumer", {**fetch, **(consumer or {})}),
        *(table("kafka.producer", producer) if producer else []),
        *table("worker", {"group_id": group, "snapshot_interval_s": 30, **(worker or {})}),
        *table(
            "topics",
            {
                k: getattr(t, k)
                for k in ("contexts", "decisions", "rewards", "actions", "joined", "dead_letter")
            },
        ),
    ]
    return "\n".join(lines) + models_toml


def serve(broker: EmbeddedBroker, config_text: str, workdir: Path, group: str) -> subprocess.Popen:
    """``streambandit serve`` as deployed, its log (-v) on a pipe for ``wait_for_line``."""
    cfg = workdir / f"{group}.toml"
    cfg.write_text(config_text)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "-v",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--snapshot-dir",
            str(workdir / group),
            "--processes",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def serve_to_file(
    broker: EmbeddedBroker,
    config: Path,
    snapshot_dir: Path | None,
    instance: str,
    log: Path,
    snapshot_topic: str | None = None,
) -> subprocess.Popen:
    """``streambandit serve`` as deployed (one process, its own instance id), its log in ``log``;
    its snapshots in ``snapshot_dir``, or in ``snapshot_topic`` when given."""
    store = (
        ["--snapshot-topic", snapshot_topic]
        if snapshot_topic
        else ["--snapshot-dir", str(snapshot_dir)]
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(config),
            "--bootstrap-servers",
            broker.bootstrap_servers,
            *store,
            "--processes",
            "1",
            "--instance-id",
            instance,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "w"),
    )


def wait_for_line(
    proc: subprocess.Popen, pattern: str, count: int, timeout_s: float = 120
) -> list[re.Match]:
    """Read the worker's log until ``pattern`` matched ``count`` times."""
    found, deadline, tail = [], time.monotonic() + timeout_s, collections.deque(maxlen=20)
    while len(found) < count:
        line = proc.stderr.readline()
        if not line:
            proc.wait(10)
            raise RuntimeError(
                f"the worker exited (code {proc.returncode}) before logging {pattern!r}; its last "
                f"lines:\n{''.join(tail)}"
            )
        tail.append(line)
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern!r} within {timeout_s} s")
        m = re.search(pattern, line)
        if m:
            found.append(m)
    return found


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    proc.communicate(timeout=60)


def stop_all(procs, timeout_s: float = 120) -> None:
    """SIGTERM every process still running; one still running after ``timeout_s`` is killed."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()


def caught_up(broker: EmbeddedBroker, group: str, ends: dict) -> bool:
    """Whether the group's committed offsets reached ``ends`` ((topic, partition) -> offset)."""
    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
        }
    )
    try:
        got = c.committed([TopicPartition(topic, p) for topic, p in ends], timeout=10)
        return all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in got)
    finally:
        c.close()


def broker_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` (utime + stime)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
