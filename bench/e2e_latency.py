"""Parts 5 and 5b of ``python -m bench.e2e``: decision latency, and its floor.

5. Context produced -> action readable by a read_committed consumer, at 10 %, 50 % and 90 % of the
   worker's live maximum rate, p50 / p99 / p99.9. The worker runs as a ``streambandit serve``
   subprocess (as deployed) and the load generator in this process.
5b. The same load and measurement with the bare transactional pass-through (part 1's loop,
   bench/passthrough_serve.py, a subprocess) in place of the worker, at the same rates (fractions
   of --max-rate, else of this run's live maximum, else of the one in e2e.json): the latency no
   worker can beat on this broker; the report gives streambandit / floor ratios.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from confluent_kafka import Consumer, Producer, TopicPartition

from bench import harness, kafka_io, traffic
from bench.passthrough_serve import event_id_span
from streambandit.dev.tansu import EmbeddedBroker
from streambandit.wire import Context, Reward, encode

PARTITIONS = traffic.PARTITIONS


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
LATENCY_SETS = {
    "defaults": LATENCY_DEFAULTS,
    "merge-wait-0": MERGE_WAIT_0,
    "low-latency": LOW_LATENCY,
}
# The floor (bare pass-through) with the default Kafka settings and with the fastest of part 5a.
FLOOR_SETS = {
    "defaults": {"fetch_wait": 10, "linger": 5, "poll_timeout": 50},
    "fastest": {"fetch_wait": 1, "linger": 0, "poll_timeout": 50},
}


def fetch_wait(knobs: dict) -> dict:
    """The consumers' ``fetch.wait.max.ms`` of a knob set; None keeps librdkafka's default (Apache
    Kafka answers a fetch as soon as a record is there)."""
    return {} if knobs["fetch_wait"] is None else {"fetch.wait.max.ms": knobs["fetch_wait"]}


def _event_id(action: bytes) -> str:
    """The event id of an action record without a full decode: the first field after the header."""
    start, end = event_id_span(action)
    return action[start:end].decode()


def latency_run(
    broker: EmbeddedBroker,
    policy: str,
    rate: float,
    seconds: float,
    workdir: Path,
    knobs: dict,
    floor: bool = False,
) -> dict:
    """Offered ``rate`` contexts/s (and a reward for every third, 5 ms of event time later) to a
    ``serve`` subprocess, or with ``floor`` to the bare pass-through as a subprocess
    (bench/passthrough_serve.py; ``merge_wait`` does not apply to it); latency = context produced
    -> action read by a read_committed consumer. The same load generator for both."""
    t = kafka_io.fresh_topics(broker)
    group = f"{'floor' if floor else 'lat'}-{t.contexts}"
    if floor:
        cmd = [
            sys.executable,
            "-m",
            "bench.passthrough_serve",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--contexts",
            t.contexts,
            "--rewards",
            t.rewards,
            "--actions",
            t.actions,
            "--group",
            group,
            "--fetch-wait",
            str(knobs["fetch_wait"]),
            "--linger",
            str(knobs["linger"]),
            "--poll-timeout",
            str(knobs["poll_timeout"]),
        ]
    else:
        cfg = workdir / f"{group}.toml"
        cfg.write_text(
            kafka_io.worker_toml(
                group,
                t,
                traffic.models_toml(policy),
                consumer=fetch_wait(knobs),
                fetch=kafka_io.fetch_settings(broker),
                producer={"linger.ms": knobs["linger"]},
                worker={
                    "merge_wait_ms": knobs["merge_wait"],
                    "poll_timeout_ms": knobs["poll_timeout"],
                },
            )
        )
        cmd = [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "-v",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--snapshot-dir",
            str(workdir / group),
            "--processes",
            "1",
        ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
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


_BURST = 2_000  # contexts produced per pass of the load generator's loop, at most


def _offer(
    broker: EmbeddedBroker, t, rate: float, seconds: float, knobs: dict, server_pid: int
) -> dict:
    """The load generator: contexts at ``rate``/s on ``t.contexts`` (a reward for every third 5 ms
    later), actions read from ``t.actions``; 3 s of warm-up, then ``seconds`` measured. Also the
    CPU (of one core) the broker and the server process (worker or pass-through) used meanwhile."""
    prod = Producer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "partitioner": "murmur2_random",
            "linger.ms": knobs["linger"],
            "enable.idempotence": True,
        }
    )
    cons = Consumer(
        {
            "bootstrap.servers": broker.bootstrap_servers,
            "group.id": f"app-{t.contexts}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            **fetch_wait(knobs),
        }
    )
    cons.assign([TopicPartition(t.actions, p, 0) for p in range(PARTITIONS)])
    cons.consume(100, 1.0)
    broker_pid = kafka_io.broker_pid(broker)
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
        if not measuring and now >= start + warm_s:
            measuring, lat, answered, i0 = True, [], 0, i
            cpu0 = (kafka_io.broker_cpu(broker_pid), kafka_io.broker_cpu(server_pid), now)
        if now >= end:
            break
        # At most a burst at a time: above what this loop can produce (a fast worker's maximum
        # offered), it falls behind the rate but still reads the actions and watches the clock.
        due = min(int((now - start) * rate) - i, _BURST)
        for _ in range(max(due, 0)):
            c = pool[i % len(pool)][0]
            eid, key = f"q{i}", c.model_key
            ts = int(time.time() * 1000)
            value = encode(Context(eid, key, ts, c.arm_ids, c.features))
            sent[eid] = time.perf_counter()
            kafka_io.produce_waiting(prod, t.contexts, key.encode(), value)
            if i % 3 == 0:
                rewards.append(
                    (sent[eid] + 0.005, key.encode(), encode(Reward(eid, key, ts + 5, 1.0)))
                )
            i += 1
        while rewards and rewards[0][0] <= now:
            _, k, v = rewards.pop(0)
            kafka_io.produce_waiting(prod, t.rewards, k, v)
        prod.poll(0)
        for msg in cons.consume(5000, 0.001):
            if msg.error():
                continue
            t0 = sent.pop(_event_id(msg.value()), None)
            if t0 is not None:
                lat.append((time.perf_counter() - t0) * 1000.0)
                answered += 1
    wall = time.perf_counter() - cpu0[2]
    cpu = {
        "broker_cpu": (kafka_io.broker_cpu(broker_pid) - cpu0[0]) / wall,
        "server_cpu": (kafka_io.broker_cpu(server_pid) - cpu0[1]) / wall,
    }
    prod.flush(10)
    cons.close()
    a = np.array(lat) if lat else np.array([np.nan])
    return {
        "offered_per_s": rate,
        # What this loop produced: below ``rate`` when the load generator is the limit.
        "sent_per_s": (i - i0) / wall,
        "answered_per_s": answered / wall,
        "unanswered": len(sent),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "p999_ms": float(np.percentile(a, 99.9)),
        "n": len(lat),
        **cpu,
    }


def latency(
    broker: EmbeddedBroker,
    policy: str,
    max_rate: float,
    seconds: float,
    repeats: int,
    knob_sets: dict,
    given_max: float | None = None,
    broker_per_run: bool = False,
) -> dict:
    """First the live maximum: the rate a ``serve`` worker answers when offered the drain maximum
    (the load generator and the broker share the machine with it, so it is lower); then the
    percentiles at fractions of that. With ``given_max`` (contexts/s) no probe: the fractions are
    of that. ``broker_per_run``: each run at a fraction on a broker of its own."""
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        if given_max:
            out["live_max"] = {"answered_per_s": given_max, "given": True}
            max_rate = given_max
        else:
            probe = latency_run(
                broker, policy, round(max_rate), seconds, Path(tmp), LATENCY_DEFAULTS
            )
            out["live_max"] = probe
            max_rate = probe["answered_per_s"]
            print(
                f"live maximum: offered {probe['offered_per_s']}/s (sent {probe['sent_per_s']:.0f}/s), "
                f"answered {max_rate:.0f}/s contexts",
                flush=True,
            )
        out.update(
            _at_fractions(
                broker,
                policy,
                max_rate,
                seconds,
                repeats,
                knob_sets,
                Path(tmp),
                "latency",
                broker_per_run,
            )
        )
    return out


def _at_fractions(
    broker: EmbeddedBroker,
    policy: str,
    max_rate: float,
    seconds: float,
    repeats: int,
    knob_sets: dict,
    workdir: Path,
    what: str,
    broker_per_run: bool,
) -> dict:
    out: dict = {}
    for label, knobs in knob_sets.items():
        for frac in FRACTIONS:
            rate = round(max_rate * frac)
            runs = []
            for _ in range(repeats):
                # --broker-per-run: Tansu keeps every topic in memory and its CPU per request grew
                # with what it held, so on one broker later runs met a busier broker than earlier ones.
                if broker_per_run:
                    with EmbeddedBroker() as own:
                        runs.append(
                            latency_run(
                                own, policy, rate, seconds, workdir, knobs, floor=what == "floor"
                            )
                        )
                else:
                    runs.append(
                        latency_run(
                            broker, policy, rate, seconds, workdir, knobs, floor=what == "floor"
                        )
                    )
            out[f"{label}@{frac}"] = {"knobs": knobs, "fraction": frac, "runs": runs}
            print(
                f"{what} {label} at {frac:.0%} ({rate}/s contexts): "
                + "; ".join(
                    f"p50 {x['p50_ms']:.1f} p99 {x['p99_ms']:.1f} p99.9 {x['p999_ms']:.1f} ms, "
                    f"answered {x['answered_per_s']:.0f}/s, "
                    f"cpu broker {x['broker_cpu']:.0%} server {x['server_cpu']:.0%}"
                    for x in runs
                ),
                flush=True,
            )
    return out


def floor(
    broker: EmbeddedBroker,
    max_rate: float,
    seconds: float,
    repeats: int,
    knob_sets: dict,
    broker_per_run: bool = False,
) -> dict:
    """Part 5's measurement with the bare transactional pass-through (part 1's loop, a subprocess:
    bench/passthrough_serve.py) in place of the worker, at the same fractions of ``max_rate``: the
    decision latency no worker can beat on this broker with these Kafka settings."""
    with tempfile.TemporaryDirectory() as tmp:
        return _at_fractions(
            broker, "", max_rate, seconds, repeats, knob_sets, Path(tmp), "floor", broker_per_run
        )


def _summary(v: dict) -> dict:
    med = harness.median
    runs = v["runs"]
    return {
        "fraction": v["fraction"],
        "offered": runs[0]["offered_per_s"],
        **{k: med([x[f"{k}_ms"] for x in runs]) for k in ("p50", "p99", "p999")},
        "answered": med([x["answered_per_s"] for x in runs]),
        "broker_cpu": med([x.get("broker_cpu", float("nan")) for x in runs]),
        "server_cpu": med([x.get("server_cpu", float("nan")) for x in runs]),
    }


def _pct(x: float) -> str:
    return "" if x != x else f"{x:.0%}"  # nan (results from before the CPU was recorded): blank


def _latency_rows(part: dict) -> list[str]:
    out = []
    for key, v in part.items():
        if key == "live_max":
            continue
        q = _summary(v)
        knobs = ", ".join(f"{k} {x}" for k, x in v["knobs"].items())
        behind = (
            " (fell behind)" if q["answered"] < 0.95 * q["offered"] else ""
        )  # percentiles of the answered only
        out.append(
            f"| {key.rsplit('@', 1)[0]}: {knobs} | {q['fraction']:.0%} | {q['offered']:,.0f} | "
            f"{q['answered']:,.0f}{behind} | {q['p50']:.1f} | {q['p99']:.1f} | {q['p999']:.1f} | "
            f"{_pct(q['broker_cpu'])} | {_pct(q['server_cpu'])} |"
        )
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
            if f["fraction"] == v["fraction"] and all(
                f["knobs"][k] == v["knobs"][k] for k in ("fetch_wait", "linger")
            ):
                out.append((key, fkey, _summary(v), _summary(f)))
                break
    return out


def render_latency(res: dict) -> list[str]:
    """Part 5 of the report."""
    lines: list[str] = []
    given = res["latency"]["live_max"].get("given")
    lines += [
        "## 5. Decision latency: context produced -> action readable (read_committed), oful",
        "",
        "The worker is a `streambandit serve` subprocess; the load generator (encoding and producing contexts, "
        "a reward for every third 5 ms later, reading the actions) is this process, on the same two cores as the "
        "broker. "
        + (
            f"The rates below are 10 %, 50 % and 90 % of a given maximum of "
            f"{res['latency']['live_max']['answered_per_s']:,.0f} contexts/s (no probe in this run). "
            if given
            else "Offered the drain maximum of part 4 "
            f"({res['latency_max_contexts_per_s']:,.0f} contexts/s), the live worker answered "
            f"{res['latency']['live_max']['answered_per_s']:,.0f} contexts/s: that is the live maximum, "
            "and the rates below are 10 %, 50 % and 90 % of it. "
        )
        + "Median over runs of each run's percentile; CPU (of one core) of the broker and of the worker process "
        "over the measured seconds. "
        + (
            "Each run on a broker of its own."
            if res.get("broker_per_run")
            else "All runs on one broker, one after another."
        ),
        "",
        "| knobs | load | offered contexts / s | answered / s | p50 ms | p99 ms | p99.9 ms | broker CPU | worker CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += _latency_rows(res["latency"])
    lines.append("")
    return lines


def render_floor(res: dict) -> list[str]:
    """Part 5b of the report."""
    batch_max = res["batch_max_records"]
    lines: list[str] = []
    fm = res["floor_max"]
    lines += [
        "## 5b. The floor: part 5's load on the bare transactional pass-through",
        "",
        f"Part 1's loop (consume what is fetched, up to {batch_max:,} "
        "records, waiting up to poll_timeout for the first; "
        "one action-sized output per input; send offsets; commit), as a subprocess of its own "
        "(`bench/passthrough_serve.py`) in place of the worker, offered the same load by the same load "
        "generator and measured the same way: no decode, no merge, no learner (every run is in e2e.json). "
        f"Rates: fractions of {fm['contexts_per_s']:,.0f} contexts/s ({fm['from']}).",
        "",
        "| knobs | load | offered contexts / s | answered / s | p50 ms | p99 ms | p99.9 ms "
        "| broker CPU | pass-through CPU |",
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
            lines.append(
                f"| {key.rsplit('@', 1)[0]} | {fkey.rsplit('@', 1)[0]} | {q['fraction']:.0%} | "
                f"{q['p50']:.1f} | {f['p50']:.1f} | {q['p50'] / f['p50']:.1f} | "
                f"{q['p99']:.1f} | {f['p99']:.1f} | {q['p99'] / f['p99']:.1f} |"
            )
        lines.append("")
    return lines
