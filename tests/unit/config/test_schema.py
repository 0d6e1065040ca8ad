"""Every setting of config/schema.py is checked for its type and its range with one error line
naming it, from the file and from the environment; settings that must agree, unknown keys and
the librdkafka settings exactly-once depends on are refused; the environment overrides the file;
the printed configuration masks credentials and reads back to the same configuration."""

import copy
import dataclasses
import math
import tomllib

import pytest

from streambandit.config import schema
from streambandit.config.app import dump_worker_config, load_worker_config, parse_worker_config
from streambandit.config.environment import apply_environment, variable_name
from streambandit.config.kafka import FORCED, consumer_settings, producer_settings
from streambandit.config.worker import WORKER_FIELDS, Topics, WorkerConfig

MODEL = {"match": "m-*", "policy": "oful", "dim": 3, "reward_window_ms": 500, "default_reward": 0.0}
BASE = {"kafka": {"bootstrap.servers": "127.0.0.1:1"}, "models": [MODEL]}


def with_setting(setting, value):
    raw = copy.deepcopy(BASE)
    if setting.table == "models":
        raw["models"][0][setting.key] = value
    else:
        raw.setdefault(setting.table, {})[setting.key] = value
    return raw


def refused(raw):
    with pytest.raises(ValueError) as info:
        parse_worker_config(raw, source="w.toml")
    message = str(info.value)
    assert "\n" not in message and message.startswith("w.toml: ")
    return message


WRONG_TYPE = {"int": "1", "float": "1.5s", "bool": "yes", "str": 5}


def out_of_range(s):
    """Values of the setting's type just outside what it allows."""
    if s.choices:
        return ["nope"]
    if s.kind == "str":
        return [""]
    values = [math.inf] if s.kind == "float" else []
    if s.low is not None:
        values.append(s.low if s.low_open else s.low - (1 if s.kind == "int" else 1e-9))
    if s.high is not None:
        values.append(s.high + 1)
    return values


def name(s):
    return f"{s.table}.{s.key}"


@pytest.mark.parametrize("s", schema.SETTINGS, ids=name)
def test_every_setting_has_a_type_a_range_a_default_and_a_description(s):
    assert s.kind in ("int", "float", "bool", "str") and s.description
    assert s.allowed and s.range
    if s.default is not schema.REQUIRED:
        s.check(s.default)  # the default itself is allowed
    if s.kind != "bool":
        assert out_of_range(s), "a setting of a type with values it refuses says which"


@pytest.mark.parametrize("s", schema.SETTINGS, ids=name)
def test_a_wrong_type_is_one_line_naming_the_key(s):
    message = refused(with_setting(s, WRONG_TYPE[s.kind]))
    assert s.key in message


@pytest.mark.parametrize(
    "s, value",
    [(s, v) for s in schema.SETTINGS for v in out_of_range(s)],
    ids=lambda x: name(x) if isinstance(x, schema.Setting) else repr(x),
)
def test_a_value_out_of_range_is_one_line_naming_the_key_and_the_range(s, value):
    message = refused(with_setting(s, value))
    assert s.key in message
    assert (s.phrase or s.range) in message or all(c in message for c in s.choices)


@pytest.mark.parametrize(
    "s", [s for s in schema.SETTINGS if s.table in ("worker", "topics")], ids=name
)
def test_every_file_setting_comes_from_the_environment_parsed_as_its_type(s):
    var = variable_name(s.table, s.key)
    good = {"int": "7", "float": "7.5", "bool": "true", "str": "x7"}[s.kind]
    if s.key == "metrics_port" or s.key == "snapshot_max_share":
        good = "1"
    if s.choices:
        good = s.choices[-1]
    raw = apply_environment(BASE, {var: good})
    value = raw[s.table][s.key]
    assert type(value) is {"int": int, "float": float, "bool": bool, "str": str}[s.kind]
    if s.kind != "str":  # text that is not of the setting's type
        with pytest.raises(ValueError, match=f"^{var}: .*{s.key} must be"):
            apply_environment(BASE, {var: "x7"})


def test_the_dataclasses_take_their_defaults_from_the_schema():
    fields = {f.name: f.default for f in dataclasses.fields(WorkerConfig)}
    assert WORKER_FIELDS and all(
        fields[k] == schema.table("worker")[k].default for k in WORKER_FIELDS
    )
    assert set(schema.table("worker")) - WORKER_FIELDS == {
        "snapshot_topic",
        "snapshot_dir",
        "snapshot_max_chunk_bytes",
    }
    assert dataclasses.asdict(Topics()) == {k: s.default for k, s in schema.table("topics").items()}


def test_the_reported_bugs():
    # A string where seconds go: refused at load (check and start-up), not a TypeError later.
    assert refused(BASE | {"worker": {"snapshot_interval_s": "30s"}}) == (
        "w.toml: [worker] snapshot_interval_s must be a number > 0, got '30s'"
    )
    assert refused(BASE | {"worker": {"merge_wait_ms": -5}}) == (
        "w.toml: [worker] merge_wait_ms must be >= 0, got -5"
    )
    with pytest.raises(ValueError, match="snapshot_interval_s"):
        WorkerConfig(bootstrap_servers="x:1", models=None, snapshot_interval_s="30s")


@pytest.mark.parametrize("table", ["", "consumer", "producer"])
@pytest.mark.parametrize("key", sorted(FORCED))
def test_a_setting_exactly_once_needs_is_refused_with_the_reason(key, table):
    kafka = {"bootstrap.servers": "x:1"}
    settings = kafka.setdefault(table, {}) if table else kafka
    settings[key] = "other-value"
    message = refused(BASE | {"kafka": kafka})
    assert f"{key} = 'other-value' is refused: exactly-once needs" in message
    assert f"[kafka{'.' + table if table else ''}]" in message


def test_the_value_the_worker_sets_anyway_is_accepted_from_the_file_and_the_environment():
    kafka = {"bootstrap.servers": "x:1", "isolation.level": "read_committed", "acks": -1}
    config, _ = parse_worker_config(BASE | {"kafka": kafka})
    env = {"STREAMBANDIT_KAFKA__ENABLE_AUTO_COMMIT": "false"}
    config, _ = parse_worker_config(apply_environment(BASE, env))
    assert consumer_settings("x:1", "g", config.kafka)["enable.auto.commit"] is False
    # A program building a WorkerConfig itself gets them forced, as before.
    p = producer_settings("x:1", "t", {"request.required.acks": "1", "acks": "0"})
    assert p["acks"] == "all" and "request.required.acks" not in p
    assert "request.required.acks" in refused(
        BASE | {"kafka": {"bootstrap.servers": "x:1", "request.required.acks": 1}}
    )


@pytest.mark.parametrize(
    "raw, named",
    [
        (BASE | {"workr": {}}, "top level: workr"),
        (BASE | {"worker": {"merge_wait": 5}}, "[worker] has unknown setting(s) merge_wait"),
        (BASE | {"topics": {"context": "c"}}, "[topics] has unknown key(s) context"),
        (BASE | {"models": [MODEL | {"colour": 1}]}, "unknown field(s) colour"),
        (BASE | {"kafka": {"bootstrap.servers": "x:1", "admin": {}}}, "sub-table(s) admin"),
        (
            BASE | {"kafka": {"bootstrap.servers": "x:1", "consumer": {"x": {"y": 1}}}},
            "[kafka.consumer] x is a table",
        ),
        (BASE | {"worker": 5}, "worker must be a table"),
    ],
)
def test_unknown_keys_in_every_table_are_one_line_naming_them(raw, named):
    assert named in refused(raw)


@pytest.mark.parametrize(
    "raw, named",
    [
        (
            BASE | {"worker": {"snapshot_topic": "s", "snapshot_dir": "d"}},
            "sets both snapshot_topic and snapshot_dir",
        ),
        (
            BASE | {"worker": {"snapshot_topic": "joined"}},
            "snapshot_topic 'joined' is also one of [topics]",
        ),
        (
            BASE | {"topics": {"rewards": "contexts"}},
            "[topics] name(s) contexts given to more than one",
        ),
        (
            BASE | {"worker": {"health_timeout_s": 0.04, "poll_timeout_ms": 50}},
            "health_timeout_s (0.04 s) must be longer than poll_timeout_ms (50 ms)",
        ),
        (
            BASE | {"kafka": {"bootstrap.servers": "x:1", "heartbeat.interval.ms": 6000}},
            "heartbeat.interval.ms (6000) must be below session.timeout.ms (6000)",
        ),
        (
            BASE
            | {
                "kafka": {"bootstrap.servers": "x:1", "producer": {"message.max.bytes": 100_000}},
            },
            "max_dead_letter_bytes (262144) must be at least 16384 below the producer's",
        ),
    ],
)
def test_settings_that_must_agree_are_one_line_naming_both(raw, named):
    assert named in refused(raw)


def test_agreeing_settings_pass_also_as_text_from_the_environment():
    env = {
        "STREAMBANDIT_KAFKA__CONSUMER__SESSION_TIMEOUT_MS": "10000",
        "STREAMBANDIT_KAFKA__HEARTBEAT_INTERVAL_MS": "6000",
        "STREAMBANDIT_KAFKA__PRODUCER__MESSAGE_MAX_BYTES": "2000000",
        "STREAMBANDIT_WORKER__MAX_DEAD_LETTER_BYTES": "1000000",
    }
    config, _ = parse_worker_config(apply_environment(BASE, env))
    assert config.max_dead_letter_bytes == 1_000_000
    env["STREAMBANDIT_KAFKA__CONSUMER__SESSION_TIMEOUT_MS"] = "5000"
    assert "heartbeat.interval.ms" in refused(apply_environment(BASE, env))


def test_the_environment_overrides_the_file_and_names_its_variable(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(
        '[kafka]\n"bootstrap.servers" = "file:1"\n"sasl.username" = "u"\n'
        '[worker]\nsnapshot_dir = "s"\nsnapshot_interval_s = 30\n'
        '[[models]]\nmatch = "m-*"\npolicy = "oful"\ndim = 3\nreward_window_ms = 500\n'
        "default_reward = 0.0\n"
    )
    env = {
        "STREAMBANDIT_WORKER__SNAPSHOT_INTERVAL_S": "5",
        "STREAMBANDIT_WORKER__STATIC_MEMBERSHIP": "true",
        "STREAMBANDIT_WORKER__SNAPSHOT_DIR": "",  # unsets the file's, for the topic below
        "STREAMBANDIT_WORKER__SNAPSHOT_TOPIC": "snaps",
        "STREAMBANDIT_TOPICS__DEAD_LETTER": "dl",
        "STREAMBANDIT_KAFKA__BOOTSTRAP_SERVERS": "env:1",
        "STREAMBANDIT_KAFKA__SASL_PASSWORD": "hunter2",
        "STREAMBANDIT_KAFKA__PRODUCER__LINGER_MS": "1",
        "STREAMBANDIT_BOOTSTRAP_SERVERS": "not-a-setting:1",  # --bootstrap-servers' own: left alone
        "STREAMBANDIT_KAFKA_CACHE": "/tmp/x",
        "OTHER__THING": "x",
    }
    config, snaps = load_worker_config(path, environ=env)
    assert (config.snapshot_interval_s, config.static_membership) == (5.0, True)
    assert (snaps.topic, snaps.dir, config.topics.dead_letter) == ("snaps", None, "dl")
    assert config.bootstrap_servers == "env:1"
    assert config.kafka == {
        "sasl.username": "u",
        "sasl.password": "hunter2",
        "producer": {"linger.ms": "1"},
    }
    assert load_worker_config(path, environ=env, bootstrap_servers="cli:1")[
        0
    ].bootstrap_servers == ("cli:1")
    for var, message in (
        ("STREAMBANDIT_WORKER__SNAPSHOT_INTERVAL", "[worker] has no setting snapshot_interval"),
        ("STREAMBANDIT_MODELS__DIM", "STREAMBANDIT_MODELS__DIM names no setting"),
        ("STREAMBANDIT_KAFKA__ADMIN__X", "STREAMBANDIT_KAFKA__ADMIN__X names no setting"),
        (
            "STREAMBANDIT_WORKER_MERGE_WAIT_MS",
            "two underscores (STREAMBANDIT_WORKER__MERGE_WAIT_MS)",
        ),
    ):
        with pytest.raises(ValueError) as info:
            load_worker_config(path, environ={var: "1"})
        assert str(info.value).startswith(var) and message in str(info.value)
    with pytest.raises(ValueError, match=r"^STREAMBANDIT_WORKER__SNAPSHOT_INTERVAL_S: "):
        load_worker_config(path, environ={"STREAMBANDIT_WORKER__SNAPSHOT_INTERVAL_S": "30s"})


@pytest.mark.parametrize(
    "key, secret",
    [
        ("sasl.password", True),
        ("ssl.key.password", True),
        ("ssl.keystore.password", True),
        ("sasl.oauthbearer.client.secret", True),
        ("ssl.key.pem", True),
        ("ssl_key", True),
        ("sasl.oauthbearer.assertion.private.key.passphrase", True),
        ("sasl.oauthbearer.config", True),
        ("sasl.oauthbearer.client.credentials.client.secret", True),
        ("sasl.oauthbearer.client.credentials.client.id", False),
        ("sasl.oauthbearer.token.endpoint.url", False),
        ("sasl.oauthbearer.assertion.private.key.file", False),
        ("sasl.username", False),
        ("ssl.key.location", False),
        ("ssl.certificate.pem", False),
        ("bootstrap.servers", False),
    ],
)
def test_credentials_are_recognised(key, secret):
    assert schema.is_secret(key) is secret


def test_the_printed_configuration_masks_credentials_and_reads_back_to_the_same():
    kafka = {
        "bootstrap.servers": "x:1",
        "sasl.username": "u",
        "sasl.password": "hunter2",
        "consumer": {"fetch.wait.max.ms": 10, "ssl.key.password": "pem-pass"},
    }
    raw = BASE | {"kafka": kafka, "worker": {"snapshot_topic": "s", "merge_wait_ms": 7}}
    config, snaps = parse_worker_config(raw)
    text = dump_worker_config(config, snaps)
    assert "hunter2" not in text and "pem-pass" not in text
    assert f'"sasl.password" = "{schema.MASK}"' in text and '"sasl.username" = "u"' in text
    assert "# metrics_port unset" in text and "merge_wait_ms = 7" in text
    again, snaps_again = parse_worker_config(tomllib.loads(text))
    assert snaps_again == snaps
    assert dataclasses.replace(again, kafka=config.kafka) == config
    assert again.kafka["sasl.password"] == schema.MASK
