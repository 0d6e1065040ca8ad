"""What the application side does in the integration tests: produce events, read our outputs."""

from __future__ import annotations

import re
import time
import uuid

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from streambandit.config.worker import Topics
from streambandit.stream.logs import committed_view, group_committed, high_watermark, read_range
from streambandit.wire import Context, Reward, decode, encode


def client_settings(broker) -> dict:
    """The librdkafka settings that reach ``broker`` with full rights: its address, and on a
    secured Apache Kafka (dev/kafka_security.py) the admin's credentials."""
    settings = getattr(broker, "client_settings", None)
    return settings() if settings else {"bootstrap.servers": broker.bootstrap_servers}


def producer(broker) -> Producer:
    # Idempotent: a retried send must not duplicate an input record (the tests compare runs that
    # must see the same input).
    return Producer(
        {
            **client_settings(broker),
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,
        }
    )


def send(
    prod: Producer, topic: str, event, key: bytes | None = None, raw: bytes | None = None
) -> None:
    k = key if key is not None else event.model_key.encode()
    prod.produce(topic, key=k, value=raw if raw is not None else encode(event))


def send_numbered(prod: Producer, topics, rng, start: int, n: int, t0_ms: int) -> None:
    """Contexts e{start}..e{start+n-1} (3 arms, d = 3, 4 model keys m-0..m-3, 10 ms apart from
    ``t0_ms``) and a reward of 1 for every even one 5 ms after it, flushed."""
    for i in range(start, start + n):
        send(
            prod,
            topics.contexts,
            Context(
                f"e{i}", f"m-{i % 4}", t0_ms + 10 * i, ("a", "b", "c"), rng.standard_normal((3, 3))
            ),
        )
        if i % 2 == 0:
            send(prod, topics.rewards, Reward(f"e{i}", f"m-{i % 4}", t0_ms + 10 * i + 5, 1.0))
    prod.flush()


def assert_numbered_once(out: dict, n: int) -> None:
    """What ``send_numbered`` sent of e0..e{n-1}, through a worker: one committed action per
    context, one joined record each, the even ones with their reward, nothing dead-lettered."""
    ids = sorted(a.event_id for a in out["actions"])
    assert ids == sorted(f"e{i}" for i in range(n))
    joined = {j.event_id: j for j in out["joined"]}
    assert sorted(joined) == ids and len(joined) == len(out["joined"])
    assert all(joined[f"e{i}"].reward_observed == (i % 2 == 0) for i in range(n))
    assert out["dead_letter"] == []


def is_tansu(broker) -> bool:
    """Whether ``broker`` is the embedded one (Tansu), with the differences from Apache Kafka that
    docs/notes/tansu.md lists: its read_committed readers see aborted transactions' records, its
    reported high watermark can be too low, it has no record size limit."""
    from streambandit.dev.tansu import EmbeddedBroker

    return isinstance(broker, EmbeddedBroker)


def read_all(broker, topic: str, partitions: int = 2) -> list:
    """Every readable (read_committed) message of a topic, partition by partition, read to the
    partition's end (EOF), not to its reported high watermark: the embedded broker reports too
    low a one for topics written in non-transactional batches (docs/notes/tansu.md). On Apache
    Kafka that reported end is checked to hold everything read (the EOF read is only Tansu's)."""
    c = Consumer(
        {
            **client_settings(broker),
            "group.id": "reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        msgs = [m for p in range(partitions) for m in read_range(c, topic, p, 0, end=2**62)]
        if not is_tansu(broker):
            for p in range(partitions):
                read = [m.offset() for m in msgs if m.partition() == p]
                end = high_watermark(c, topic, p)
                assert not read or read[-1] < end, (
                    f"{topic}[{p}]: read up to offset {read[-1]}, reported end {end}"
                )
        return msgs
    finally:
        c.close()


def fresh_topics(
    broker, partitions: int = 2, tag: str | None = None, learn_only: bool = False
) -> Topics:
    """A co-partitioned topic set named for this test alone (``tag``, or a random one), created:
    a learn-only worker's (decisions for contexts) with ``learn_only``."""
    tag = tag or uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"contexts-{tag}",
        decisions=f"decisions-{tag}",
        rewards=f"rewards-{tag}",
        actions=f"actions-{tag}",
        joined=f"joined-{tag}",
        dead_letter=f"dead-letter-{tag}",
    )
    broker.create_topics(t.all(learn_only), partitions=partitions)
    return t


def committed_offsets(
    broker, group: str, topic: str, partitions: int = 2, stable: bool = True
) -> dict[int, int]:
    """The group's committed offsets. ``stable``: wait while a transaction holds offsets of the
    group not yet committed (librdkafka asks so of a read_committed consumer, KIP-447), as the
    worker's recovery does; otherwise the offsets last committed, at once."""
    c = Consumer(
        {
            **client_settings(broker),
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed" if stable else "read_uncommitted",
        }
    )
    try:
        got = group_committed(c, [TopicPartition(topic, p) for p in range(partitions)], 10)
        return {tp.partition: max(tp.offset, 0) for tp in got}
    finally:
        c.close()


def end_offsets(broker, topic: str, partitions: int = 2) -> dict[int, int]:
    """Where each partition of ``topic`` ends for a read_committed reader: the offset its
    end-of-partition event names, read to the end (the embedded broker's reported high watermark
    can be too low, docs/notes/tansu.md)."""
    from confluent_kafka import KafkaError

    c = Consumer(
        {
            **client_settings(broker),
            "group.id": "reader",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + 30
        while len(ends) < partitions and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() and m.error().code() == KafkaError._PARTITION_EOF:
                    ends[m.partition()] = m.offset()
        assert len(ends) == partitions, (
            f"{topic}: no end seen for {set(range(partitions)) - set(ends)}"
        )
        return ends
    finally:
        c.close()


def all_input_committed(broker, group: str, topics: list[str], partitions: int = 2) -> bool:
    """Whether the group's committed offset of every partition of ``topics`` is its end."""
    return all(
        committed_offsets(broker, group, t, partitions) == end_offsets(broker, t, partitions)
        for t in topics
    )


def outputs(
    broker, topics, group: str, partitions: int = 2, first_input: str | None = None
) -> dict[str, list]:
    """Our output logs as a committed transaction wrote them: per topic, the decoded records of
    all partitions. ``first_input``: the worker's first input when it is not contexts (a
    learn-only worker's decisions).

    On Tansu, whose readers see aborted transactions' records, through the committed-view filter
    (streambandit/stream/logs.py). On Apache Kafka without it: what a plain read_committed reader
    sees, checked to be what the filter would keep (every record's trigger below the group's
    committed offsets, read after the records, and each natural key once), so a test's count of
    actions or joined records there holds of the plain reader, and the filter is shown a no-op.
    """

    def offsets() -> dict[int, dict[int, int]]:
        first = committed_offsets(broker, group, first_input or topics.contexts, partitions)
        rewards = committed_offsets(broker, group, topics.rewards, partitions)
        return {p: {0: first[p], 1: rewards[p]} for p in range(partitions)}

    filtered = is_tansu(broker)
    if not filtered:
        # Apache Kafka writes a transaction's markers just after commit_transaction returns: a
        # read_committed reader sees the last transaction only once they are written.
        _markers_written(broker, [getattr(topics, name) for name in OUTPUT_LOGS], partitions)
    # Offsets first on Tansu: a transaction that commits while the logs are read is left out,
    # rather than its records judged against offsets that do not include it. After, on Kafka:
    # every record read was committed with offsets at least as far as these.
    committed = offsets() if filtered else None
    logs = {name: read_all(broker, getattr(topics, name), partitions) for name in OUTPUT_LOGS}
    if not filtered:
        committed = offsets()
    out: dict = {"raw_counts": {name: len(msgs) for name, msgs in logs.items()}}
    for name, msgs in logs.items():
        recs = []
        for p in range(partitions):
            events = [decode(m.value()) for m in msgs if m.partition() == p]
            view = committed_view(events, committed[p])
            if not filtered:
                kept = {id(r) for r in view}
                dropped = [(r.natural_key, r.trigger) for r in events if id(r) not in kept]
                assert not dropped, (
                    f"a plain read_committed reader of {name}[{p}] saw records that no committed "
                    f"transaction wrote, or one twice (committed {committed[p]}): {dropped[:5]}"
                )
                view = events
            recs += view
        out[name] = recs
    return out


OUTPUT_LOGS = ("actions", "joined", "dead_letter")


def _markers_written(broker, topics: list[str], partitions: int, timeout_s: float = 10) -> None:
    """Wait, at most ``timeout_s``, until no partition of ``topics`` has records a read_committed
    reader cannot see yet (its last stable offset is its end); a transaction a test left open
    stays open, and the caller reads what is committed."""
    clients = [
        Consumer(
            {
                **client_settings(broker),
                "group.id": "reader",
                "isolation.level": level,
            }
        )
        for level in ("read_committed", "read_uncommitted")
    ]
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]

    def settled() -> bool:
        stable, end = (
            [c.get_watermark_offsets(tp, timeout=10, cached=False)[1] for tp in tps]
            for c in clients
        )
        return stable == end

    try:
        wait_for(settled, timeout_s=timeout_s, interval_s=0.05)
    finally:
        for c in clients:
            c.close()


def same_state(a: dict, b: dict) -> bool:
    """Two policy states (``state_dict()``, or as a snapshot holds them) are equal to the bit."""
    return a.keys() == b.keys() and all(
        a[k].tobytes() == b[k].tobytes() if isinstance(a[k], np.ndarray) else a[k] == b[k]
        for k in a
    )


def engine_states_equal(a: dict, b: dict) -> None:
    """Two engine snapshots hold the same models, to the bit, the same open decisions and the
    same watermark."""
    assert a["models"].keys() == b["models"].keys() and a["models"]
    for key in a["models"]:
        assert same_state(a["models"][key], b["models"][key]), key
    assert [x["event_id"] for x in a["pending"]] == [x["event_id"] for x in b["pending"]]
    assert a["watermark_ms"] == b["watermark_ms"]


def wait_for(predicate, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


# -- added for test_bad_input / test_window / test_learning_e2e --------------------------------


class Sent:
    """A produced record and, once the producer is flushed, where it landed."""

    def __init__(self, topic: str, key: bytes | None, value: bytes) -> None:
        self.topic, self.key, self.value = topic, key, value
        self.partition: int | None = None
        self.offset: int | None = None

    def _delivered(self, err, msg) -> None:
        if err is not None:
            raise RuntimeError(f"delivery of a test record failed: {err}")
        self.partition, self.offset = msg.partition(), msg.offset()


def send_tracked(prod: Producer, topic: str, key: bytes | None, value: bytes) -> Sent:
    """Produce one record and return a :class:`Sent` whose position is known after ``flush()``."""
    s = Sent(topic, key, value)
    prod.produce(topic, key=key, value=value, on_delivery=s._delivered)
    prod.poll(0)
    return s


def run_in_thread(worker) -> tuple:
    """``worker.run()`` on a daemon thread; returns the thread and the list that collects what
    the run raised (a test asserts on it after stopping or joining the thread)."""
    import threading

    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def start_worker(broker, topics, snapshot_dir, group: str, models: dict, **overrides):
    """A worker on its own thread (as tests/integration/test_worker.py starts one)."""
    import threading

    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import WorkerConfig
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import Worker

    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(models),
        group_id=group,
        topics=topics,
        **overrides,
    )
    w = Worker(cfg, DirectoryStore(snapshot_dir))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    return w, t


def caught_up(broker, topics, group: str, sent: list[Sent], partitions: int = 2) -> bool:
    """True when the group's committed input offsets are past every record in ``sent``."""
    need: dict[tuple[str, int], int] = {}
    for s in sent:
        need[(s.topic, s.partition)] = max(need.get((s.topic, s.partition), 0), s.offset + 1)
    for topic in {t for t, _ in need}:
        # Without waiting for a transaction that holds offsets (a killed worker's stays open until
        # fenced or timed out): those are not committed yet either way.
        got = committed_offsets(broker, group, topic, partitions, stable=False)
        if any(got[p] < off for (t, p), off in need.items() if t == topic):
            return False
    return True


class Tail:
    """Follows a topic (read_committed, all partitions from offset 0) and decodes what it reads."""

    def __init__(self, broker, topic: str, partitions: int = 2) -> None:
        import uuid

        self.c = Consumer(
            {
                **client_settings(broker),
                "group.id": f"tail-{uuid.uuid4().hex[:8]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])

    def read(self, timeout_s: float = 0.2) -> list:
        out = []
        for m in self.c.consume(1000, timeout_s):
            if m.error():
                raise RuntimeError(f"tail: {m.error()}")
            out.append(decode(m.value()))
        return out

    def close(self) -> None:
        self.c.close()


def topics_toml(topics) -> str:
    """The ``[topics]`` table of a worker configuration that names ``topics``."""
    return "[topics]\n" + "".join(
        f'{name} = "{getattr(topics, name)}"\n'
        for name in ("contexts", "decisions", "rewards", "actions", "joined", "dead_letter")
    )


SERVE_CONFIG = """
[worker]
group_id = "{group}"
snapshot_dir = "{snaps}"
{worker}

{topics}
[[models]]
match = "m-*"
policy = "oful"
dim = 3
reward_window_ms = 100
default_reward = 0.0

[kafka.producer]
"transaction.timeout.ms" = 60000
"""


def serve_config(group: str, snaps, topics, worker: str = "") -> str:
    """A ``streambandit serve`` configuration for the tests that run the command: OFUL on the
    ``m-*`` models of ``topics``, snapshots in ``snaps``, ``worker`` added to the [worker] table."""
    return SERVE_CONFIG.format(group=group, snaps=snaps, worker=worker, topics=topics_toml(topics))


def serve_process(
    broker, cfg_path, instance: str, log_path, args: tuple[str, ...] = (), env: dict | None = None
):
    """``streambandit serve`` as one worker process with ``instance`` as its id, logging at INFO
    to ``log_path`` (appended: a restarted instance continues its log); ``args`` added, ``env``
    over the environment."""
    import os
    import subprocess
    import sys

    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg_path),
            "-v",
            "--instance-id",
            instance,
            "--processes",
            "1",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=open(log_path, "a"),
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )


_HOLDING = re.compile(r"partition (assigned|revoked|lost|stopped) partition=(\d+)|(worker started)")


def held_in(text: str) -> set[int]:
    """The partitions a worker's log says it holds (the last start's, for a log appended to):
    assigned and recovered, and not revoked, lost (a zombie's) or stopped since."""
    out: set[int] = set()
    for m in _HOLDING.finditer(text):
        if m.group(3):
            out.clear()
        else:
            (out.add if m.group(1) == "assigned" else out.discard)(int(m.group(2)))
    return out


def held_partitions(log_path) -> set[int]:
    """held_in on the log at ``log_path``."""
    return held_in(log_path.read_text())


def log_time(line: str) -> float:
    """The wall time (epoch seconds) of a worker's text log line."""
    import datetime

    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def serving_intervals(text: str, cut: list[float] = ()) -> dict[int, list[list[float]]]:
    """Per partition, the wall-clock intervals [start, end] a worker's log shows it serving the
    partition: from its "partition assigned" line to its revoked, lost or stopped line, or to the
    first time in ``cut`` after the start (when the test killed or froze the process), or to the
    next start of the worker in the same log."""
    out: dict[int, list[list[float]]] = {}
    open_: dict[int, list[float]] = {}

    def end_by(at: float) -> None:  # the intervals open at ``at`` end there
        for p in [p for p, interval in open_.items() if interval[0] <= at]:
            open_.pop(p)[1] = at

    for line in text.splitlines():
        m = _HOLDING.search(line)
        if m is None:
            continue
        when = log_time(line)
        for c in sorted(cut):
            if c < when:
                end_by(c)
        if m.group(3):
            end_by(when)
            continue
        p = int(m.group(2))
        if m.group(1) == "assigned":
            open_[p] = [when, float("inf")]
            out.setdefault(p, []).append(open_[p])
        elif p in open_:
            open_.pop(p)[1] = when
    for c in sorted(cut):
        end_by(c)
    return out


def assert_never_served_twice(intervals: list[dict[int, list[list[float]]]]) -> None:
    """No partition served by two workers at once: per partition, the serving intervals of all
    the workers' logs, in order of start, each begins after the one before it ended."""
    for p in sorted(set().union(*intervals)):
        spans = sorted(tuple(i) for log in intervals for i in log.get(p, []))
        for (s0, e0), (s1, e1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"partition {p} served twice at once: [{s0}, {e0}] and [{s1}, {e1}]"


def stop_processes(*procs, timeout_s: float = 60) -> list[str]:
    """SIGTERM to every process still running, then wait for each (killed after ``timeout_s``);
    the exit lines (stdout) of those that were running, in order."""
    import signal

    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    lines = []
    for proc in running:
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            lines.append(out.decode() if out else "")
        finally:
            proc.kill()
    return lines


def packed_snapshot(partition: int, mark: int, size: int = 8) -> bytes:
    """A real, packed partition snapshot; ``mark`` tells them apart, ``size`` floats of noise make
    it big."""
    import numpy as np

    from streambandit.wire import pack_snapshot

    state = {"theta": np.random.default_rng(mark).standard_normal(size)}
    return pack_snapshot(
        {
            "partition": partition,
            "created_ms": mark,
            "contexts_offset": mark,
            "rewards_offset": 0,
            "actions_offset": 0,
            "joined_offset": 0,
            "dead_letter_offset": 0,
            "engine": {
                "models": {"m": state},
                "pending": [],
                "early": [],
                "recent": [],
                "watermark_ms": 0,
                "counters": {},
            },
        }
    )


def get(port, path):
    """(status, body) of a GET of a worker's telemetry endpoint (stream/telemetry.py)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port):
    """The families and the samples ({(name, sorted labels): value}) a worker's /metrics shows."""
    from prometheus_client.parser import text_string_to_metric_families

    status, text = get(port, "/metrics")
    assert status == 200
    values = {}
    families = set()
    for f in text_string_to_metric_families(text):
        families.add(f.name)
        for s in f.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return families, values
