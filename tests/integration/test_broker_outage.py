"""The only broker away while events flow (about 100 contexts a second), then back: the worker
says so and waits, and goes on by itself, exactly once (docs/operations.md, *A broker away*).

How the broker goes away differs by tier. Apache Kafka's node is stopped (SIGTERM: connections
refused) and started again on its log directory. Tansu keeps everything in memory, so a stop
would lose every topic: it is frozen (SIGSTOP) and resumed (SIGCONT), its connections open and
unanswered, requests timing out instead of being refused.

Each test prints what it saw, in seconds from the moment the broker went away (or was back), so
the figures in docs/operations.md can be quoted with the command that reproduces them:

    pytest -s tests/integration/test_broker_outage.py --broker=both
"""

import json
import re
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig
from streambandit.engine.merge import CONTEXTS, REWARDS
from streambandit.stream.snapshots import DirectoryStore
from streambandit.stream.worker import Worker
from streambandit.wire import DecodeError, decode

from .faults import Flow, Group
from .helpers import (
    caught_up,
    committed_offsets,
    is_tansu,
    outputs,
    producer,
    read_all,
    wait_for,
)
from .test_worker import MODELS

pytestmark = pytest.mark.integration

PARTS = 2
WORKER = {"metrics_port": 0}  # a free port, named on the start-up line
# A transaction open when the broker left outlives its timeout on Apache Kafka, which then aborts
# it and fences the producer when it is back: the worker goes on with a new producer.
TXN_TIMEOUT_MS = 5000


def _away(broker) -> None:
    if is_tansu(broker):
        broker.pause()
    else:
        broker.stop_node(1)


def _back(broker) -> None:
    if is_tansu(broker):
        broker.resume()
    elif not broker.running_nodes():
        broker.start_node(1)


def _get(port: int, path: str) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError as e:
        return None, str(e)


def _gauges(port: int) -> dict[str, float]:
    code, text = _get(port, "/metrics")
    if code != 200:
        return {}
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("streambandit_broker_unavailable")
    }


def _lines(g: Group, instance: str) -> list[dict]:
    """The worker's log lines: every one a JSON object (--log-format json)."""
    out = []
    for line in g.text(instance).splitlines():
        if line.startswith("streambandit: error:"):
            out.append({"message": line})
            continue
        out.append(json.loads(line))  # a raw librdkafka line would fail here
    return out


def _port(g: Group, instance: str) -> int | None:
    m = re.findall(r"worker started .* metrics=[\d.]+:(\d+)", g.text(instance))
    return int(m[-1]) if m else None


def _serving(g: Group, instance: str) -> bool:
    port = _port(g, instance)
    return port is not None and _get(port, "/ready")[0] == 200


def _started(broker, tmp_path, topics) -> tuple[Group, int]:
    g = Group(
        broker,
        tmp_path,
        "outage",
        topics,
        worker=WORKER,
        txn_timeout_ms=TXN_TIMEOUT_MS,
        args=("--log-format", "json"),
    )
    g.start("w")
    assert wait_for(lambda: _serving(g, "w"), timeout_s=60), g.text("w")[-3000:]
    return g, _port(g, "w")


def _assert_each_context_decided_once(broker, g: Group, flow: Flow) -> dict:
    got = outputs(broker, g.topics, g.group, PARTS)
    ids = [a.event_id for a in got["actions"]]
    assert len(ids) == len(set(ids)), "a context decided twice"
    missing = {f"e{n}" for n in range(flow.contexts)} - set(ids)
    assert not missing, _where_they_went(broker, g, sorted(missing, key=lambda e: int(e[1:])), got)
    joined = [j.event_id for j in got["joined"]]
    assert len(joined) == len(set(joined)) and set(joined) <= set(ids)
    assert len(got["dead_letter"]) >= flow.malformed
    return got


def _where_they_went(broker, g: Group, missing: list[str], got: dict) -> str:
    """What the logs say of contexts with no committed action: where each is in the contexts
    topic, whether a dead letter or an action of an uncommitted batch names it, and the group's
    committed offsets."""
    where = {}
    for m in read_all(broker, g.topics.contexts, PARTS):
        try:
            ev = decode(m.value())
        except DecodeError:
            continue
        if ev.event_id in missing:
            where[ev.event_id] = (m.partition(), m.offset())
    raw = {decode(m.value()).event_id for m in read_all(broker, g.topics.actions, PARTS)}
    dead = [
        (d.reason, d.source_partition, d.source_offset, d.trigger)
        for d in got["dead_letter"]
        if (d.source_partition, d.source_offset) in set(where.values())
    ]
    return (
        f"{len(missing)} contexts with no committed action: {missing[:20]}; in the contexts "
        f"topic at (partition, offset): {[where.get(e) for e in missing[:20]]}; an action in the "
        f"raw log (uncommitted batches included): {sorted(set(missing) & raw)[:20]}; their dead "
        f"letters: {dead[:20]}; committed offsets: "
        f"{committed_offsets(broker, g.group, g.topics.contexts, PARTS)}; raw counts "
        f"{got['raw_counts']}; worker's exits: {g.exits}"
    )


def test_a_broker_away_under_traffic_is_reported_waited_out_and_the_worker_goes_on_by_itself(
    broker, topics, tmp_path
):
    """While the broker is away: /ready 503 naming it, /healthz 200 throughout, the gauges set,
    the worker's own JSON line saying what it waits for; back: /ready 200 again with no restart
    of the worker, and every context decided exactly once."""
    g, port = _started(broker, tmp_path, topics)
    flow = Flow(producer(broker), topics, pace_s=0.1, per_period=10)
    seen: dict[str, float] = {}
    try:
        flow.start()
        time.sleep(2)
        away = time.monotonic()
        _away(broker)
        gone = time.monotonic() - away  # a clean stop of Apache Kafka's node takes a while
        unhealthy = []
        while time.monotonic() - away < 30:
            t = time.monotonic() - away
            health, ready = _get(port, "/healthz"), _get(port, "/ready")
            if health[0] != 200:
                unhealthy.append((round(t, 1), health))
            if ready[0] == 503 and ready[1].startswith("broker unavailable"):
                seen.setdefault("ready 503", t)
            gauges = _gauges(port)
            if gauges.get("streambandit_broker_unavailable") == 1:
                if gauges.get("streambandit_broker_unavailable_seconds", 0) > 0:
                    seen.setdefault("gauge", t)
            if any(
                x.get("logger") == "streambandit"
                and x.get("level") == "WARNING"
                and x["message"].startswith("broker unavailable: waiting for ")
                for x in _lines(g, "w")
            ):
                seen.setdefault("log line", t)
            if len(seen) == 3 and t > max(seen.values()) + 3 and t > 10:
                break
            time.sleep(0.25)
        assert not unhealthy, unhealthy
        assert len(seen) == 3, (seen, g.text("w")[-3000:])
        assert g.procs["w"].poll() is None, g.text("w")[-3000:]  # alive: no exit to be restarted
        held = time.monotonic() - away
        resumed = time.monotonic()
        _back(broker)
        back = time.monotonic()
        assert wait_for(lambda: _serving(g, "w"), timeout_s=60), g.text("w")[-3000:]
        ready_again = time.monotonic() - back
        assert _gauges(port).get("streambandit_broker_unavailable") == 0
        assert "broker available again after" in g.text("w")
        time.sleep(2)
        flow.finish()
        assert wait_for(lambda: caught_up(broker, topics, g.group, flow.sent, PARTS), 90), g.text(
            "w"
        )[-3000:]
        assert g.starts("w") == 1  # the same process throughout
        g.stop()
    finally:
        g.kill_all()
        _back(broker)  # whatever failed: the next test has its broker
        flow.finish()
    _assert_each_context_decided_once(broker, g, flow)
    metrics = dict(kv.split("=", 1) for kv in g.exits[0].split() if "=" in kv)
    print(
        f"\n[{'tansu' if is_tansu(broker) else 'kafka'}] broker away ({gone:.1f} s to take it "
        f"away) for {held:.1f} s: /ready 503 after {seen['ready 503']:.1f} s, gauge set after "
        f"{seen['gauge']:.1f} s, own log line after {seen['log line']:.1f} s; broker back "
        f"({back - resumed:.1f} s to bring it back), /ready 200 again {ready_again:.1f} s later; "
        f"{flow.contexts} contexts each decided once; producer_restarts="
        f"{metrics.get('producer_restarts', '0')} transaction_aborts="
        f"{metrics.get('transaction_aborts', '0')}"
    )


def test_a_stop_while_the_broker_is_away_exits_within_seconds_and_the_restart_loses_nothing(
    broker, topics, tmp_path
):
    """SIGTERM while the worker waits for the broker: exit 0 within 5 s; started again once the
    broker is back, the group ends with every context decided exactly once."""
    g, port = _started(broker, tmp_path, topics)
    flow = Flow(producer(broker), topics, pace_s=0.1, per_period=10)
    try:
        flow.start()
        time.sleep(2)
        away = time.monotonic()
        _away(broker)
        assert wait_for(
            lambda: _get(port, "/ready")[1].startswith("broker unavailable"), timeout_s=30
        ), g.text("w")[-3000:]
        detected = time.monotonic() - away
        proc = g.procs.pop("w")
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - asked
        assert proc.returncode == 0, g.text("w")[-3000:]
        assert took < 5, (took, g.text("w")[-3000:])
        g.exits.append(out.decode())
        _back(broker)
        g.start("w")
        time.sleep(2)
        flow.finish()
        assert wait_for(lambda: caught_up(broker, topics, g.group, flow.sent, PARTS), 90), g.text(
            "w"
        )[-3000:]
        g.stop()
    finally:
        g.kill_all()
        _back(broker)  # whatever failed: the next test has its broker
        flow.finish()
    _assert_each_context_decided_once(broker, g, flow)
    print(
        f"\n[{'tansu' if is_tansu(broker) else 'kafka'}] stop while the broker was away: "
        f"outage seen after {detected:.1f} s, SIGTERM to exit 0 in {took:.1f} s; the restart "
        f"decided each of {flow.contexts} contexts once"
    )


def test_a_recovery_waits_for_the_group_s_committed_offsets_while_the_broker_is_away(
    broker, topics, tmp_path
):
    """The committed offsets a recovery starts from (and a rebuild after a fenced producer seeks
    to), asked for while the broker is away: the worker reports the outage and waits, and has
    them once the broker is back, where it used to exit on the coordinator's time-out."""
    cfg = WorkerConfig(
        bootstrap_servers=broker.bootstrap_servers,
        models=parse_models_config(MODELS),
        group_id="committed-wait",
        topics=topics,
    )
    w = Worker(cfg, DirectoryStore(tmp_path / "snapshots"))
    w.start()  # joined; its loop is not run: this thread is the only caller of its consumer
    got: dict = {}
    raised: list[BaseException] = []

    def recover_offsets() -> None:
        try:
            got.update(w._committed(0))
        except BaseException as exc:  # noqa: BLE001 (asserted below)
            raised.append(exc)

    asking = threading.Thread(target=recover_offsets, daemon=True)
    try:
        _away(broker)
        asking.start()
        assert wait_for(lambda: w.outage.active or raised, timeout_s=60), "no outage reported"
        time.sleep(5)  # more than two of the wait's steps
        assert not raised and asking.is_alive(), raised
        assert "waiting for the group's committed offsets" in w.ready()[1], w.ready()
        _back(broker)
        asking.join(120)
        assert not raised, raised
        assert got == {CONTEXTS: 0, REWARDS: 0}  # nothing committed by this group yet
        assert not w.outage.active
    finally:
        _back(broker)
        w.close()
