"""No credential comes out of any command: credentials given each way a configuration takes
them (an environment variable, a ``_FILE`` variable, ``{ file = PATH }`` in the file) never
appear in a log line (text or JSON), an error line, /metrics, a dead letter, ``--print-config``,
``status``, ``topics`` or ``export``, while the worker serves traffic with a bad record in it and
a command fails on a bad security setting whose error librdkafka writes with the credential.
The api's keys, and the wrong keys clients present, appear in nothing the api writes either."""

import json
import os
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest

from streambandit.stream.errors import NOT_AUTHORIZED_EXIT
from streambandit.wire import Context

from .helpers import (
    get,
    producer,
    read_all,
    send,
    serve_config,
    serve_process,
    stop_processes,
    wait_for,
)

pytestmark = pytest.mark.integration


def cli(*args, env, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "streambandit", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What is masked is the clients' and the commands' doing, not the broker's: the embedded broker
# only (it passes on Apache Kafka too, --broker=kafka, in another 25 s of the CI's time).
@pytest.mark.brokers("tansu")
def test_no_credential_appears_in_anything_the_commands_write(broker, topics, tmp_path):
    tag = uuid.uuid4().hex[:12]
    # librdkafka takes these on a plaintext connection and has no use for them.
    by_env, by_file, by_toml = (f"{way}-{tag}" for way in ("by-env", "by-file", "by-toml"))
    secrets = [by_env, by_file, by_toml]
    (tmp_path / "key-password").write_text(by_file + "\n")
    (tmp_path / "client-secret").write_text(by_toml + "\n")
    cfg = tmp_path / "w.toml"
    cfg.write_text(
        serve_config(f"g-secrets-{tag}", tmp_path / "snaps", topics).replace(
            "[kafka.producer]",
            f'[kafka.consumer]\n"sasl.oauthbearer.client.secret" = '
            f'{{ file = "{tmp_path / "client-secret"}" }}\n\n[kafka.producer]',
        )
    )
    env = {
        "STREAMBANDIT_KAFKA__SASL_PASSWORD": by_env,
        "STREAMBANDIT_KAFKA__SSL_KEY_PASSWORD_FILE": str(tmp_path / "key-password"),
    }
    at = ["--config", cfg, "--bootstrap-servers", broker.bootstrap_servers]
    written = []  # everything any command wrote

    printed = cli("serve", *at, "--print-config", env=env)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.count('= "********"') == 3  # the three, masked
    written.append(printed.stdout + printed.stderr)

    described = cli("topics", "describe", *at, "--log-format", "json", env=env)
    assert described.returncode == 0, described.stderr
    written.append(described.stdout + described.stderr)

    prod, rng = producer(broker), np.random.default_rng(0)
    for i in range(6):
        send(
            prod,
            topics.contexts,
            Context(f"e{i}", f"m-{i % 2}", 1000 + i, ("a", "b"), rng.standard_normal((2, 3))),
        )
    send(prod, topics.contexts, None, key=b"m-0", raw=b"not a record")  # dead-lettered
    prod.flush()
    port = free_port()
    log = tmp_path / "serve.log"
    args = ("--log-format", "json", "--metrics-port", str(port))
    proc = serve_process(broker, cfg, "w-secrets", log, args=args, env=env)
    try:
        served = wait_for(
            lambda: (
                len(read_all(broker, topics.actions)) >= 6
                and len(read_all(broker, topics.dead_letter)) >= 1
            ),
            timeout_s=60,
        )
        assert served, log.read_text()[-3000:]
        status, metrics = get(port, "/metrics")
        assert status == 200 and "streambandit_worker_info" in metrics
        written.append(metrics)
        for command in (
            ("status", *at, "--log-format", "json"),
            ("export", *at, "--out", tmp_path / "out.avro"),
        ):
            out = cli(*command, env=env)
            assert out.returncode == 0, out.stderr
            written.append(out.stdout + out.stderr)
    finally:
        written += stop_processes(proc)
    lines = log.read_text().splitlines()
    assert [json.loads(line)["level"] for line in lines]  # every line JSON, and there are some
    assert any("worker started" in line for line in lines)
    written.append("\n".join(lines))
    dead = [m.value() + (m.key() or b"") for m in read_all(broker, topics.dead_letter)]
    assert dead
    written.append(b"".join(dead).decode("utf-8", "replace"))

    # A bad security setting: librdkafka's error echoes the credential it cannot parse, and the
    # command exits on it (one error line, exit 1) in either log format.
    (tmp_path / "oauth").write_text(f"principal=p {tag}-oauth\n")
    secrets.append(f"{tag}-oauth")
    bad = env | {
        "STREAMBANDIT_KAFKA__SECURITY_PROTOCOL": "sasl_plaintext",
        "STREAMBANDIT_KAFKA__SASL_MECHANISM": "OAUTHBEARER",
        "STREAMBANDIT_KAFKA__ENABLE_SASL_OAUTHBEARER_UNSECURE_JWT": "true",
        "STREAMBANDIT_KAFKA__SASL_OAUTHBEARER_CONFIG_FILE": str(tmp_path / "oauth"),
        "STREAMBANDIT_WORKER__BROKER_WAIT_S": "2",
    }
    failing = [  # at once: each waits broker_wait_s
        subprocess.Popen(
            [sys.executable, "-m", "streambandit", "serve", *map(str, at), "--log-format", fmt],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **bad},
        )
        for fmt in ("text", "json")
    ]
    for proc in failing:
        out, err = proc.communicate(timeout=120)
        # librdkafka reports the token it cannot make as an authentication failure (exit 3).
        assert proc.returncode == NOT_AUTHORIZED_EXIT, err
        assert "sasl.oauthbearer.config beginning at: ********" in err
        written.append(out + err)

    for text in written:
        assert not [s for s in secrets if s in text], text[-3000:]


def _call(url: str, headers: dict, body=None) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, headers={"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_no_api_key_appears_in_anything_the_api_writes(tmp_path):
    """The api's keys (one from the key file, one inline in the environment) and the wrong keys
    clients present appear in no log line (JSON), refusal, metric or error line; a key file with
    a bad line says where, not what."""
    import signal
    import time

    tag = uuid.uuid4().hex[:12]
    ranker, scraper = f"ranker-key-{tag}", f"scraper-key-{tag}"
    wrong = [f"wrong-key-{tag}", f"{ranker}x", ranker[:-1]]
    secrets = [ranker, scraper, *wrong]
    models = tmp_path / "models.toml"
    models.write_text(
        '[[models]]\nmatch = "ads"\npolicy = "oful"\ndim = 3\nreward_window_ms = 1000\n'
        "default_reward = 0.0\n"
    )
    keys = tmp_path / "keys"
    keys.write_text(f"ad-server rank,reward {ranker}\nprometheus metrics {scraper}\n")
    port = free_port()
    log = tmp_path / "api.log"
    written = []
    cmd = [sys.executable, "-m", "streambandit", "api", "--models", str(models)]
    cmd += ["--model-key", "ads", "--port", str(port), "--log-format", "json"]
    env = {**os.environ, "STREAMBANDIT_API_KEYS_FILE": str(keys)}
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env)
    try:
        assert wait_for(
            lambda: proc.poll() is not None or "api: serving" in log.read_text(), timeout_s=60
        ), log.read_text()
        assert proc.poll() is None, log.read_text()
        url = f"http://127.0.0.1:{port}"
        rank = {"eventId": "e1", "actions": [{"id": "a", "features": [1.0, 0.0, 0.0]}]}
        ok = {"Ocp-Apim-Subscription-Key": ranker}
        for headers, path, body, status in [
            (ok, "/rank", rank, 200),
            ({"Authorization": f"Bearer {ranker}"}, "/events/e1/reward", {"value": 1.0}, 204),
            (ok, "/metrics", None, 403),  # not its scope
            *(({"Authorization": f"Bearer {w}"}, "/rank", rank, 401) for w in wrong),
            ({"Ocp-Apim-Subscription-Key": wrong[0]}, "/metrics", None, 401),
        ]:
            got, text = _call(url + path, headers, body)
            assert got == status, (path, got, text)
            written.append(text)
        got, metrics = _call(url + "/metrics", {"Authorization": f"Bearer {scraper}"})
        assert got == 200 and 'key="ad-server"' in metrics, metrics
        written.append(metrics)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
    lines = log.read_text().splitlines()
    assert [json.loads(line)["level"] for line in lines]
    assert any("ad-server" in line for line in lines)  # keys are named by their names
    written += lines

    # A key file with a bad line: the error says which line, never the secret on it.
    keys.write_text(f"ad-server rank,nosuchscope {ranker}\n")
    started = time.monotonic()
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert bad.returncode == 2 and f"{keys}:1" in bad.stderr, bad.stderr
    assert time.monotonic() - started < 60
    written.append(bad.stdout + bad.stderr)

    for text in written:
        assert not [s for s in secrets if s in text], text[-3000:]
