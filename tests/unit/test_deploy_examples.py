"""The examples in deploy/ cannot drift from the code: their configurations load with the real
loader, compose creates the topics of the file its workers read, and the probes, the scrape
annotation and the image's HEALTHCHECK point at the port the worker serves."""

import re
import textwrap
import tomllib
from pathlib import Path

import pytest

from streambandit.config.app import parse_worker_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def k8s_worker_toml() -> str:
    text = (DEPLOY / "k8s" / "streambandit.yaml").read_text()
    block = re.search(r"worker\.toml: \|\n((?:    .*\n|\n)+)", text).group(1)
    return textwrap.dedent(block)


@pytest.mark.parametrize(
    "name, text",
    [
        ("deploy/worker.toml", (DEPLOY / "worker.toml").read_text()),
        ("deploy/k8s ConfigMap", k8s_worker_toml()),
    ],
)
def test_example_configurations_load(name, text):
    config, snapshots = parse_worker_config(tomllib.loads(text), source=name)
    assert snapshots.topic == "streambandit-snapshots"
    assert config.models.resolve("ads-homepage") is not None
    assert config.models.resolve("ads-homepage").build().dim == 20


def test_the_manifests_credentials_come_from_a_secret_as_settings_the_worker_reads():
    from streambandit.config.environment import apply_environment
    from streambandit.config.secret_files import read_file_settings
    from streambandit.redaction import is_secret

    manifest = (DEPLOY / "k8s" / "streambandit.yaml").read_text()
    names = re.findall(r"- name: (STREAMBANDIT_\w+)\n\s+valueFrom: \{secretKeyRef", manifest)
    assert names == ["STREAMBANDIT_KAFKA__SASL_USERNAME"]
    mount = re.search(r"\{name: kafka-credentials, mountPath: (\S+), readOnly: true\}", manifest)
    assert re.search(
        r"- name: kafka-credentials\n\s+secret: \{secretName: streambandit-kafka, optional: true",
        manifest,
    )
    # The ConfigMap holds no credential; its SASL lines, uncommented, read the password from the
    # file the Secret's key (kubectl create secret ... --from-file=sasl-password=) becomes.
    toml = k8s_worker_toml()
    assert not [k for k in tomllib.loads(toml)["kafka"] if is_secret(k)]
    with_sasl = re.sub(r'(?m)^# ("[\w.]+" = .*)$', r"\1", toml)
    files = {
        f"{mount.group(1)}/{key}": "pw" for key in re.findall(r"--from-file=([\w-]+)=", manifest)
    }
    raw = read_file_settings(tomllib.loads(with_sasl), read=lambda path: files[path])
    raw = apply_environment(raw, {n: "user" for n in names})
    config, _ = parse_worker_config(raw)
    assert config.kafka["sasl.username"] == "user" and config.kafka["sasl.password"] == "pw"
    assert config.kafka["security.protocol"] == "SASL_SSL"


def test_compose_creates_the_topics_of_the_configuration_its_workers_read():
    compose = (DEPLOY / "docker-compose.yml").read_text()
    created = re.search(r'command: \["topics", "create", "--config", "([^"]+)"', compose).group(1)
    served = re.search(r'command: \["serve", "--config", "([^"]+)"', compose).group(1)
    assert created == served == "/etc/streambandit/worker.toml"


def test_probes_scrapes_and_healthcheck_use_the_port_the_worker_serves():
    manifest = (DEPLOY / "k8s" / "streambandit.yaml").read_text()
    port = re.search(r'"--metrics-port", "(\d+)"', manifest).group(1)
    assert f"containerPort: {port}" in manifest and f'prometheus.io/port: "{port}"' in manifest
    assert "httpGet: {path: /healthz, port: metrics}" in manifest
    assert "httpGet: {path: /ready, port: metrics}" in manifest
    docker = (DEPLOY / "Dockerfile").read_text()
    cmd_port = re.search(r'CMD \[.*"--metrics-port", "(\d+)"', docker).group(1)
    assert f"127.0.0.1:{cmd_port}/healthz" in docker and f"EXPOSE {cmd_port}" in docker
    assert (
        "USER 10001" in docker
        and "NUMBA_CACHE_DIR" in docker
        and "streambandit.cli.warmup" in docker
    )


def test_the_dashboard_and_the_operations_guide_name_only_metrics_the_worker_serves():
    import json

    from prometheus_client.exposition import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from streambandit import Decider
    from streambandit.serving.api import _Metrics, _Registry
    from streambandit.stream.telemetry import render_metrics
    from tests.unit.stream.test_telemetry import status

    served = {
        f.name
        for f in text_string_to_metric_families(
            render_metrics(status(**{"dead_letter.malformed": 1}), ready=True).decode()
        )
    }
    # The guide names the api's too (*The api's keys*), as it serves them with a key configured.
    models = {
        "models": [
            {"match": "m", "policy": "oful", "dim": 2, "reward_window_ms": 1, "default_reward": 0.0}
        ]
    }
    api_page = generate_latest(_Registry(_Metrics(Decider(models), ["a-key"]))).decode()
    api_served = {f.name for f in text_string_to_metric_families(api_page)}
    dashboard = json.loads((DEPLOY / "grafana" / "streambandit.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    guide = (DEPLOY.parent / "docs" / "operations.md").read_text()
    for where, text, ok in (
        ("dashboard", exprs, served),
        ("docs/operations.md", guide, served | api_served),
    ):
        named = {
            re.sub(r"_(bucket|count|sum|total)$", "", n)
            for n in re.findall(r"streambandit_[a-z_]+", text)
        }
        assert named - {"streambandit_"} <= ok, (where, named - ok)
    # The guide's metric table lists every family served, by its name without the prefix.
    table = {re.sub(r"_total$", "", m) for m in re.findall(r"^\| `([a-z_]+)", guide, flags=re.M)}
    table |= {m for m in re.findall(r"`(snapshot_last_[a-z_]+)`", guide)}
    ours = {n for n in served if n.startswith("streambandit_")}
    assert {n.removeprefix("streambandit_") for n in ours} <= table, ours - {
        f"streambandit_{t}" for t in table
    }
    # The process's own families (prometheus_client's collectors) are named too.
    process = served - ours
    assert process and all(f"`{n}" in guide for n in process), process


def test_every_dashboard_query_is_scoped_by_the_job_and_instance_variables():
    import json

    dashboard = json.loads((DEPLOY / "grafana" / "streambandit.json").read_text())
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"job", "instance"} <= variables
    selectors = 0
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            # Every series the query reads, each with both matchers.
            for m in re.finditer(r"\b(?:streambandit|process)_[a-z_]+(\{[^}]*\})?", target["expr"]):
                assert m.group(1) and 'job=~"$job"' in m.group(1), (panel["title"], m.group())
                assert 'instance=~"$instance"' in m.group(1), (panel["title"], m.group())
                selectors += 1
    assert selectors >= len(dashboard["panels"])
