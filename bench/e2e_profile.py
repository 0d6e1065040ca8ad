"""Part 3 of ``python -m bench.e2e``: a cProfile of ``Worker.step()`` draining a backlog, in
process, grouped by stage. Also the worker on a backlog that part 4 drains."""

from __future__ import annotations

import cProfile
import inspect
import pstats
import tempfile
import time
from pathlib import Path

from bench import kafka_io, traffic
from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.stream.batch import _Fetched

PARTITIONS = traffic.PARTITIONS


def worker_on_backlog(broker: EmbeddedBroker, policy: str, events: list, **settings):
    """A worker (in this process) assigned both partitions of fresh topics holding ``events``."""
    from streambandit.stream.snapshots import DirectoryStore
    from streambandit.stream.worker import Worker

    t = kafka_io.fresh_topics(broker)
    n_records = sum(kafka_io.produce(broker, t, events).values())
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(traffic.models(policy, 100)),
        topics=t,
        group_id=f"e2e-{t.contexts}",
        snapshot_interval_s=1e9,
        snapshot_every_updates=10**9,
        kafka={"consumer": kafka_io.fetch_settings(broker)},
        **settings,
    )
    snaps = tempfile.mkdtemp()
    w = Worker(cfg, DirectoryStore(snaps))
    w.start()  # run() without its loop
    while len(w.partitions) < PARTITIONS:
        w.step()
    return w, n_records


def warm(policy: str) -> None:
    """Compile the learner's kernels (numba) and load the worker's batch path's from the cache
    before anything is timed: a worker pays that once per process, in its first poll batch."""
    from streambandit.cli.warmup import compile_kernels

    compile_kernels()
    m = parse_models_config(traffic.models(policy)).resolve("placement-0").build()
    ctx = traffic.backlog(2)[0][0]
    for _ in range(3):
        m.update(ctx.features[m.select(ctx.features)], 1.0)


def check_exact(m: dict, what: str) -> None:
    wrong = {
        k: v
        for k, v in m.items()
        if (k.startswith("dead_letter.") or k == "merge_out_of_order") and v
    }
    if wrong:
        raise RuntimeError(f"{what} was not exact: {wrong}")


STAGES = ("poll", "decode", "merge", "engine", "learner", "encode", "produce", "commit", "other")


def _stages(stats: pstats.Stats, total: float) -> dict:
    """Seconds per stage from a cProfile of ``Worker.step``. Learner: every call into
    streambandit/policies (and the kernels) from outside it, i.e. the Python rules' (the compiled
    pass calls the kernels inside itself, out of the profiler's sight: engine); engine: a run's
    columns and ``process_columns`` (decisions, joins, bookkeeping) minus the learner and the
    encoding; other: the rest, the worker's own loop among it."""
    st = stats.stats  # type: ignore[attr-defined]

    def ct(pred) -> float:
        return sum(v[3] for f, v in st.items() if pred(f))

    def is_learner(f) -> bool:
        return "/policies/" in f[0] or f[0].endswith(("numerics/linalg.py", "numerics/kernels.py"))

    learner = sum(
        c[3]
        for f, v in st.items()
        if is_learner(f)
        for caller, c in v[4].items()
        if not is_learner(caller) and "numba" not in caller[0]
    )
    name = lambda f, file, fn: f[0].endswith(file) and f[2] == fn  # noqa: E731
    # A poll batch decoded into columns: ``_Fetched.__init__`` (stream/batch.py holds other
    # __init__s: told apart by its first line).
    fetched_line = inspect.getsourcelines(_Fetched.__init__)[1]
    out = {
        "poll": sum(
            ct(lambda f, fn=fn: name(f, "stream/worker.py", fn))
            for fn in ("_poll_batch", "_inputs_behind")
        ),
        "decode": ct(lambda f: name(f, "stream/batch.py", "__init__") and f[1] == fetched_line),
        "merge": sum(
            ct(lambda f, fn=fn: name(f, "engine/column_merge.py", fn))
            for fn in ("extend", "push_untimed", "pop_ready")
        ),
        # Outputs: the compiled pass's encoded from its columns (pass_outputs.encode_outputs,
        # inside process_columns), the Python rules' in bulk (batch_encode, from batch.py's
        # _Outputs.take), dead letters and ticks one by one (codec.encode).
        "encode": ct(lambda f: name(f, "engine/pass_outputs.py", "encode_outputs"))
        + sum(
            c[3]
            for f, v in st.items()
            if (
                f[0].endswith("batch_encode.py")
                and f[2] in ("encode_actions", "encode_joined_records")
            )
            or (f[0].endswith("codec.py") and f[2] == "encode")
            for caller, c in v[4].items()
            if caller[0].endswith("stream/batch.py")
        ),
        "produce": sum(
            v[3]
            for f, v in st.items()
            if f[2]
            in (
                "<method 'produce' of 'cimpl.Producer' objects>",
                "<method 'poll' of 'cimpl.Producer' objects>",
            )
        ),
        "commit": sum(
            v[3]
            for f, v in st.items()
            if f[2]
            in (
                "<method 'begin_transaction' of 'cimpl.Producer' objects>",
                "<method 'send_offsets_to_transaction' of 'cimpl.Producer' objects>",
                "<method 'commit_transaction' of 'cimpl.Producer' objects>",
            )
        ),
        "learner": learner,
    }
    # The engine: a run's columns gathered (``_Run.columns``) and ``process_columns`` (the
    # compiled pass, with the learners' kernels inside it, and the Python rules for what it
    # leaves, whose calls into the learners are ``learner``), less the encoding inside it.
    process = ct(lambda f: name(f, "stream/batch.py", "columns")) + ct(
        lambda f: name(f, "engine/array_partition.py", "process_columns")
    )
    out["engine"] = (
        process - out["learner"] - ct(lambda f: name(f, "engine/pass_outputs.py", "encode_outputs"))
    )
    out["other"] = total - sum(out.values())
    return out


def profile(broker: EmbeddedBroker, policy: str, n: int) -> dict:
    warm(policy)
    events = traffic.backlog(n)
    w, n_records = worker_on_backlog(broker, policy, events)
    pr = cProfile.Profile()
    start = time.perf_counter()
    pr.enable()
    while w.metrics["records_in"] < n_records:
        w.step()
    pr.disable()
    elapsed = time.perf_counter() - start
    m = dict(w.metrics)
    w.close()
    check_exact(m, "profile run")
    stats = pstats.Stats(pr)
    total = sum(v[3] for f, v in stats.stats.items() if f[2] == "step")  # type: ignore[attr-defined]
    stages = _stages(stats, total)
    top = sorted(
        ((v[2], f"{Path(f[0]).name}:{f[2]}") for f, v in stats.stats.items()), reverse=True
    )[:15]  # type: ignore[attr-defined]
    out = {
        "policy": policy,
        "events": n_records,
        "profiled_s": total,
        "events_per_s_profiled": n_records / elapsed,
        "stages_s": stages,
        "share": {k: v / total for k, v in stages.items()},
        "us_per_event": {k: v / n_records * 1e6 for k, v in stages.items()},
        "top_tottime": [[name, t] for t, name in top],
    }
    print(
        f"profile {policy}: " + ", ".join(f"{k} {v:.0%}" for k, v in out["share"].items()),
        flush=True,
    )
    return out


def render(res: dict) -> list[str]:
    """Part 3 of the report."""
    lines: list[str] = []
    lines += [
        "## 3. Where the worker's time goes (cProfile of `Worker.step` draining a backlog)",
        "",
        "Share of the profiled time and microseconds per event (profiler overhead included: it inflates stages "
        "made of many small Python calls, so read the shares as an upper bound for them). The engine's "
        "compiled pass calls the learners' kernels inside itself: their time is in *engine*; *learner* is "
        "what the Python rules call (a model's first decisions, exploration draws).",
        "",
        "| policy | events/s (profiled) | " + " | ".join(STAGES) + " |",
        "|---|---:|" + "---:|" * len(STAGES),
    ]
    for p, v in res["profile"].items():
        lines.append(
            f"| {p} | {v['events_per_s_profiled']:,.0f} | "
            + " | ".join(f"{v['share'][k]:.0%} ({v['us_per_event'][k]:.1f})" for k in STAGES)
            + " |"
        )
    lines.append("")
    return lines
