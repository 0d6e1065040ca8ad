"""Part 1 of ``python -m bench.e2e``: the broker's ceiling, what any worker could reach on this
broker and machine with nothing of ours in the loop.

(a) A producer alone writing context-sized records (the bytes of real d = 20, K = 10 contexts),
idempotent, linger 5 ms, and the same producer transactional. (b) A bare transactional
pass-through: a consumer in a group (read_committed, the worker's consumer settings) takes up to
``batch_max_records`` already-fetched records, and one transaction produces one action-sized
record per input and sends the offsets, the worker's batching and commit pattern with no decode,
no merge and no learner. The inputs are contexts and rewards in the worker benchmark's 3:1 ratio.
Part 4 runs the same pass-through on its backlog.
"""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition

from bench import harness, kafka_io, traffic
from streambandit.config.kafka import consumer_settings, producer_settings
from streambandit.config.worker import WorkerConfig
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.wire import encode, records

PARTITIONS = traffic.PARTITIONS


def fresh(broker: EmbeddedBroker, names: list[str]) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    out = [f"{n}-{tag}" for n in names]
    broker.create_topics(out, partitions=PARTITIONS)
    return out


def sample_records(n: int) -> tuple[list[bytes], list[bytes], list[bytes], bytes]:
    """Encoded contexts, their keys, rewards for every third, and one action-sized output."""
    events = traffic.backlog(n)
    ctx = [encode(c) for c, _ in events]
    keys = [c.model_key.encode() for c, _ in events]
    rew = [encode(r) for _, r in events if r is not None]
    c0 = events[0][0]
    action = encode(
        records.Action(
            c0.event_id,
            c0.model_key,
            c0.arm_ids[0],
            0,
            0.5,
            1.0,
            12345,
            c0.timestamp_ms,
            c0.features[0],
            0,
            12345,
        )
    )
    return ctx, keys, rew, action


def producer_rate(
    broker: EmbeddedBroker, records: list[bytes], keys: list[bytes], transactional: bool
) -> float:
    """Records per second of one producer writing ``records`` and waiting for every delivery."""
    (topic,) = fresh(broker, ["prod"])
    conf = {
        "bootstrap.servers": broker.bootstrap_servers,
        "partitioner": "murmur2_random",
        "linger.ms": 5,
        "enable.idempotence": True,
    }
    if transactional:
        conf = producer_settings(broker.bootstrap_servers, f"ceiling-{topic}", {}) | {
            "partitioner": "murmur2_random"
        }
    p = Producer(conf)
    if transactional:
        p.init_transactions(30)
    start = time.perf_counter()
    if transactional:
        for lo in range(0, len(records), 2000):
            p.begin_transaction()
            for v, k in zip(records[lo : lo + 2000], keys[lo : lo + 2000]):
                p.produce(topic, value=v, key=k)
            p.commit_transaction(30)
    else:
        for i, (v, k) in enumerate(zip(records, keys)):
            kafka_io.produce_waiting(p, topic, k, v)
            if i % 1000 == 0:
                p.poll(0)
        p.flush(60)
    return len(records) / (time.perf_counter() - start)


def preload(
    broker: EmbeddedBroker, n: int, ctx: list[bytes], keys: list[bytes], rew: list[bytes]
) -> tuple[list[str], int]:
    """Topics contexts/rewards/out holding n contexts and a reward for every third (as traffic.backlog)."""
    topics = fresh(broker, ["c", "r", "a"])
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,
        }
    )
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


def passthrough(
    broker: EmbeddedBroker,
    topics: list[str],
    total: int,
    out_value: bytes,
    *,
    batch: int = WorkerConfig.batch_max_records,
) -> dict:
    """Consume -> produce one output per input -> send offsets -> commit, per batch, like
    ``Worker.step`` with no decode, no merge and no learner. Events per second."""
    c_t, r_t, a_t = topics
    group = f"pt-{c_t}"
    consumer = Consumer(
        consumer_settings(broker.bootstrap_servers, group, kafka_io.fetch_settings(broker))
    )
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
        producer.send_offsets_to_transaction(
            [TopicPartition(t, p, o) for (t, p), o in nxt.items()],
            consumer.consumer_group_metadata(),
            30,
        )
        producer.commit_transaction(30)
        t3 = time.perf_counter()
        t_poll, t_prod, t_commit = t_poll + t1 - t0, t_prod + t2 - t1, t_commit + t3 - t2
        taken += len(msgs)
        tx += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    producer.flush(10)
    return {
        "events_per_s": total / elapsed,
        "transactions": tx,
        "events_per_transaction": total / max(tx, 1),
        "share": {
            "poll": t_poll / elapsed,
            "produce": t_prod / elapsed,
            "commit": t_commit / elapsed,
        },
    }


def ceiling(broker: EmbeddedBroker, n: int, repeats: int) -> dict:
    ctx, keys, rew, action = sample_records(2000)
    pid = kafka_io.broker_pid(broker)
    runs = []
    for r in range(repeats):
        recs = [ctx[i % len(ctx)] for i in range(n)]
        ks = [keys[i % len(keys)] for i in range(n)]
        cpu0, t0 = kafka_io.broker_cpu(pid), time.perf_counter()
        prod = producer_rate(broker, recs, ks, transactional=False)
        prod_cpu = (kafka_io.broker_cpu(pid) - cpu0) / (time.perf_counter() - t0)
        prod_tx = producer_rate(broker, recs, ks, transactional=True)
        topics, total = preload(broker, n, ctx, keys, rew)
        cpu0, t0 = kafka_io.broker_cpu(pid), time.perf_counter()
        pt = passthrough(broker, topics, total, action)
        pt["broker_cpu"] = (kafka_io.broker_cpu(pid) - cpu0) / (time.perf_counter() - t0)
        runs.append(
            {
                "producer_per_s": prod,
                "producer_broker_cpu": prod_cpu,
                "producer_tx_per_s": prod_tx,
                "passthrough": pt,
            }
        )
        print(
            f"ceiling run {r}: producer {prod:,.0f}/s (broker cpu {prod_cpu:.0%}), transactional producer "
            f"{prod_tx:,.0f}/s, pass-through {pt['events_per_s']:,.0f} events/s "
            f"({pt['events_per_transaction']:.0f}/tx, broker cpu {pt['broker_cpu']:.0%}, {pt['share']})",
            flush=True,
        )
    return {
        "records": n,
        "context_bytes": len(ctx[0]),
        "reward_bytes": len(rew[0]),
        "action_bytes": len(action),
        "runs": runs,
    }


def render(res: dict) -> list[str]:
    """Part 1 of the report."""
    med = harness.median
    batch_max = res["batch_max_records"]
    lines: list[str] = []
    c = res["ceiling"]
    runs = c["runs"]
    pt = [r["passthrough"] for r in runs]
    lines += [
        f"## 1. The broker's ceiling ({c['records']:,} contexts of {c['context_bytes']:,} bytes, "
        f"rewards of {c['reward_bytes']} bytes, outputs of {c['action_bytes']} bytes; median of {len(runs)} runs)",
        "",
        "Nothing of streambandit in the loop: raw bytes, no decode, no merge, no learner. The pass-through consumes "
        f"up to {batch_max:,} fetched records (`batch_max_records`), produces one action-sized record per input and "
        "commits them with the input offsets in one transaction.",
        "",
        "| loop | records / s | broker CPU (of one core) |",
        "|---|---:|---:|",
        f"| producer alone, idempotent, linger 5 ms, contexts | {med([r['producer_per_s'] for r in runs]):,.0f} | "
        f"{med([r['producer_broker_cpu'] for r in runs]):.0%} |",
        f"| producer alone, transactional (2,000 per transaction), contexts | "
        f"{med([r['producer_tx_per_s'] for r in runs]):,.0f} | |",
        "| consume -> produce -> send offsets -> commit (read_committed) | "
        f"{med([p['events_per_s'] for p in pt]):,.0f} | "
        f"{med([p['broker_cpu'] for p in pt]):.0%} |",
        "",
        f"In the pass-through, {med([p['events_per_transaction'] for p in pt]):,.0f} events per "
        "transaction; of its wall "
        f"time: poll {med([p['share']['poll'] for p in pt]):.0%}, "
        f"produce {med([p['share']['produce'] for p in pt]):.0%}, "
        f"send offsets + commit {med([p['share']['commit'] for p in pt]):.0%}.",
        "",
    ]
    return lines
