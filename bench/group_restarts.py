"""Clean stops and restarts of ``streambandit serve`` on the embedded broker: does every restart serve?

    python -m bench.group_restarts          # ~6 min, writes bench/results/group_restarts.{md,json}
    python -m bench.group_restarts --quick  # 3 rounds of each

1. ``serve --processes 2`` (the supervisor, stream/supervisor.py), SIGTERM, started again: ten
   rounds. Per round, the time from the start until its two processes hold both partitions
   between them (each one's ``/ready``), and the time SIGTERM takes to end it.
2. The same group served by two ``serve --processes 1`` processes, both sent SIGTERM at the same
   moment (two members leaving together), started again, up to ten rounds or until a start
   serves nothing within the wait. Then what brings serving back: the same group started again
   after waiting, and the same command under a new group id.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from bench import harness
from streambandit.config.worker import Topics
from streambandit.dev.tansu import EmbeddedBroker

SERVE_WAIT_S = 30.0  # a start that holds no partition by then counts as wedged
TARGET_S = 10.0

CONFIG = """
[worker]
group_id = "{group}"
snapshot_dir = "{snaps}"

[topics]
{topics}

[[models]]
match = "m-*"
policy = "oful"
dim = 3
reward_window_ms = 100
default_reward = 0.0

[kafka.consumer]
"fetch.wait.max.ms" = 10
"""


def _ports(n: int) -> int:
    """A port P with P .. P + n - 1 free."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        try:
            for k in range(1, n):
                with socket.socket() as s:
                    s.bind(("0.0.0.0", p + k))
            return p
        except OSError:
            continue


def _held(port: int) -> int:
    """The partitions the worker serving metrics on ``port`` holds, by its /ready (0 if none)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as r:
            body = r.read().decode()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode()
    except (OSError, http.client.HTTPException):  # not listening yet
        return 0
    m = re.search(r"serving (\d+) partition", body)
    return int(m[1]) if m else 0


def _serve(broker, cfg: Path, processes: int, instance: str, port: int, log: Path):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streambandit",
            "serve",
            "--config",
            str(cfg),
            "--processes",
            str(processes),
            "--instance-id",
            instance,
            "--metrics-port",
            str(port),
            "--bootstrap-servers",
            broker.bootstrap_servers,
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "a"),
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _until_served(ports: list[int], started: float) -> float | None:
    while time.monotonic() - started < SERVE_WAIT_S:
        if sum(_held(p) for p in ports) == 2:
            return round(time.monotonic() - started, 2)
        time.sleep(0.1)
    return None


def _stop(procs: list[subprocess.Popen]) -> float:
    t0 = time.monotonic()
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(120)
        if p.returncode != 0:
            raise SystemExit(f"serve exited with {p.returncode}: see its log")
    return round(time.monotonic() - t0, 2)


def _config(tmp: Path, topics: Topics, group: str) -> Path:
    cfg = tmp / f"{group}.toml"
    names = ("contexts", "rewards", "actions", "joined", "dead_letter")
    cfg.write_text(
        CONFIG.format(
            group=group,
            snaps=tmp / "snaps",
            topics="\n".join(f'{n} = "{getattr(topics, n)}"' for n in names),
        )
    )
    return cfg


def supervisor_rounds(broker, tmp: Path, rounds: int) -> list[dict]:
    topics = _topics(broker)
    cfg = _config(tmp, topics, "g-supervised")
    out = []
    for i in range(rounds):
        port = _ports(2)
        started = time.monotonic()
        proc = _serve(broker, cfg, 2, "box", port, tmp / "supervised.log")
        served = _until_served([port, port + 1], started)
        stop = _stop([proc])
        out.append({"round": i, "served_s": served, "stop_s": stop, "exit": proc.returncode})
        print(out[-1], flush=True)
    return out


def together_rounds(broker, tmp: Path, rounds: int) -> dict:
    topics = _topics(broker)
    cfg = _config(tmp, topics, "g-together")

    def start(cfg_path: Path, tag: str) -> tuple[list[subprocess.Popen], list[int], float]:
        port = _ports(2)
        started = time.monotonic()
        procs = [
            _serve(broker, cfg_path, 1, f"{tag}-{k}", port + k, tmp / "together.log")
            for k in range(2)
        ]
        return procs, [port, port + 1], started

    out: dict = {"rounds": [], "after": []}
    for i in range(rounds):
        procs, ports, started = start(cfg, "box")
        served = _until_served(ports, started)
        stop = _stop(procs)
        out["rounds"].append({"round": i, "served_s": served, "stop_s": stop})
        print(out["rounds"][-1], flush=True)
        if served is None:
            break
    if out["rounds"] and out["rounds"][-1]["served_s"] is None:
        for what, wait_s, path in (
            ("the same group, after 60 s", 60, cfg),
            ("the same group, started again at once", 0, cfg),
            ("a new group id", 0, _config(tmp, topics, "g-together-new")),
        ):
            time.sleep(wait_s)
            procs, ports, started = start(path, "box")
            served = _until_served(ports, started)
            _stop(procs)
            out["after"].append({"what": what, "served_s": served})
            print(out["after"][-1], flush=True)
    return out


def _topics(broker) -> Topics:
    tag = uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"contexts-{tag}",
        rewards=f"rewards-{tag}",
        actions=f"actions-{tag}",
        joined=f"joined-{tag}",
        dead_letter=f"dead-letter-{tag}",
    )
    broker.create_topics(t.all(), partitions=2)
    return t


def measure(args: argparse.Namespace) -> dict:
    rounds = 3 if args.quick else 10
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        return {
            "rounds": rounds,
            "serve_wait_s": SERVE_WAIT_S,
            "supervised": supervisor_rounds(broker, Path(tmp), rounds),
            "together": together_rounds(broker, Path(tmp), rounds),
        }


def _s(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f}"


def render(res: dict) -> str:
    sup = res["supervised"]
    ok = [r for r in sup if r["served_s"] is not None and r["served_s"] <= TARGET_S]
    tog = res["together"]
    lines = [
        "# Clean stops and restarts of `streambandit serve` on the embedded broker",
        "",
        harness.provenance(res, "Explained in docs/notes/tansu.md."),
        "",
        "An empty group on two partitions, an embedded broker of its own. *serving*: from the "
        "start until the processes' `/ready` say they hold both partitions between them "
        f"(*never*: not within {res['serve_wait_s']:g} s). *stop*: from SIGTERM until every "
        "process has exited.",
        "",
        "## `serve --processes 2`, SIGTERM, started again",
        "",
        "| round | serving s | stop s | exit code |",
        "|---:|---:|---:|---:|",
        *[f"| {r['round']} | {_s(r['served_s'])} | {r['stop_s']:.1f} | {r['exit']} |" for r in sup],
        "",
        f"{len(ok)} of {len(sup)} starts served within {TARGET_S:g} s.",
        "",
        "## Two `serve --processes 1` of one group, SIGTERM to both at once, started again",
        "",
        "| round | serving s | stop s |",
        "|---:|---:|---:|",
        *[f"| {r['round']} | {_s(r['served_s'])} | {r['stop_s']:.1f} |" for r in tog["rounds"]],
        "",
    ]
    if tog["after"]:
        lines += [
            "After the start that served nothing:",
            "",
            "| started again | serving s |",
            "|---|---:|",
            *[f"| {r['what']} | {_s(r['served_s'])} |" for r in tog["after"]],
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(harness.main("group_restarts", __doc__, measure, render))
