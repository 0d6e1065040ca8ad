"""Where the worker's CPU goes per event, without a profiler and without a broker.

    python -m bench.worker_path            # ~2 min, writes bench/results/worker_path.{md,json}
    python -m bench.worker_path --quick    # a smoke run (printed, not written)

The worker's own per-batch code (``BatchProcessor.buffer`` and ``release``, ``Transaction.emit``) runs
on real ``confluent_kafka.Message`` objects holding the encoded ad-traffic backlog of
bench/traffic.py (as e2e part 4 drains it), in batches of ``WorkerConfig.batch_max_records``
as polled under a backlog. The
producer is a real librdkafka producer with no broker reachable (``produce`` queues; the queue is
purged after each batch), so Kafka's network and the transaction round trips are left out: those
are bench.e2e's.

Stages are measured by ablation, each level doing everything the one before does plus one
stage, so the difference is that stage's cost in place (with the caches and allocator the
whole path sees), in CPU time of this thread (``time.thread_time``), best of REPEATS fresh runs
per level (the machine is shared: the best run is the one least disturbed), the levels taken in
turn within each round, so that a slower stretch of the machine falls on every level alike
rather than on the levels measured during it. cProfile's shares
(e2e part 3) inflate stages made of many small calls; these do not.

1. decode: the batch's values decoded into columns (``stream.batch._Fetched``);
2. buffer: 1 + the batch's records handed to their partitions' mergers, a stretch of columns per
   partition and input (``BatchProcessor.buffer``);
3. engine: 2 + merge release and the partition engines, a run of columns per hand-over
   (decisions, joins, the learners);
4. encode: 3 + the worker's per-record dispatch and the outputs encoded
   (``BatchProcessor.release``, its hand-overs dropped);
5. produce: 4 + every output handed to the producer (``release`` handing them to
   ``Transaction.emit``).
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Callable

from confluent_kafka import Message, Producer

from bench import harness, traffic
from streambandit.config.models import parse_models_config
from streambandit.config.worker import Topics, WorkerConfig
from streambandit.engine.array_partition import ArrayPartitionEngine
from streambandit.engine.column_merge import ColumnMerger
from streambandit.stream.batch import EMIT_EVERY, BatchProcessor, PartitionState, _Fetched, _Run
from streambandit.stream.transaction import Transaction
from streambandit.stream.worker import freeze_long_lived
from streambandit.wire import encode

STAGE_TEXT = {
    "decode": "the batch's values decoded into columns, with each record's input, offset and timestamp "
    "(`stream.batch._Fetched`: one compiled pass, no record object)",
    "buffer": "the batch's records handed to their partitions' mergers as columns, one stretch per partition "
    "and input (`BatchProcessor.buffer`, `ColumnMerger.extend`)",
    "engine": "the merge's release and the partition engines, one run of columns per hand-over "
    "(`ArrayPartitionEngine.process_columns`): decisions, joins, the learners' calls (the outputs left as columns)",
    "encode": "the outputs encoded from the pass's columns (objects only for what the Python rules made), "
    "per hand-over of 256 records (`BatchProcessor.release` with its hand-overs dropped, against the engine alone)",
    "produce": "every output handed to librdkafka (`Transaction.emit`, which `release` calls per hand-over)",
}
STAGES = tuple(STAGE_TEXT)
REPEATS = 7
EXPLORING = 0.1  # the exploring row's epsilon
BATCH = WorkerConfig.batch_max_records  # as the worker polls under a backlog
TOPICS = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")


def messages(n: int) -> list[list[Message]]:
    """The backlog as the consumer would hand it over: batches of Message objects, each record on
    the partition of its model key, offsets counted per topic-partition."""
    out, offsets = [], collections.Counter()
    for ctx, rew in traffic.backlog(n):
        p = int(ctx.model_key.rsplit("-", 1)[1]) % traffic.PARTITIONS
        for topic, ev in ((TOPICS.contexts, ctx), (TOPICS.rewards, rew)):
            if ev is not None:
                out.append(
                    Message(
                        topic=topic,
                        partition=p,
                        offset=offsets[(topic, p)],
                        key=ev.model_key.encode(),
                        value=encode(ev),
                        timestamp=(1, ev.timestamp_ms),
                    )
                )
                offsets[(topic, p)] += 1
    return [out[i : i + BATCH] for i in range(0, len(out), BATCH)]


def processor(policy: str, epsilon: float = 0.0) -> BatchProcessor:
    """The worker's batch processor with both partitions assigned and fresh (no broker); its
    models explore at rate ``epsilon``."""
    models = traffic.models(policy, 100)
    for entry in models["models"]:
        entry["epsilon"] = epsilon
    cfg = WorkerConfig(
        bootstrap_servers="unused",
        models=parse_models_config(models),
        topics=TOPICS,
        merge_wait_ms=0,
    )
    b = BatchProcessor(cfg, collections.Counter())
    for p in range(traffic.PARTITIONS):
        b.partitions[p] = PartitionState(
            ArrayPartitionEngine(cfg.models), ColumnMerger(0), {0: 0, 1: 0}
        )
    return b


def _producer() -> Producer:
    """A producer with no broker and room for every output: ``Transaction.emit``'s produce calls
    run as in the worker, and nothing is ever sent."""
    return Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "log_level": 0,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 2_000_000,
        }
    )


_NOT_BEHIND = {
    p: (False, False) for p in range(traffic.PARTITIONS)
}  # nothing held back for a fetch to come


def _engine_only(b: BatchProcessor, now: int) -> None:
    """``BatchProcessor.release`` without encoding the outputs (level 3)."""
    for p, part in b.partitions.items():
        items = part.merger.pop_ready(now, (False, False))
        for at in range(0, len(items), EMIT_EVERY):
            run = _Run(items, at, at + EMIT_EVERY, p)
            part.engine.process_columns(
                run.columns(), run, None, lambda j, run=run, part=part: b._handle(part, run, j)
            )
            run.advance(part.next_offset)


def _drop(outputs: list) -> None:
    """Level 4's hand-over: the encoded outputs go nowhere."""


def _produce(producer: Producer) -> Callable[[list], None]:
    """Level 5's hand-over: ``Transaction.emit``'s produce loop, without a transaction (there is
    no broker to begin one with)."""
    tx = Transaction(producer, [])
    tx.open = True  # as after the batch's first hand-over
    return tx.emit


def run(policy: str, batches: list[list[Message]], level: int, epsilon: float = 0.0) -> float:
    """CPU microseconds per input record of one fresh processor through ``level`` stages."""
    b, now, n = processor(policy, epsilon), 10**13, 0
    producer = _producer() if level == 5 else None
    freeze_long_lived()
    start = time.thread_time()
    for batch in batches:
        if level == 1:
            _Fetched(batch, b.source_of, False)
        else:
            b.buffer(batch, now)
            if level == 3:
                _engine_only(b, now)
            elif level == 4:
                b.release(now, _NOT_BEHIND, _drop)
            elif level == 5:
                b.release(now, _NOT_BEHIND, _produce(producer))
                producer.purge(in_queue=True, in_flight=False)
        n += len(batch)
    cpu = time.thread_time() - start
    if level >= 4 and b.metrics["records_in"] != n:
        raise RuntimeError(f"level {level}: {b.metrics['records_in']} of {n} records processed")
    return cpu / n * 1e6


def stages_of(policy: str, n: int, repeats: int, epsilon: float = 0.0) -> dict:
    batches = messages(n)
    run(policy, batches, 5, epsilon)  # compile and warm
    levels = range(1, len(STAGES) + 1)
    rounds = [[run(policy, batches, lvl, epsilon) for lvl in levels] for _ in range(repeats)]
    best = {lvl: min(r[lvl - 1] for r in rounds) for lvl in levels}
    stages, prev = {}, 0.0
    for lvl, name in enumerate(STAGES, start=1):
        stages[name] = best[lvl] - prev
        prev = best[lvl]
    n_events = sum(map(len, batches))
    return {
        "policy": policy,
        "epsilon": epsilon,
        "events": n_events,
        "contexts": n,
        "us_per_event": stages,
        "total_us_per_event": prev,
        "events_per_cpu_s": 1e6 / prev,
    }


def measure(args: argparse.Namespace) -> dict:
    n, repeats = (3000, 2) if args.quick else (30000, REPEATS)
    return {
        "contexts": n,
        "repeats": repeats,
        "batch_max_records": BATCH,
        "interleaved": True,  # levels in turn within each round (stages_of)
        "stages": STAGE_TEXT,
        # The models of the first two decide greedily; the third's explore (epsilon-greedy),
        # as a team logging propensities for off-policy evaluation runs them.
        "runs": [
            stages_of(p, n, repeats, eps)
            for p, eps in (("oful", 0.0), ("glb_omd", 0.0), ("oful", EXPLORING))
        ],
    }


def render(res: dict) -> str:
    stages = tuple(res["stages"])
    lines = [
        "# The worker's CPU per event, by stage (no broker, no profiler)",
        "",
        harness.provenance(
            res,
            "The worker's own batch code on real "
            f"`confluent_kafka.Message` objects ({res['contexts']:,} contexts of the ad-traffic backlog "
            f"(bench/traffic.py) and their rewards, batches of {res['batch_max_records']:,}), a producer "
            "with no broker; each level adds one stage, CPU time of the thread, best of "
            f"{res['repeats']} fresh runs per level"
            + (", the levels in turn within each round" if res.get("interleaved") else "")
            + ". Kafka's network and transactions are not in these figures (e2e part 4 has them).",
        ),
        "",
        "| policy | " + " | ".join(stages) + " | total us / event | events per CPU s |",
        "|---|" + "---:|" * (len(stages) + 2),
    ]
    for r in res["runs"]:
        eps = r.get("epsilon", 0.0)
        lines.append(
            f"| {r['policy']}{f', epsilon {eps:g}' if eps else ''} | "
            + " | ".join(f"{r['us_per_event'][s]:.2f}" for s in stages)
            + f" | {r['total_us_per_event']:.2f} | {r['events_per_cpu_s']:,.0f} |"
        )
    lines += ["", "Each stage is the difference between a level and the one before it:", ""]
    lines += [f"- {name}: {what}" for name, what in res["stages"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(harness.main("worker_path", __doc__, measure, render))
