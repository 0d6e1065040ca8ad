"""The worker's librdkafka settings: user settings pass through, per-client sub-tables go to their
client only, and the settings exactly-once depends on cannot be overridden."""

import pytest

from streambandit.config.kafka import consumer_settings, producer_settings, reader_settings

USER = {"client.id": "w1", "consumer": {"fetch.wait.max.ms": 10}, "producer": {"linger.ms": 1}}


def test_sub_tables_reach_only_their_client():
    c, p, r = (
        consumer_settings("b:9092", "g", USER),
        producer_settings("b:9092", "t", USER),
        reader_settings("b:9092", USER),
    )
    assert c["client.id"] == p["client.id"] == r["client.id"] == "w1"
    assert c["fetch.wait.max.ms"] == r["fetch.wait.max.ms"] == 10 and "fetch.wait.max.ms" not in p
    assert p["linger.ms"] == 1 and "linger.ms" not in c
    assert not any(isinstance(v, dict) for s in (c, p, r) for v in s.values())


def test_exactly_once_settings_are_forced():
    user = {
        "enable.auto.commit": True,
        "isolation.level": "read_uncommitted",
        "enable.idempotence": False,
        "consumer": {"group.id": "other"},
        "producer": {"transactional.id": "other", "acks": "1"},
    }
    c, p = consumer_settings("b:9092", "g", user), producer_settings("b:9092", "t", user)
    assert (c["enable.auto.commit"], c["isolation.level"], c["group.id"]) == (
        False,
        "read_committed",
        "g",
    )
    assert (p["enable.idempotence"], p["transactional.id"], p["acks"]) == (True, "t", "all")


def test_an_unknown_sub_table_is_an_error():
    with pytest.raises(ValueError, match=r"sub-table\(s\) admin unknown"):
        consumer_settings("b:9092", "g", {"admin": {"x": 1}})


def test_static_membership_uses_the_workers_own_instance_id():
    assert "group.instance.id" not in consumer_settings("b:9092", "g", USER)
    assert (
        consumer_settings("b:9092", "g", USER, static_instance="g-w1")["group.instance.id"]
        == "g-w1"
    )
    # Not from the shared file: every process of the group would claim the same member id.
    with pytest.raises(ValueError, match="static_membership"):
        consumer_settings("b:9092", "g", {"consumer": {"group.instance.id": "x"}})
    with pytest.raises(ValueError, match="static_membership"):
        consumer_settings("b:9092", "g", {"group.instance.id": "x"})


def test_the_consumer_protocol_leaves_session_and_assignor_to_the_broker():
    from confluent_kafka import Consumer

    c = consumer_settings("b:9092", "g", USER, protocol="consumer")
    assert (c["group.protocol"], c["group.remote.assignor"]) == ("consumer", "range")
    assert not {
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "partition.assignment.strategy",
    } & set(c)
    # librdkafka takes the settings as they are (no broker is contacted)
    Consumer({k: v for k, v in c.items() if k != "bootstrap.servers"}).close()
    classic = consumer_settings("b:9092", "g", USER)
    assert classic["partition.assignment.strategy"] == "range" and "group.protocol" not in classic


@pytest.mark.parametrize(
    "user",
    [
        {"consumer": {"session.timeout.ms": 30000}},
        {"heartbeat.interval.ms": 500},
        {"consumer": {"partition.assignment.strategy": "cooperative-sticky"}},
    ],
)
def test_a_classic_only_setting_under_the_consumer_protocol_is_one_clear_error(user):
    key = next(iter(user.get("consumer", user)))
    with pytest.raises(ValueError, match=rf"^\[kafka\] {key}: .*group_protocol = \"classic\""):
        consumer_settings("b:9092", "g", user, protocol="consumer")
    consumer_settings("b:9092", "g", user)  # the classic protocol takes it


def test_an_assignor_that_splits_a_partitions_inputs_is_refused():
    with pytest.raises(ValueError, match="group.remote.assignor = 'uniform'"):
        consumer_settings("b:9092", "g", {"group.remote.assignor": "uniform"}, protocol="consumer")
    with pytest.raises(ValueError, match="classic or consumer"):
        consumer_settings("b:9092", "g", USER, protocol="streams")
