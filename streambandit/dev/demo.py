"""``streambandit demo``: the whole loop on one machine, with nothing to set up.

An embedded broker (Apache Kafka with ``kafka``: ``streambandit demo --kafka``), the five topics,
a worker (the same ``Worker`` that ``streambandit serve`` runs), and a simulated ad server
(``ad_server.py``) that sends requests at a fixed rate and clicks after a random delay. Once a
second it prints what the worker achieves: requests answered per second, the expected
click-through rate of the learner's choices against the best and a random ad, open decisions,
decision latency p50/p99 and snapshots written. At the end it writes the per-second figures as
CSV and, when matplotlib is installed, a PNG.

With ``edge`` (``streambandit demo --edge``) the ad server decides at the edge: a replica in its
process (``serving/replica.py``) ranks each request with a copy of the models and logs the
decision; the worker is learn-only (it joins the clicks to the logged decisions, learns, and the
replica follows). The rows then show the edge's decision time beside the Kafka round trip of the
same requests (a logged decision until the learner's action is read back), and the same learning
curve.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import gc
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np

from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.dev.ad_server import AdServer
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.sim.ads import AdTraffic, ad_hyper
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker

__all__ = ["DemoConfig", "run_demo"]

_SMOOTH_S = 5  # the CTR columns average the answers of the last few seconds
# At the end of a run: how long the requests still in flight may take to be answered before the
# summary counts them as unanswered (a backlog of a second or two on a loaded machine).
_DRAIN_S = 10.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoConfig:
    duration_s: float = 60.0
    rate_per_s: float = 500.0
    policy: str = "glb_omd"
    dim: int = 20
    arms: int = 10
    partitions: int = 2
    models: int = 4  # model keys (ad placements), spread over the partitions by their hash
    reward_window_ms: int = 2000
    click_delay_ms: float = 400.0
    epsilon: float = 0.0
    seed: int = 0
    out_dir: Path = Path("out/demo")
    edge: bool = False
    kafka: bool = False  # Apache Kafka (streambandit.dev.kafka) instead of the embedded broker


def _models(cfg: DemoConfig) -> dict:
    return {
        "models": [
            {
                "match": "placement-*",
                "policy": cfg.policy,
                "dim": cfg.dim,
                "hyper": ad_hyper(cfg.policy),
                "reward_window_ms": cfg.reward_window_ms,
                "default_reward": 0.0,
                "aggregation": "first",
                "epsilon": cfg.epsilon,
                "seed": cfg.seed,
            }
        ]
    }


def _percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


_COLUMNS = (
    "time_s",
    "answered_per_s",
    "answered",
    "ctr_learner",
    "ctr_best",
    "ctr_random",
    "pending",
    "latency_p50_ms",
    "latency_p99_ms",
    "edge_p50_us",
    "edge_p99_us",
    "snapshots",
    "joined",
    "dead_letters",
)


def _row_text(r: dict, edge: bool) -> str:
    return (
        f"{r['time_s']:>5.0f} {r['answered_per_s']:>7.0f} {r['answered']:>9} {r['ctr_learner']:>8.4f} "
        f"{r['ctr_best']:>7.4f} {r['ctr_random']:>7.4f} {r['pending']:>8} "
        + (f"{r['edge_p50_us']:>7.0f} {r['edge_p99_us']:>7.0f} " if edge else "")
        + f"{r['latency_p50_ms']:>7.1f} {r['latency_p99_ms']:>7.1f} {r['snapshots']:>6} {r['joined']:>9} "
        f"{r['dead_letters']:>5}"
    )


def _header(edge: bool) -> str:
    return (
        "time/s   ans/s  answered   CTR:ml    best  random  pending  "
        + ("edge p50 us  p99 us  kafka p50 ms  p99 ms" if edge else "p50 ms  p99 ms")
        + "  snaps    joined   dlq"
    )


def run_demo(cfg: DemoConfig, out: Callable[[str], None] = print) -> list[dict]:
    """Run the demo; returns the per-second rows (also written to ``cfg.out_dir``)."""
    topics = Topics()
    if cfg.kafka:
        from streambandit.dev.kafka import ApacheKafka

        broker: EmbeddedBroker | ApacheKafka = ApacheKafka()
        name = f"Apache Kafka {broker.version}"
        out(f"starting {name} ...")
        # On Tansu a fetch waits its full fetch.wait.max.ms (500 ms by default) even when records
        # are there (docs/notes/tansu.md); Apache Kafka answers at once and keeps the default.
        fetch: dict = {}
    else:
        broker, name, fetch = EmbeddedBroker(), "embedded broker", {"fetch.wait.max.ms": 10}
    with (
        broker,
        tempfile.TemporaryDirectory(prefix="streambandit-snapshots-") as snap_dir,
    ):
        broker.create_topics(topics.all(cfg.edge), partitions=cfg.partitions)
        out(
            f"{name} at {broker.bootstrap_servers}; topics {', '.join(topics.all(cfg.edge))} "
            f"({cfg.partitions} partitions each)"
        )
        rows = _run(cfg, broker.bootstrap_servers, topics, Path(snap_dir), out, fetch)
        # The Kafka clients of _run are unreachable now; destroyed before the broker stops, they
        # leave quietly instead of logging lost connections.
        gc.collect()
    return rows


def _run(
    cfg: DemoConfig,
    bootstrap: str,
    topics: Topics,
    snap_dir: Path,
    out: Callable[[str], None],
    fetch: dict,
) -> list[dict]:
    config = WorkerConfig(
        bootstrap_servers=bootstrap,
        models=parse_models_config(_models(cfg)),
        group_id="demo",
        topics=topics,
        snapshot_interval_s=5.0,
        idle_tick_ms=500,
        kafka={"consumer": fetch},
        learn_only=cfg.edge,
    )
    worker = Worker(config, DirectoryStore(snap_dir))
    failure: list[BaseException] = []

    def work() -> None:
        try:
            worker.run()
        except BaseException as exc:  # reported on the main thread
            failure.append(exc)

    thread = threading.Thread(target=work, name="worker", daemon=True)
    thread.start()
    out("waiting for the worker to join its consumer group ...")
    deadline = time.monotonic() + 60
    while len(worker.partitions) < cfg.partitions:
        if failure or time.monotonic() > deadline:
            worker.stop()
            raise RuntimeError(
                f"the worker did not start: {failure[0] if failure else 'no assignment in 60 s'}"
            )
        time.sleep(0.1)
    replica = None
    if cfg.edge:
        from streambandit.serving.replica import Replica

        out("starting the edge replica (it reads the learner's snapshots and joined log) ...")
        replica = Replica(config, DirectoryStore(snap_dir), poll_s=0.01).start(60)
    server = AdServer(
        bootstrap,
        contexts=topics.contexts,
        rewards=topics.rewards,
        actions=topics.actions,
        partitions=cfg.partitions,
        traffic=AdTraffic(dim=cfg.dim, k=cfg.arms, seed=cfg.seed),
        model_keys=[f"placement-{i}" for i in range(cfg.models)],
        rate_per_s=cfg.rate_per_s,
        click_delay_ms=cfg.click_delay_ms,
        seed=cfg.seed,
        consumer_settings=fetch,
        replica=replica,
    )
    out(
        f"{cfg.policy} on {cfg.models} placements, {cfg.arms} candidate ads of dimension {cfg.dim} per request, "
        f"{cfg.rate_per_s:.0f} requests/s offered, clicks after ~{cfg.click_delay_ms:.0f} ms, reward window "
        f"{cfg.reward_window_ms} ms; Ctrl-C stops"
    )
    out(
        "CTR: expected click-through rate of the chosen ad, averaged over the last "
        f"{_SMOOTH_S} s; best and random: of the same requests"
    )
    if cfg.edge:
        out(
            "edge: the replica's rank call in this process (microseconds); kafka: the same request's logged decision "
            "until the learner's action is read back (the round trip it did not wait for)"
        )
    out(_header(cfg.edge))
    rows: list[dict] = []
    s = server.stats
    history: collections.deque = collections.deque([(0, 0.0, 0.0, 0.0)], maxlen=_SMOOTH_S + 1)
    started = time.monotonic()
    next_report = started + 1.0
    try:
        while time.monotonic() - started < cfg.duration_s:
            if failure:
                raise RuntimeError(f"the worker failed: {failure[0]!r}") from failure[0]
            server.step()
            now = time.monotonic()
            if now < next_report:
                continue
            next_report += 1.0
            history.append((s.answered, s.ctr_learner, s.ctr_best, s.ctr_random))
            n0, l0, b0, r0 = history[0]
            n = max(s.answered - n0, 1)
            lat = server.take_latencies()
            edge = server.take_edge_latencies()
            m = worker.metrics
            row = {
                "time_s": round(now - started, 1),
                "answered_per_s": s.answered - history[-2][0],
                "answered": s.answered,
                "ctr_learner": (s.ctr_learner - l0) / n,
                "ctr_best": (s.ctr_best - b0) / n,
                "ctr_random": (s.ctr_random - r0) / n,
                "pending": m["pending"],
                "latency_p50_ms": _percentile(lat, 50),
                "latency_p99_ms": _percentile(lat, 99),
                "edge_p50_us": _percentile(edge, 50),
                "edge_p99_us": _percentile(edge, 99),
                "snapshots": m["snapshots"],
                "joined": m["joined"],
                "dead_letters": sum(v for k, v in m.items() if k.startswith("dead_letter.")),
            }
            rows.append(row)
            out(_row_text(row, cfg.edge))
        server.drain(_DRAIN_S)
    except KeyboardInterrupt:
        out("stopping (Ctrl-C) ...")
    finally:
        worker.stop()
        thread.join(60)
        server.close()
        if replica is not None:
            replica.close()
    _summary(cfg, rows, server, worker, out)
    return rows


def _summary(
    cfg: DemoConfig, rows: list[dict], server: AdServer, worker: Worker, out: Callable[[str], None]
) -> None:
    s = server.stats
    if s.answered:
        out(
            f"answered {s.answered} of {s.requests} requests; expected CTR over the run: learner "
            f"{s.ctr_learner / s.answered:.4f}, best {s.ctr_best / s.answered:.4f}, "
            f"random {s.ctr_random / s.answered:.4f}; "
            f"{s.clicks} clicks sent"
        )
    dead = {
        k.removeprefix("dead_letter."): v
        for k, v in worker.metrics.items()
        if k.startswith("dead_letter.")
    }
    out(
        f"worker: {worker.metrics['actions']} actions, {worker.metrics['joined']} joined, "
        f"{worker.metrics['transactions']} transactions, {worker.metrics['snapshots']} snapshots, "
        f"dead letters {dead or 0}"
    )
    if not rows:
        return
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    with open(cfg.out_dir / "demo.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    written = [str(cfg.out_dir / "demo.csv")]
    if _plot(rows, cfg.out_dir / "demo.png", cfg):
        written.append(str(cfg.out_dir / "demo.png"))
    out("wrote " + " and ".join(written))


def _plot(rows: list[dict], path: Path, cfg: DemoConfig) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = [r["time_s"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for key, label, style in (
        ("ctr_best", "best ad", "--"),
        ("ctr_learner", cfg.policy, "-"),
        ("ctr_random", "random ad", ":"),
    ):
        ax1.plot(t, [r[key] for r in rows], style, label=label)
    ax1.set_ylabel(f"expected CTR (last {_SMOOTH_S} s)")
    ax1.legend(loc="lower right")
    ax1.set_title(
        f"streambandit demo{' --edge' if cfg.edge else ''}: {cfg.rate_per_s:.0f} requests/s, {cfg.arms} ads, "
        f"d = {cfg.dim}"
    )
    kafka = "Kafka round trip " if cfg.edge else ""
    ax2.plot(t, [r["latency_p50_ms"] for r in rows], label=f"{kafka}p50")
    ax2.plot(t, [r["latency_p99_ms"] for r in rows], label=f"{kafka}p99")
    if cfg.edge:  # three orders of magnitude apart: a log scale shows both
        ax2.plot(t, [r["edge_p50_us"] / 1e3 for r in rows], label="edge p50")
        ax2.plot(t, [r["edge_p99_us"] / 1e3 for r in rows], label="edge p99")
        ax2.set_yscale("log")
    ax2.set_ylabel("decision latency (ms)")
    ax2.set_xlabel("time (s)")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
