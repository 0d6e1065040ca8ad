"""``streambandit api``: the Decider over HTTP (aiohttp), shaped like Personalizer's Rank and Reward.

    POST /rank                      {"eventId", "actions": [{"id", "features"}], "contextFeatures"?,
                                     "excludedActions"?, "modelKey"?, "timestampMs"?}
                                 -> {"eventId", "rewardActionId", "ranking": [{"id", "probability"}],
                                     "modelKey", "modelVersion", "scores": {id: score}}
    POST /events/{eventId}/reward   {"value": number, "timestampMs"?}  -> 204
    POST /events/{eventId}/activate accepted and ignored (decisions here are always active) -> 204
    GET  /metrics                   Prometheus text format: requests, their time, refusals, the
                                    models, and the process's own figures
    GET  /healthz, /ready           200 while serving

With a :class:`~streambandit.serving.auth.Gate` (API keys: ``--api-keys``), every request but
the open paths (/healthz and /ready unless told otherwise) presents a key with the route's
scope, within the key's budget: else 401 (no key, or not a key of ours), 403 (not this route's
scope) or 429 (over its budget, with ``Retry-After``), each with the usual error body.

A Personalizer client's requests map one to one: the paths and the fields ``eventId``,
``contextFeatures``, ``actions[].id``, ``actions[].features``, ``excludedActions``,
``ranking[].probability``, ``rewardActionId`` and the reward's ``value`` are Personalizer's;
``ranking`` lists every action with the probability the decision rule gave it, the chosen one
first, the excluded ones last with 0. An action's ``features`` is either the model's ``dim``
numbers, or Personalizer's feature objects (a list of objects, with ``contextFeatures`` the
same): these are hashed into the model's dimension exactly as the DSJSON reader hashes a logged
event (``replay/dsjson.py``, ``rank_request_vectors``), so a model chosen by replaying a team's
Personalizer logs decides live on the vectors it was evaluated on. The model is named by
``modelKey`` (a Personalizer resource has one loop; the server's ``--model-key`` is the default).
``deferActivation: true`` is refused with a 400 rather than silently ignored.

Every refusal is a 4xx with ``{"error": {"code", "message"}}``: 400 for a malformed request (the
code is the worker's reason: ``malformed``, ``bad_dimension``, ``non_finite_features``, ...), 404
for a reward of an unknown event, 409 for a duplicate event id or a reward after its window, 413
for a body over ``max_body_bytes``. The server keeps serving. At most ``max_models`` model keys
are served (``too_many_models`` past it): the client names them, and each costs a model's state.
One event loop serves every request and the Decider is not shared with another thread: rank and
reward run in the loop, tens of microseconds each (``python -m bench.decider``).
With ``snapshot``, the state is saved every
``save_every_s`` seconds and on shutdown, and loaded at start.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import math
import ssl
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from streambandit import reasons
from streambandit.engine.decision import action_probabilities
from streambandit.redaction import redact
from streambandit.serving import auth
from streambandit.serving.decider import Decider, DecisionError
from streambandit.stream.telemetry import Histogram, process_metrics

__all__ = ["make_app", "serve_api", "STATUS_OF"]

log = logging.getLogger("streambandit")

# The HTTP status of each refusal: the request's fault (400), an event the server does not know
# (404), or a conflict with what it already did (409).
STATUS_OF = collections.defaultdict(
    lambda: 400,
    {
        reasons.UNKNOWN_EVENT: 404,
        reasons.DUPLICATE_EVENT: 409,
        reasons.DUPLICATE_REWARD: 409,
        reasons.LATE_REWARD: 409,
        "not_ready": 503,
        "stale_replica": 503,  # serving/replica.py (this module does not import the Kafka client)
        auth.UNAUTHENTICATED: 401,
        auth.FORBIDDEN: 403,
        auth.RATE_LIMITED: 429,
    },
)
MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_MODELS = 10_000
# Bucket bounds (seconds) of a request's time in the server: tens of microseconds for a rank of a
# few actions, up to the seconds of a saturated event loop.
REQUEST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5)


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Metrics:
    """What /metrics shows: requests and their time by route and status, refusals by reason (every
    reason from 0, so that the first one is an increase), and the Decider's models and open
    decisions."""

    def __init__(self, decider: Decider, key_names: list[str]) -> None:
        self.decider = decider
        # Requests let through and refusals of a known key (by its name, never the key), every
        # series from 0.
        self.key_requests: collections.Counter[str] = collections.Counter(
            dict.fromkeys(key_names, 0)
        )
        self.key_refused: collections.Counter[tuple[str, str]] = collections.Counter(
            {(name, r): 0 for name in key_names for r in (auth.FORBIDDEN, auth.RATE_LIMITED)}
        )
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.seconds: dict[tuple[str, str], Histogram] = {}
        self.refused: collections.Counter[str] = collections.Counter(
            dict.fromkeys((*reasons.ALL, *STATUS_OF), 0)
        )

    def observe(self, route: str, status: str, seconds: float) -> None:
        self.requests[(route, status)] += 1
        h = self.seconds.get((route, status))
        if h is None:
            h = self.seconds[(route, status)] = Histogram(REQUEST_BUCKETS)
        h.observe_one(seconds)

    def collect(self):
        yield from (m for c in process_metrics() for m in c.collect())
        c = CounterMetricFamily(
            "streambandit_api_requests",
            "HTTP requests by route and status",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(self.requests.items()):
            c.add_metric([route, status], n)
        yield c
        h = HistogramMetricFamily(
            "streambandit_api_request_seconds",
            "time from the handler taking a request (its body not yet read) to its answer, "
            "by route and status",
            labels=["route", "status"],
        )
        for (route, status), hist in sorted(self.seconds.items()):
            buckets, total = hist.frozen()
            h.add_metric([route, status], list(buckets), total)
        yield h
        r = CounterMetricFamily(
            "streambandit_api_refused", "Requests refused, by reason code", labels=["reason"]
        )
        for reason, n in sorted(self.refused.items()):
            r.add_metric([reason], n)
        yield r
        if self.key_refused:
            k = CounterMetricFamily(
                "streambandit_api_key_refused",
                "Requests of a known API key refused (forbidden, rate_limited), by the key's name",
                labels=["key", "reason"],
            )
            for (name, reason), n in sorted(self.key_refused.items()):
                k.add_metric([name, reason], n)
            yield k
            a = CounterMetricFamily(
                "streambandit_api_key_requests",
                "Requests of a known API key let through to their route, by the key's name",
                labels=["key"],
            )
            for name, n in sorted(self.key_requests.items()):
                a.add_metric([name], n)
            yield a
        yield GaugeMetricFamily(
            "streambandit_api_models", "Models held", value=len(self.decider.models)
        )
        engine = getattr(self.decider, "engine", None)
        if engine is not None:
            yield GaugeMetricFamily(
                "streambandit_api_open_decisions",
                "Decisions waiting for their reward window",
                value=len(engine.pending),
            )
        counters = getattr(self.decider, "counters", None)
        if counters is not None:  # a replica (serving/replica.py)
            yield CounterMetricFamily(
                "streambandit_api_replica_applied",
                "Joined records applied to the replica's models",
                value=counters["applied"],
            )
            yield CounterMetricFamily(
                "streambandit_api_replica_loads",
                "Partitions loaded from a snapshot and the "
                "log (at start, and when the log did not continue the copy)",
                value=counters["loads"],
            )
            yield GaugeMetricFamily(
                "streambandit_api_replica_staleness_seconds",
                "How far behind the learners the replica's models may be",
                value=self.decider.staleness_s(),
            )


def make_app(
    decider: Decider,
    *,
    model_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    gate: auth.Gate | None = None,
) -> web.Application:
    """The aiohttp application over ``decider``; ``model_key``: the model of a request that names
    none; ``gate``: the API keys every request but the open paths presents (None: no keys)."""
    metrics = _Metrics(decider, [k.name for k in gate.keys] if gate is not None else [])

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        started = time.perf_counter()
        route = request.match_info.route.name  # None: a path the server does not have
        headers = request.headers
        verdict = gate.check(
            route, headers.get("Authorization"), headers.get("Ocp-Apim-Subscription-Key")
        )
        if verdict.refusal is None:
            if verdict.key is not None:
                metrics.key_requests[verdict.key] += 1
            return await handler(request)
        metrics.refused[verdict.refusal] += 1
        if verdict.key is not None:
            metrics.key_refused[(verdict.key, verdict.refusal)] += 1
        extra = {}
        if verdict.refusal == auth.UNAUTHENTICATED:
            extra["WWW-Authenticate"] = 'Bearer realm="streambandit"'
        elif verdict.refusal == auth.RATE_LIMITED:
            extra["Retry-After"] = str(verdict.retry_after_s)
        resp = web.json_response(
            {"error": {"code": verdict.refusal, "message": verdict.message}},
            status=verdict.status,
            headers=extra,
        )
        metrics.observe(route or "unmatched", str(resp.status), time.perf_counter() - started)
        return resp

    async def body(request: web.Request) -> dict[str, Any]:
        if request.content_length is not None and request.content_length > max_body_bytes:
            raise _Refused(413, reasons.MALFORMED, f"body over {max_body_bytes} bytes")
        raw = await request.content.read(max_body_bytes + 1)
        if len(raw) > max_body_bytes:
            raise _Refused(413, reasons.MALFORMED, f"body over {max_body_bytes} bytes")
        try:
            doc = json.loads(raw, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refused(400, reasons.MALFORMED, f"the body is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise _Refused(400, reasons.MALFORMED, "the body must be a JSON object")
        return doc

    def answer(route: str, fn):
        async def handler(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                resp = await fn(request)
            except _Refused as r:
                metrics.refused[r.code] += 1
                resp = web.json_response(
                    {"error": {"code": r.code, "message": r.message}}, status=r.status
                )
            except DecisionError as e:
                metrics.refused[e.reason] += 1
                # The detail may quote an error of the replica's Kafka clients.
                body = {"error": {"code": e.reason, "message": redact(e.detail)}}
                resp = web.json_response(body, status=STATUS_OF[e.reason])
            metrics.observe(route, str(resp.status), time.perf_counter() - started)
            return resp

        return handler

    async def rank(request: web.Request) -> web.Response:
        doc = await body(request)
        if doc.get("deferActivation"):
            raise _Refused(
                400,
                reasons.MALFORMED,
                "'deferActivation' is not supported: every decision is active (docs/api.md)",
            )
        event_id = doc.get("eventId")
        key = doc.get("modelKey", model_key)
        if key is None:
            raise _Refused(
                400, reasons.MALFORMED, "no modelKey in the request and no default (--model-key)"
            )
        actions = doc.get("actions")
        if not isinstance(actions, list) or not all(isinstance(a, dict) for a in actions):
            raise _Refused(400, reasons.MALFORMED, "actions must be a list of {id, features}")
        excluded = doc.get("excludedActions") or []
        if not isinstance(excluded, list) or not all(isinstance(e, str) for e in excluded):
            raise _Refused(400, reasons.MALFORMED, "excludedActions must be a list of action ids")
        excluded_set = set(excluded)
        kept = [a for a in actions if a.get("id") not in excluded_set]
        ids = [a.get("id") for a in kept]
        feats = [a.get("features") for a in kept]
        if not kept:
            raise _Refused(400, reasons.EMPTY_ARMS, "no action left to choose from")
        if "contextFeatures" in doc or any(_feature_objects(f) for f in feats):
            feats = _hashed(
                doc.get("contextFeatures"),
                feats,
                decider.config.resolve(key) if isinstance(key, str) else None,
            )
        elif not all(isinstance(f, list) for f in feats):
            raise _Refused(
                400,
                reasons.MALFORMED,
                "each action's features must be a list of numbers, or of feature "
                "objects (Personalizer's)",
            )
        elif len({len(f) for f in feats}) > 1:
            raise _Refused(400, reasons.BAD_DIMENSION, "the actions' features differ in length")
        r = decider.rank(event_id, key, ids, feats, timestamp_ms=_timestamp(doc))
        spec = decider.config.resolve(key)
        probs = action_probabilities(r.scores, spec.epsilon)
        order = [r.arm_index] + [k for k in range(len(ids)) if k != r.arm_index]
        return web.json_response(
            {
                "eventId": r.event_id,
                "rewardActionId": r.arm_id,
                "modelKey": r.model_key,
                "modelVersion": r.model_version,
                # Excluded actions last, with probability 0, as Personalizer ranks them.
                "ranking": [{"id": ids[k], "probability": float(probs[k])} for k in order]
                + [
                    {"id": e, "probability": 0.0}
                    for e in excluded
                    if e in {a.get("id") for a in actions}
                ],
                "scores": {ids[k]: _finite(r.scores[k]) for k in range(len(ids))},
            }
        )

    async def reward(request: web.Request) -> web.Response:
        doc = await body(request)
        if "value" not in doc:
            raise _Refused(400, reasons.MALFORMED, "a reward needs a value")
        value = doc["value"]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Refused(400, reasons.NON_FINITE_REWARD, f"value must be a number, got {value!r}")
        decider.reward(
            request.match_info["event_id"],
            value,
            model_key=doc.get("modelKey"),
            timestamp_ms=_timestamp(doc),
        )
        return web.Response(status=204)

    async def activate(request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def metrics_page(request: web.Request) -> web.Response:
        return web.Response(
            body=generate_latest(_Registry(metrics)), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def ready(request: web.Request) -> web.Response:
        is_ready = getattr(decider, "is_ready", None)  # a replica: caught up, and not stale
        if is_ready is not None and not is_ready():
            return web.Response(
                status=503, text="not ready: reading the learners' log, or too far behind it\n"
            )
        return web.Response(text="ok\n")

    # The routes' names are what the gate's scopes and open paths name (serving/auth.py).
    app = web.Application(
        client_max_size=max_body_bytes, middlewares=[guard] if gate is not None else []
    )
    app.router.add_post("/rank", answer("rank", rank), name="rank")
    app.router.add_post("/events/{event_id}/reward", answer("reward", reward), name="reward")
    app.router.add_post(
        "/events/{event_id}/activate", answer("activate", activate), name="activate"
    )
    app.router.add_get("/metrics", metrics_page, name="metrics")
    app.router.add_get("/healthz", ok, name="healthz")
    app.router.add_get("/ready", ready, name="ready")
    return app


class _Registry:
    def __init__(self, collector: _Metrics) -> None:
        self._collector = collector

    def collect(self):
        return self._collector.collect()


def _feature_objects(features: Any) -> bool:
    """Whether an action's features are Personalizer's: a non-empty list of objects."""
    return (
        isinstance(features, list) and bool(features) and all(isinstance(f, dict) for f in features)
    )


def _hashed(context_features: Any, action_features: list, spec: Any) -> np.ndarray:
    """Personalizer's feature objects as the model's vectors: hashed into its dimension as the
    DSJSON reader hashes a logged event (replay/dsjson.py, ``rank_request_vectors``)."""
    from streambandit.replay.dsjson import rank_request_vectors
    from streambandit.replay.logged import LogError

    if spec is None:
        return np.zeros((len(action_features), 1))  # the Decider refuses the key (unknown_model)
    if not all(_feature_objects(f) or f == [] for f in action_features):
        raise _Refused(
            400,
            reasons.MALFORMED,
            "with contextFeatures or feature objects, every action's features "
            "must be a list of objects",
        )
    try:
        return rank_request_vectors(context_features, action_features, dim=spec.dim)
    except LogError as exc:
        raise _Refused(400, reasons.MALFORMED, str(exc)) from None
    except ValueError as exc:  # a dimension the hashing does not take
        raise _Refused(
            400, reasons.BAD_DIMENSION, f"the model's dimension cannot hold hashed features: {exc}"
        ) from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _timestamp(doc: dict[str, Any]) -> int | None:
    ts = doc.get("timestampMs")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int)):
        raise _Refused(400, reasons.MALFORMED, f"timestampMs must be an integer, got {ts!r}")
    return ts


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


async def _saver(decider: Decider, path: Path, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        decider.save(path)


def _listening(
    host: str, port: int, gate: auth.Gate | None, ssl_context: ssl.SSLContext | None
) -> tuple[str, str]:
    """The start-up line's address and who may call (keys by name, never a key); warns of keys
    sent in clear text."""
    warning = auth.plain_http_warning(host, gate is not None, ssl_context is not None)
    if warning is not None:
        log.warning("api: %s", warning)
    url = f"{'https' if ssl_context is not None else 'http'}://{host}:{port}"
    if gate is None:
        return url, "no API keys"
    return url, (
        "API keys "
        + ", ".join(f"{k.name} ({','.join(sorted(k.scopes))})" for k in gate.keys)
        + "; open without a key: "
        + (", ".join(f"/{p}" for p in sorted(gate.open_paths)) or "nothing")
        + "; per key: "
        + (f"{gate.rate_per_s:g}/s, burst {gate.burst}" if gate.rate_per_s else "no limit")
    )


def _say_on_startup(app: web.Application, *line: Any) -> None:
    """Log the start-up line as the app's last start-up step, which aiohttp runs after it has set
    its SIGINT/SIGTERM handlers: a supervisor that signals as soon as it reads the line gets a
    clean stop (the state saved), not the signal's default action."""

    async def say(app: web.Application) -> None:
        log.info(*line)

    app.on_startup.append(say)


def serve_replica(
    replica: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    model_key: str | None = None,
    gate: auth.Gate | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve a :class:`streambandit.serving.replica.Replica` until interrupted: it starts reading
    the learners' log at once, and /ready answers 200 (and /rank decides) once it has caught up.
    ``gate``: the API keys (None: none); ``ssl_context``: serve HTTPS."""
    app = make_app(replica, model_key=model_key, gate=gate)

    async def start_replica(app: web.Application) -> None:
        replica.start(None)

    async def close_replica(app: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, replica.close)

    app.on_startup.append(start_replica)
    app.on_cleanup.append(close_replica)
    url, who = _listening(host, port, gate, ssl_context)
    _say_on_startup(
        app,
        "api: serving on %s, a replica of group %s; %s",
        url,
        replica.worker_config.group_id,
        who,
    )
    web.run_app(app, host=host, port=port, ssl_context=ssl_context, print=None, access_log=None)


def serve_api(
    models: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    model_key: str | None = None,
    snapshot: str | Path | None = None,
    save_every_s: float = 30.0,
    max_models: int = DEFAULT_MAX_MODELS,
    gate: auth.Gate | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Serve until interrupted (SIGINT, SIGTERM); with ``snapshot``, load it if it exists, save it
    every ``save_every_s`` seconds and on the way out. ``max_models``: the most model keys served
    (clients name them; each costs a model's state). ``gate``: the API keys (None: none);
    ``ssl_context``: serve HTTPS."""
    path = Path(snapshot) if snapshot is not None else None
    decider = (
        Decider.load(models, path, max_models=max_models)
        if path is not None and path.exists()
        else Decider(models, max_models=max_models)
    )
    app = make_app(decider, model_key=model_key, gate=gate)

    async def start_saver(app: web.Application) -> None:
        if path is not None:
            app["saver"] = asyncio.create_task(_saver(decider, path, save_every_s))

    async def save_at_exit(app: web.Application) -> None:
        if path is not None:
            app["saver"].cancel()
            decider.save(path)
            log.info("api: state saved to %s", path)

    app.on_startup.append(start_saver)
    app.on_cleanup.append(save_at_exit)
    url, who = _listening(host, port, gate, ssl_context)
    _say_on_startup(
        app,
        "api: serving on %s (models %s%s); %s",
        url,
        models,
        f", snapshot {path}" if path is not None else "",
        who,
    )
    started = time.monotonic()
    web.run_app(app, host=host, port=port, ssl_context=ssl_context, print=None, access_log=None)
    log.info("api: stopped after %.0f s", time.monotonic() - started)
