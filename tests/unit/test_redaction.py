"""Credentials are masked in the configuration's repr and in any text the process writes: the
values registered, and what librdkafka echoes of a sasl.oauthbearer.config it cannot parse."""

from streambandit.config.app import parse_worker_config
from streambandit.redaction import MASK, hide, masked, redact, secret_values

KAFKA = {
    "bootstrap.servers": "b:9092",
    "sasl.username": "alice",
    "sasl.password": "pw-redaction-1",
    "consumer": {"ssl.key.password": "pw-redaction-2", "fetch.wait.max.ms": 10},
    "producer": {"sasl.oauthbearer.client.secret": "pw-redaction-3"},
}


def test_the_credentials_of_a_kafka_table_and_its_sub_tables():
    assert sorted(secret_values(KAFKA)) == ["pw-redaction-1", "pw-redaction-2", "pw-redaction-3"]
    assert secret_values("not a table") == [] and secret_values({"sasl.password": ""}) == []
    shown = masked(KAFKA)
    assert shown["sasl.password"] == shown["consumer"]["ssl.key.password"] == MASK
    assert shown["sasl.username"] == "alice" and shown["consumer"]["fetch.wait.max.ms"] == 10


def test_hidden_values_are_masked_wherever_they_occur_a_longer_one_whole():
    hide(["pw-redaction-4", "pw-redaction-4-longer"])
    line = 'error: Invalid value "pw-redaction-4-longer" (and pw-redaction-4 again)'
    assert redact(line) == f'error: Invalid value "{MASK}" (and {MASK} again)'
    assert redact("nothing secret here") == "nothing secret here"
    hide(["c"])  # too short to hide anything: it would mask every c of every line
    assert redact("nothing secret here") == "nothing secret here"


def test_what_librdkafka_echoes_of_an_oauthbearer_configuration_is_masked():
    # librdkafka's own words, from a client given sasl.oauthbearer.config = "principal=a t0ken"
    line = (
        'KafkaError{code=_AUTHENTICATION,val=-169,str="Failed to acquire SASL OAUTHBEARER token: '
        'Unrecognized sasl.oauthbearer.config beginning at: t0ken scope=x"}'
    )
    assert "t0ken" not in redact(line)
    assert redact(line).endswith(f'beginning at: {MASK}"}}')
    # masked where librdkafka's text ended, the words said after it are kept
    said = redact("sasl.oauthbearer.config beginning at: t0ken x") + ". Check the address"
    assert redact(said) == f"sasl.oauthbearer.config beginning at: {MASK}. Check the address"


def test_the_configuration_s_repr_masks_its_credentials():
    raw = {
        "kafka": KAFKA,
        "worker": {"snapshot_dir": "/tmp/s"},
        "models": [
            {"match": "m", "policy": "oful", "dim": 2, "reward_window_ms": 1, "default_reward": 0.0}
        ],
    }
    config, _ = parse_worker_config(raw)
    text = repr(config)
    assert "pw-redaction" not in text and "alice" in text and text.startswith("WorkerConfig(")
    assert "group_id='streambandit'" in text
