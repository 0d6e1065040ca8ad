"""The alerting rules of deploy/prometheus/alerts.yml cannot drift from the code or the guide:
every expression names only series the worker exports (read from what its /metrics renders), each
alert is the one docs/operations.md names, and, where Prometheus's ``promtool`` is installed, the
rules and the Prometheus configuration load and each alert fires on the series its unit tests
(alerts_test.yml) feed it."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streambandit.stream.telemetry import render_metrics
from tests.unit.stream.test_telemetry import status

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"

# Words of PromQL that are not series: operators, modifiers, and Prometheus's own ``up``.
KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right"}
PROMETHEUS_SERIES = {"up"}


def rules() -> dict[str, str]:
    """alert name -> its expression, read from the file's two shapes of ``expr``: one line, or a
    folded block (``>-``) of the lines indented below it."""
    out: dict[str, str] = {}
    lines = RULES.read_text().splitlines()
    name = None
    for i, line in enumerate(lines):
        if m := re.match(r"\s*- alert: (\w+)$", line):
            name = m.group(1)
        elif m := re.match(r"(\s*)expr: (.*)$", line):
            indent, value = len(m.group(1)), m.group(2).strip()
            if value == ">-":
                block = []
                for more in lines[i + 1 :]:
                    if len(more) - len(more.lstrip()) <= indent:
                        break
                    block.append(more.strip())
                value = " ".join(block)
            assert name is not None and name not in out, line
            out[name] = value
    return out


def series_named(expr: str) -> set[str]:
    """The series names in a PromQL expression: what is left once strings, label matchers,
    ranges, grouping clauses, functions and keywords are taken out."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if e[m.end() :].lstrip().startswith("(") or m.group() in KEYWORDS:
            continue  # a function, or an operator
        names.add(m.group())
    return names


def exported() -> set[str]:
    """Every series name the worker's /metrics shows (with the suffixes _total, _bucket, ...)."""
    text = render_metrics(status(**{"dead_letter.malformed": 1}), ready=True).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_expression_reader_finds_series_and_only_series():
    assert series_named(
        'sum by (job, reason) (rate(a_total{x="b c"}[5m])) / ignoring (reason) group_left '
        "sum by (job) (rate(b_total[5m])) > 0.01 and deriv(c[10m:1m]) > 0"
    ) == {"a_total", "b_total", "c"}


def test_every_alert_names_only_series_the_worker_exports():
    found = rules()
    assert len(found) >= 10
    served = exported() | PROMETHEUS_SERIES
    for name, expr in found.items():
        named = series_named(expr)
        assert named, (name, expr)
        assert named <= served, (name, named - served)


def test_the_operations_guide_names_every_alert_and_only_those():
    guide = (DEPLOY.parent / "docs" / "operations.md").read_text()
    assert set(re.findall(r"`(Streambandit\w+)`", guide)) == set(rules())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promtool_loads_the_configuration_and_each_alert_fires_on_its_test_series():
    for args in (
        ["check", "config", str(DEPLOY / "prometheus.yml")],
        ["test", "rules", str(DEPLOY / "prometheus" / "alerts_test.yml")],
    ):
        out = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr


def test_prometheus_yml_loads_the_rules_where_compose_mounts_them():
    config = (DEPLOY / "prometheus.yml").read_text()
    [rule_file] = re.findall(r"rule_files:\n\s+- (\S+)", config)
    assert (
        DEPLOY / rule_file
    ).resolve() == RULES  # relative to prometheus.yml, as Prometheus reads it
    compose = (DEPLOY / "docker-compose.yml").read_text()
    assert '"./prometheus.yml:/etc/prometheus/prometheus.yml:ro"' in compose
    assert f'"./{rule_file}:/etc/prometheus/{rule_file}:ro"' in compose
