"""The snapshot topic's clients log through the worker's logger, not onto stderr."""

import logging

import pytest
from confluent_kafka import KafkaException

from streambandit.stream.snapshots import TopicStore


def test_a_store_whose_broker_is_away_logs_through_streambandit_kafka(capfd, caplog, monkeypatch):
    # Seen with Apache Kafka stopped under a worker: the store's idle reader wrote a line to stderr
    # every 50 ms of the outage, past the logger that holds the worker's own clients' repeats back.
    # A fresh repeat filter: an earlier test's "Connection refused" would otherwise hold this one's
    # back for a minute.
    monkeypatch.setattr(logging.getLogger("streambandit.kafka"), "filters", [])
    with caplog.at_level(logging.INFO, logger="streambandit.kafka"):
        with pytest.raises(KafkaException):
            TopicStore("127.0.0.1:1", "snapshots", timeout_s=2)
    assert "Connection refused" in caplog.text
    assert "rdkafka#" not in capfd.readouterr().err
