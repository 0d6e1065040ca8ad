"""No credential comes out of any command: credentials given each way a configuration takes
them (an environment variable, a ``_FILE`` variable, ``{ file = PATH }`` in the file) never
appear in a log line (text or JSON), an error line, /metrics, a dead letter, ``--print-config``,
``status``, ``topics`` or ``export``, while the worker serves traffic with a bad record in it and
a command fails on a bad security setting whose error librdkafka writes with the credential."""

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
