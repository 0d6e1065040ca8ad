"""The bare transactional pass-through as a process of its own (the latency floor of bench.e2e).

    python -m bench.passthrough_serve --bootstrap-servers HOST:PORT --contexts C --rewards R \
        --actions A --group G [--fetch-wait 10] [--linger 5] [--poll-timeout 50]

Part 1's loop with ``Worker.step``'s polling, run the way ``streambandit serve`` runs the worker
(a subprocess started by the load generator, stopped by SIGINT): a group consumer (the worker's
consumer settings, read_committed) takes what is already fetched, up to the worker's
``batch_max_records`` records, waiting up to ``--poll-timeout`` ms for the first one only; one
transaction produces one action-sized record per input, sends the input offsets and commits.
Nothing of streambandit in between: no decode, no merge, no learner.

So that the load generator can match an output to its context exactly as it matches a worker's
action, the output of a context is the action template with the context's event id spliced in
(both records start with a 3-byte header and the event id; a byte copy, ~1 us); the output of a
reward is the template as it is. Logs ``partition assigned partition=P`` to stderr, one line per
assigned partition, as the worker does.
"""

from __future__ import annotations

import argparse
import signal
import sys

from confluent_kafka import Consumer, Producer, TopicPartition

from bench import traffic
from streambandit.config.kafka import consumer_settings, producer_settings
from streambandit.config.worker import WorkerConfig
from streambandit.wire import encode, records

BATCH = WorkerConfig.batch_max_records  # up to what the worker takes per transaction


def event_id_span(value: bytes) -> tuple[int, int]:
    """Where the event id's UTF-8 bytes are in one of our records (contexts, actions, joined: the
    3-byte header, then the id as an Avro string: zig-zag varint length, bytes), without a decode."""
    n, shift, i = 0, 0, 3
    while True:
        b = value[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    return i, i + ((n >> 1) ^ -(n & 1))


def template() -> bytes:
    """An action-sized record (the one part 1 of bench.e2e writes)."""
    c0 = traffic.backlog(1)[0][0]
    return encode(
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-servers", required=True)
    ap.add_argument("--contexts", required=True)
    ap.add_argument("--rewards", required=True)
    ap.add_argument("--actions", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--fetch-wait", type=int, default=10, help="fetch.wait.max.ms of the consumer")
    ap.add_argument("--linger", type=int, default=5, help="linger.ms of the transactional producer")
    ap.add_argument(
        "--poll-timeout", type=int, default=50, help="ms to wait for the first record of a batch"
    )
    args = ap.parse_args()

    action = template()
    head, tail = action[:3], action[event_id_span(action)[1] :]
    consumer = Consumer(
        consumer_settings(
            args.bootstrap_servers, args.group, {"fetch.wait.max.ms": args.fetch_wait}
        )
    )
    producer = Producer(
        producer_settings(args.bootstrap_servers, f"{args.group}-tx", {"linger.ms": args.linger})
    )
    producer.init_transactions(30)

    def on_assign(_c, tps) -> None:
        for tp in tps:
            if tp.topic == args.contexts:
                print(f"partition assigned partition={tp.partition}", file=sys.stderr, flush=True)

    stop = []
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    consumer.subscribe([args.contexts, args.rewards], on_assign=on_assign)
    nxt: dict = {}
    timeout = args.poll_timeout / 1000
    while not stop:
        msgs = consumer.consume(BATCH, 0)
        if not msgs:
            msgs = consumer.consume(1, timeout)
            if msgs:
                msgs += consumer.consume(BATCH - 1, 0)
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            if m.error():
                continue
            v = m.value()
            out = head + v[3 : event_id_span(v)[1]] + tail if m.topic() == args.contexts else action
            producer.produce(args.actions, value=out, key=m.key(), partition=m.partition())
            nxt[(m.topic(), m.partition())] = m.offset() + 1
        producer.poll(0)
        producer.send_offsets_to_transaction(
            [TopicPartition(t, p, o) for (t, p), o in nxt.items()],
            consumer.consumer_group_metadata(),
            30,
        )
        producer.commit_transaction(30)
    consumer.close()
    producer.flush(10)


if __name__ == "__main__":
    main()
