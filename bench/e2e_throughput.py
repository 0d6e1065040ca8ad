"""Part 4 of ``python -m bench.e2e``: one worker (transactions on) draining a backlog, events
(contexts + rewards) per second, next to part 1's pass-through on the same backlog in the same
runs; the garbage collector's pauses with and without ``freeze_long_lived``; ``batch_max_records``
at its default and at 2,000."""

from __future__ import annotations

import gc
import time

from bench import harness, traffic
from bench.e2e_ceiling import passthrough, preload, sample_records
from bench.e2e_profile import check_exact, warm, worker_on_backlog
from streambandit.config.models import parse_models_config
from streambandit.dev.tansu import EmbeddedBroker


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


def drain(
    broker: EmbeddedBroker, policy: str, events: list, *, freeze: bool = True, **settings
) -> dict:
    """One worker draining ``events``. ``freeze=False``: the worker without ``freeze_long_lived``
    (and everything frozen before unfrozen), for the comparison in the same run."""
    import streambandit.stream.worker as worker_module

    real_freeze = worker_module.freeze_long_lived
    if not freeze:
        gc.unfreeze()
        worker_module.freeze_long_lived = lambda: None
    try:
        w, n_records = worker_on_backlog(broker, policy, events, **settings)
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
    check_exact(m, "throughput run")
    # Per CPU second of the worker's own thread: what a core it had to itself would give (the
    # librdkafka threads and the broker run beside it; the machine is shared).
    return {
        "events_per_s": n_records / elapsed,
        "contexts_per_s": len(events) / elapsed,
        "events_per_s_with_first_fetch": n_records / (end - begin),
        "first_fetch_ms": 1000 * (first or 0.0),
        "events_per_cpu_s": n_records / cpu,
        "events_per_transaction": n_records / max(m["transactions"], 1),
        "gc_count": pauses.count,
        "gc_ms": pauses.ms,
        "gc_longest_ms": pauses.longest_ms,
    }


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
        warm(p)
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
            print(
                f"throughput run {r} {p}: worker {out[p]['worker'][-1]['events_per_s']:,.0f} events/s, "
                f"pass-through {out['passthrough'][-1]:,.0f}, "
                f"bare learner {out[p]['bare_learner_events_per_s'][-1]:,.0f}",
                flush=True,
            )
    return out


def render(res: dict) -> list[str]:
    """Part 4 of the report."""
    med = harness.median
    batch_max = res["batch_max_records"]
    lines: list[str] = []
    tp = res["throughput"]
    pt = med(tp["passthrough"])
    lines += [
        "## 4. Throughput: one worker draining a backlog, transactions on",
        "",
        "Medians of the runs; the pass-through (part 1's loop) ran on the same backlog in the same runs. Both are "
        "timed from the first poll that returns records; the wait for the first fetch after the assignment is its "
        "own column, and the column after it counts that wait in.",
        "",
        "| policy | events / s | contexts / s | events per CPU s of the worker thread | events per transaction | "
        "first fetch ms | events / s with the first fetch | pass-through events / s | bare learner events / s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, v in tp.items():
        if p in ("passthrough", "oful_no_freeze", "oful_batch_2000"):
            continue
        w = v["worker"]
        lines.append(
            f"| {p} | {med([x['events_per_s'] for x in w]):,.0f} | {med([x['contexts_per_s'] for x in w]):,.0f} | "
            f"{med([x['events_per_cpu_s'] for x in w]):,.0f} | "
            f"{med([x['events_per_transaction'] for x in w]):,.0f} | "
            f"{med([x.get('first_fetch_ms', float('nan')) for x in w]):,.0f} | "
            f"{med([x.get('events_per_s_with_first_fetch', float('nan')) for x in w]):,.0f} | {pt:,.0f} | "
            f"{med(v['bare_learner_events_per_s']):,.0f} |"
        )
    lines.append("")
    if tp.get("oful_no_freeze"):
        lines += [
            "The garbage collector during the drain (`oful`, medians of the same runs), with the worker's "
            "`freeze_long_lived` and without it:",
            "",
            "| worker | events / s | full (gen 2) collections | their ms | longest pause ms | gen 0 + gen 1 ms |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for label, w in (
            ("as shipped (frozen)", tp["oful"]["worker"]),
            ("without the freeze", tp["oful_no_freeze"]),
        ):
            lines.append(
                f"| {label} | {med([x['events_per_s'] for x in w]):,.0f} | "
                f"{med([x['gc_count'][2] for x in w]):.0f} | {med([x['gc_ms'][2] for x in w]):.1f} | "
                f"{med([x['gc_longest_ms'] for x in w]):.1f} | "
                f"{med([x['gc_ms'][0] + x['gc_ms'][1] for x in w]):.1f} |"
            )
        lines.append("")
    if tp.get("oful_batch_2000"):
        lines += [
            "`batch_max_records` (`oful`, medians of the same runs): the default, and 2,000:",
            "",
            "| batch_max_records | events / s | events per CPU s | events per transaction |",
            "|---:|---:|---:|---:|",
        ]
        for label, w in (
            (f"{batch_max:,} (default)", tp["oful"]["worker"]),
            ("2,000", tp["oful_batch_2000"]),
        ):
            lines.append(
                f"| {label} | {med([x['events_per_s'] for x in w]):,.0f} | "
                f"{med([x['events_per_cpu_s'] for x in w]):,.0f} | "
                f"{med([x['events_per_transaction'] for x in w]):,.0f} |"
            )
        lines.append("")
    return lines
