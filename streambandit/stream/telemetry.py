"""What a running worker shows an operator: Prometheus metrics, liveness and readiness, over HTTP.

The loop never waits for a scrape. It counts in a plain ``collections.Counter`` and a few
histograms observed a batch at a time (numpy), and about once a second publishes a ``Status``:
an immutable copy of those figures plus its gauges (models, open decisions, lag per partition).
The HTTP thread renders only the newest published ``Status`` (``prometheus_client``'s text
format), so a scrape reads no structure the loop is changing. Liveness and readiness read two
plain attributes the loop sets (the time of its last progress, whether it is recovering); the
scrape adds readiness (``streambandit_ready``) and the process's own figures, read as it renders.

    GET /metrics   Prometheus text format
    GET /healthz   200 while the loop made progress within ``health_timeout_s`` or waits for an
                   unreachable broker (a restart cannot help), else 503
    GET /ready     200 once partitions are assigned and recovered, else 503 (recovering,
                   a partition waiting for an open transaction, none assigned, starting,
                   stopping, broker unavailable)
"""

from __future__ import annotations

import bisect
import dataclasses
import http.server
import logging
import sys
import threading
from typing import Any, Callable, Iterable

import numpy as np
from prometheus_client import PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from streambandit import reasons

__all__ = [
    "Histogram",
    "Status",
    "render_metrics",
    "process_metrics",
    "TelemetryServer",
    "BUCKETS",
]

log = logging.getLogger("streambandit")

# Bucket bounds (seconds): decision latency and batch times span a few ms to the seconds of a
# rebalance; a reward's delay spans the reward windows of an ad (seconds to an hour).
BUCKETS = {
    "decision_latency": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    "batch": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
    "commit": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
    "reward_delay": (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
    "recovery": (0.01, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
}


class Histogram:
    """Prometheus buckets (``le``: less than or equal) filled a batch of values at a time."""

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = np.asarray(tuple(bounds), dtype=np.float64)
        self._bounds = tuple(float(b) for b in self.bounds)  # for one value at a time
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.int64)  # the last: above every bound
        self.sum = 0.0

    def observe(self, values: Any) -> None:
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size:
            # searchsorted 'left': the first bound >= v, i.e. the bucket ``le`` that takes v first.
            self.counts += np.bincount(
                np.searchsorted(self.bounds, v, side="left"), minlength=len(self.counts)
            )
            self.sum += float(v.sum())

    def observe_one(self, value: float) -> None:
        """One value, without numpy's per-call cost (an HTTP request's time)."""
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value

    def frozen(self) -> tuple[tuple[tuple[str, int], ...], float]:
        """Cumulative (le, count) pairs ending with +Inf, and the sum: what a scrape shows."""
        cum = np.cumsum(self.counts)
        les = [_le(b) for b in self.bounds] + ["+Inf"]
        return tuple(zip(les, (int(c) for c in cum))), self.sum


def _le(bound: float) -> str:
    return repr(float(bound))


@dataclasses.dataclass(frozen=True)
class Status:
    """One published view of the worker: counters, gauges and histograms at one moment."""

    counters: dict[str, int]
    histograms: dict[str, tuple[tuple[tuple[str, int], ...], float]]
    assigned: tuple[int, ...] = ()
    models: int = 0
    open_decisions: int = 0
    lag: tuple[tuple[str, int, int], ...] = ()  # (topic, partition, records behind)
    snapshot_age_s: tuple[
        tuple[int, float], ...
    ] = ()  # (partition, seconds since its last snapshot)
    # (partition, seconds its recovery has waited for an open transaction), of the waiting ones
    recovery_wait_s: tuple[tuple[int, float], ...] = ()
    # Seconds the loop has waited for an unreachable broker (stream/outage.py); None: it is not.
    broker_unavailable_s: float | None = None
    info: dict[str, str] = dataclasses.field(default_factory=dict)


# Counters of the worker's Counter shown as Prometheus counters: metric name, help, Counter key.
_COUNTERS = (
    ("records", "input records taken from contexts and rewards", "records_in"),
    ("decisions", "actions committed (one per context decided)", "actions"),
    (
        "joined",
        "decisions closed and written to the joined log (a reward, or the default at the window's end)",
        "joined",
    ),
    (
        "default_rewards",
        "decisions closed with the default reward: no reward arrived within the window",
        "default_rewards",
    ),
    (
        "merge_forced",
        "input merges that went ahead without the other source (merge_wait_ms passed)",
        "merge_forced",
    ),
    ("merge_out_of_order", "records merged out of event-time order", "merge_out_of_order"),
    ("snapshot_failures", "snapshots that could not be stored", "snapshot_failures"),
    (
        "snapshot_fallbacks",
        "recoveries that fell back from an unusable snapshot",
        "snapshot_fallbacks",
    ),
    ("recovered_joined", "joined records re-applied by recoveries", "recovered_joined"),
    ("stalls", "stalls reported (idle while work waits, commits not applied)", "stalls_reported"),
    ("ticks", "idle ticks written to the rewards log", "ticks"),
    ("broker_outages", "times the loop began to wait for an unreachable broker", "broker_outages"),
    (
        "producer_restarts",
        "producers replaced after the broker aborted a transaction that waited for it",
        "producer_restarts",
    ),
)
_HISTOGRAMS = (
    (
        "decision_latency_seconds",
        "context event time to the commit of its action",
        "decision_latency",
    ),
    ("batch_seconds", "processing time of a batch, poll to commit", "batch"),
    ("commit_seconds", "time to commit a batch's transaction", "commit"),
    (
        "reward_delay_seconds",
        "reward event time minus its decision's event time, for observed rewards",
        "reward_delay",
    ),
    ("recovery_seconds", "time to recover an assigned partition (snapshot and logs)", "recovery"),
)


class _StatusCollector:
    """A prometheus_client collector over the newest ``Status`` (read, never built, here)."""

    def __init__(self, current: Callable[[], Status | None]) -> None:
        self._current = current

    def collect(self) -> Iterable[Metric]:
        s = self._current()
        if s is None:
            return
        c = s.counters
        for name, doc, key in _COUNTERS:
            yield _counter(name, doc, [((), c.get(key, 0))])
        yield _counter(
            "dead_letters",
            "records dead-lettered, by reason code",
            sorted(_dead_letters(c).items()),
            labels=("reason",),
        )
        yield _counter(
            "transactions",
            "batch transactions, by outcome",
            [(("commit",), c.get("transactions", 0)), (("abort",), c.get("transaction_aborts", 0))],
            labels=("outcome",),
        )
        yield _counter(
            "rebalances",
            "partition assignments, revocations and losses seen, and joins the broker refused "
            "(a static member's instance id still held), by kind",
            [
                (("assign",), c.get("assigns", 0)),
                (("revoke",), c.get("revokes", 0)),
                (("lost",), c.get("losses", 0)),
                (("join_refused",), c.get("join_refused", 0)),
            ],
            labels=("kind",),
        )
        yield _counter(
            "snapshots",
            "snapshots stored, by kind",
            [
                (("base",), c.get("snapshot_bases", 0)),
                (("increment",), c.get("snapshot_increments", 0)),
            ],
            labels=("kind",),
        )
        for name, doc, key in _HISTOGRAMS:
            buckets, total = s.histograms[key]
            h = HistogramMetricFamily(f"streambandit_{name}", doc)
            h.add_metric([], [(le, n) for le, n in buckets], total)
            yield h
        yield _gauge("assigned_partitions", "partitions this worker holds", [((), len(s.assigned))])
        yield _gauge(
            "partitions_waiting",
            "assigned partitions whose recovery waits for an open transaction on their output logs",
            [((), len(s.recovery_wait_s))],
        )
        yield _gauge(
            "recovery_wait_seconds",
            "seconds the partition's recovery has waited for an open transaction, while it waits",
            [((str(p),), w) for p, w in s.recovery_wait_s],
            labels=("partition",),
        )
        yield _gauge("models", "live models in the partitions held", [((), s.models)])
        yield _gauge(
            "open_decisions",
            "decisions waiting for their reward or their window's end",
            [((), s.open_decisions)],
        )
        yield _gauge(
            "consumer_lag",
            "input records not yet processed, per topic and partition",
            [((t, str(p)), n) for t, p, n in s.lag],
            labels=("topic", "partition"),
        )
        yield _gauge(
            "snapshot_age_seconds",
            "seconds since the partition's last snapshot was taken",
            [((str(p),), a) for p, a in s.snapshot_age_s],
            labels=("partition",),
        )
        yield _gauge(
            "snapshot_last_bytes",
            "bytes of the last snapshot stored",
            [((), c.get("snapshot_bytes", 0))],
        )
        yield _gauge(
            "snapshot_last_write_seconds",
            "time to pack and store the last snapshot",
            [((), c.get("snapshot_write_us", 0) / 1e6)],
        )
        yield _gauge(
            "snapshot_last_pause_seconds",
            "the loop's pause for the last snapshot (a copy, or a fork)",
            [((), c.get("snapshot_pause_us", 0) / 1e6)],
        )
        away = s.broker_unavailable_s
        yield _gauge(
            "broker_unavailable",
            "1 while the loop waits for a broker that does not answer, else 0",
            [((), 0 if away is None else 1)],
        )
        yield _gauge(
            "broker_unavailable_seconds",
            "how long the loop has waited for the broker (0 when it is not waiting)",
            [((), away or 0.0)],
        )
        info = GaugeMetricFamily(
            "streambandit_worker_info",
            "the worker's version, group and instance",
            labels=sorted(s.info),
        )
        info.add_metric([s.info[k] for k in sorted(s.info)], 1)
        yield info


def _dead_letters(counters: dict[str, int]) -> dict[tuple[str], int]:
    """Dead letters by reason, every known reason from 0: a series that exists before its first
    increase lets ``rate`` and ``increase`` see that first one."""
    out = {(r,): 0 for r in reasons.ALL}
    for k, v in counters.items():
        if k.startswith("dead_letter."):
            out[(k.removeprefix("dead_letter."),)] = v
    return out


def _counter(
    name: str, doc: str, samples: list[tuple[tuple[str, ...], float]], labels: tuple[str, ...] = ()
) -> CounterMetricFamily:
    return _family(CounterMetricFamily, name, doc, samples, labels)


def _gauge(
    name: str, doc: str, samples: list[tuple[tuple[str, ...], float]], labels: tuple[str, ...] = ()
) -> GaugeMetricFamily:
    return _family(GaugeMetricFamily, name, doc, samples, labels)


def _family(
    cls: Any,
    name: str,
    doc: str,
    samples: list[tuple[tuple[str, ...], float]],
    labels: tuple[str, ...],
) -> Any:
    m = cls(f"streambandit_{name}", doc, labels=list(labels))
    for values, v in samples:
        m.add_metric(list(values), v)
    return m


def render_metrics(status: Status | None, ready: bool | None = None) -> bytes:
    """``status`` in the Prometheus text format, after the process's own metrics; ``ready``, what
    ``/ready`` answers now, as ``streambandit_ready`` (1 or 0)."""
    collectors: list[Any] = [*process_metrics(), _StatusCollector(lambda: status)]
    if ready is not None:
        collectors.append(_Ready(ready))
    return generate_latest(_Registry(*collectors))


class _Ready:
    def __init__(self, ready: bool) -> None:
        self._ready = ready

    def collect(self) -> Iterable[Metric]:
        yield _gauge(
            "ready",
            "1 while /ready answers 200: partitions assigned and recovered, the loop serving them",
            [((), int(self._ready))],
        )


def process_metrics() -> tuple[Any, ...]:
    """prometheus_client's collectors of the process (``process_resident_memory_bytes``,
    ``process_cpu_seconds_total``, ``process_open_fds``, ...) and of the Python running it
    (``python_info``), each read at the scrape."""
    return ProcessCollector(registry=None), PlatformCollector(registry=None)


class _Registry:
    """The collectors ``generate_latest`` needs; not the process-wide default registry (several
    workers may share a process, as the tests run them)."""

    def __init__(self, *collectors: Any) -> None:
        self._collectors = collectors

    def collect(self) -> Iterable[Metric]:
        for c in self._collectors:
            yield from c.collect()


class TelemetryServer:
    """``/metrics``, ``/healthz`` and ``/ready`` of one worker, on a daemon thread.

    ``status()`` gives the newest published Status, ``health()`` and ``ready()`` (ok, reason)."""

    def __init__(
        self,
        host: str,
        port: int,
        status: Callable[[], Status | None],
        health: Callable[[], tuple[bool, str]],
        ready: Callable[[], tuple[bool, str]],
    ) -> None:
        routes = {
            "/metrics": lambda: (
                200,
                CONTENT_TYPE_LATEST,
                render_metrics(status(), ready=ready()[0]),
            ),
            "/healthz": lambda: _probe(health()),
            "/ready": lambda: _probe(ready()),
        }

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
                route = routes.get(self.path.split("?", 1)[0])
                code, ctype, body = (
                    route()
                    if route
                    else (404, "text/plain", b"not found: /metrics, /healthz, /ready\n")
                )
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # a scrape every few seconds is not news
                pass

        try:
            self._server = _Server((host, port), Handler)
        except OSError as exc:
            raise ValueError(
                f"cannot serve metrics on {host}:{port} ([worker] metrics_port, --metrics-port): "
                f"{exc.strerror or exc}"
            ) from None
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="telemetry", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Server(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A scraper that hung up mid-answer: a log line (JSON with --log-format json), not the
        # standard library's traceback on stderr.
        log.info("metrics request from %s failed: %r", client_address[0], sys.exc_info()[1])


def _probe(result: tuple[bool, str]) -> tuple[int, str, bytes]:
    ok, reason = result
    return (200 if ok else 503), "text/plain; charset=utf-8", (reason + "\n").encode()
