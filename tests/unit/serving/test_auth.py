"""The api's keys, scopes, budgets and listening rule as pure logic (serving/auth.py, tls.py)."""

import hashlib
import math

import pytest

from streambandit.serving import auth
from streambandit.serving.tls import server_context

SECRET_A = "a" * 15 + "Z0-._~+/"
SECRET_B = "b" * 20 + "=="
FILE = f"""# name scopes secret
ranker rank,reward {SECRET_A}

scraper metrics sha256:{hashlib.sha256(SECRET_B.encode()).hexdigest()}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_file_gives_names_scopes_and_digests_and_a_digest_entry_stands_for_its_secret():
    keys = auth.parse_keys(FILE.splitlines(), "keys.txt")
    assert [(k.name, sorted(k.scopes)) for k in keys] == [
        ("ranker", ["rank", "reward"]),
        ("scraper", ["metrics"]),
    ]
    gate = auth.Gate(keys)
    assert gate.identify(SECRET_A).name == "ranker" and gate.identify(SECRET_B).name == "scraper"
    # The secret is not kept, nor shown by the object.
    assert SECRET_A not in repr(keys) and SECRET_A not in repr(vars(keys[0]))


def test_every_bad_entry_is_one_line_with_its_file_and_line_and_never_the_secret():
    secret = "s3cr3t-s3cr3t-s3cr3t"
    lines = [
        "ok rank " + SECRET_A,
        "two-fields rank",
        "bad/name rank " + secret + "1",
        "x rnak " + secret + "2",
        "y rank short",
        "z rank has;semicolon-in-it",
        # Fields in the wrong order: the secret lands where a name or a scope is quoted.
        f"{secret}3 rank name",
        f"w {secret}4 rank",
        "ok reward " + secret + "5",  # the name again
        "dup rank " + SECRET_A,  # the secret again
    ]
    with pytest.raises(ValueError) as err:
        auth.parse_keys(lines, "keys.txt")
    got = str(err.value).splitlines()
    assert got[0] == "bad API keys:"
    assert [line.split(":")[1] for line in got[1:]] == [str(n) for n in range(2, 11)]
    assert all(line.startswith("keys.txt:") for line in got[1:])
    text = str(err.value)
    assert secret not in text and SECRET_A not in text
    assert "three fields" in got[1] and "the name" in got[2] and "unknown scope 'rnak'" in got[3]
    assert "the secret is not 16 to 256" in got[4] and "the secret is not" in got[5]
    assert "also on entry 1" in got[8] and "the same secret as entry 1" in got[9]


def test_no_entry_at_all_is_refused():
    with pytest.raises(ValueError, match="keys.txt: no API key in it"):
        auth.parse_keys(["# only a comment", ""], "keys.txt")


def test_keys_come_from_the_option_the_file_variable_or_inline_but_not_two_places(tmp_path):
    f = tmp_path / "keys"
    f.write_text(FILE)
    assert auth.load_keys(None, {}) is None
    assert len(auth.load_keys(str(f), {})) == 2
    assert len(auth.load_keys(None, {"STREAMBANDIT_API_KEYS_FILE": str(f)})) == 2
    inline = {"STREAMBANDIT_API_KEYS": f"a rank {SECRET_A}; b admin {SECRET_B}"}
    assert [k.name for k in auth.load_keys(None, inline)] == ["a", "b"]
    with pytest.raises(ValueError, match="give one"):
        auth.load_keys(str(f), inline)
    with pytest.raises(ValueError, match=r"^\$STREAMBANDIT_API_KEYS:2: unknown scope"):
        try:
            auth.load_keys(None, {"STREAMBANDIT_API_KEYS": f"a rank {SECRET_A}\nb nope {SECRET_B}"})
        except ValueError as exc:
            raise ValueError(str(exc).splitlines()[1]) from None
    with pytest.raises(ValueError, match="cannot read it"):
        auth.load_keys(str(tmp_path / "missing"), {})


@pytest.mark.parametrize(
    "authorization, subscription, want",
    [
        ("Bearer k1", None, "k1"),
        ("bearer   k1 ", None, "k1"),
        (None, "k1", "k1"),
        ("Bearer k1", "k1", "k1"),
        ("Bearer k1", "k2", None),  # two keys that differ: neither
        ("Basic dXNlcjpwYXNz", None, None),
        ("Bearer", None, None),
        ("Bearer k1 k2", None, None),
        (None, "", None),
        (None, None, None),
    ],
)
def test_the_presented_key_is_a_bearer_token_or_personalizers_header(
    authorization, subscription, want
):
    assert auth.presented_key(authorization, subscription) == want


def test_a_key_is_compared_with_every_configured_key_whichever_matches(monkeypatch):
    keys = [
        auth.ApiKey(f"k{i}", frozenset({"rank"}), hashlib.sha256(f"{i:020d}".encode()).digest())
        for i in range(5)
    ]
    gate = auth.Gate(keys)
    calls = []
    real = auth.hmac.compare_digest

    def counted(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counted)
    for presented, want in ((f"{0:020d}", "k0"), (f"{4:020d}", "k4"), ("x" * 20, None)):
        calls.clear()
        got = gate.identify(presented)
        assert (got.name if got else None) == want
        # Every key's digest, compared with the presented key's digest (never the key itself).
        assert [b for _, b in calls] == [k.digest for k in keys]
        assert {a for a, _ in calls} == {hashlib.sha256(presented.encode()).digest()}
    # One character off, at either end, is not the key.
    assert gate.identify(f"{0:020d}"[:-1] + "9") is None
    assert gate.identify("9" + f"{0:020d}"[1:]) is None


def test_scopes_open_paths_and_the_order_of_refusals():
    keys = auth.parse_keys(
        [f"ranker rank,reward {SECRET_A}", f"scraper metrics {SECRET_B}", "root admin " + "r" * 16],
        "k",
    )
    gate = auth.Gate(keys, rate_per_s=0)
    bearer = f"Bearer {SECRET_A}"
    check = gate.check
    assert (
        check("healthz", None, None) == auth.Verdict() and check("ready", None, None).status == 200
    )
    for route in ("rank", "reward", "activate", "metrics", None):
        v = check(route, None, None)
        assert (v.status, v.refusal, v.key) == (401, "unauthenticated", None)
        assert check(route, "Bearer " + "w" * 20, None).status == 401
    assert check("rank", bearer, None) == auth.Verdict(None, "ranker")
    assert check("activate", None, SECRET_A).status == 200
    v = check("metrics", bearer, None)
    assert (v.status, v.refusal, v.key) == (403, "forbidden", "ranker")
    assert check("rank", f"Bearer {SECRET_B}", None).status == 403
    assert check("metrics", f"Bearer {SECRET_B}", None).status == 200
    assert all(check(r, "Bearer " + "r" * 16, None).status == 200 for r in ("rank", "metrics"))
    assert check(None, bearer, None).status == 200  # any key reaches the 404 of an unknown path
    # The message says nothing of which key or scope.
    assert len({check("rank", h, None).message for h in (None, "Bearer x", "Basic y")}) == 1
    closed = auth.Gate(keys, open_paths=auth.parse_open_paths(""), rate_per_s=0)
    assert closed.check("healthz", None, None).status == 401
    assert closed.check("healthz", bearer, None).status == 200
    opened = auth.Gate(keys, open_paths=auth.parse_open_paths("healthz, /ready,metrics"))
    assert opened.check("metrics", None, None).status == 200
    with pytest.raises(ValueError, match="'rank' cannot be open"):
        auth.parse_open_paths("healthz,rank")


def test_a_key_over_its_budget_is_told_when_to_retry_and_other_keys_are_not_held_back():
    clock = Clock()
    keys = auth.parse_keys([f"a rank {SECRET_A}", f"b rank {SECRET_B}"], "k")
    gate = auth.Gate(keys, rate_per_s=0.4, burst=3, clock=clock)
    a, b = f"Bearer {SECRET_A}", f"Bearer {SECRET_B}"
    assert [gate.check("rank", a, None).status for _ in range(3)] == [200] * 3
    v = gate.check("rank", a, None)
    assert (v.status, v.refusal, v.key, v.retry_after_s) == (429, "rate_limited", "a", 3)
    assert gate.check("rank", b, None).status == 200  # a bucket per key
    clock.now += 2.0  # 0.8 of a token: not yet
    assert gate.check("rank", a, None).retry_after_s == 1
    clock.now += 0.5  # 1.0
    assert gate.check("rank", a, None).status == 200
    assert gate.check("rank", a, None).status == 429
    # Refused requests (forbidden) take nothing from the budget.
    clock.now += 1000
    assert all(gate.check("metrics", a, None).status == 403 for _ in range(10))
    assert [gate.check("rank", a, None).status for _ in range(4)] == [200, 200, 200, 429]


def test_a_bucket_refills_at_its_rate_up_to_its_burst():
    clock = Clock()
    bucket = auth.TokenBucket(10.0, 5, clock)
    assert [bucket.take() for _ in range(5)] == [0.0] * 5
    assert bucket.take() == pytest.approx(0.1)
    clock.now += 0.25  # 2.5 tokens
    assert [bucket.take() == 0.0 for _ in range(3)] == [True, True, False]
    clock.now += 3600
    assert sum(bucket.take() == 0.0 for _ in range(10)) == 5
    assert math.isclose(bucket.take(), 0.1)


def test_budget_settings_are_checked():
    keys = auth.parse_keys([f"a rank {SECRET_A}"], "k")
    with pytest.raises(ValueError, match="--rate-limit -1 --burst 5"):
        auth.Gate(keys, rate_per_s=-1, burst=5)
    with pytest.raises(ValueError, match="burst >= 1"):
        auth.Gate(keys, rate_per_s=5, burst=0)
    assert auth.Gate(keys, rate_per_s=0, burst=0).buckets == {}  # no limit


@pytest.mark.parametrize(
    "host, loopback",
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.20", False),
        ("10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("my-host", False),  # a name could resolve to anything
        ("", False),
    ],
)
def test_only_a_loopback_address_is_served_without_keys_unless_insecure(host, loopback):
    assert auth.is_loopback(host) is loopback
    refusal = auth.listen_refusal(host, have_keys=False, insecure=False)
    assert (refusal is None) is loopback
    if refusal is not None:
        assert refusal.startswith(f"--host {host}: not a loopback address") and "--insecure" in (
            refusal
        )
    assert auth.listen_refusal(host, have_keys=True, insecure=False) is None
    assert auth.listen_refusal(host, have_keys=False, insecure=True) is None
    warning = auth.plain_http_warning(host, have_keys=True, tls=False)
    assert (warning is None) is loopback
    assert auth.plain_http_warning(host, have_keys=True, tls=True) is None
    assert auth.plain_http_warning(host, have_keys=False, tls=False) is None


def test_tls_needs_a_certificate_and_its_key_that_load(tmp_path):
    assert server_context(None, None) is None
    with pytest.raises(ValueError, match="go together"):
        server_context("cert.pem", None)
    (tmp_path / "bad.pem").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="cannot load them"):
        server_context(str(tmp_path / "bad.pem"), str(tmp_path / "bad.pem"))
    with pytest.raises(ValueError, match="cannot load them"):
        server_context(str(tmp_path / "none.pem"), str(tmp_path / "none.pem"))


def test_the_key_file_of_docs_security_parses_as_it_says():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    block = text.split("```\n# name")[1].split("```")[0]
    keys = auth.parse_keys(("# name" + block).splitlines(), "docs/security.md")
    assert [(k.name, sorted(k.scopes)) for k in keys] == [
        ("ad-server", ["rank", "reward"]),
        ("prometheus", ["metrics"]),
    ]
    assert auth.Gate(keys).identify("Qm9vbXRvd24tY2xpZW50LWtleS0wMDAx").name == "ad-server"
