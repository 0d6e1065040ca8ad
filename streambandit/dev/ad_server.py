"""A simulated ad server: the application side of ``streambandit demo`` and of the worker benchmark.

It does what a real ad server does around streambandit, on live Kafka topics:

1. For each ad request it publishes a context event (the K candidate ads and their features),
   stamped with the request's wall-clock time as event time, at a fixed offered rate.
2. It reads the committed actions (read_committed), shows the chosen ad, and, with the hidden
   click model's probability (``sim/ads.py``), the user clicks after a random delay.
3. A click is published as a reward event stamped with the click time. Impressions nobody clicks
   get no reward event at all: the worker applies the default reward when the window closes.

With a ``replica`` (``streambandit demo --edge``) the ad server decides at the edge instead: each
request is ranked by the replica in its own process (``serving/replica.py``) and answered at once,
its clicks go through the replica's ``reward``, and the learn-only worker's actions, read back as
before, time the Kafka round trip the request no longer waits for.

It also keeps the figures a person watching the demo wants: how fast requests are answered
(end-to-end decision latency: request published -> committed action read back), and the expected
click-through rate of the chosen ads next to the best ad and a random ad of each request. Expected
rates (the click model's probability for the chosen ad) are far less noisy than counted clicks.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from typing import Any

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from streambandit.sim.ads import AdTraffic
from streambandit.wire import Action, Context, DecodeError, Reward, decode, encode

__all__ = ["AdServer", "AdServerStats"]


@dataclasses.dataclass
class AdServerStats:
    """Counters since the start, and the latencies (ms) of answers read since the last ``take``."""

    requests: int = 0
    answered: int = 0
    clicks: int = 0
    ctr_learner: float = 0.0  # sums of expected click rates; divide by ``answered``
    ctr_best: float = 0.0
    ctr_random: float = 0.0
    latencies_ms: list[float] = dataclasses.field(default_factory=list)
    edge_latencies_us: list[float] = dataclasses.field(
        default_factory=list
    )  # rank calls at the edge


class AdServer:
    """Publishes ad requests at ``rate_per_s``, reads the worker's actions, publishes delayed clicks.

    Call ``step()`` in a loop (it never blocks for more than ``poll_s``); it is single-threaded.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        contexts: str,
        rewards: str,
        actions: str,
        partitions: int,
        traffic: AdTraffic,
        model_keys: list[str],
        rate_per_s: float,
        click_delay_ms: float = 400.0,
        seed: int = 0,
        poll_s: float = 0.005,
        consumer_settings: dict | None = None,
        replica: Any = None,
    ) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
        self.traffic, self.model_keys, self.rate_per_s = traffic, model_keys, rate_per_s
        self.replica = replica
        self.contexts_topic, self.rewards_topic = contexts, rewards
        self.click_delay_ms, self.poll_s = click_delay_ms, poll_s
        self._rng = np.random.default_rng([seed, 7])
        # murmur2_random: the topics' partitioner (docs/design.md, data flow), so a Java ad server would agree with us.
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "partitioner": "murmur2_random",
                "linger.ms": 2,
                "enable.idempotence": True,
            }
        )
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": "demo-ad-server",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                **(consumer_settings or {}),
            }
        )
        self._consumer.assign([TopicPartition(actions, p, 0) for p in range(partitions)])
        # Connect and fetch once before the first request, so the first answers are not charged
        # with the consumer's start-up. Nothing of ours can be there yet: no request was sent.
        self._consumer.consume(100, 1.0)
        self._open: dict[
            str, tuple[float, np.ndarray | None]
        ] = {}  # event id -> (sent at, click rates)
        self._clicks: list[
            tuple[int, str, str]
        ] = []  # heap of (click time ms, event id, model key)
        self._started = time.monotonic()
        self._next_id = 0
        self.stats = AdServerStats()

    @property
    def open_requests(self) -> int:
        return len(self._open)

    def step(self) -> None:
        self._send_due_requests()
        self._read_actions()
        self._send_due_clicks()
        self._producer.poll(0)

    def drain(self, timeout_s: float) -> None:
        """Read actions and send clicks, offering no new request, until every request sent is
        answered or ``timeout_s`` has passed: a run's last requests are answered, not cut off."""
        deadline = time.monotonic() + timeout_s
        while self._open and time.monotonic() < deadline:
            self._read_actions()
            self._send_due_clicks()
            self._producer.poll(0)

    def take_latencies(self) -> list[float]:
        """The latencies read since the last call (for per-interval percentiles)."""
        out, self.stats.latencies_ms = self.stats.latencies_ms, []
        return out

    def take_edge_latencies(self) -> list[float]:
        """The edge rank times (microseconds) since the last call."""
        out, self.stats.edge_latencies_us = self.stats.edge_latencies_us, []
        return out

    def close(self, timeout_s: float = 10.0) -> None:
        self._producer.flush(timeout_s)
        self._consumer.close()

    # -- the three duties ------------------------------------------------------------------------

    def _send_due_requests(self) -> None:
        due = int((time.monotonic() - self._started) * self.rate_per_s) - self.stats.requests
        for _ in range(max(due, 0)):
            req = self.traffic.request(self._rng)
            event_id = f"req-{self._next_id}"
            key = self.model_keys[self._next_id % len(self.model_keys)]
            self._next_id += 1
            now_ms = int(time.time() * 1000)
            sent_at = time.perf_counter()
            self.stats.requests += 1
            if self.replica is None:
                self._open[event_id] = (sent_at, req.click_rates)
                self._produce(
                    self.contexts_topic,
                    key,
                    encode(Context(event_id, key, now_ms, req.ad_ids, req.features)),
                )
                continue
            r = self.replica.rank(event_id, key, req.ad_ids, req.features, timestamp_ms=now_ms)
            self.stats.edge_latencies_us.append((time.perf_counter() - sent_at) * 1e6)
            self._open[event_id] = (
                sent_at,
                None,
            )  # answered; the learner's action times the round trip
            self._answer(event_id, key, r.arm_index, now_ms, req.click_rates)

    def _read_actions(self) -> None:
        for msg in self._consumer.consume(1000, self.poll_s):
            if msg.error():
                continue
            try:
                action = decode(msg.value())
            except DecodeError:
                continue
            # A redo after an aborted transaction may show an action twice (docs/notes/tansu.md):
            # the first one read answers the request.
            opened = self._open.pop(action.event_id, None) if isinstance(action, Action) else None
            if opened is None:
                continue
            sent_at, rates = opened
            self.stats.latencies_ms.append((time.perf_counter() - sent_at) * 1000.0)
            if rates is not None:
                self._answer(
                    action.event_id,
                    action.model_key,
                    action.arm_index,
                    action.decision_timestamp_ms,
                    rates,
                )

    def _answer(
        self, event_id: str, key: str, arm_index: int, decided_ms: int, rates: np.ndarray
    ) -> None:
        """Show the chosen ad; the user clicks it with its click rate, after a random delay."""
        self.stats.answered += 1
        rate = float(rates[arm_index])
        self.stats.ctr_learner += rate
        self.stats.ctr_best += float(rates.max())
        self.stats.ctr_random += float(rates.mean())
        if self.traffic.click(self._rng, rate):
            delay = int(self._rng.exponential(self.click_delay_ms))
            heapq.heappush(self._clicks, (decided_ms + delay, event_id, key))

    def _send_due_clicks(self) -> None:
        now_ms = int(time.time() * 1000)
        while self._clicks and self._clicks[0][0] <= now_ms:
            ts, event_id, key = heapq.heappop(self._clicks)
            if self.replica is None:
                self._produce(self.rewards_topic, key, encode(Reward(event_id, key, ts, 1.0)))
            else:
                self.replica.reward(event_id, 1.0, model_key=key, timestamp_ms=ts)
            self.stats.clicks += 1

    def _produce(self, topic: str, key: str, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, key=key.encode(), value=value)
                return
            except BufferError:  # the local queue is full: let librdkafka send, then retry
                self._producer.poll(0.05)
