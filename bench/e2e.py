"""End to end on the embedded broker: the broker's ceiling, the worker's profile, throughput, latency.

    python -m bench.e2e --broker-per-run  # full run (~10 min), writes bench/results/e2e.{md,json}
    python -m bench.e2e --quick         # smoke run with small sizes (printed, not written)
    python -m bench.e2e --only ceiling  # one part (printed, not written): ceiling, codec, profile, throughput,
                                        # hops, latency, floor, snapshot
    python -m bench.e2e --only latency --only floor --max-rate 6767 --broker-per-run  # latency vs its floor

1. Broker ceiling. What any worker could reach on this broker and machine, with nothing of ours in
   the loop: (a) a producer alone writing context-sized records (the bytes of real d = 20, K = 10
   contexts), idempotent, linger 5 ms; (b) a bare transactional pass-through: a consumer in a
   group (read_committed, the worker's consumer settings) takes up to ``batch_max_records``
   already-fetched records, and one transaction produces one action-sized record per input and
   sends the offsets, exactly the worker's batching and commit pattern, with no decode, no merge and
   no learner. The inputs are contexts and rewards in the worker benchmark's 3:1 ratio.
2. Codec: decode and encode per record for the wire formats a context's features could take.
3. Profile: cProfile of ``Worker.step()`` draining a backlog, in process, grouped by stage.
4. Throughput: one worker (transactions on) draining a backlog, events (contexts + rewards) per
   second, next to the pass-through of part 1 measured in the same run.
5. Latency: context produced -> action readable by a read_committed consumer, at 10 %, 50 % and
   90 % of the worker's measured maximum rate, p50 / p99 / p99.9. The worker runs as a
   ``streambandit serve`` subprocess (as deployed) and the load generator in this process.
5b. Floor: part 5's load and measurement with the bare transactional pass-through (part 1's loop,
   bench/passthrough_serve.py, a subprocess) in place of the worker, at the same rates (fractions of
   --max-rate, else of this run's live maximum, else of the one in e2e.json): the latency no worker
   can beat on this broker; the report gives streambandit / floor ratios.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from bench import harness, kafka_io, traffic
from bench.passthrough_serve import event_id_span
from bench.snapshot_pause import snapshot_pause
from streambandit.config.kafka import consumer_settings, producer_settings
from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.stream.batch import EMIT_EVERY
from streambandit.wire import Context, Reward, encode, records
from streambandit.wire import codec as wire_codec
from streambandit.wire.batch_decode import decode_batch
from streambandit.wire.batch_encode import encode_actions, encode_joined_records

D, K, PARTITIONS = traffic.D, traffic.K, traffic.PARTITIONS
FAST_FETCH = kafka_io.FAST_FETCH


def fresh(broker: EmbeddedBroker, names: list[str]) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    out = [f"{n}-{tag}" for n in names]
    broker.create_topics(out, partitions=PARTITIONS)
    return out


# -- 1. the broker's ceiling ---------------------------------------------------------------------


def sample_records(n: int) -> tuple[list[bytes], list[bytes], list[bytes], bytes]:
    """Encoded contexts, their keys, rewards for every third, and one action-sized output."""
    events = traffic.backlog(n)
    ctx = [encode(c) for c, _ in events]
    keys = [c.model_key.encode() for c, _ in events]
    rew = [encode(r) for _, r in events if r is not None]
    c0 = events[0][0]
    action = encode(records.Action(c0.event_id, c0.model_key, c0.arm_ids[0], 0, 0.5, 1.0, 12345, c0.timestamp_ms,
                              c0.features[0], 0, 12345))
    return ctx, keys, rew, action


def producer_rate(broker: EmbeddedBroker, records: list[bytes], keys: list[bytes], transactional: bool) -> float:
    """Records per second of one producer writing ``records`` and waiting for every delivery."""
    (topic,) = fresh(broker, ["prod"])
    conf = {"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random", "linger.ms": 5,
            "enable.idempotence": True}
    if transactional:
        conf = producer_settings(broker.bootstrap_servers, f"ceiling-{topic}", {}) | {"partitioner": "murmur2_random"}
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
    start = time.perf_counter()
    if transactional:
        for lo in range(0, len(records), 2000):
            p.begin_transaction()
            for v, k in zip(records[lo:lo + 2000], keys[lo:lo + 2000]):
                p.produce(topic, value=v, key=k)
            p.commit_transaction(30)
    else:
        for i, (v, k) in enumerate(zip(records, keys)):
            while True:
                try:
                    p.produce(topic, value=v, key=k)
                    break
                except BufferError:
                    p.poll(0.01)
            if i % 1000 == 0:
                p.poll(0)
        p.flush(60)
    return len(records) / (time.perf_counter() - start)


def preload(broker: EmbeddedBroker, n: int, ctx: list[bytes], keys: list[bytes], rew: list[bytes]) -> tuple[list[str], int]:
    """Topics contexts/rewards/out holding n contexts and a reward for every third (as traffic.backlog)."""
    topics = fresh(broker, ["c", "r", "a"])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random", "linger.ms": 5,
                  "enable.idempotence": True})
    total = 0
    for i in range(n):
        p.produce(topics[0], value=ctx[i % len(ctx)], key=keys[i % len(keys)])
        total += 1
        if i % 3 == 0:
            p.produce(topics[1], value=rew[(i // 3) % len(rew)], key=keys[i % len(keys)])
            total += 1
        if i % 2000 == 0:
            p.poll(0)
    p.flush(60)
    return topics, total


def passthrough(broker: EmbeddedBroker, topics: list[str], total: int, out_value: bytes, *,
                batch: int = WorkerConfig.batch_max_records) -> dict:
    """Consume -> produce one output per input -> send offsets -> commit, per batch, like
    ``Worker.step`` with no decode, no merge and no learner. Events per second."""
    c_t, r_t, a_t = topics
    group = f"pt-{c_t}"
    consumer = Consumer(consumer_settings(broker.bootstrap_servers, group, FAST_FETCH))
    producer = Producer(producer_settings(broker.bootstrap_servers, f"{group}-tx", {}))
    producer.init_transactions(30)
    assigned: list = []
    consumer.subscribe([c_t, r_t], on_assign=lambda c, tps: assigned.extend(tps))
    while not assigned:
        consumer.consume(1, 0.1)  # nothing is consumed before the assignment; offsets start at 0
    taken, tx, t_poll, t_prod, t_commit = 0, 0, 0.0, 0.0, 0.0
    nxt: dict = {}
    start = None  # from the first poll that returns records, as the worker's drain is timed
    while taken < total:
        t0 = time.perf_counter()
        msgs = consumer.consume(batch, 0)
        if not msgs:
            msgs = consumer.consume(1, 0.05)
            if msgs:
                msgs += consumer.consume(batch - 1, 0)
        t1 = time.perf_counter()
        if not msgs:
            if start is not None:
                t_poll += t1 - t0
            continue
        if start is None:
            start = t0
        producer.begin_transaction()
        for m in msgs:
            if m.error():
                continue
            producer.produce(a_t, value=out_value, key=m.key(), partition=m.partition())
            nxt[(m.topic(), m.partition())] = m.offset() + 1
        producer.poll(0)
        t2 = time.perf_counter()
        producer.send_offsets_to_transaction([TopicPartition(t, p, o) for (t, p), o in nxt.items()],
                                             consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        t3 = time.perf_counter()
        t_poll, t_prod, t_commit = t_poll + t1 - t0, t_prod + t2 - t1, t_commit + t3 - t2
        taken += len(msgs)
        tx += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    producer.flush(10)
    return {"events_per_s": total / elapsed, "transactions": tx, "events_per_transaction": total / max(tx, 1),
            "share": {"poll": t_poll / elapsed, "produce": t_prod / elapsed, "commit": t_commit / elapsed}}


def broker_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` (utime + stime)."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def ceiling(broker: EmbeddedBroker, n: int, repeats: int) -> dict:
    ctx, keys, rew, action = sample_records(2000)
    pid = broker._proc.pid  # noqa: SLF001 (benchmark only: the broker's CPU time)
    runs = []
    for r in range(repeats):
        recs = [ctx[i % len(ctx)] for i in range(n)]
        ks = [keys[i % len(keys)] for i in range(n)]
        cpu0, t0 = broker_cpu(pid), time.perf_counter()
        prod = producer_rate(broker, recs, ks, transactional=False)
        prod_cpu = (broker_cpu(pid) - cpu0) / (time.perf_counter() - t0)
        prod_tx = producer_rate(broker, recs, ks, transactional=True)
        topics, total = preload(broker, n, ctx, keys, rew)
        cpu0, t0 = broker_cpu(pid), time.perf_counter()
        pt = passthrough(broker, topics, total, action)
        pt["broker_cpu"] = (broker_cpu(pid) - cpu0) / (time.perf_counter() - t0)
        runs.append({"producer_per_s": prod, "producer_broker_cpu": prod_cpu, "producer_tx_per_s": prod_tx,
                     "passthrough": pt})
        print(f"ceiling run {r}: producer {prod:,.0f}/s (broker cpu {prod_cpu:.0%}), transactional producer "
              f"{prod_tx:,.0f}/s, pass-through {pt['events_per_s']:,.0f} events/s "
              f"({pt['events_per_transaction']:.0f}/tx, broker cpu {pt['broker_cpu']:.0%}, {pt['share']})", flush=True)
    return {"records": n, "context_bytes": len(ctx[0]), "reward_bytes": len(rew[0]), "action_bytes": len(action),
            "runs": runs}


# -- 2. codec ----------------------------------------------------------------------------------


def codec(n: int = 20_000) -> dict:
    """Microseconds per record: context decode for three wire layouts of the features, and the
    worker's per-event encodes."""
    import io

    import fastavro

    c = traffic.backlog(1)[0][0]
    arrays = fastavro.parse_schema({"type": "record", "name": "CtxArrays", "fields": [
        {"name": "event_id", "type": "string"}, {"name": "model_key", "type": "string"},
        {"name": "timestamp_ms", "type": "long"},
        {"name": "arms", "type": {"type": "array", "items": {"type": "record", "name": "ArmArrays", "fields": [
            {"name": "arm_id", "type": "string"}, {"name": "features", "type": {"type": "array", "items": "double"}}]}}}]})
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, arrays, {"event_id": c.event_id, "model_key": c.model_key, "timestamp_ms": c.timestamp_ms,
                                             "arms": [{"arm_id": a, "features": [float(v) for v in x]}
                                                      for a, x in zip(c.arm_ids, c.features)]})
    arrays_bytes = buf.getvalue()

    def decode_arrays() -> None:  # what a reader of a double-array layout must do, validation included
        d = fastavro.schemaless_reader(io.BytesIO(arrays_bytes), arrays, None)
        x = np.array([a["features"] for a in d["arms"]], dtype=np.float64)
        np.isfinite(x).all()

    def per(f) -> float:
        f()
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        return (time.perf_counter() - t0) / n * 1e6

    def batch_us(f, records: list, repeats: int = 7) -> float:
        """Microseconds per record of ``f(records)``, a call for a whole batch (median of the repeats)."""
        f(records)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            f(records)
            times.append((time.perf_counter() - t0) / len(records) * 1e6)
        return harness.median(times)

    v1, v2 = wire_codec.encode_context_v1(c), encode(c)
    action = records.Action(c.event_id, c.model_key, c.arm_ids[3], 3, 0.5, 1.0, 100, c.timestamp_ms, c.features[3], 0, 100)
    joined = records.Joined(c.event_id, c.model_key, c.features[3], 1.0, True, 1.0, c.timestamp_ms, c.timestamp_ms + 5,
                            100, 1, 77)
    fa_action = ({f: getattr(action, f) for f in action.__dataclass_fields__}
                 | {"features": wire_codec.features_to_bytes(action.features)})
    # What the worker does: a poll batch of 2,000 different contexts decoded in one pass (batch_decode.py).
    batch = [encode(x) for x, _ in traffic.backlog(2000)]
    # What the worker does with its outputs: a hand-over's worth (batch.EMIT_EVERY records) of
    # actions and of joined records, each encoded in one compiled pass (batch_encode.py).
    ctxs = [x for x, _ in traffic.backlog(EMIT_EVERY)]
    actions = [records.Action(x.event_id, x.model_key, x.arm_ids[i % 10], i % 10, 0.5, 1.0, 10_000 + i, x.timestamp_ms,
                         x.features[i % 10].copy(), 0, 50_000 + i) for i, x in enumerate(ctxs)]
    joins = [records.Joined(a.event_id, a.model_key, a.features, 1.0, i % 3 == 0, 1.0, a.decision_timestamp_ms,
                       a.decision_timestamp_ms + 100, a.model_version, 1, 20_000 + i) for i, a in enumerate(actions)]

    out = {
        "bytes": {"arrays_of_double": len(arrays_bytes) + 3, "v1_bytes_per_arm": len(v1), "v2_one_block": len(v2)},
        "decode_us": {"arrays_of_double": per(decode_arrays), "v1_bytes_per_arm": per(lambda: wire_codec.decode(v1)),
                      "v2_one_block": per(lambda: wire_codec.decode(v2)),
                      "v2_batch": batch_us(decode_batch, batch)},
        "encode_us": {"action_fastavro": per(lambda: wire_codec.write(3, fa_action)), "action": per(lambda: encode(action)),
                      "joined": per(lambda: encode(joined)), "context_v2": per(lambda: encode(c)),
                      "action_batch": batch_us(encode_actions, actions),
                      "joined_batch": batch_us(encode_joined_records, joins)},
    }
    print(f"codec: {out}", flush=True)
    return out


# -- 3. profile ----------------------------------------------------------------------------------


def _worker_on_backlog(broker: EmbeddedBroker, policy: str, events: list, **settings):
    """A worker (in this process) assigned both partitions of fresh topics holding ``events``."""
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import Worker

    t = kafka_io.fresh_topics(broker)
    n_records = sum(kafka_io.produce(broker, t, events).values())
    cfg = WorkerConfig(bootstrap_servers=broker.bootstrap_servers, models=parse_models_config(traffic.models(policy, 100)),
                       topics=t, group_id=f"e2e-{t.contexts}", snapshot_interval_s=1e9, snapshot_every_updates=10**9,
                       kafka={"consumer": FAST_FETCH}, **settings)
    snaps = tempfile.mkdtemp()
    w = Worker(cfg, DirectoryStore(snaps))
    w.start()  # run() without its loop
    while len(w.partitions) < PARTITIONS:
        w.step()
    return w, n_records


def _warm(policy: str) -> None:
    """Compile the learner's kernels (numba) before anything is timed."""
    m = parse_models_config(traffic.models(policy)).resolve("placement-0").build()
    ctx = traffic.backlog(2)[0][0]
    for _ in range(3):
        m.update(ctx.features[m.select(ctx.features)], 1.0)


def _check_exact(m: dict, what: str) -> None:
    wrong = {k: v for k, v in m.items() if (k.startswith("dead_letter.") or k == "merge_out_of_order") and v}
    if wrong:
        raise RuntimeError(f"{what} was not exact: {wrong}")


STAGES = ("poll", "decode", "merge", "engine", "learner", "encode", "produce", "commit", "other")


def _stages(stats: pstats.Stats, total: float) -> dict:
    """Seconds per stage from a cProfile of ``Worker.step``. Learner: every call into
    streambandit/policies (and the kernels) from outside it; engine: the partition engines'
    entry points (decisions, joins, bookkeeping) minus the learner; other: the rest, the worker's
    own per-record loop among it."""
    st = stats.stats  # type: ignore[attr-defined]

    def ct(pred) -> float:
        return sum(v[3] for f, v in st.items() if pred(f))

    def is_learner(f) -> bool:
        return "/policies/" in f[0] or f[0].endswith(("numerics/linalg.py", "numerics/kernels.py"))

    learner = sum(c[3] for f, v in st.items() if is_learner(f) for caller, c in v[4].items() if not is_learner(caller)
                  and "numba" not in caller[0])
    name = lambda f, file, fn: f[0].endswith(file) and f[2] == fn  # noqa: E731
    out = {
        "poll": ct(lambda f: name(f, "worker.py", "_poll_batch")) + ct(lambda f: name(f, "worker.py", "_inputs_behind")),
        "decode": ct(lambda f: name(f, "batch_decode.py", "decode_batch")),
        "merge": sum(ct(lambda f, fn=fn: name(f, "merge.py", fn)) for fn in ("extend", "push", "pop_ready")),
        # Outputs: actions and joined records in bulk (batch_encode, from batch.py's _Outputs.take),
        # dead letters and ticks one by one (codec.encode).
        "encode": sum(c[3] for f, v in st.items()
                      if (f[0].endswith("batch_encode.py") and f[2] in ("encode_actions", "encode_joined_records"))
                      or (f[0].endswith("codec.py") and f[2] == "encode")
                      for caller, c in v[4].items() if caller[0].endswith("batch.py")),
        "produce": sum(v[3] for f, v in st.items() if f[2] in ("<method 'produce' of 'cimpl.Producer' objects>",
                                                              "<method 'poll' of 'cimpl.Producer' objects>")),
        "commit": sum(v[3] for f, v in st.items() if f[2] in (
            "<method 'begin_transaction' of 'cimpl.Producer' objects>",
            "<method 'send_offsets_to_transaction' of 'cimpl.Producer' objects>",
            "<method 'commit_transaction' of 'cimpl.Producer' objects>")),
        "learner": learner,
    }
    # The engine's entry points, called from BatchProcessor.release's loop (the common case) and
    # _other (the rest); the learner's calls are inside them.
    process = (ct(lambda f: name(f, "engine.py", "on_context")) + ct(lambda f: name(f, "engine.py", "on_reward"))
               + ct(lambda f: name(f, "batch.py", "_other")))
    out["engine"] = process - out["learner"]
    out["other"] = total - sum(out.values())
    return out


def profile(broker: EmbeddedBroker, policy: str, n: int) -> dict:
    _warm(policy)
    events = traffic.backlog(n)
    w, n_records = _worker_on_backlog(broker, policy, events)
    pr = cProfile.Profile()
    start = time.perf_counter()
    pr.enable()
    while w.metrics["records_in"] < n_records:
        w.step()
    pr.disable()
    elapsed = time.perf_counter() - start
    m = dict(w.metrics)
    w.close()
    _check_exact(m, "profile run")
    stats = pstats.Stats(pr)
    total = sum(v[3] for f, v in stats.stats.items() if f[2] == "step")  # type: ignore[attr-defined]
    stages = _stages(stats, total)
    top = sorted(((v[2], f"{Path(f[0]).name}:{f[2]}") for f, v in stats.stats.items()), reverse=True)[:15]  # type: ignore[attr-defined]
    out = {"policy": policy, "events": n_records, "profiled_s": total, "events_per_s_profiled": n_records / elapsed,
           "stages_s": stages, "share": {k: v / total for k, v in stages.items()},
           "us_per_event": {k: v / n_records * 1e6 for k, v in stages.items()},
           "top_tottime": [[name, t] for t, name in top]}
    print(f"profile {policy}: " + ", ".join(f"{k} {v:.0%}" for k, v in out["share"].items()), flush=True)
    return out


# -- 4. throughput -------------------------------------------------------------------------------


class GCPauses:
    """Count and wall time of the garbage collector's runs per generation while in the block."""

    def __init__(self) -> None:
        self.count, self.ms, self.longest_ms, self._t = [0, 0, 0], [0.0, 0.0, 0.0], 0.0, 0.0

    def _cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t = time.perf_counter()
            return
        g, dt = info["generation"], 1e3 * (time.perf_counter() - self._t)
        self.count[g] += 1
        self.ms[g] += dt
        self.longest_ms = max(self.longest_ms, dt)

    def __enter__(self) -> "GCPauses":
        gc.callbacks.append(self._cb)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._cb)


def drain(broker: EmbeddedBroker, policy: str, events: list, *, freeze: bool = True, **settings) -> dict:
    """One worker draining ``events``. ``freeze=False``: the worker without ``freeze_long_lived``
    (and everything frozen before unfrozen), for the comparison in the same run."""
    import streambandit.stream.worker as worker_module

    real_freeze = worker_module.freeze_long_lived
    if not freeze:
        gc.unfreeze()
        worker_module.freeze_long_lived = lambda: None
    try:
        w, n_records = _worker_on_backlog(broker, policy, events, **settings)
        with GCPauses() as pauses:
            # The clock runs from the step that got the first records: before it the worker only
            # waits for the first fetch after its assignment, a start-up cost reported on its own
            # (``first_fetch_ms``), which would otherwise weigh on a drain of about a second.
            begin = start = time.perf_counter()
            cpu0 = time.thread_time()
            first = None
            while w.metrics["records_in"] < n_records:
                s, c = time.perf_counter(), time.thread_time()
                if w.step() and first is None:
                    first, start, cpu0 = s - begin, s, c
            end = time.perf_counter()
            elapsed, cpu = end - start, time.thread_time() - cpu0
    finally:
        worker_module.freeze_long_lived = real_freeze
    m = dict(w.metrics)
    w.close()
    _check_exact(m, "throughput run")
    # Per CPU second of the worker's own thread: what a core it had to itself would give (the
    # librdkafka threads and the broker run beside it; the machine is shared).
    return {"events_per_s": n_records / elapsed, "contexts_per_s": len(events) / elapsed,
            "events_per_s_with_first_fetch": n_records / (end - begin), "first_fetch_ms": 1000 * (first or 0.0),
            "events_per_cpu_s": n_records / cpu, "events_per_transaction": n_records / max(m["transactions"], 1),
            "gc_count": pauses.count, "gc_ms": pauses.ms, "gc_longest_ms": pauses.longest_ms}


def bare(policy: str, events: list) -> float:
    """Events per second of the learner alone (same decisions and updates, no Kafka)."""
    spec = parse_models_config(traffic.models(policy)).resolve(traffic.MODEL_KEYS[0])
    learners = {key: spec.build() for key in traffic.MODEL_KEYS}
    start = time.perf_counter()
    for ctx, rew in events:
        p = learners[ctx.model_key]
        i = p.select(ctx.features)
        p.update(ctx.features[i], 1.0 if rew is not None else 0.0)
    n_events = len(events) + sum(r is not None for _, r in events)
    return n_events / (time.perf_counter() - start)


def throughput(broker: EmbeddedBroker, policies: tuple, n: int, repeats: int) -> dict:
    events = traffic.backlog(n)
    ctx, keys, rew, action = sample_records(2000)
    out: dict = {p: {"worker": [], "bare_learner_events_per_s": []} for p in policies}
    out["passthrough"], out["oful_no_freeze"], out["oful_batch_2000"] = [], [], []
    for p in policies:
        _warm(p)
    for r in range(repeats):
        topics, total = preload(broker, n, ctx, keys, rew)
        out["passthrough"].append(passthrough(broker, topics, total, action)["events_per_s"])
        if "oful" in policies:  # the worker without its gc.freeze, for the ratio in the same run
            out["oful_no_freeze"].append(drain(broker, "oful", events, freeze=False))
            # batch_max_records 2,000 against the default: what fewer, larger transactions save
            out["oful_batch_2000"].append(drain(broker, "oful", events, batch_max_records=2000))
        for p in policies:
            out[p]["worker"].append(drain(broker, p, events))
            out[p]["bare_learner_events_per_s"].append(bare(p, events))
            print(f"throughput run {r} {p}: worker {out[p]['worker'][-1]['events_per_s']:,.0f} events/s, "
                  f"pass-through {out['passthrough'][-1]:,.0f}, bare learner {out[p]['bare_learner_events_per_s'][-1]:,.0f}",
                  flush=True)
    return out


# -- 5. latency ----------------------------------------------------------------------------------


FRACTIONS = tuple(float(x) for x in os.environ.get("E2E_FRACS", "0.1,0.5,0.9").split(","))
# fetch_wait: fetch.wait.max.ms of every consumer (worker and application); linger: linger.ms of
# every producer; merge_wait, poll_timeout: the worker's merge_wait_ms and poll_timeout_ms.
LATENCY_DEFAULTS = {"fetch_wait": 10, "linger": 5, "merge_wait": 20, "poll_timeout": 50}
LOW_LATENCY = {"fetch_wait": 5, "linger": 0, "merge_wait": 5, "poll_timeout": 50}
# merge_wait 0 (Kafka Streams' max.task.idle.ms default: wait only for an input with known lag,
# which ``behind`` does anyway) with the default Kafka settings. fetch_wait 1 with linger 0, the
# fastest for one record (part 5a), saturates Tansu under load: the floor's "fastest" row shows it,
# and the worker with it fell behind at every load when tried (E2E_KNOBS runs any other set).
MERGE_WAIT_0 = {"fetch_wait": 10, "linger": 5, "merge_wait": 0, "poll_timeout": 50}
LATENCY_SETS = {"defaults": LATENCY_DEFAULTS, "merge-wait-0": MERGE_WAIT_0, "low-latency": LOW_LATENCY}
# Latency and floor runs each on a fresh broker (--broker-per-run): Tansu keeps every topic in
# memory and its CPU per request grew with what it held in these runs, so later runs met a busier
# broker than earlier ones.
BROKER_PER_RUN = False
# The floor (bare pass-through) with the default Kafka settings and with the fastest of part 5a.
FLOOR_SETS = {"defaults": {"fetch_wait": 10, "linger": 5, "poll_timeout": 50},
              "fastest": {"fetch_wait": 1, "linger": 0, "poll_timeout": 50}}


def _event_id(action: bytes) -> str:
    """The event id of an action record without a full decode: the first field after the header."""
    start, end = event_id_span(action)
    return action[start:end].decode()


def hops(broker: EmbeddedBroker, n: int = 40, fetch_wait: int = 10, linger: int = 5) -> dict:
    """One record at a time through the bare pass-through, timing each hop (ms): produced ->
    fetched by the group consumer (read_committed) -> transaction committed (produce one output,
    send offsets, commit) -> output read by a read_committed consumer."""
    c_t, a_t = fresh(broker, ["hc", "ha"])
    ctx, keys, _, action = sample_records(1)
    prod = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": linger, "enable.idempotence": True})
    consumer = Consumer(consumer_settings(broker.bootstrap_servers, f"hops-{c_t}", {"fetch.wait.max.ms": fetch_wait}))
    tx = Producer(producer_settings(broker.bootstrap_servers, f"hops-{c_t}", {"linger.ms": linger}))
    tx.init_transactions(30)
    app = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"hops-app-{c_t}",
                    "isolation.level": "read_committed", "fetch.wait.max.ms": fetch_wait, "enable.auto.commit": False})
    app.assign([TopicPartition(a_t, 0, 0)])
    assigned: list = []
    consumer.subscribe([c_t], on_assign=lambda c, tps: assigned.extend(tps))
    while not assigned:
        consumer.consume(1, 0.1)
    app.consume(10, 0.5)
    rows = []
    for _ in range(n):
        time.sleep(0.05)
        t0 = time.perf_counter()
        prod.produce(c_t, value=ctx[0], key=keys[0], partition=0)
        prod.poll(0)
        msgs = []
        while not msgs:
            msgs = consumer.consume(1, 1.0)
        t1 = time.perf_counter()
        m = msgs[0]
        tx.begin_transaction()
        tx.produce(a_t, value=action, key=m.key(), partition=0)
        tx.send_offsets_to_transaction([TopicPartition(c_t, 0, m.offset() + 1)], consumer.consumer_group_metadata(), 30)
        t2a = time.perf_counter()
        tx.commit_transaction(30)
        t2 = time.perf_counter()
        got = []
        while not got:
            got = app.consume(1, 1.0)
        t3 = time.perf_counter()
        rows.append(((t1 - t0) * 1e3, (t2a - t1) * 1e3, (t2 - t2a) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3))
    consumer.close()
    app.close()
    a = np.array(rows[5:])
    names = ["fetch_in", "produce_send_offsets", "commit", "fetch_out", "total"]
    out = {"fetch_wait_ms": fetch_wait, "linger_ms": linger,
           "p50_ms": dict(zip(names, np.percentile(a, 50, axis=0).tolist())),
           "max_ms": dict(zip(names, a.max(axis=0).tolist()))}
    print(f"hops fetch.wait.max.ms={fetch_wait} linger.ms={linger}: " +
          ", ".join(f"{k} {v:.1f}" for k, v in out["p50_ms"].items()), flush=True)
    return out


def latency_run(broker: EmbeddedBroker, policy: str, rate: float, seconds: float, workdir: Path, knobs: dict,
                floor: bool = False) -> dict:
    """Offered ``rate`` contexts/s (and a reward for every third, 5 ms of event time later) to a
    ``serve`` subprocess, or with ``floor`` to the bare pass-through as a subprocess
    (bench/passthrough_serve.py; ``merge_wait`` does not apply to it); latency = context produced
    -> action read by a read_committed consumer. The same load generator for both."""
    t = kafka_io.fresh_topics(broker)
    group = f"{'floor' if floor else 'lat'}-{t.contexts}"
    if floor:
        cmd = [sys.executable, "-m", "bench.passthrough_serve",
               "--bootstrap-servers", broker.bootstrap_servers, "--contexts", t.contexts, "--rewards", t.rewards,
               "--actions", t.actions, "--group", group, "--fetch-wait", str(knobs["fetch_wait"]),
               "--linger", str(knobs["linger"]), "--poll-timeout", str(knobs["poll_timeout"])]
    else:
        cfg = workdir / f"{group}.toml"
        cfg.write_text(kafka_io.worker_toml(
            group, t, traffic.models_toml(policy), consumer={"fetch.wait.max.ms": knobs["fetch_wait"]},
            producer={"linger.ms": knobs["linger"]},
            worker={"merge_wait_ms": knobs["merge_wait"], "poll_timeout_ms": knobs["poll_timeout"]}))
        cmd = [sys.executable, "-m", "streambandit", "serve", "--config", str(cfg), "-v",
               "--bootstrap-servers", broker.bootstrap_servers, "--snapshot-dir", str(workdir / group), "--processes", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        kafka_io.wait_for_line(proc, r"partition assigned", PARTITIONS)
        proc.stderr.close()  # the log is not read any more (an unread pipe would block the worker)
        return _offer(broker, t, rate, seconds, knobs, proc.pid)
    finally:
        proc.send_signal(2)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _offer(broker: EmbeddedBroker, t, rate: float, seconds: float, knobs: dict, server_pid: int) -> dict:
    """The load generator: contexts at ``rate``/s on ``t.contexts`` (a reward for every third 5 ms
    later), actions read from ``t.actions``; 3 s of warm-up, then ``seconds`` measured. Also the
    CPU (of one core) the broker and the server process (worker or pass-through) used meanwhile."""
    prod = Producer({"bootstrap.servers": broker.bootstrap_servers, "partitioner": "murmur2_random",
                     "linger.ms": knobs["linger"], "enable.idempotence": True})
    cons = Consumer({"bootstrap.servers": broker.bootstrap_servers, "group.id": f"app-{t.contexts}",
                     "isolation.level": "read_committed", "enable.auto.commit": False,
                     "fetch.wait.max.ms": knobs["fetch_wait"]})
    cons.assign([TopicPartition(t.actions, p, 0) for p in range(PARTITIONS)])
    cons.consume(100, 1.0)
    pool = traffic.backlog(64)
    sent: dict[str, float] = {}
    lat: list[float] = []
    rewards: list[tuple[float, bytes, bytes]] = []
    warm_s, i, answered = 3.0, 0, 0
    start = time.perf_counter()
    end = start + warm_s + seconds
    measuring = False
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if not measuring and now >= start + warm_s:
            measuring, lat, answered = True, [], 0
            cpu0 = (broker_cpu(broker._proc.pid), broker_cpu(server_pid), now)  # noqa: SLF001
        due = int((now - start) * rate) - i
        for _ in range(max(due, 0)):
            c = pool[i % len(pool)][0]
            eid, key = f"q{i}", c.model_key
            ts = int(time.time() * 1000)
            value = encode(Context(eid, key, ts, c.arm_ids, c.features))
            sent[eid] = time.perf_counter()
            prod.produce(t.contexts, key=key.encode(), value=value)
            if i % 3 == 0:
                rewards.append((sent[eid] + 0.005, key.encode(), encode(Reward(eid, key, ts + 5, 1.0))))
            i += 1
        while rewards and rewards[0][0] <= now:
            _, k, v = rewards.pop(0)
            prod.produce(t.rewards, key=k, value=v)
        prod.poll(0)
        for msg in cons.consume(5000, 0.001):
            if msg.error():
                continue
            t0 = sent.pop(_event_id(msg.value()), None)
            if t0 is not None:
                lat.append((time.perf_counter() - t0) * 1000.0)
                answered += 1
    wall = time.perf_counter() - cpu0[2]
    cpu = {"broker_cpu": (broker_cpu(broker._proc.pid) - cpu0[0]) / wall,  # noqa: SLF001
           "server_cpu": (broker_cpu(server_pid) - cpu0[1]) / wall}
    prod.flush(10)
    cons.close()
    a = np.array(lat) if lat else np.array([np.nan])
    return {"offered_per_s": rate, "answered_per_s": answered / seconds, "unanswered": len(sent),
            "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "p999_ms": float(np.percentile(a, 99.9)), "n": len(lat), **cpu}


def latency(broker: EmbeddedBroker, policy: str, max_rate: float, seconds: float, repeats: int, knob_sets: dict,
            given_max: float | None = None) -> dict:
    """First the live maximum: the rate a ``serve`` worker answers when offered the drain maximum
    (the load generator and the broker share the machine with it, so it is lower); then the
    percentiles at fractions of that. With ``given_max`` (contexts/s) no probe: the fractions are
    of that."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if given_max:
            out["live_max"] = {"answered_per_s": given_max, "given": True}
            max_rate = given_max
        else:
            probe = latency_run(broker, policy, round(max_rate), seconds, Path(tmp), LATENCY_DEFAULTS)
            out["live_max"] = probe
            max_rate = probe["answered_per_s"]
            print(f"live maximum: offered {probe['offered_per_s']}/s, answered {max_rate:.0f}/s contexts", flush=True)
        out.update(_at_fractions(broker, policy, max_rate, seconds, repeats, knob_sets, Path(tmp), "latency"))
    return out


def _at_fractions(broker: EmbeddedBroker, policy: str, max_rate: float, seconds: float, repeats: int, knob_sets: dict,
                  workdir: Path, what: str) -> dict:
    out: dict = {}
    for label, knobs in knob_sets.items():
        for frac in FRACTIONS:
            rate = round(max_rate * frac)
            runs = []
            for _ in range(repeats):
                if BROKER_PER_RUN:  # a broker of its own: no drift with what earlier runs left in memory
                    with EmbeddedBroker() as own:
                        runs.append(latency_run(own, policy, rate, seconds, workdir, knobs, floor=what == "floor"))
                else:
                    runs.append(latency_run(broker, policy, rate, seconds, workdir, knobs, floor=what == "floor"))
            out[f"{label}@{frac}"] = {"knobs": knobs, "fraction": frac, "runs": runs}
            print(f"{what} {label} at {frac:.0%} ({rate}/s contexts): " + "; ".join(
                f"p50 {x['p50_ms']:.1f} p99 {x['p99_ms']:.1f} p99.9 {x['p999_ms']:.1f} ms, answered {x['answered_per_s']:.0f}/s, "
                f"cpu broker {x['broker_cpu']:.0%} server {x['server_cpu']:.0%}" for x in runs), flush=True)
    return out


def floor(broker: EmbeddedBroker, max_rate: float, seconds: float, repeats: int, knob_sets: dict) -> dict:
    """Part 5's measurement with the bare transactional pass-through (part 1's loop, a subprocess:
    bench/passthrough_serve.py) in place of the worker, at the same fractions of ``max_rate``: the
    decision latency no worker can beat on this broker with these Kafka settings."""
    with tempfile.TemporaryDirectory() as tmp:
        return _at_fractions(broker, "", max_rate, seconds, repeats, knob_sets, Path(tmp), "floor")


# -- report --------------------------------------------------------------------------------------


def _summary(v: dict) -> dict:
    med = harness.median
    runs = v["runs"]
    return {"fraction": v["fraction"], "offered": runs[0]["offered_per_s"],
            **{k: med([x[f"{k}_ms"] for x in runs]) for k in ("p50", "p99", "p999")},
            "answered": med([x["answered_per_s"] for x in runs]),
            "broker_cpu": med([x.get("broker_cpu", float("nan")) for x in runs]),
            "server_cpu": med([x.get("server_cpu", float("nan")) for x in runs])}


def _pct(x: float) -> str:
    return "" if x != x else f"{x:.0%}"  # nan (results from before the CPU was recorded): blank


def _latency_rows(part: dict) -> list[str]:
    out = []
    for key, v in part.items():
        if key == "live_max":
            continue
        q = _summary(v)
        knobs = ", ".join(f"{k} {x}" for k, x in v["knobs"].items())
        behind = " (fell behind)" if q["answered"] < 0.95 * q["offered"] else ""  # percentiles of the answered only
        out.append(f"| {key.rsplit('@', 1)[0]}: {knobs} | {q['fraction']:.0%} | {q['offered']:,.0f} | "
                   f"{q['answered']:,.0f}{behind} | {q['p50']:.1f} | {q['p99']:.1f} | {q['p999']:.1f} | "
                   f"{_pct(q['broker_cpu'])} | {_pct(q['server_cpu'])} |")
    return out


def _floor_pairs(res: dict) -> list[tuple[str, str, dict, dict]]:
    """(latency key, floor key, their summaries) for each streambandit row whose Kafka settings
    (fetch_wait, linger) and load have a floor row in the same run."""
    if "latency" not in res or "floor" not in res:
        return []
    out = []
    for key, v in res["latency"].items():
        if key == "live_max":
            continue
        for fkey, f in res["floor"].items():
            if f["fraction"] == v["fraction"] and all(f["knobs"][k] == v["knobs"][k] for k in ("fetch_wait", "linger")):
                out.append((key, fkey, _summary(v), _summary(f)))
                break
    return out


def render(res: dict) -> str:
    med = harness.median
    batch_max, partitions = res["batch_max_records"], res["partitions"]
    lines = [
        "# End to end on the embedded broker",
        "",
        harness.provenance(res, "The cores are shared by the broker, the worker, librdkafka's threads and the load "
                           "generator (and other jobs: figures are medians and the comparisons are ratios within one "
                           f"run). Broker: embedded Tansu (in-memory). d = {res['d']}, K = {res['K']}, {partitions} "
                           "partitions, 4 model keys, a reward for every third context; events = input records "
                           "(contexts + rewards). Transactions on, read_committed everywhere."),
        "",
    ]
    if "ceiling" in res:
        c = res["ceiling"]
        runs = c["runs"]
        pt = [r["passthrough"] for r in runs]
        lines += [
            f"## 1. The broker's ceiling ({c['records']:,} contexts of {c['context_bytes']:,} bytes, "
            f"rewards of {c['reward_bytes']} bytes, outputs of {c['action_bytes']} bytes; median of {len(runs)} runs)",
            "",
            "Nothing of streambandit in the loop: raw bytes, no decode, no merge, no learner. The pass-through consumes "
            f"up to {batch_max:,} fetched records (the worker's "
            "`batch_max_records`), produces one action-sized record per input and commits them with the input "
            "offsets in one transaction, as `Worker.step` does.",
            "",
            "| loop | records / s | broker CPU (of one core) |",
            "|---|---:|---:|",
            f"| producer alone, idempotent, linger 5 ms, contexts | {med([r['producer_per_s'] for r in runs]):,.0f} | "
            f"{med([r['producer_broker_cpu'] for r in runs]):.0%} |",
            f"| producer alone, transactional (2,000 per transaction), contexts | "
            f"{med([r['producer_tx_per_s'] for r in runs]):,.0f} | |",
            f"| consume -> produce -> send offsets -> commit (read_committed) | {med([p['events_per_s'] for p in pt]):,.0f} | "
            f"{med([p['broker_cpu'] for p in pt]):.0%} |",
            "",
            f"In the pass-through, {med([p['events_per_transaction'] for p in pt]):,.0f} events per transaction; of its wall "
            f"time: poll {med([p['share']['poll'] for p in pt]):.0%}, produce {med([p['share']['produce'] for p in pt]):.0%}, "
            f"send offsets + commit {med([p['share']['commit'] for p in pt]):.0%}.",
            "",
        ]
    if "codec" in res:
        c = res["codec"]
        lines += [
            "## 2. Feature decoding: three wire layouts of a context (d = 20, K = 10)",
            "",
            "Microseconds per record, decode with validation (shape, finite) into a (K, d) float64 array.",
            "",
            "| layout | bytes | decode us |",
            "|---|---:|---:|",
            f"| fastavro `array<double>` per arm | {c['bytes']['arrays_of_double']:,} "
            f"| {c['decode_us']['arrays_of_double']:.1f} |",
            f"| packed little-endian float64 `bytes` per arm (context v1) | {c['bytes']['v1_bytes_per_arm']:,} | "
            f"{c['decode_us']['v1_bytes_per_arm']:.1f} |",
            f"| one packed block for all arms (context v2, chosen) | {c['bytes']['v2_one_block']:,} | "
            f"{c['decode_us']['v2_one_block']:.1f} |",
            *([f"| context v2, a poll batch of 2,000 in one compiled pass (`batch_decode`, what the worker does) | "
               f"{c['bytes']['v2_one_block']:,} | {c['decode_us']['v2_batch']:.1f} |"] if "v2_batch" in c["decode_us"] else []),
            "",
            f"Encode per event: action {c['encode_us']['action']:.1f} us (fastavro: {c['encode_us']['action_fastavro']:.1f} us), "
            f"joined {c['encode_us']['joined']:.1f} us; a context (the application's side) "
            f"{c['encode_us']['context_v2']:.1f} us. "
            + (f"What the worker does, a hand-over of {res['emit_every']} records in one compiled pass (`batch_encode`): action "
               f"{c['encode_us']['action_batch']:.2f} us, joined {c['encode_us']['joined_batch']:.2f} us per record."
               if "action_batch" in c["encode_us"] else ""),
            "",
        ]
    if "profile" in res:
        lines += [
            "## 3. Where the worker's time goes (cProfile of `Worker.step` draining a backlog)",
            "",
            "Share of the profiled time and microseconds per event (profiler overhead included: it inflates stages "
            "made of many small Python calls, so read the shares as an upper bound for them).",
            "",
            "| policy | events/s (profiled) | " + " | ".join(STAGES) + " |",
            "|---|---:|" + "---:|" * len(STAGES),
        ]
        for p, v in res["profile"].items():
            lines.append(f"| {p} | {v['events_per_s_profiled']:,.0f} | " + " | ".join(
                f"{v['share'][k]:.0%} ({v['us_per_event'][k]:.1f})" for k in STAGES) + " |")
        lines.append("")
    if "throughput" in res:
        tp = res["throughput"]
        pt = med(tp["passthrough"])
        lines += [
            "## 4. Throughput: one worker draining a backlog, transactions on",
            "",
            "Median of the runs; the pass-through (part 1's loop) ran on the same backlog in the same runs. Both are "
            "timed from the first poll that returns records: before it they only wait for the first fetch after the "
            "assignment, a start-up cost (its own column). The column after it times the drain from its first poll.",
            "",
            "| policy | events / s | contexts / s | events per CPU s of the worker thread | events per transaction | "
            "first fetch ms | events / s with the first fetch | pass-through events / s | bare learner events / s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for p, v in tp.items():
            if p in ("passthrough", "oful_no_freeze", "oful_batch_2000"):
                continue
            w = v["worker"]
            lines.append(f"| {p} | {med([x['events_per_s'] for x in w]):,.0f} | {med([x['contexts_per_s'] for x in w]):,.0f} | "
                         f"{med([x['events_per_cpu_s'] for x in w]):,.0f} | "
                         f"{med([x['events_per_transaction'] for x in w]):,.0f} | "
                         f"{med([x.get('first_fetch_ms', float('nan')) for x in w]):,.0f} | "
                         f"{med([x.get('events_per_s_with_first_fetch', float('nan')) for x in w]):,.0f} | {pt:,.0f} | "
                         f"{med(v['bare_learner_events_per_s']):,.0f} |")
        lines.append("")
        if tp.get("oful_no_freeze"):
            lines += [
                "The garbage collector during the drain (`oful`, medians of the runs), with the worker's "
                "`freeze_long_lived` (gc.freeze after start-up and recovery) and without it, in the same runs:",
                "",
                "| worker | events / s | full (gen 2) collections | their ms | longest pause ms | gen 0 + gen 1 ms |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            for label, w in (("as shipped (frozen)", tp["oful"]["worker"]), ("without the freeze", tp["oful_no_freeze"])):
                lines.append(f"| {label} | {med([x['events_per_s'] for x in w]):,.0f} | "
                             f"{med([x['gc_count'][2] for x in w]):.0f} | {med([x['gc_ms'][2] for x in w]):.1f} | "
                             f"{med([x['gc_longest_ms'] for x in w]):.1f} | "
                             f"{med([x['gc_ms'][0] + x['gc_ms'][1] for x in w]):.1f} |")
            lines.append("")
        if tp.get("oful_batch_2000"):
            lines += [
                "`batch_max_records` (`oful`, medians of the same runs): the default, and 2,000. Each transaction's "
                "commit waits for ~3 serial broker round trips (the outputs' acknowledgements, the offsets, the end "
                "of the transaction), so the size of a transaction sets how much of a backlog's drain is spent "
                "committing:",
                "",
                "| batch_max_records | events / s | events per CPU s | events per transaction |",
                "|---:|---:|---:|---:|",
            ]
            for label, w in ((f"{batch_max:,} (default)", tp["oful"]["worker"]),
                             ("2,000", tp["oful_batch_2000"])):
                lines.append(f"| {label} | {med([x['events_per_s'] for x in w]):,.0f} | "
                             f"{med([x['events_per_cpu_s'] for x in w]):,.0f} | "
                             f"{med([x['events_per_transaction'] for x in w]):,.0f} |")
            lines.append("")
    if "hops" in res:
        lines += [
            "## 5a. One record at a time through the bare pass-through: where an unloaded round trip goes",
            "",
            "Median ms per hop over 35 records (50 ms apart): produced -> fetched by the group consumer; produce one "
            "output + send offsets; commit; output read by a read_committed consumer.",
            "",
            "| fetch.wait.max.ms | linger.ms | fetch in | produce + offsets | commit | fetch out | total |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for h in res["hops"]:
            q = h["p50_ms"]
            lines.append(f"| {h['fetch_wait_ms']} | {h['linger_ms']} | {q['fetch_in']:.1f} | {q['produce_send_offsets']:.1f} | "
                         f"{q['commit']:.1f} | {q['fetch_out']:.1f} | {q['total']:.1f} |")
        lines.append("")
    if "latency" in res:
        given = res["latency"]["live_max"].get("given")
        lines += [
            "## 5. Decision latency: context produced -> action readable (read_committed), oful",
            "",
            "The worker is a `streambandit serve` subprocess; the load generator (encoding and producing contexts, "
            "a reward for every third 5 ms later, reading the actions) is this process, on the same two cores as the "
            "broker. " + (f"The rates below are 10 %, 50 % and 90 % of a given maximum of "
                          f"{res['latency']['live_max']['answered_per_s']:,.0f} contexts/s (no probe in this run). "
                          if given else "Offered the drain maximum of part 4 "
                          f"({res['latency_max_contexts_per_s']:,.0f} contexts/s), the live worker answered "
                          f"{res['latency']['live_max']['answered_per_s']:,.0f} contexts/s: that is the live maximum, "
                          "and the rates below are 10 %, 50 % and 90 % of it. ") +
            "Median over runs of each run's percentile; CPU (of one core) of the broker and of the worker process "
            "over the measured seconds. " + ("Each run on a broker of its own." if res.get("broker_per_run") else
                                             "All runs on one broker, one after another."),
            "",
            "| knobs | load | offered contexts / s | answered / s | p50 ms | p99 ms | p99.9 ms | broker CPU | worker CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += _latency_rows(res["latency"])
        lines.append("")
    if "floor" in res:
        fm = res["floor_max"]
        lines += [
            "## 5b. The floor: part 5's load on the bare transactional pass-through",
            "",
            f"Part 1's loop (consume what is fetched, up to {batch_max:,} "
            "records, waiting up to poll_timeout for the first; "
            "one action-sized output per input; send offsets; commit), as a subprocess of its own "
            "(`bench/passthrough_serve.py`) in place of the worker, offered the same load by the same load "
            "generator and measured the same way: no decode, no merge, no learner; what the broker and the "
            "Kafka clients alone cost at that load, with these settings (a worker can only match it within run-to-run "
            "noise: at light load the floor's runs vary as much as the worker's; every run is in e2e.json). "
            f"Rates: fractions of {fm['contexts_per_s']:,.0f} contexts/s ({fm['from']}).",
            "",
            "| knobs | load | offered contexts / s | answered / s | p50 ms | p99 ms | p99.9 ms | broker CPU | pass-through CPU |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += _latency_rows(res["floor"])
        lines.append("")
        pairs = _floor_pairs(res)
        if pairs:
            lines += [
                "Streambandit against the floor with the same Kafka settings (fetch_wait, linger) at the same load, "
                "in the same run (ratio = streambandit / floor):",
                "",
                "| streambandit knobs | floor knobs | load | p50 ms | floor p50 | ratio | p99 ms | floor p99 | ratio |",
                "|---|---|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for key, fkey, q, f in pairs:
                lines.append(f"| {key.rsplit('@', 1)[0]} | {fkey.rsplit('@', 1)[0]} | {q['fraction']:.0%} | "
                             f"{q['p50']:.1f} | {f['p50']:.1f} | {q['p50'] / f['p50']:.1f} | "
                             f"{q['p99']:.1f} | {f['p99']:.1f} | {q['p99'] / f['p99']:.1f} |")
            lines.append("")
    if "snapshot" in res:
        sp = res["snapshot"]
        lines += [
            "## 6. A snapshot's pause at the latency runs' load",
            "",
            f"One partition's engine as the worker holds it at half the live maximum ({sp['contexts_per_s']:,.0f} "
            f"contexts/s over {partitions} partitions, reward window {sp['window_ms']:,} ms, 4 models): "
            f"{sp['pending']:,} open decisions and {sp['recent']:,} recently joined ids. The worker snapshots a "
            "partition inside its loop (`engine.snapshot()` then `pack_snapshot`, before the store's write), so this "
            f"is a pause of every decision of that partition. Median of {sp['repeats']} runs.",
            "",
            "| engine.snapshot ms | pack_snapshot ms | total ms | bytes |",
            "|---:|---:|---:|---:|",
            f"| {sp['snapshot_ms']:.1f} | {sp['pack_ms']:.1f} | {sp['snapshot_ms'] + sp['pack_ms']:.1f} | {sp['bytes']:,} |",
            "",
            f"At that rate the default triggers (`snapshot_every_updates` {res['snapshot_every_updates']:,}, "
            f"`snapshot_interval_s` {res['snapshot_interval_s']:g}) snapshot each partition every "
            f"{min(res['snapshot_every_updates'] / (sp['contexts_per_s'] / partitions), res['snapshot_interval_s']):.0f} s.",
            "",
        ]
    return "\n".join(lines) + "\n"


# -- main ----------------------------------------------------------------------------------------


PARTS = ("ceiling", "codec", "profile", "throughput", "hops", "latency", "floor", "snapshot")


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--only", choices=PARTS, action="append", help="run only these parts (printed, not written)")
    ap.add_argument("--max-rate", type=float, help="contexts/s that latency and floor take fractions of (latency: "
                    "no live-maximum probe; floor's default: this run's live maximum, else the one in e2e.json)")
    ap.add_argument("--seconds", type=float, help="measured seconds per latency / floor run (default 8, --quick 5)")
    ap.add_argument("--repeats", type=int, help="runs per rate and knob set of latency / floor (default 2, --quick 1)")
    ap.add_argument("--broker-per-run", action="store_true", help="each latency / floor run on a fresh broker")


def measure(args: argparse.Namespace) -> dict:
    global BROKER_PER_RUN
    BROKER_PER_RUN = args.broker_per_run
    if args.only:  # a partial result must not replace the whole one in bench/results/
        args.print_only = True
    parts = args.only or PARTS
    repeats, n = (1, 6000) if args.quick else (3, 30_000)
    lat_s = args.seconds or (5.0 if args.quick else 8.0)
    lat_repeats = args.repeats or (1 if args.quick else 2)
    if os.environ.get("E2E_N"):
        n = int(os.environ["E2E_N"])
    res: dict = {"d": D, "K": K, "partitions": PARTITIONS, "batch_max_records": WorkerConfig.batch_max_records,
                 "emit_every": EMIT_EVERY, "snapshot_every_updates": WorkerConfig.snapshot_every_updates,
                 "snapshot_interval_s": WorkerConfig.snapshot_interval_s, "broker_per_run": BROKER_PER_RUN}
    policies = ("oful", "glb_omd")
    with EmbeddedBroker() as broker:
        if "ceiling" in parts:
            res["ceiling"] = ceiling(broker, n, repeats)
        if "codec" in parts:
            res["codec"] = codec()
        if "profile" in parts:
            res["profile"] = {p: profile(broker, p, n // 2) for p in policies}
        if "throughput" in parts:
            res["throughput"] = throughput(broker, policies, n, repeats)
        if "hops" in parts:
            res["hops"] = [hops(broker, fetch_wait=fw, linger=lg) for fw, lg in ((10, 5), (10, 0), (5, 0), (1, 0))]
        if "latency" in parts:
            tp = res.get("throughput")
            max_ctx = harness.median([x["contexts_per_s"] for x in tp["oful"]["worker"]]) if tp else float(
                os.environ.get("E2E_MAX_CONTEXTS", 8000))
            knob_sets = LATENCY_SETS
            if os.environ.get("E2E_KNOBS"):
                knob_sets = json.loads(os.environ["E2E_KNOBS"])
            res["latency_max_contexts_per_s"] = max_ctx
            res["latency"] = latency(broker, "oful", max_ctx, lat_s, lat_repeats, knob_sets, given_max=args.max_rate)
        if "floor" in parts:
            if args.max_rate:
                max_ctx, src = args.max_rate, "given"
            elif "latency" in res:
                max_ctx, src = res["latency"]["live_max"]["answered_per_s"], "this run's live maximum"
            else:
                max_ctx = harness.load("e2e")["latency"]["live_max"]["answered_per_s"]
                src = "the live maximum recorded in bench/results/e2e.json"
            knob_sets = json.loads(os.environ["E2E_FLOOR_KNOBS"]) if os.environ.get("E2E_FLOOR_KNOBS") else FLOOR_SETS
            res["floor_max"] = {"contexts_per_s": max_ctx, "from": src}
            res["floor"] = floor(broker, max_ctx, lat_s, lat_repeats, knob_sets)
        if "snapshot" in parts:
            res["snapshot"] = snapshot_pause(res.get("latency", {}).get("live_max", {}).get("answered_per_s", 11_000) / 2)
    return res


if __name__ == "__main__":
    raise SystemExit(harness.main("e2e", __doc__, measure, render, add_arguments=_options))
