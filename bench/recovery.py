"""The Kafka worker on the embedded broker: throughput, decision latency, recovery time, snapshot size.

    python bench/bench_worker.py            # full run (~8 min), writes bench/results/worker.{md,json}
    python bench/bench_worker.py --quick    # a smoke run with small sizes (results not written)

1. Throughput: a backlog of contexts (d = 20, K = 10) and rewards (one per three contexts) is
   produced first; one worker (in this process) then drains it with transactions on. Median of
   REPEATS runs per policy, oful and glb_omd interleaved. In the same run the bare learner does the
   same decisions and updates without Kafka: their ratio is what the worker's I/O, codec, join and
   exactly-once commits cost.
2. Decision latency: a ``streambandit serve`` subprocess (the worker as deployed) and the simulated
   ad server of the demo (this process) at a fixed offered rate; latency is request published ->
   committed action read back by the ad server. Median over runs of each run's p50 / p99.
3. Recovery: a ``serve`` subprocess drains a stream with no periodic snapshot, is killed with
   SIGKILL, and restarts: it rebuilds every partition from the (empty) snapshot taken at its first
   assignment plus the logs (all joined records replayed). Killed again right after, it restarts
   from the snapshot it took on recovery (nothing to replay). Times from the worker's log.
4. Snapshot size per model: a partition engine with many models, packed as the worker stores it.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.pin_one_thread()

import numpy as np  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from streambandit.models_config import parse_models_config  # noqa: E402
from streambandit.sim.ads import AdTraffic, ad_hyper  # noqa: E402
from streambandit.stream.ad_server import AdServer  # noqa: E402
from streambandit.stream.broker import EmbeddedBroker  # noqa: E402
from streambandit.stream.engine import PartitionEngine  # noqa: E402
from streambandit.stream.snapshots import DirectoryStore  # noqa: E402
from streambandit.stream.worker import Topics, Worker, WorkerConfig  # noqa: E402
from streambandit.wire import Context, Reward, encode, pack_snapshot  # noqa: E402

D, K, PARTITIONS = 20, 10, 2
HYPER = {p: ad_hyper(p) for p in ("oful", "glb_omd")}
FAST_FETCH = {"fetch.wait.max.ms": 10}  # Tansu waits the full fetch.wait.max.ms (docs/notes/tansu.md)


def models(policy: str, window_ms: int = 2000) -> dict:
    return {"models": [{"match": "placement-*", "policy": policy, "dim": D, "hyper": HYPER[policy],
                        "reward_window_ms": window_ms, "default_reward": 0.0, "aggregation": "first"}]}


def fresh_topics(broker: EmbeddedBroker) -> Topics:
    tag = uuid.uuid4().hex[:8]
    t = Topics(contexts=f"c-{tag}", rewards=f"r-{tag}", actions=f"a-{tag}", joined=f"j-{tag}", dead_letter=f"d-{tag}")
    broker.create_topics(t.all(), partitions=PARTITIONS)
    return t


# Event time starts at an epoch timestamp as an application's clock gives (2023-11-14): what the
# worker encodes per record then has the size it has in production (6-byte varints, not 2).
T0_MS = 1_700_000_000_000


def backlog(n: int, seed: int = 0) -> list[tuple[Context, Reward | None]]:
    """n ad requests (event time 1 ms apart) and a click for every third, 5 ms after it."""
    traffic, rng = AdTraffic(dim=D, k=K, seed=seed), np.random.default_rng(seed)
    out = []
    for i in range(n):
        req, key = traffic.request(rng), f"placement-{i % 4}"
        ctx = Context(f"e{i}", key, T0_MS + i, req.ad_ids, req.features)
        out.append((ctx, Reward(ctx.event_id, key, ctx.timestamp_ms + 5, 1.0) if i % 3 == 0 else None))
    return out


def produce(broker: EmbeddedBroker, t: Topics, events: list[tuple[Context, Reward | None]]) -> dict:
    """Produce the events; returns per (topic, partition) the offset after the last record, from
    the delivery reports (the embedded broker reports too low a high watermark for batched,
    non-transactional writes: docs/notes/tansu.md)."""
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random", "linger.ms": 5,
                  "enable.idempotence": True})
    ends: dict = {}

    def delivered(err, msg) -> None:
        if err is not None:
            raise RuntimeError(f"produce failed: {err}")
        key = (msg.topic(), msg.partition())
        ends[key] = max(ends.get(key, 0), msg.offset() + 1)

    n = 0
    for ctx, rew in events:
        p.produce(t.contexts, key=ctx.model_key.encode(), value=encode(ctx), on_delivery=delivered)
        n += 1
        if rew is not None:
            p.produce(t.rewards, key=rew.model_key.encode(), value=encode(rew), on_delivery=delivered)
            n += 1
        if n % 5000 == 0:
            p.poll(0)
    p.flush()
    return ends


# -- 1. throughput -----------------------------------------------------------------------------


def worker_throughput(broker: EmbeddedBroker, policy: str, events: list) -> dict:
    t = fresh_topics(broker)
    n_records = sum(produce(broker, t, events).values())
    cfg = WorkerConfig(bootstrap_servers=broker.bootstrap_servers, models=parse_models_config(models(policy, 100)),
                       topics=t, group_id=f"bench-{t.contexts}", snapshot_interval_s=1e9,
                       snapshot_every_updates=10**9, kafka={"consumer": FAST_FETCH})
    with tempfile.TemporaryDirectory() as snaps:
        w = Worker(cfg, DirectoryStore(snaps))
        # run() without its loop: the clock starts once the group has assigned both partitions.
        w.start()
        while len(w.partitions) < PARTITIONS:
            w.step()
        start = time.perf_counter()
        while w.metrics["records_in"] < n_records:
            w.step()
        elapsed = time.perf_counter() - start
        m = dict(w.metrics)
        w.close()
    # A throughput figure is only worth something if the run was right: every reward joined, no
    # record merged out of order (a broken merge once made this figure look plausible while it
    # dead-lettered the rewards).
    wrong = {k: v for k, v in m.items() if (k.startswith("dead_letter.") or k == "merge_out_of_order") and v}
    if wrong:
        raise RuntimeError(f"throughput run for {policy} was not exact: {wrong}")
    return {"contexts_per_s": len(events) / elapsed, "records_per_s": n_records / elapsed,
            "transactions": m["transactions"], "records_per_transaction": n_records / max(m["transactions"], 1)}


def bare_learner(policy: str, events: list) -> float:
    """Contexts per second of the policies alone: the same decisions and updates, no Kafka."""
    spec = parse_models_config(models(policy)).resolve("placement-0")
    learners = {f"placement-{i}": spec.build() for i in range(4)}
    start = time.perf_counter()
    for ctx, rew in events:
        p = learners[ctx.model_key]
        i = p.select(ctx.features)
        p.update(ctx.features[i], 1.0 if rew is not None else 0.0)
    return len(events) / (time.perf_counter() - start)


# -- 2. latency ------------------------------------------------------------------------------


SERVE_CONFIG = """
[kafka.consumer]
"fetch.wait.max.ms" = 10

[worker]
group_id = "{group}"
snapshot_interval_s = 30
idle_tick_ms = 500

[topics]
contexts = "{contexts}"
rewards = "{rewards}"
actions = "{actions}"
joined = "{joined}"
dead_letter = "{dead_letter}"

[[models]]
match = "placement-*"
policy = "{policy}"
dim = {dim}
reward_window_ms = 2000
default_reward = 0.0
{hyper}
"""


def serve(broker: EmbeddedBroker, t: Topics, policy: str, workdir: Path, group: str, **settings) -> subprocess.Popen:
    hyper = "\n".join(["[models.hyper]"] + [f"{k} = {v!r}".replace("'", '"') for k, v in HYPER[policy].items()])
    text = SERVE_CONFIG.format(group=group, policy=policy, dim=D, hyper=hyper if HYPER[policy] else "", **vars(t))
    for key, value in settings.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.M)
    cfg = workdir / f"{group}.toml"
    cfg.write_text(text)
    return subprocess.Popen([sys.executable, "-m", "streambandit", "serve", "--config", str(cfg), "-v",
                             "--bootstrap-servers", broker.bootstrap_servers, "--snapshot-dir", str(workdir / group)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_for_line(proc: subprocess.Popen, pattern: str, count: int, timeout_s: float = 120) -> list[re.Match]:
    """Read the worker's log until ``pattern`` matched ``count`` times."""
    found, deadline = [], time.monotonic() + timeout_s
    while len(found) < count:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"the worker exited (code {proc.poll()}) before logging {pattern!r}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern!r} within {timeout_s} s")
        m = re.search(pattern, line)
        if m:
            found.append(m)
    return found


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    proc.send_signal(sig)
    proc.communicate(timeout=60)


def latency(broker: EmbeddedBroker, policy: str, rate: float, seconds: float, workdir: Path) -> dict:
    t = fresh_topics(broker)
    proc = serve(broker, t, policy, workdir, f"lat-{t.contexts}")
    try:
        wait_for_line(proc, r"partition assigned", PARTITIONS)
        server = AdServer(broker.bootstrap_servers, contexts=t.contexts, rewards=t.rewards, actions=t.actions,
                          partitions=PARTITIONS, traffic=AdTraffic(dim=D, k=K), model_keys=[f"placement-{i}" for i in range(4)],
                          rate_per_s=rate, consumer_settings=FAST_FETCH)
        warmup_until = time.monotonic() + 3.0
        while time.monotonic() < warmup_until:
            server.step()
        server.take_latencies()
        answered0, start = server.stats.answered, time.monotonic()
        while time.monotonic() - start < seconds:
            server.step()
        lat = server.take_latencies()
        answered = server.stats.answered - answered0
        server.close()
    finally:
        stop(proc)
    return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "answered_per_s": answered / seconds}


# -- 3. recovery -----------------------------------------------------------------------------


def caught_up(broker: EmbeddedBroker, group: str, ends: dict) -> bool:
    c = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": group, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for topic, p in ends], timeout=10)
        return all(tp.offset >= ends[(tp.topic, tp.partition)] for tp in got)
    finally:
        c.close()


def recovery(broker: EmbeddedBroker, policy: str, events: list, workdir: Path) -> dict:
    t = fresh_topics(broker)
    ends = produce(broker, t, events)
    group = f"rec-{t.contexts}"
    settings = {"snapshot_interval_s": 1e9, "idle_tick_ms": 10**9}
    proc = serve(broker, t, policy, workdir, group, snapshot_every_updates=10**9, **settings)
    wait_for_line(proc, r"partition assigned", PARTITIONS)
    while not caught_up(broker, group, ends):
        time.sleep(0.5)
    stop(proc, signal.SIGKILL)
    out = {}
    for case in ("from_logs", "from_snapshot"):
        started = time.perf_counter()
        proc = serve(broker, t, policy, workdir, group, snapshot_every_updates=10**9, **settings)
        got = wait_for_line(proc, r"partition assigned partition=\d+ recovered_in_ms=(\d+)", PARTITIONS)
        out[case] = {"recover_ms": [int(m.group(1)) for m in got],
                     "restart_to_resumed_s": time.perf_counter() - started}
        stop(proc, signal.SIGKILL)
    out["joined_replayed"] = len(events)
    return out


# -- 4. snapshot size ------------------------------------------------------------------------


def snapshot_bytes_per_model(policy: str, dim: int, n_models: int = 100, updates_per_model: int = 50) -> dict:
    cfg = parse_models_config({"models": [{"match": "m-*", "policy": policy, "dim": dim, "hyper": HYPER[policy],
                                           "reward_window_ms": 10**12, "default_reward": 0.0}]})
    engine = PartitionEngine(cfg)
    rng = np.random.default_rng(0)
    for i in range(n_models):
        model = engine.models[f"m-{i}"] = cfg.resolve(f"m-{i}").build()
        for _ in range(updates_per_model):
            x = rng.standard_normal(dim) / np.sqrt(dim)
            model.update(x, float(rng.random() < 0.1))
    empty = len(pack_snapshot(_snap(PartitionEngine(cfg))))
    full = len(pack_snapshot(_snap(engine)))
    state = engine.models["m-0"].state_nbytes()
    return {"bytes_per_model": (full - empty) / n_models, "state_nbytes": state}


def _snap(engine: PartitionEngine) -> dict:
    return {"partition": 0, "created_ms": 0, "contexts_offset": 0, "rewards_offset": 0, "actions_offset": 0,
            "joined_offset": 0, "dead_letter_offset": 0, "engine": engine.snapshot()}


# -- report ----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, results not written")
    args = ap.parse_args()
    repeats, n_tp, n_rec, lat_s = (1, 2000, 2000, 4.0) if args.quick else (5, 20_000, 20_000, 15.0)
    rates = (200, 1000)
    policies = ("oful", "glb_omd")
    res: dict = {"machine": common.machine(), "d": D, "K": K, "partitions": PARTITIONS, "repeats": repeats}
    events = backlog(n_tp)
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tp: dict = {p: [] for p in policies}
        bare: dict = {p: [] for p in policies}
        for p in policies:  # compile the learners' kernels (numba) before anything is timed
            bare_learner(p, events[:50])
        for r in range(repeats):
            for p in policies:
                tp[p].append(worker_throughput(broker, p, events))
                bare[p].append(bare_learner(p, events))
                print(f"throughput {p} run {r}: {tp[p][-1]['contexts_per_s']:.0f} contexts/s "
                      f"(bare learner {bare[p][-1]:.0f}/s)", flush=True)
        res["throughput"] = {p: {"runs": tp[p], "bare_learner_contexts_per_s": bare[p]} for p in policies}
        lat: dict = {}
        for p in policies:
            for rate in rates:
                lat[f"{p}@{rate}"] = [latency(broker, p, rate, lat_s, work) for _ in range(max(repeats // 2, 1))]
                print(f"latency {p} at {rate}/s: {lat[f'{p}@{rate}']}", flush=True)
        res["latency"] = lat
        rec = {p: [recovery(broker, p, backlog(n_rec, seed=1), work) for _ in range(max(repeats // 2, 1))]
               for p in policies}
        print(f"recovery: {rec}", flush=True)
        res["recovery"] = rec
    res["snapshot"] = {f"{p}@d={d}": snapshot_bytes_per_model(p, d) for p in policies for d in (20, 100)}
    md = report(res, rates, policies, n_tp, n_rec, lat_s)
    if args.quick:
        print(md)
    else:
        common.write("worker", res, md)


def report(res: dict, rates, policies, n_tp: int, n_rec: int, lat_s: float) -> str:
    med = common.median
    m = res["machine"]
    lines = [
        "# The Kafka worker on the embedded broker",
        "",
        f"Command: `python bench/bench_worker.py`. Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, "
        f"numpy {m['numpy']}, commit {m['commit']}, {m['date']}. Broker: embedded Tansu (in-memory), same machine. "
        f"d = {D}, K = {K} arms, {PARTITIONS} partitions, 4 model keys, transactions on (read_committed).",
        "",
        f"## Throughput: one worker draining a backlog of {n_tp:,} contexts + {n_tp // 3 + (n_tp % 3 > 0):,} rewards",
        "",
        f"Median of {res['repeats']} runs. The bare learner makes the same decisions and updates with no Kafka, "
        "in the same run; the last column is the share of the worker's time that is not the learner.",
        "",
        "| policy | contexts / s | input records / s | records per transaction | bare learner contexts / s | not-learner share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for p in policies:
        runs = res["throughput"][p]["runs"]
        c, r = med([x["contexts_per_s"] for x in runs]), med([x["records_per_s"] for x in runs])
        b = med(res["throughput"][p]["bare_learner_contexts_per_s"])
        per_tx = med([x["records_per_transaction"] for x in runs])
        lines.append(f"| {p} | {c:,.0f} | {r:,.0f} | {per_tx:,.0f} | {b:,.0f} | {1 - c / b:.0%} |")
    lines += [
        "",
        f"## Decision latency at a fixed offered rate ({lat_s:.0f} s measured after 3 s of warm-up)",
        "",
        "Request published by the simulated ad server -> committed action read back by it (read_committed): "
        "includes the merge wait (20 ms), the transaction commit and two fetches. The worker is a `streambandit "
        "serve` subprocess; consumers use `fetch.wait.max.ms = 10` (docs/notes/tansu.md). Median over runs of "
        "each run's percentile.",
        "",
        "| policy | offered / s | answered / s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for p in policies:
        for rate in rates:
            runs = res["latency"][f"{p}@{rate}"]
            lines.append(f"| {p} | {rate} | {med([x['answered_per_s'] for x in runs]):,.0f} | "
                         f"{med([x['p50_ms'] for x in runs]):.1f} | {med([x['p99_ms'] for x in runs]):.1f} |")
    lines += [
        "",
        f"## Recovery after SIGKILL ({n_rec:,} contexts, one model version per joined record)",
        "",
        "`recover` is the worker's own time to rebuild one partition (load the snapshot, read the logs after it, "
        "re-apply the joined records); `restart -> resumed` is from starting the process to both partitions "
        "recovered, group join included. From logs: no periodic snapshot, so every joined record is replayed; "
        "from snapshot: killed right after a recovery, which snapshots each partition it rebuilt.",
        "",
        "| policy | case | joined replayed (both partitions) | recover ms per partition (median) | "
        "restart -> resumed s (median) |",
        "|---|---|---:|---:|---:|",
    ]
    for p in policies:
        runs = res["recovery"][p]
        for case in ("from_logs", "from_snapshot"):
            ms = med([v for x in runs for v in x[case]["recover_ms"]])
            s = med([x[case]["restart_to_resumed_s"] for x in runs])
            n = runs[0]["joined_replayed"] if case == "from_logs" else 0
            lines.append(f"| {p} | {case.replace('_', ' ')} | {n:,} | {ms:,.0f} | {s:.1f} |")
    lines += [
        "",
        "## Snapshot size per model",
        "",
        "Bytes a model adds to its partition's snapshot (100 models, packed as the worker stores them: Avro, "
        "zlib above 4 KiB, CRC32), next to the policy's own `state_nbytes()`.",
        "",
        "| policy | d | snapshot bytes per model | state_nbytes |",
        "|---|---:|---:|---:|",
    ]
    for key, v in res["snapshot"].items():
        p, d = key.split("@d=")
        lines.append(f"| {p} | {d} | {v['bytes_per_model']:,.0f} | {v['state_nbytes']:,} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
