"""Part 5a of ``python -m bench.e2e``: one record at a time through the bare pass-through,
each hop timed (produced -> fetched by the group consumer -> transaction committed -> output read
by a read_committed consumer), at a few fetch.wait.max.ms and linger.ms settings."""

from __future__ import annotations

import time

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from bench.e2e_ceiling import fresh, sample_records
from streambandit.config.kafka import consumer_settings, producer_settings
from streambandit.dev.tansu import EmbeddedBroker


def hops(broker: EmbeddedBroker, n: int = 40, fetch_wait: int = 10, linger: int = 5) -> dict:
    """One record at a time through the bare pass-through, timing each hop (ms): produced ->
    fetched by the group consumer (read_committed) -> transaction committed (produce one output,
    send offsets, commit) -> output read by a read_committed consumer."""
    c_t, a_t = fresh(broker, ["hc", "ha"])
    ctx, keys, _, action = sample_records(1)
    prod = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "linger.ms": linger,
            "enable.idempotence": True,
        }
    )
    consumer = Consumer(
        consumer_settings(
            broker.bootstrap_servers, f"hops-{c_t}", {"fetch.wait.max.ms": fetch_wait}
        )
    )
    tx = Producer(producer_settings(broker.bootstrap_servers, f"hops-{c_t}", {"linger.ms": linger}))
    tx.init_transactions(30)
    app = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": f"hops-app-{c_t}",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": fetch_wait,
            "enable.auto.commit": False,
        }
    )
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
        tx.send_offsets_to_transaction(
            [TopicPartition(c_t, 0, m.offset() + 1)], consumer.consumer_group_metadata(), 30
        )
        t2a = time.perf_counter()
        tx.commit_transaction(30)
        t2 = time.perf_counter()
        got = []
        while not got:
            got = app.consume(1, 1.0)
        t3 = time.perf_counter()
        rows.append(
            ((t1 - t0) * 1e3, (t2a - t1) * 1e3, (t2 - t2a) * 1e3, (t3 - t2) * 1e3, (t3 - t0) * 1e3)
        )
    consumer.close()
    app.close()
    a = np.array(rows[5:])
    names = ["fetch_in", "produce_send_offsets", "commit", "fetch_out", "total"]
    out = {
        "fetch_wait_ms": fetch_wait,
        "linger_ms": linger,
        "p50_ms": dict(zip(names, np.percentile(a, 50, axis=0).tolist())),
        "max_ms": dict(zip(names, a.max(axis=0).tolist())),
    }
    print(
        f"hops fetch.wait.max.ms={fetch_wait} linger.ms={linger}: "
        + ", ".join(f"{k} {v:.1f}" for k, v in out["p50_ms"].items()),
        flush=True,
    )
    return out


def render(res: dict) -> list[str]:
    """Part 5a of the report."""
    lines: list[str] = []
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
        lines.append(
            f"| {h['fetch_wait_ms']} | {h['linger_ms']} | {q['fetch_in']:.1f} | {q['produce_send_offsets']:.1f} | "
            f"{q['commit']:.1f} | {q['fetch_out']:.1f} | {q['total']:.1f} |"
        )
    lines.append("")
    return lines
