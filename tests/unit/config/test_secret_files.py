"""A credential may come from a file (config/secret_files.py), named by a ``..._FILE`` variable
or by ``{ file = PATH }`` in the configuration file: the file's text without its trailing line
end, and every refusal one line naming the setting and the path, never the file's text."""

import os

import pytest

from streambandit.config.app import load_worker_config
from streambandit.config.secret_files import read_file_settings, read_secret_files

CONFIG = """
[kafka]
"bootstrap.servers" = "127.0.0.1:1"
"sasl.password" = "from-the-toml"
"ssl.key.password" = { file = "%s" }
[kafka.producer]
"sasl.oauthbearer.client.secret" = { file = "%s" }
[worker]
snapshot_dir = "/tmp/s"
[[models]]
match = "m"
policy = "oful"
dim = 2
reward_window_ms = 1000
default_reward = 0.0
"""


def secret(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "worker.toml"
    path.write_text(
        CONFIG % (secret(tmp_path, "key-pw", "k\r\n"), secret(tmp_path, "client", "c\n\n"))
    )
    return path


def test_credentials_come_from_their_files_without_the_line_end(tmp_path, config):
    environ = {
        "STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE": secret(tmp_path, "pw", "s3cret word\n"),
        "STREAMBANDIT_KAFKA__CONSUMER__SSL_KEYSTORE_PASSWORD_FILE": secret(tmp_path, "ks", "x"),
        "STREAMBANDIT_KAFKA__SASL_USERNAME": "alice",
    }
    cfg, _ = load_worker_config(config, environ=environ)
    assert cfg.kafka["sasl.password"] == "s3cret word"  # the environment's file over the toml
    assert cfg.kafka["consumer"]["ssl.keystore.password"] == "x"
    assert cfg.kafka["ssl.key.password"] == "k"
    assert cfg.kafka["producer"]["sasl.oauthbearer.client.secret"] == "c"
    assert cfg.kafka["sasl.username"] == "alice"


def test_the_environment_overrides_a_file_of_the_configuration(config):
    environ = {"STREAMBANDIT_KAFKA__SSL_KEY_PASSWORD": "from-env"}
    assert load_worker_config(config, environ=environ)[0].kafka["ssl.key.password"] == "from-env"


def test_other_variables_and_librdkafka_s_own_file_settings_are_left_as_they_are():
    environ = {
        "STREAMBANDIT_KAFKA__SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_FILE": "/keys/a.pem",
        "STREAMBANDIT_API_KEYS_FILE": "/run/keys",
        "PATH": "/bin",
    }
    assert read_secret_files(environ, read=lambda p: pytest.fail(p)) == environ


def refusal(call):
    with pytest.raises(ValueError) as info:
        call()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_each_refusal_is_one_line_naming_the_setting_and_the_path(tmp_path):
    var = "STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE"
    named = f"{var} ([kafka] sasl.password)"

    def env(path, read=lambda p: open(p).read(), **more):
        return refusal(lambda: read_secret_files({var: path, **more}, read=read))

    missing = str(tmp_path / "nowhere")
    assert env(missing) == f"{named}: cannot read {missing}: No such file or directory"
    unreadable = secret(tmp_path, "locked", "never-shown")
    os.chmod(unreadable, 0)
    if os.geteuid() != 0:  # root reads it anyway
        assert env(unreadable) == f"{named}: cannot read {unreadable}: Permission denied"
    assert env(str(tmp_path)).endswith("Is a directory")
    assert env("/e", read=lambda p: "\n") == f"{named}: /e is empty"
    assert env("/b", read=lambda p: b"\xff".decode()) == f"{named}: /b is not UTF-8 text"
    assert env("/p", STREAMBANDIT_KAFKA__SASL_PASSWORD="y").startswith(
        f"{var} and STREAMBANDIT_KAFKA__SASL_PASSWORD are both set"
    )
    for name, setting in (
        ("STREAMBANDIT_KAFKA__SASL_USERNAME_FILE", "[kafka] sasl.username"),
        ("STREAMBANDIT_KAFKA__PRODUCER__LINGER_MS_FILE", "[kafka.producer] linger.ms"),
        ("STREAMBANDIT_WORKER__GROUP_ID_FILE", "STREAMBANDIT_WORKER__GROUP_ID"),
    ):
        text = refusal(lambda: read_secret_files({name: "/p"}, read=lambda p: "x"))
        assert text.startswith(f"{name} ({setting}): only a credential may come from a file")

    def toml(table, read=lambda p: "x"):
        return refusal(lambda: read_file_settings({"kafka": table}, source="w.toml", read=read))

    assert toml({"sasl.username": {"file": "/u"}}).startswith(
        "w.toml: [kafka] sasl.username: only a credential may come from a file"
    )
    assert toml({"consumer": {"ssl.key.password": {"file": str(missing)}}}, read=open) == (
        f"w.toml: [kafka.consumer] ssl.key.password: cannot read {missing}: "
        "No such file or directory"
    )
    assert toml({"sasl.password": {"file": "/p", "mode": 1}}).startswith(
        "w.toml: [kafka] sasl.password: a credential's file is { file = PATH } alone"
    )
    assert toml({"sasl.password": {"file": 3}}).startswith(
        "w.toml: [kafka] sasl.password: the file must be a path"
    )


def test_the_loader_refuses_as_the_functions_do(config):
    var = "STREAMBANDIT_KAFKA__SSL_KEY_PASSWORD_FILE"
    with pytest.raises(ValueError, match=rf"^{var} \(\[kafka\] ssl.key.password\): cannot read "):
        load_worker_config(config, environ={var: "/nowhere/pw"})
