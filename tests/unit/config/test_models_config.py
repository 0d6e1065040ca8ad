"""Model configuration: resolution order, validation with errors that name the entry."""

import pytest

from streambandit.config.models import load_models_config, parse_models_config

GOOD = """
[[models]]
match = "ads-*"
policy = "glb_omd"
dim = 4
reward_window_ms = 60000
default_reward = 0.0
aggregation = "sum"
epsilon = 0.1
[models.hyper]
link = "logistic"
S = 8.0

[[models]]
match = "ads-home"
policy = "oful"
dim = 4
reward_window_ms = 1000
default_reward = 0.0
"""


def test_load_and_resolve_exact_before_pattern(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(GOOD)
    cfg = load_models_config(path)
    assert cfg.resolve("ads-home").policy == "oful"  # exact match wins, although listed second
    spec = cfg.resolve("ads-search")
    assert spec.policy == "glb_omd" and spec.aggregation == "sum" and spec.epsilon == 0.1
    assert spec.build().config()["link"] == "logistic"
    assert cfg.resolve("video-1") is None


def entry(**changes):
    base = {
        "match": "m",
        "policy": "oful",
        "dim": 3,
        "reward_window_ms": 100,
        "default_reward": 0.0,
    }
    base.update(changes)
    return {"models": [{k: v for k, v in base.items() if v is not None}]}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"policy": "nope"}, "unknown policy 'nope'"),
        ({"dim": 0}, "dim must be an integer >= 1"),
        ({"reward_window_ms": 0}, "reward_window_ms must be a positive integer"),
        ({"reward_window_ms": None}, "missing required field 'reward_window_ms'"),
        ({"aggregation": "mean"}, "aggregation must be one of first, last, sum"),
        ({"epsilon": 1.5}, r"epsilon must be in \[0, 1\]"),
        ({"hyper": {"lam": -1.0}}, "lam must be a finite number > 0"),
        ({"hyper": {"nope": 1}}, "no hyper-parameter 'nope'"),
        ({"policy": "glb_omd", "default_reward": 2.0}, r"logistic link needs a reward in \[0, 1\]"),
        ({"colour": "red"}, "unknown field"),
    ],
)
def test_bad_entries_are_rejected_with_the_entry_named(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_models_config(entry(**changes))
    assert "[[models]]" in str(info.value)


def test_empty_duplicate_and_unparsable(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        parse_models_config({})
    twice = {"models": entry()["models"] * 2}
    with pytest.raises(ValueError, match="configured twice"):
        parse_models_config(twice)
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_models_config(bad)
    with pytest.raises(ValueError, match="does not exist"):
        load_models_config(tmp_path / "missing.toml")
