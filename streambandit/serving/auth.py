"""Who may call ``streambandit api``: API keys with scopes, a request budget per key, and where the
server may listen without keys. Pure logic (no HTTP server here): ``api.py`` asks
:meth:`Gate.check` about each request and answers what it says.

A key file holds one key per line, ``NAME SCOPES SECRET``; blank lines and lines starting with
``#`` are skipped::

    # name       scopes          secret (or sha256:<hex of the secret's SHA-256>)
    ad-server    rank,reward     9pQ2vX7mTt0bK4sYw1LzRfA8dHc3EuN6
    prometheus   metrics         sha256:5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8

NAME is what logs and metrics show ([A-Za-z0-9_.-], unique); SCOPES a comma-separated list of
``rank`` (POST /rank), ``reward`` (POST /events/{id}/reward and /activate), ``metrics``
(GET /metrics) and ``admin`` (every route); SECRET the key a client presents (16 to 256
characters of RFC 6750's token: letters, digits, ``-._~+/``, ``=`` at the end), or its SHA-256 as
``sha256:`` and 64 hex digits, so that the file need not hold the key itself. The same lines
can be given inline, separated by newlines or ``;`` (``$STREAMBANDIT_API_KEYS``, for containers).

A presented key is hashed (SHA-256) and its digest compared with every configured digest by
``hmac.compare_digest``, all of them whatever matched first: the time a check takes says nothing
about which key, or how much of one, was right.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import math
import re
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping

__all__ = [
    "ApiKey",
    "Gate",
    "Verdict",
    "TokenBucket",
    "parse_keys",
    "load_keys",
    "parse_open_paths",
    "presented_key",
    "listen_refusal",
    "plain_http_warning",
    "is_loopback",
    "SCOPES",
    "OPEN_PATHS",
    "DEFAULT_OPEN_PATHS",
    "DEFAULT_RATE_PER_S",
    "DEFAULT_BURST",
]

UNAUTHENTICATED, FORBIDDEN, RATE_LIMITED = "unauthenticated", "forbidden", "rate_limited"
REFUSALS = (UNAUTHENTICATED, FORBIDDEN, RATE_LIMITED)
# Fixed messages: a refusal says neither whether the key exists nor which scopes there are.
MESSAGES = {
    UNAUTHENTICATED: "a valid API key is required (Authorization: Bearer or "
    "Ocp-Apim-Subscription-Key)",
    FORBIDDEN: "this API key may not make this request",
    RATE_LIMITED: "too many requests for this API key: retry after Retry-After seconds",
}

SCOPES = ("rank", "reward", "metrics", "admin")
# The scope each route needs (``admin`` grants them all); routes not named here (health, readiness,
# and paths the server does not have) need a valid key and no particular scope.
ROUTE_SCOPE = {"rank": "rank", "reward": "reward", "activate": "reward", "metrics": "metrics"}
# The routes that may be left open, and those open unless told otherwise: probes carry no key.
OPEN_PATHS = ("healthz", "ready", "metrics")
DEFAULT_OPEN_PATHS = frozenset({"healthz", "ready"})
# A key's budget: sustained requests per second and the burst above it. One api process serves a
# few thousand requests/s on a core (bench/results/api_http.md), so one client at the default
# leaves room for others.
DEFAULT_RATE_PER_S = 1000.0
DEFAULT_BURST = 2000

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_SECRET = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
_DIGEST = re.compile(r"sha256:([0-9a-fA-F]{64})")
MIN_SECRET, MAX_SECRET = 16, 256


@dataclasses.dataclass(frozen=True)
class ApiKey:
    name: str
    scopes: frozenset[str]
    digest: bytes  # SHA-256 of the secret; the secret itself is not kept

    def allows(self, route: str | None) -> bool:
        need = ROUTE_SCOPE.get(route or "")
        return need is None or "admin" in self.scopes or need in self.scopes

    def __repr__(self) -> str:  # never the digest either: a log line of an object shows no key
        return f"ApiKey({self.name!r}, scopes={sorted(self.scopes)})"


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


def _shown(field: str) -> str:
    """A bad field as an error line quotes it: only when too short to be a secret (fields in the
    wrong order would otherwise put one in the log)."""
    return f" {field!r}" if len(field) < MIN_SECRET else ""


def parse_keys(lines: Iterable[str], source: str) -> list[ApiKey]:
    """The keys of ``lines`` (``NAME SCOPES SECRET``), or ValueError listing every bad entry, one
    line each as ``source:N: what is wrong`` (never the secret)."""
    keys: list[ApiKey] = []
    errors: list[str] = []
    names: dict[str, int] = {}
    digests: dict[bytes, int] = {}
    for n, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{source}:{n}"
        fields = text.split()
        if len(fields) != 3:
            errors.append(
                f"{where}: {len(fields)} fields; a key is NAME SCOPES SECRET, three fields"
            )
            continue
        name, scopes_text, secret = fields
        bad = []
        if not _NAME.fullmatch(name):
            bad.append(f"the name{_shown(name)} is not 1 to 64 of A-Z a-z 0-9 _ . -")
        scopes = scopes_text.split(",")
        unknown = [s for s in scopes if s not in SCOPES]
        if unknown:
            bad.append(f"unknown scope{_shown(unknown[0])} (scopes: {', '.join(SCOPES)})")
        m = _DIGEST.fullmatch(secret)
        if m:
            digest = bytes.fromhex(m.group(1))
        elif not _SECRET.fullmatch(secret) or not MIN_SECRET <= len(secret) <= MAX_SECRET:
            bad.append(
                f"the secret is not {MIN_SECRET} to {MAX_SECRET} characters of A-Z a-z 0-9 "
                "- . _ ~ + / (then =), nor sha256:<64 hex digits>"
            )
            digest = b""
        else:
            digest = _digest(secret)
        if not bad and name in names:
            bad.append(f"the name {name!r} is also on entry {names[name]}")
        if not bad and digest in digests:
            bad.append(f"the same secret as entry {digests[digest]}")
        if bad:
            errors.append(f"{where}: " + "; ".join(bad))
            continue
        names[name], digests[digest] = n, n
        keys.append(ApiKey(name, frozenset(scopes), digest))
    if errors:
        raise ValueError("bad API keys:\n" + "\n".join(errors))
    if not keys:
        raise ValueError(f"{source}: no API key in it (a key is NAME SCOPES SECRET, one a line)")
    return keys


def load_keys(file: str | None, env: Mapping[str, str]) -> list[ApiKey] | None:
    """The keys of ``file`` (``--api-keys``, else ``$STREAMBANDIT_API_KEYS_FILE``) or of
    ``$STREAMBANDIT_API_KEYS`` (inline, entries separated by newlines or ``;``); None if neither
    is set. Both set is refused: which one counts would be a guess."""
    file = file or env.get("STREAMBANDIT_API_KEYS_FILE") or None
    inline = env.get("STREAMBANDIT_API_KEYS") or None
    if file and inline:
        raise ValueError(
            "API keys from both a file (--api-keys or $STREAMBANDIT_API_KEYS_FILE) and "
            "$STREAMBANDIT_API_KEYS: give one"
        )
    if inline:
        return parse_keys(re.split(r"[;\n]", inline), "$STREAMBANDIT_API_KEYS")
    if file:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"API key file {file}: cannot read it ({exc})") from None
        return parse_keys(text.splitlines(), file)
    return None


def parse_open_paths(text: str) -> frozenset[str]:
    """``healthz,ready`` and the like: the paths served without a key ('' for none)."""
    paths = {p.strip().lstrip("/") for p in text.split(",") if p.strip()}
    unknown = sorted(paths - set(OPEN_PATHS))
    if unknown:
        raise ValueError(
            f"--open-paths: {unknown[0]!r} cannot be open (choose among {', '.join(OPEN_PATHS)})"
        )
    return frozenset(paths)


def presented_key(authorization: str | None, subscription_key: str | None) -> str | None:
    """The key a request presents (``Authorization: Bearer <key>`` or Personalizer's
    ``Ocp-Apim-Subscription-Key: <key>``), or None: no key, a header of another form, or two that
    differ."""
    bearer = None
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or " " in token:
            return None
        bearer = token
    sub = subscription_key.strip() if subscription_key is not None else None
    if (
        bearer is not None
        and sub is not None
        and not hmac.compare_digest(
            bearer.encode("utf-8", "surrogateescape"), sub.encode("utf-8", "surrogateescape")
        )
    ):
        return None
    return bearer if bearer is not None else (sub or None)


class TokenBucket:
    """``rate_per_s`` requests a second sustained, ``burst`` at once: the bucket holds up to
    ``burst`` tokens, refills at ``rate_per_s``, and each request takes one."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate_per_s, float(burst), clock
        self.tokens, self.at = float(burst), clock()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one will be there."""
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What to do with a request: serve it (``refusal`` None) or refuse it; ``key``: the name of
    the key presented, when known; ``retry_after_s``: whole seconds, for ``rate_limited``."""

    refusal: str | None = None
    key: str | None = None
    retry_after_s: int = 0

    @property
    def status(self) -> int:
        return {None: 200, UNAUTHENTICATED: 401, FORBIDDEN: 403, RATE_LIMITED: 429}[self.refusal]

    @property
    def message(self) -> str:
        return MESSAGES[self.refusal] if self.refusal else ""


class Gate:
    """The keys, the open paths and each key's bucket. ``rate_per_s`` 0: no limit."""

    def __init__(
        self,
        keys: list[ApiKey],
        *,
        open_paths: frozenset[str] = DEFAULT_OPEN_PATHS,
        rate_per_s: float = DEFAULT_RATE_PER_S,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_per_s < 0 or (rate_per_s > 0 and burst < 1):
            raise ValueError(
                f"--rate-limit {rate_per_s:g} --burst {burst}: the rate must be >= 0 (0: no "
                "limit) and the burst >= 1"
            )
        self.keys = list(keys)
        self.open_paths = open_paths
        self.rate_per_s, self.burst = rate_per_s, burst
        self.buckets = (
            {k.name: TokenBucket(rate_per_s, burst, clock) for k in self.keys}
            if rate_per_s > 0
            else {}
        )

    def identify(self, presented: str | None) -> ApiKey | None:
        """The configured key equal to ``presented``, compared with every key in constant time."""
        if presented is None:
            return None
        digest = _digest(presented)
        found = None
        for key in self.keys:  # no early exit: every check costs the same, match or not
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found

    def check(
        self, route: str | None, authorization: str | None, subscription_key: str | None
    ) -> Verdict:
        """The verdict on a request for ``route`` (the api's route name; None: no such path)
        with these headers: unauthenticated (401), then forbidden (403), then over the key's
        budget (429); only requests a key may make take from its budget."""
        if route in self.open_paths:
            return Verdict()
        key = self.identify(presented_key(authorization, subscription_key))
        if key is None:
            return Verdict(UNAUTHENTICATED)
        if not key.allows(route):
            return Verdict(FORBIDDEN, key.name)
        bucket = self.buckets.get(key.name)
        wait = bucket.take() if bucket is not None else 0.0
        if wait > 0:
            return Verdict(RATE_LIMITED, key.name, max(1, math.ceil(wait)))
        return Verdict(None, key.name)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (or ``localhost``); a name that is not an address
    literal might resolve to anything, so it counts as not loopback."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def listen_refusal(host: str, have_keys: bool, insecure: bool) -> str | None:
    """Why the api may not listen on ``host``, or None: without keys only a loopback address,
    unless ``insecure``."""
    if have_keys or insecure or is_loopback(host):
        return None
    return (
        f"--host {host}: not a loopback address, and no API key is configured, so anyone who "
        "reaches it could rank and reward; give keys (--api-keys FILE, $STREAMBANDIT_API_KEYS_FILE "
        "or $STREAMBANDIT_API_KEYS; docs/security.md), or --insecure to serve without them"
    )


def plain_http_warning(host: str, have_keys: bool, tls: bool) -> str | None:
    """The warning for keys sent in clear text: keys, no TLS, and an address others can reach."""
    if not have_keys or tls or is_loopback(host):
        return None
    return (
        f"API keys over plain HTTP on {host}: clients send them in clear text; give --tls-cert "
        "and --tls-key, or serve behind a TLS-terminating proxy (docs/security.md)"
    )
