"""`streambandit api` over HTTP on loopback at offered loads, against the Kafka round trip in the same run.

    python -m bench.api_http            # 1,000 and 5,000 requests/s, API keys on and off at
                                        # 1,000/s, and the Kafka round trip, 3 runs of 10 s
                                        # each (~5 min)
    python -m bench.api_http --only auth    # API keys on and off only (~1.5 min)
    python -m bench.api_http --quick    # 2 s each, prints only

The server is ``streambandit api`` as a subprocess (one core: one event loop), d = 20, K = 10,
``oful`` with epsilon 0.1 on 4 model keys. The load generator is open-loop (aiohttp's client, in
this process, its garbage collector off while it offers load): request i is due at i / rate
seconds and its latency is counted from that moment to the response, so a server that falls
behind shows it as latency rather than as a slower offer.
Every request is a Rank; one in three is followed by its Reward (not timed). 2 s of warm-up are
not counted. The Kafka round trip is ``bench.e2e``'s: a context produced to a ``streambandit serve``
worker on the embedded broker until its action is read back (read_committed), at 1,000 contexts/s
with the worker's default latency settings, measured in the same run.

API keys on and off: at 1,000 requests/s, a server without keys and one with a key file of four
keys (``--api-keys``, a budget per key far above the load so that none is refused, its bucket
still taken from), every request carrying ``Ocp-Apim-Subscription-Key``; the runs alternate
(off, on, off, ...) so that both meet the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import harness
from bench.e2e_latency import LATENCY_DEFAULTS, latency_run

D, K, KEYS = 20, 10, 4
KEY = "bench-key-0123456789abcdef-"  # + a suffix per client (the api's key file)
RATES = (1_000, 5_000)
TARGET_P99_MS = 5.0
RUNS = 3
MODELS = f"""[[models]]
match = "ads-*"
policy = "oful"
dim = {D}
reward_window_ms = 1000
default_reward = 0.0
epsilon = 0.1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _offer(
    url: str, rate: float, seconds: float, warm_s: float = 2.0, key: str | None = None
) -> dict:
    """The open-loop load. The generator's own garbage collector is off while it runs: its
    collections over the thousands of request tasks it holds stalled its event loop for tens of
    milliseconds, and each stall was counted as the server's latency of every request due then."""
    gc.collect()
    gc.disable()
    try:
        return await _offer_load(url, rate, seconds, warm_s, key)
    finally:
        gc.enable()


async def _offer_load(
    url: str, rate: float, seconds: float, warm_s: float, key: str | None
) -> dict:
    import aiohttp

    rng = np.random.default_rng(int(rate))
    pool = [
        [
            {"id": f"ad-{k}", "features": [float(v) for v in row]}
            for k, row in enumerate(rng.standard_normal((K, D)) / 5)
        ]
        for _ in range(64)
    ]
    lat: list[float] = []
    errors = 0
    total = int(rate * (warm_s + seconds))
    start = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=256)
    headers = {"Ocp-Apim-Subscription-Key": key} if key is not None else {}
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(i: int) -> None:
            nonlocal errors
            due = start + i / rate
            body = {
                "eventId": f"q{i}",
                "modelKey": f"ads-{i % KEYS}",
                "actions": pool[i % len(pool)],
            }
            async with session.post(f"{url}/rank", json=body) as resp:
                await resp.read()
                ok = resp.status == 200
            done = time.perf_counter()
            if not ok:
                errors += 1
            elif due - start >= warm_s:
                lat.append((done - due) * 1e3)
            if ok and i % 3 == 0:
                async with session.post(f"{url}/events/q{i}/reward", json={"value": 1.0}) as resp:
                    await resp.read()

        tasks = []
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    a = np.array(lat) if lat else np.array([np.nan])
    return {
        "offered_per_s": rate,
        "achieved_per_s": total / wall,
        "n": len(lat),
        "errors": errors,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "p999_ms": float(np.percentile(a, 99.9)),
    }


def _server(workdir: Path, with_keys: bool = False) -> tuple[subprocess.Popen, str]:
    models = workdir / "models.toml"
    models.write_text(MODELS)
    port = _free_port()
    keys = []
    if with_keys:
        (workdir / "keys").write_text(
            "".join(f"client-{i} rank,reward {KEY}{i}\n" for i in range(3))
            + f"prometheus metrics {KEY}p\n"
        )
        # The bucket is taken from on every request; its budget is far above the load.
        keys = ["--api-keys", str(workdir / "keys"), "--rate-limit", "1e6", "--burst", "1000000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "streambandit", "api", "--models", str(models), "--port", str(port)]
        + keys,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("streambandit api did not start within 60 s")


def _auth(work: Path, seconds: float, runs: int) -> dict:
    """The same load on a server without keys and on one with them, runs alternating."""
    rows: dict[str, list[dict]] = {"off": [], "on": []}
    for _ in range(runs):
        for mode in ("off", "on"):
            proc, url = _server(work, with_keys=mode == "on")
            try:
                key = f"{KEY}0" if mode == "on" else None
                rows[mode].append(asyncio.run(_offer(url, RATES[0], seconds, key=key)))
            finally:
                proc.terminate()
                proc.wait(30)
            print(
                f"keys {mode} {RATES[0]}/s: "
                + ", ".join(f"{k} {v:,.2f}" for k, v in rows[mode][-1].items()),
                flush=True,
            )
    out = {
        mode: {k: harness.median([r[k] for r in rs]) for k in rs[0]} | {"each": rs}
        for mode, rs in rows.items()
    }
    out["p99_ratio"] = out["on"]["p99_ms"] / out["off"]["p99_ms"]
    out["check_us"] = _check_us()
    return out


def _check_us(n: int = 100_000) -> float:
    """The gate's own time per request (Gate.check of a valid key, four keys, its budget
    taken), in this process: what the key check adds to each request apart from the middleware."""
    from streambandit.serving import auth

    keys = auth.parse_keys(
        [f"client-{i} rank,reward {KEY}{i}" for i in range(3)] + [f"prometheus metrics {KEY}p"],
        "bench",
    )
    gate = auth.Gate(keys, rate_per_s=1e9, burst=10**9)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            gate.check("rank", None, f"{KEY}0")
        best = min(best, time.perf_counter() - t)
    return best / n * 1e6


def _add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--only",
        choices=("auth",),
        default=None,
        help="auth: only API keys on against off (the other loads and the Kafka round trip not run)",
    )


def measure(args: argparse.Namespace) -> dict:
    seconds, runs = (2.0, 1) if args.quick else (10.0, RUNS)
    res: dict = {
        "d": D,
        "K": K,
        "keys": KEYS,
        "seconds": seconds,
        "runs": runs,
        "http": [],
        "kafka": None,
        "auth": None,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        res["auth"] = _auth(work, seconds, runs)
        if args.only == "auth":
            return res
        for rate in RATES:
            rows = []
            for _ in range(runs):
                proc, url = _server(work)  # a fresh server per run: no state carried over
                try:
                    rows.append(asyncio.run(_offer(url, rate, seconds)))
                finally:
                    proc.terminate()
                    proc.wait(30)
                print(
                    f"http {rate}/s: " + ", ".join(f"{k} {v:,.2f}" for k, v in rows[-1].items()),
                    flush=True,
                )
            # The median run of each figure (the runs themselves are in the JSON).
            res["http"].append(
                {k: harness.median([r[k] for r in rows]) for k in rows[0]} | {"each": rows}
            )
        from streambandit.dev.tansu import EmbeddedBroker

        with EmbeddedBroker() as broker:
            kafka = [
                latency_run(broker, "oful", 1_000.0, seconds, work, LATENCY_DEFAULTS)
                for _ in range(runs)
            ]
        res["kafka"] = {
            k: harness.median([r[k] for r in kafka])
            for k in (
                "offered_per_s",
                "answered_per_s",
                "p50_ms",
                "p99_ms",
                "p999_ms",
                "unanswered",
            )
        }
        res["kafka"]["each"] = kafka
        print(
            f"kafka 1000/s: p50 {res['kafka']['p50_ms']:.1f} ms, p99 {res['kafka']['p99_ms']:.1f} ms",
            flush=True,
        )
    return res


def _render_auth(res: dict) -> list[str]:
    a = res.get("auth")
    if a is None:
        return []
    rows = [
        f"| {label} | {r['offered_per_s']:,} | {r['achieved_per_s']:,.0f} | {r['p50_ms']:.2f} | "
        f"{r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {r['errors']} |"
        for label, r in (("none", a["off"]), ("4 keys, a budget per key", a["on"]))
    ]
    return [
        "## API keys",
        "",
        f"The same load at {a['off']['offered_per_s']:,} requests/s on a server without API keys "
        "and on one with a key file (`--api-keys`, four keys, a budget far above the load), every "
        "request carrying its key; medians of the runs, which alternate between the two.",
        "",
        "| API keys | offered / s | achieved / s | p50 ms | p99 ms | p99.9 ms | errors |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        f"p99 with keys / without (the medians), same run: {a['p99_ratio']:.2f}. The key check "
        f"itself (`Gate.check` of a valid key among four, its budget taken; the fastest of 5 "
        f"rounds of 100,000 in the benchmark's process) takes {a['check_us']:.1f} us a request.",
        "",
    ]


def render(res: dict) -> str:
    if res.get("kafka") is None:  # --only auth
        return "\n".join(
            [
                "# Decisions over HTTP with and without API keys",
                "",
                harness.provenance(res, "BLAS pinned to one thread."),
                "",
                *_render_auth(res),
            ]
        )
    k = res["kafka"]
    rows = [
        f"| HTTP `streambandit api` | {r['offered_per_s']:,} | {r['achieved_per_s']:,.0f} | {r['p50_ms']:.2f} | "
        f"{r['p99_ms']:.2f} | {r['p999_ms']:.2f} | {r['errors']} |"
        for r in res["http"]
    ]
    rows.append(
        f"| Kafka round trip (`serve`) | {k['offered_per_s']:,.0f} | {k['answered_per_s']:,.0f} | {k['p50_ms']:.2f} | "
        f"{k['p99_ms']:.2f} | {k['p999_ms']:.2f} | {k['unanswered']} |"
    )
    first = res["http"][0]
    verdict = (
        f"At {first['offered_per_s']:,} requests/s the HTTP p99 is {first['p99_ms']:.2f} ms: the target of "
        f"{TARGET_P99_MS:g} ms is {'met' if first['p99_ms'] < TARGET_P99_MS else 'not met'}; the Kafka round "
        f"trip's p99 in the same run is {k['p99_ms'] / first['p99_ms']:.0f}x it."
    )
    for r in res["http"][1:]:
        kept = r["achieved_per_s"] >= 0.95 * r["offered_per_s"]
        verdict += (
            f" At {r['offered_per_s']:,}/s the server and the load generator (sharing the machine's two cores) "
            f"{'kept up' if kept else 'did not keep up'} ({r['achieved_per_s']:,.0f}/s achieved), p99 "
            f"{r['p99_ms']:.2f} ms."
        )
    return "\n".join(
        [
            "# Decisions over HTTP against the Kafka round trip",
            "",
            harness.provenance(res, "BLAS pinned to one thread."),
            "",
            f"d = {res['d']}, K = {res['K']}, `oful` with epsilon 0.1 on {res['keys']} model keys; medians of "
            f"{res.get('runs', 1)} runs per path and load, each {res['seconds']:g} s "
            "measured per load after 2 s (HTTP) or 3 s (Kafka) of warm-up. HTTP: open-loop, "
            "latency from each request's "
            "due time to its response, a Reward after one Rank in three (not timed). "
            "Kafka: a context produced until its "
            "action is read back (read_committed), `bench.e2e`'s load generator and the worker's latency defaults.",
            "",
            "| path | offered / s | achieved / s | p50 ms | p99 ms | p99.9 ms | errors (HTTP) / unanswered (Kafka) |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            verdict,
            "",
            *_render_auth(res),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(harness.main("api_http", __doc__, measure, render, _add_arguments))
