"""`streambandit api` over real HTTP on loopback: Rank and Reward, every refusal a clear 4xx, and it serves on."""

import asyncio
import http.client
import json
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from streambandit import Decider, reasons
from streambandit.serving.api import make_app

MODELS = {
    "models": [
        {
            "match": "ads",
            "policy": "oful",
            "dim": 3,
            "reward_window_ms": 60_000,
            "default_reward": 0.0,
            "epsilon": 0.1,
        }
    ]
}


def _serving(decider, gate=None, ssl_context=None):
    """The app over ``decider`` on an ephemeral port, its own event loop on a thread; yields the
    base url. ``gate``: its API keys; ``ssl_context``: serve HTTPS."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(decider, model_key="ads", max_body_bytes=4096, gate=gate))
    ready = threading.Event()
    port = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        loop.run_until_complete(site.start())
        port.append(site._server.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    yield f"{'https' if ssl_context else 'http'}://127.0.0.1:{port[0]}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    t.join(10)


@pytest.fixture()
def server():
    """The app over a Decider of MODELS; yields (base url, decider)."""
    decider = Decider(MODELS)
    for url in _serving(decider):
        yield url, decider


def call(url: str, body=None, raw: bytes | None = None) -> tuple[int, dict | str]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        url,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        text, status = err.read().decode(), err.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def _actions(rng, k=4):
    return [
        {"id": f"ad-{i}", "features": [float(v) for v in rng.standard_normal(3)]} for i in range(k)
    ]


def test_rank_and_reward_decide_as_the_decider_does(server):
    url, served = server
    rng = np.random.default_rng(0)
    mirror = Decider(MODELS)
    for i in range(40):
        actions = _actions(rng)
        status, got = call(
            f"{url}/rank", {"eventId": f"e{i}", "actions": actions, "timestampMs": 1_000 + i}
        )
        assert status == 200
        want = mirror.rank(
            f"e{i}", "ads", {a["id"]: a["features"] for a in actions}, timestamp_ms=1_000 + i
        )
        assert (got["rewardActionId"], got["modelVersion"]) == (want.arm_id, want.model_version)
        assert got["ranking"][0]["id"] == want.arm_id and got["ranking"][0][
            "probability"
        ] == pytest.approx(want.propensity)
        assert sum(r["probability"] for r in got["ranking"]) == pytest.approx(1.0)
        assert sorted(r["id"] for r in got["ranking"]) == sorted(a["id"] for a in actions)
        assert got["scores"][want.arm_id] == want.score
        if i % 2:
            assert (
                call(f"{url}/events/e{i}/reward", {"value": 1.0, "timestampMs": 1_000 + i})[0]
                == 204
            )
            mirror.reward(f"e{i}", 1.0, timestamp_ms=1_000 + i)
    assert np.array_equal(
        served.models["ads"].state_dict()["theta"], mirror.models["ads"].state_dict()["theta"]
    )
    status, text = call(f"{url}/metrics")
    assert (
        status == 200 and 'streambandit_api_requests_total{route="rank",status="200"} 40.0' in text
    )
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    rank_ok = (("route", "rank"), ("status", "200"))
    assert got[("streambandit_api_request_seconds_count", rank_ok)] == 40
    assert got[("streambandit_api_request_seconds_bucket", (("le", "+Inf"), *rank_ok))] == 40
    assert 0 < got[("streambandit_api_request_seconds_sum", rank_ok)] < 40
    # Every refusal's reason is a series from the start, and the process's own figures are there.
    for reason in (*reasons.ALL, "not_ready", "stale_replica"):
        assert got[("streambandit_api_refused_total", (("reason", reason),))] == 0
    assert got[("process_resident_memory_bytes", ())] > 0
    assert call(f"{url}/healthz")[0] == 200 and call(f"{url}/ready")[0] == 200


@pytest.mark.parametrize(
    "path, body, raw, status, code",
    [
        ("/rank", None, b"{not json", 400, "malformed"),
        (
            "/rank",
            None,
            b'{"eventId": "x", "actions": [{"id": "a", "features": [NaN, 0, 0]}]}',
            400,
            "malformed",
        ),
        ("/rank", None, b"[1, 2]", 400, "malformed"),
        (
            "/rank",
            {"eventId": "x", "actions": [{"id": "a", "features": [1.0, 0.0]}]},
            None,
            400,
            "bad_dimension",
        ),
        (
            "/rank",
            {
                "eventId": "x",
                "actions": [
                    {"id": "a", "features": [1.0, 0.0, 0.0]},
                    {"id": "b", "features": [1.0]},
                ],
            },
            None,
            400,
            "bad_dimension",
        ),
        (
            "/rank",
            {"eventId": "x", "actions": [{"id": "a", "features": ["big", 0.0, 0.0]}]},
            None,
            400,
            "bad_dimension",
        ),
        (
            "/rank",
            {"eventId": "x", "actions": [{"id": "a", "features": [1e300, 0.0, 0.0]}]},
            None,
            400,
            "feature_out_of_range",
        ),
        ("/rank", {"eventId": "x", "actions": []}, None, 400, "empty_arms"),
        (
            "/rank",
            {
                "eventId": "x",
                "modelKey": "nobody",
                "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}],
            },
            None,
            400,
            "unknown_model",
        ),
        (
            "/rank",
            {
                "eventId": "x",
                "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}],
                "contextFeatures": [{"user": "u"}],
            },
            None,
            400,
            "malformed",
        ),
        ("/rank", {"actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}]}, None, 400, "malformed"),
        (
            "/rank",
            {"eventId": "first", "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}]},
            None,
            409,
            "duplicate_event",
        ),
        ("/events/never/reward", {"value": 1.0}, None, 404, "unknown_event"),
        (
            "/events/first/reward",
            {"value": 1.0, "timestampMs": 10**15},
            None,
            400,
            "event_time_ahead",
        ),
        ("/events/first/reward", {"value": "one"}, None, 400, "non_finite_reward"),
        ("/events/first/reward", {}, None, 400, "malformed"),
        ("/rank", None, b'{"pad": "' + b"x" * 5000 + b'"}', 413, "malformed"),
    ],
)
def test_every_bad_request_is_a_clear_4xx_and_the_server_serves_on(
    server, path, body, raw, status, code
):
    url, _ = server
    assert (
        call(
            f"{url}/rank",
            {"eventId": "first", "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}]},
        )[0]
        == 200
    )
    got_status, got = call(f"{url}{path}", body, raw)
    assert got_status == status and got["error"]["code"] == code, got
    assert got["error"]["message"]
    # Still serving: a good request right after.
    assert (
        call(
            f"{url}/rank",
            {"eventId": "after", "actions": [{"id": "a", "features": [0.0, 1.0, 0.0]}]},
        )[0]
        == 200
    )
    _, metrics = call(f"{url}/metrics")
    assert f'streambandit_api_refused_total{{reason="{code}"}} 1.0' in metrics


HASHED = {
    "models": [
        {
            "match": "ads",
            "policy": "oful",
            "dim": 64,
            "reward_window_ms": 60_000,
            "default_reward": 0.0,
            "epsilon": 0.1,
        }
    ]
}


def test_a_personalizer_rank_request_decides_on_the_vectors_the_dsjson_reader_makes():
    """Feature objects (contextFeatures, actions[].features) are hashed as a logged DSJSON event of
    the same objects is: the oracle is the DSJSON reader itself."""
    from streambandit.replay.dsjson import parse_line

    context = [{"User": {"id": "u1", "age": 0.3}}, {"device": "mobile"}]
    actions = [
        {"id": "news", "features": [{"type": "news"}, {"Topic": {"politics": 1}}]},
        {"id": "sport", "features": [{"type": "sport", "length": 2.5}]},
        {"id": "food", "features": [{"type": "food"}]},
    ]
    decider = Decider(HASHED)
    for url in _serving(decider):
        status, got = call(
            f"{url}/rank",
            {
                "eventId": "p1",
                "contextFeatures": context,
                "actions": actions,
                "excludedActions": ["food"],
            },
        )
        assert status == 200, got
        assert [r["id"] for r in got["ranking"]][-1] == "food" and got["ranking"][-1][
            "probability"
        ] == 0.0
        assert got["rewardActionId"] in {"news", "sport"}
        chosen = decider.engine.pending["p1"].action
        # The same event as Personalizer logs it: shared features in c, each action's in _multi.
        line = {
            "EventId": "p1",
            "Timestamp": "2026-01-01T00:00:00Z",
            "_label_cost": 0,
            "_label_probability": 1,
            "_labelIndex": 0,
            "c": {
                "User": {"id": "u1", "age": 0.3},
                "device": "mobile",
                "_multi": [
                    {"type": "news", "Topic": {"politics": 1}},
                    {"type": "sport", "length": 2.5},
                ],
            },
        }
        logged = parse_line(json.dumps(line), dim=64)
        assert np.array_equal(chosen.features, logged.features[chosen.arm_index])
        # A request mixing numbers and objects, or naming a feature twice, is refused.
        for bad in (
            {
                "eventId": "p2",
                "contextFeatures": context,
                "actions": [{"id": "a", "features": [1.0] * 64}],
            },
            {
                "eventId": "p3",
                "contextFeatures": [{"device": "a"}, {"device": "b"}],
                "actions": actions,
            },
        ):
            status, err = call(f"{url}/rank", bad)
            assert status == 400 and err["error"]["code"] == "malformed", err
        status, err = call(
            f"{url}/rank",
            {"eventId": "p4", "actions": actions, "excludedActions": ["news", "sport", "food"]},
        )
        assert status == 400 and err["error"]["code"] == "empty_arms"


# API keys (serving/auth.py): the secrets of two clients and a scraper, and the budget's clock.
RANKER, SCRAPER, ROOT = "ranker-" + "r" * 20, "scraper-" + "s" * 20, "root-" + "x" * 20
KEY_LINES = [f"ranker rank,reward {RANKER}", f"scraper metrics {SCRAPER}", f"root admin {ROOT}"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fetch(
    url: str, headers: dict | None = None, body=None, context=None
) -> tuple[int, dict, dict | str]:
    """(status, response headers, body as JSON or text) of a GET, or of a POST of ``body``."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url,
        data=data,
        method="POST" if data is not None else "GET",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            status, got, text = resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as err:
        status, got, text = err.code, dict(err.headers), err.read().decode()
    try:
        return status, got, json.loads(text)
    except ValueError:
        return status, got, text


def _gated(clock, **kw):
    from streambandit.serving import auth

    keys = auth.parse_keys(KEY_LINES, "keys")
    return auth.Gate(keys, clock=clock, **{"rate_per_s": 1.0, "burst": 1000, **kw})


@pytest.fixture()
def gated():
    """A server with API keys and a budget of 1/s, burst 1,000; yields (url, clock)."""
    clock = Clock()
    for url in _serving(Decider(MODELS), gate=_gated(clock)):
        yield url, clock


def _rank(i: int) -> dict:
    return {"eventId": f"g{i}", "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}]}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-a-key-of-ours-at-all"},
        {"Authorization": f"Bearer {RANKER}x"},
        {"Ocp-Apim-Subscription-Key": RANKER[:-1]},
        {"Authorization": f"Basic {RANKER}"},  # malformed: not a bearer token
        {"Authorization": "Bearer"},
        {"Authorization": f"Bearer {RANKER} {RANKER}"},
        {"Authorization": f"Bearer {RANKER}", "Ocp-Apim-Subscription-Key": SCRAPER},
    ],
)
def test_no_key_a_wrong_key_or_a_malformed_header_is_a_401_that_says_nothing_more(gated, headers):
    url, _ = gated
    for path, body in (
        ("/rank", _rank(0)),
        ("/events/g0/reward", {"value": 1}),
        ("/metrics", None),
    ):
        status, got_headers, got = fetch(url + path, headers, body)
        assert status == 401, (path, got)
        assert got_headers["WWW-Authenticate"] == 'Bearer realm="streambandit"'
        assert got == {
            "error": {
                "code": "unauthenticated",
                "message": "a valid API key is required (Authorization: Bearer or "
                "Ocp-Apim-Subscription-Key)",
            }
        }
    # Nothing was decided.
    assert fetch(f"{url}/rank", {"Authorization": f"Bearer {RANKER}"}, _rank(0))[0] == 200


def test_either_header_carries_the_key_and_a_key_without_the_scope_is_a_403(gated):
    url, _ = gated
    bearer = {"Authorization": f"Bearer {RANKER}"}
    personalizer = {"Ocp-Apim-Subscription-Key": RANKER}
    assert fetch(f"{url}/rank", bearer, _rank(1))[0] == 200
    assert fetch(f"{url}/rank", personalizer, _rank(2))[0] == 200
    assert fetch(f"{url}/events/g1/reward", personalizer, {"value": 1.0})[0] == 204
    assert fetch(f"{url}/events/g2/activate", bearer, {})[0] == 204
    status, _, got = fetch(f"{url}/metrics", bearer)
    assert status == 403 and got["error"] == {
        "code": "forbidden",
        "message": "this API key may not make this request",
    }
    scraper = {"Authorization": f"Bearer {SCRAPER}"}
    assert fetch(f"{url}/rank", scraper, _rank(3))[0] == 403
    assert fetch(f"{url}/events/g1/reward", scraper, {"value": 1.0})[0] == 403
    status, _, text = fetch(f"{url}/metrics", scraper)
    assert status == 200
    root = {"Authorization": f"Bearer {ROOT}"}
    assert (
        fetch(f"{url}/rank", root, _rank(4))[0] == 200 and fetch(f"{url}/metrics", root)[0] == 200
    )
    # An unknown path: 401 without a key (the server's paths are not told), 404 with one.
    assert fetch(f"{url}/admin")[0] == 401 and fetch(f"{url}/admin", bearer)[0] == 404


def test_a_key_over_its_budget_gets_429_with_retry_after_and_the_refusals_are_counted():
    clock = Clock()
    for url in _serving(Decider(MODELS), gate=_gated(clock, rate_per_s=0.5, burst=3)):
        _budget_and_its_metrics(url, clock)


def _budget_and_its_metrics(url, clock):
    bearer = {"Authorization": f"Bearer {RANKER}"}
    assert [fetch(f"{url}/rank", bearer, _rank(i))[0] for i in range(3)] == [200] * 3
    status, headers, got = fetch(f"{url}/rank", bearer, _rank(3))
    assert status == 429 and headers["Retry-After"] == "2"  # a token in 2 s at 0.5/s
    assert got["error"] == {
        "code": "rate_limited",
        "message": "too many requests for this API key: retry after Retry-After seconds",
    }
    # Another key is not held back, and time refills the bucket (the injected clock: no sleep).
    assert fetch(f"{url}/rank", {"Authorization": f"Bearer {ROOT}"}, _rank(4))[0] == 200
    clock.now += 1.5
    assert fetch(f"{url}/events/g0/reward", bearer, {"value": 1})[1]["Retry-After"] == "1"
    clock.now += 0.5
    assert fetch(f"{url}/events/g0/reward", bearer, {"value": 1})[0] == 204
    fetch(f"{url}/metrics", bearer)  # forbidden
    fetch(f"{url}/rank", {}, _rank(9004))  # unauthenticated
    _, _, text = fetch(f"{url}/metrics", {"Authorization": f"Bearer {SCRAPER}"})
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    refused = "streambandit_api_refused_total"
    assert got[(refused, (("reason", "rate_limited"),))] == 2
    assert got[(refused, (("reason", "forbidden"),))] == 1
    assert got[(refused, (("reason", "unauthenticated"),))] == 1
    by_key = "streambandit_api_key_refused_total"
    assert got[(by_key, (("key", "ranker"), ("reason", "rate_limited")))] == 2
    assert got[(by_key, (("key", "ranker"), ("reason", "forbidden")))] == 1
    assert got[(by_key, (("key", "root"), ("reason", "rate_limited")))] == 0
    through = "streambandit_api_key_requests_total"
    assert got[(through, (("key", "ranker"),))] == 4  # 3 ranks and a reward
    assert got[(through, (("key", "root"),))] == 1
    assert got[(through, (("key", "scraper"),))] == 1  # this scrape
    assert got[("streambandit_api_requests_total", (("route", "rank"), ("status", "429")))] == 1
    assert got[("streambandit_api_requests_total", (("route", "reward"), ("status", "429")))] == 1
    assert RANKER not in text and SCRAPER not in text and ROOT not in text


def test_health_and_readiness_are_open_and_metrics_closed_unless_told_otherwise():
    from streambandit.serving import auth

    for open_paths, want in (
        (auth.DEFAULT_OPEN_PATHS, {"/healthz": 200, "/ready": 200, "/metrics": 401}),
        (auth.parse_open_paths(""), {"/healthz": 401, "/ready": 401, "/metrics": 401}),
        (
            auth.parse_open_paths("healthz,ready,metrics"),
            {"/healthz": 200, "/ready": 200, "/metrics": 200},
        ),
    ):
        for url in _serving(Decider(MODELS), gate=_gated(Clock(), open_paths=open_paths)):
            assert {p: fetch(url + p)[0] for p in want} == want
            # A protected probe takes any key, whatever its scopes.
            assert fetch(f"{url}/healthz", {"Authorization": f"Bearer {RANKER}"})[0] == 200
            assert fetch(f"{url}/rank", {}, _rank(0))[0] == 401


def _self_signed(tmp_path):
    """A certificate for 127.0.0.1 and its key, made by openssl; None without it."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        return None
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
        + ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost"]
        + ["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def test_with_a_certificate_the_api_serves_https_only_and_tls_12_or_later(tmp_path):
    import ssl

    from streambandit.serving.tls import server_context

    made = _self_signed(tmp_path)
    if made is None:
        pytest.skip("no openssl on this machine to make the self-signed certificate")
    cert, key = made
    trust = ssl.create_default_context(cafile=str(cert))
    for url in _serving(
        Decider(MODELS), gate=_gated(Clock()), ssl_context=server_context(str(cert), str(key))
    ):
        assert url.startswith("https://")
        status, _, got = fetch(
            f"{url}/rank", {"Authorization": f"Bearer {RANKER}"}, _rank(0), trust
        )
        assert status == 200 and got["rewardActionId"] == "a"
        assert fetch(f"{url}/rank", {}, _rank(1), trust)[0] == 401
        # An untrusted certificate is refused by the client; plain HTTP gets no answer.
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch(f"{url}/healthz", context=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            fetch(url.replace("https://", "http://") + "/healthz")
    assert server_context(str(cert), str(key)).minimum_version == ssl.TLSVersion.TLSv1_2


def test_the_command_serves_https_with_keys_and_logs_their_names_never_the_keys(tmp_path):
    import signal
    import socket
    import ssl
    import subprocess
    import sys
    import time

    made = _self_signed(tmp_path)
    if made is None:
        pytest.skip("no openssl on this machine to make the self-signed certificate")
    cert, key = made
    models = tmp_path / "models.toml"
    models.write_text(
        '[[models]]\nmatch = "ads"\npolicy = "oful"\ndim = 3\nreward_window_ms = 1000\n'
        "default_reward = 0.0\n"
    )
    keys = tmp_path / "keys"
    keys.write_text("\n".join(KEY_LINES) + "\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streambandit", "api", "--models", str(models)]
            + ["--model-key", "ads", "--port", str(port), "--api-keys", str(keys)]
            + ["--tls-cert", str(cert), "--tls-key", str(key)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 60
            while "api: serving" not in err.read_text() and time.monotonic() < deadline:
                assert proc.poll() is None, err.read_text()
                time.sleep(0.1)
            trust = ssl.create_default_context(cafile=str(cert))
            url = f"https://127.0.0.1:{port}"
            ok = {"Ocp-Apim-Subscription-Key": RANKER}
            assert fetch(f"{url}/rank", ok, _rank(0), trust)[0] == 200
            assert fetch(f"{url}/rank", {}, _rank(1), trust)[0] == 401
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    log = err.read_text()
    assert f"serving on https://127.0.0.1:{port}" in log
    assert "API keys ranker (rank,reward), scraper (metrics), root (admin)" in log
    assert "open without a key: /healthz, /ready; per key: 1000/s, burst 2000" in log
    assert all(secret not in log for secret in (RANKER, SCRAPER, ROOT))


def test_a_replica_and_a_decider_are_served_behind_the_same_gate_and_tls(monkeypatch, tmp_path):
    import ssl
    import types

    from streambandit.serving import api

    served = []
    monkeypatch.setattr(api.web, "run_app", lambda app, **kw: served.append((app, kw)))
    gate, ctx = _gated(Clock()), ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    replica = Decider(MODELS)
    replica.worker_config = types.SimpleNamespace(group_id="g")
    api.serve_replica(replica, host="0.0.0.0", port=1, gate=gate, ssl_context=ctx)
    models = tmp_path / "models.toml"
    models.write_text(
        '[[models]]\nmatch = "ads"\npolicy = "oful"\ndim = 3\nreward_window_ms = 1000\n'
        "default_reward = 0.0\n"
    )
    api.serve_api(models, host="0.0.0.0", port=1, gate=gate, ssl_context=ctx)
    api.serve_api(models, port=1)
    assert [kw["ssl_context"] for _, kw in served] == [ctx, ctx, None]
    assert [len(app.middlewares) for app, _ in served] == [1, 1, 0]
