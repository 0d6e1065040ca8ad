"""The compose file runs the Apache Kafka the integration tests run."""

import re
from pathlib import Path

from streambandit.dev.kafka_jars import read_lock


def test_compose_runs_the_kafka_version_the_tests_pass_on():
    compose = (Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml").read_text()
    assert re.search(r"image: apache/kafka:(\S+)", compose).group(1) == read_lock().kafka_version
