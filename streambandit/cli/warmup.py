"""Compile the package's numba kernels ahead of their first use.

numba compiles a kernel at its first call and caches the machine code on disk (``cache=True``:
``__pycache__`` beside the module, or ``NUMBA_CACHE_DIR``). On a fresh install that first call
costs seconds per kernel, which would otherwise fall on the first decisions of a worker or the
first seconds of the demo. :func:`compile_kernels` drives every kernel once through the public
entry points, with the argument types the worker uses, so that the compiled code is cached before
it is needed. ``python -m streambandit.cli.warmup`` does it and says how long it took (the Makefile
runs it once per install).
"""

from __future__ import annotations

import sys
import time

import numpy as np

__all__ = ["compile_kernels"]


def compile_kernels() -> None:
    """Call every compiled kernel once: each learner's decisions, update and stream loop, the
    row-independent products, and the worker's batch path (decoder, the engine's compiled pass,
    encoders)."""
    from streambandit import POLICIES, make_policy
    from streambandit.engine.decision import choose
    from streambandit.policies.base import features_ok
    from streambandit.wire import Action, Context, Joined, Reward, encode
    from streambandit.wire.batch_decode import decode_batch
    from streambandit.wire.batch_encode import encode_actions, encode_joined_records

    arms = np.eye(3)
    for name in sorted(POLICIES):
        p = make_policy(name, dim=3)
        p.scores(arms)
        p.best(arms)
        p.select(arms)
        p.select_batch(arms[None])
        p.update(arms[0], 1.0)  # 1.0 is in every link's range
        make_policy(name, dim=3).play(arms[None], np.ones((1, 3)))
    choose(np.zeros(3), epsilon=1.0, model_key="m", event_id="e", seed=0)  # the exploration draw
    features_ok(arms), features_ok(arms[0])  # a call's and a record's features, a learner's x
    ctx = Context(
        event_id="e", model_key="m", timestamp_ms=1, arm_ids=("a", "b", "c"), features=arms
    )
    decode_batch(
        [encode(ctx), encode(Reward(event_id="e", model_key="m", timestamp_ms=2, value=1.0)), b"x"]
    )
    action = Action(
        event_id="e",
        model_key="m",
        arm_id="a",
        arm_index=0,
        score=0.0,
        propensity=1.0,
        model_version=0,
        decision_timestamp_ms=1,
        features=arms[0],
    )
    # One record and several: numba types a one-row column as read-only (a view of the packed
    # bytes) and a longer one as a copy, two signatures of the encoder.
    encode_actions([action])
    encode_actions([action, action])
    joined = Joined(
        event_id="e",
        model_key="m",
        features=arms[0],
        reward=1.0,
        reward_observed=True,
        propensity=1.0,
        decision_timestamp_ms=1,
        join_timestamp_ms=2,
        model_version_before=0,
    )
    encode_joined_records([joined])
    encode_joined_records([joined, joined])

    _batch_path()

    from streambandit.replay import csv_columnar

    if csv_columnar.AVAILABLE:  # the scan of a CSV log's inline features (streambandit replay)
        text = np.frombuffer(b"1 2|3 4", dtype=np.uint8)
        one = np.empty(1, np.int64)
        csv_columnar.scan_inline(
            text,
            np.array([0, text.size], np.int32),
            csv_columnar._CLASS,
            np.empty(text.size, np.uint8),
            np.empty(text.size + 2, np.int32),
            one,
            one.copy(),
            np.empty(1, np.uint8),
        )


def _batch_path() -> None:
    """A worker's poll batch through ``BatchProcessor``: the decoder's columns, a run's columns,
    the engine's compiled pass, its outputs' encoder, and the rules in Python for what the pass
    leaves (a new model)."""
    import collections

    from confluent_kafka import Message

    from streambandit.config.models import parse_models_config
    from streambandit.config.worker import Topics, WorkerConfig
    from streambandit.engine.array_partition import ArrayPartitionEngine
    from streambandit.engine.column_merge import ColumnMerger
    from streambandit.stream.batch import BatchProcessor, PartitionState
    from streambandit.wire import Context, Reward, encode

    models = parse_models_config(
        {
            "models": [
                {  # a model that explores: the pass's exploration seeds (event_seeds_into)
                    "match": "x*",
                    "policy": "oful",
                    "dim": 3,
                    "reward_window_ms": 10,
                    "default_reward": 0.0,
                    "epsilon": 0.1,
                },
                {
                    "match": "*",
                    "policy": "oful",
                    "dim": 3,
                    "reward_window_ms": 10,
                    "default_reward": 0.0,
                },
            ]
        }
    )
    topics = Topics(contexts="c", rewards="r", actions="a", joined="j", dead_letter="d")
    cfg = WorkerConfig(bootstrap_servers="unused", models=models, topics=topics, merge_wait_ms=0)
    batch = BatchProcessor(cfg, collections.Counter())
    engine = ArrayPartitionEngine(cfg.models, **cfg.engine_limits())
    batch.partitions[0] = PartitionState(engine, ColumnMerger(0), {0: 0, 1: 0})
    records, offsets = [], collections.Counter()
    # Enough records that the id tables grow (their rehash and compaction), in two polls.
    for i in range(2_000):
        # Four models, one exploring: their first contexts' actions (the rules in Python) encoded
        # together.
        key = ("m0", "m1", "m2", "x3")[i % 4]
        ctx = Context(f"e{i}", key, 100 * i, ("a", "b", "c"), np.eye(3))
        for topic, ev in (("c", ctx), ("r", Reward(f"e{i}", key, 100 * i + 1, 1.0))):
            records.append(
                Message(
                    topic=topic,
                    partition=0,
                    offset=offsets[topic],
                    key=key.encode(),
                    value=encode(ev),
                    timestamp=(1, ev.timestamp_ms),
                )
            )
            offsets[topic] += 1
    for part in (records[:1_500], records[1_500:]):
        batch.process(part, 0, {0: (False, False)}, lambda outputs: None)


def main() -> int:
    print(
        "compiling streambandit's kernels (numba; once per install, cached on disk) ...",
        end=" ",
        flush=True,
    )
    start = time.perf_counter()
    compile_kernels()
    print(f"done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
