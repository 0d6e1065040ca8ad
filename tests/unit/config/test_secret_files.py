"""A credential may come from a file named by a ``..._FILE`` variable (config/environment.py):
the file's text without its trailing line end, and every refusal one line naming the variable,
the setting and the path, never the file's text."""

import os

import pytest

from streambandit.config.app import load_worker_config
from streambandit.config.environment import read_secret_files

CONFIG = """
[kafka]
"bootstrap.servers" = "127.0.0.1:1"
"sasl.password" = "from-the-toml"
[worker]
snapshot_dir = "/tmp/s"
[[models]]
match = "m"
policy = "oful"
dim = 2
reward_window_ms = 1000
default_reward = 0.0
"""


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "worker.toml"
    path.write_text(CONFIG)
    return path


def secret(tmp_path, text, name="pw"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_credential_comes_from_its_file_over_the_toml_without_the_line_end(tmp_path, config):
    environ = {
        "STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE": secret(tmp_path, "s3cret word\n"),
        "STREAMBANDIT_KAFKA__CONSUMER__SSL_KEY_PASSWORD_FILE": secret(tmp_path, "k\r\n", "k"),
        "STREAMBANDIT_KAFKA__SASL_USERNAME": "alice",
    }
    cfg, _ = load_worker_config(config, environ=environ)
    assert cfg.kafka["sasl.password"] == "s3cret word"
    assert cfg.kafka["consumer"]["ssl.key.password"] == "k"
    assert cfg.kafka["sasl.username"] == "alice"


def test_other_variables_and_librdkafka_s_own_file_settings_are_left_as_they_are():
    environ = {
        "STREAMBANDIT_KAFKA__SASL_OAUTHBEARER_ASSERTION_PRIVATE_KEY_FILE": "/keys/a.pem",
        "STREAMBANDIT_API_KEYS_FILE": "/run/keys",
        "PATH": "/bin",
    }
    assert read_secret_files(environ, read=lambda p: pytest.fail(p)) == environ


def refusal(environ, read=lambda path: "x"):
    with pytest.raises(ValueError) as info:
        read_secret_files(environ, read=read)
    return str(info.value)


def test_each_refusal_is_one_line_naming_the_variable_the_setting_and_the_path(tmp_path):
    var = "STREAMBANDIT_KAFKA__SASL_PASSWORD_FILE"
    missing = str(tmp_path / "nowhere")
    assert refusal({var: missing}, read=lambda p: open(p).read()) == (
        f"{var}: cannot read {missing} for [kafka] sasl.password: No such file or directory"
    )
    unreadable = secret(tmp_path, "never-shown")
    os.chmod(unreadable, 0)
    if os.geteuid() != 0:  # root reads it anyway
        text = refusal({var: unreadable}, read=lambda p: open(p).read())
        assert text.endswith("Permission denied") and "never-shown" not in text
    assert refusal({var: str(tmp_path)}, read=lambda p: open(p).read()).endswith("Is a directory")
    assert refusal({var: "/e"}, read=lambda p: "\n") == (
        f"{var}: /e for [kafka] sasl.password is empty"
    )
    assert refusal({var: "/b"}, read=lambda p: b"\xff".decode()) == (
        f"{var}: /b for [kafka] sasl.password is not UTF-8 text"
    )
    both = refusal({var: "/p", "STREAMBANDIT_KAFKA__SASL_PASSWORD": "y"})
    assert both.startswith(f"{var} and STREAMBANDIT_KAFKA__SASL_PASSWORD are both set")
    for name, setting in (
        ("STREAMBANDIT_KAFKA__SASL_USERNAME_FILE", "[kafka] sasl.username"),
        ("STREAMBANDIT_KAFKA__PRODUCER__LINGER_MS_FILE", "[kafka.producer] linger.ms"),
        ("STREAMBANDIT_WORKER__GROUP_ID_FILE", "STREAMBANDIT_WORKER__GROUP_ID"),
    ):
        assert refusal({name: "/p"}).startswith(
            f"{name}: only a credential may come from a file, and {setting} is not one"
        )


def test_the_loader_refuses_as_the_function_does(tmp_path, config):
    var = "STREAMBANDIT_KAFKA__SSL_KEY_PASSWORD_FILE"
    with pytest.raises(ValueError, match=rf"^{var}: cannot read /nowhere/pw for \[kafka\]"):
        load_worker_config(config, environ={var: "/nowhere/pw"})
