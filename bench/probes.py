"""Probe contexts for a group of ``serve`` workers, and when each one's action is read back.

Used by bench.handoff and bench.join: a decision's latency as an application sees it, from the
context produced to its action readable (read_committed).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from bench import kafka_io
from bench.memory import K, feature_pool
from streambandit.dev.tansu import EmbeddedBroker


class Probes:
    """Contexts at ``rate`` per second, the i-th for model ``key(i)`` on partition ``i % partitions``
    (while ``paused`` is clear); ``sent[event_id]`` is (partition, wall time) and ``read[event_id]``
    the wall time its action was read."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        t,
        *,
        partitions: int,
        key: Callable[[int], str],
        rate: float,
        group: str,
    ) -> None:
        from confluent_kafka import Consumer, Producer, TopicPartition

        self.sent: dict[str, tuple[int, float]] = {}
        self.read: dict[str, float] = {}
        self.paused = threading.Event()
        self._stop = threading.Event()
        self._prod = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 0})
        self._cons = Consumer(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                "group.id": group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                **kafka_io.fetch_settings(broker),
            }
        )
        self._cons.assign([TopicPartition(t.actions, p, 0) for p in range(partitions)])
        self._t, self._partitions, self._key, self._rate = t, partitions, key, rate
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._send, self._read)]
        for th in self._threads:
            th.start()

    def _send(self) -> None:
        from streambandit.wire import Context, encode

        pool = feature_pool()
        arm_ids = tuple(f"ad-{j}" for j in range(K))
        i = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            if self.paused.is_set():
                time.sleep(0.01)
                next_at = time.monotonic()
                continue
            p, key, event_id = i % self._partitions, self._key(i), f"probe-{i}"
            ctx = Context(event_id, key, int(time.time() * 1000), arm_ids, pool[i % len(pool)])
            self.sent[event_id] = (p, time.time())
            self._prod.produce(self._t.contexts, encode(ctx), key.encode(), partition=p)
            self._prod.poll(0)
            i += 1
            next_at += 1.0 / self._rate
            time.sleep(max(0.0, next_at - time.monotonic()))

    def _read(self) -> None:
        from streambandit.wire import Action, decode

        while not self._stop.is_set():
            for m in self._cons.consume(500, 0.05):
                if m.error():
                    continue
                a = decode(m.value())
                if isinstance(a, Action) and a.event_id not in self.read:
                    self.read[a.event_id] = time.time()

    def first_answer_to_context_after(self, t0: float, partition: int) -> float | None:
        """When the first action was read for a context of ``partition`` produced after ``t0``:
        one that only a worker alive after ``t0`` can have decided."""
        read = self.read
        times = [
            read[e]
            for e, (p, sent) in list(self.sent.items())
            if p == partition and sent > t0 and e in read
        ]
        return min(times) if times else None

    def first_answer_after(self, t0: float) -> float | None:
        """When the first action was read after ``t0``."""
        times = [r for r in list(self.read.values()) if r > t0]
        return min(times) if times else None

    def close(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(10)
        self._prod.flush(10)
        self._cons.close()
