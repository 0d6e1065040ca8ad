"""The configuration examples in deploy/ load with the real loader, and the topic script creates
every topic they name, so the examples cannot drift from the code."""

import re
import textwrap
import tomllib
from pathlib import Path

import pytest

from streambandit.stream.app_config import parse_worker_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def k8s_worker_toml() -> str:
    text = (DEPLOY / "k8s" / "streambandit.yaml").read_text()
    block = re.search(r"worker\.toml: \|\n((?:    .*\n|\n)+)", text).group(1)
    return textwrap.dedent(block)


@pytest.mark.parametrize("name, text", [("deploy/worker.toml", (DEPLOY / "worker.toml").read_text()),
                                        ("deploy/k8s ConfigMap", k8s_worker_toml())])
def test_example_configurations_load(name, text):
    config, snapshots = parse_worker_config(tomllib.loads(text), source=name)
    assert snapshots.topic == "streambandit-snapshots"
    assert config.models.resolve("ads-homepage") is not None
    assert config.models.resolve("ads-homepage").build().dim == 20


def test_the_topic_script_creates_every_topic_the_example_uses():
    config, snapshots = parse_worker_config(tomllib.loads((DEPLOY / "worker.toml").read_text()))
    created = set(re.findall(r"^create (\S+)", (DEPLOY / "create-topics.sh").read_text(), flags=re.M))
    assert created == set(config.topics.all()) | {snapshots.topic}
