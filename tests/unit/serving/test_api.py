"""`streambandit api` over real HTTP on loopback: Rank and Reward, every refusal a clear 4xx, and it serves on."""

import asyncio
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


def _serving(decider):
    """The app over ``decider`` on an ephemeral port, its own event loop on a thread; yields the base url."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(decider, model_key="ads", max_body_bytes=4096))
    ready = threading.Event()
    port = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        port.append(site._server.sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port[0]}"
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
