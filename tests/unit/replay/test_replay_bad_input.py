"""Every row-level problem of a replayed log is an error naming the row and line, or with
``skip_bad`` skipped and counted by reason; rows of any length parse."""

from __future__ import annotations

import pytest

from streambandit.config.models import parse_models_config
from streambandit.replay.files import read_csv
from streambandit.replay.logged import MIN_PROPENSITY, LogError
from streambandit.replay.runner import replay

MODELS = parse_models_config(
    {
        "models": [
            {
                "match": "m-*",
                "policy": "glb_omd",
                "dim": 2,
                "reward_window_ms": 1,
                "default_reward": 0.0,
                "hyper": {"link": "logistic"},
            }
        ]
    }
)
HEADER = "timestamp_ms,event_id,model_key,arm_ids,action,propensity,reward,features\n"


def row(i, key="m-a", reward="1", propensity="0.5", features="1 0|0 1", event=None):
    return f"{i},{event or f'e{i}'},{key},a|b,a,{propensity},{reward},{features}\n"


GOOD = "".join(row(i) for i in range(1, 6))

# (bad row, reason code, words in the error) for problems only the target configuration sees
CASES = [
    (row(9, key="other"), "model_key", "no configuration matches model key 'other'"),
    (
        row(9, features="1 0 0|0 1 0"),
        "features",
        "features have dimension 3, model 'm-a' expects 2",
    ),
    (row(9, reward="2"), "reward", "reward 2.0 not accepted by model 'm-a'"),
    (row(9, event="e3"), "duplicate", "duplicate event id"),
]


@pytest.mark.parametrize("bad, reason, words", CASES)
def test_a_row_the_target_cannot_use_is_an_error_naming_its_row_and_line(
    tmp_path, bad, reason, words
):
    log = tmp_path / "log.csv"
    log.write_text(HEADER + GOOD + bad + row(10))
    with pytest.raises(LogError) as info:
        replay(read_csv(log), MODELS)
    assert info.value.reason == reason and words in str(info.value)
    assert str(info.value).startswith(
        f"{log} row 6 (line 7) (event 'e"
    )  # the sixth row, the file's seventh line


def test_skip_bad_skips_and_counts_each_by_reason_and_the_rest_is_replayed(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text(
        HEADER
        + GOOD
        + "".join(bad for bad, _, _ in CASES)
        + row(20, key="")
        + row(21, propensity="1e-310")
        + row(22)
    )
    counts: dict = {}
    result = replay(
        read_csv(log, skip_bad=True, counts=counts), MODELS, skip_bad=True, counts=counts
    )
    assert result.events == 6 and result.skipped == 6
    assert result.skipped_by_reason == {
        "model_key": 2,
        "features": 1,
        "reward": 1,
        "duplicate": 1,
        "propensity": 1,
    }
    assert set(result.models) == {"m-a"}  # nothing was made for the skipped key


def test_a_propensity_that_would_swamp_the_estimates_and_an_empty_key_are_refused(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text(HEADER + row(1, propensity="1e-310"))
    with pytest.raises(
        LogError, match=r"row 1 \(line 2\): propensity 1e-310 is below 1e-12"
    ) as info:
        list(read_csv(log))
    assert info.value.reason == "propensity" and MIN_PROPENSITY == 1e-12
    log.write_text(HEADER + row(1, propensity=repr(MIN_PROPENSITY)))
    assert len(list(read_csv(log))) == 1  # the bound itself is allowed
    log.write_text(HEADER + row(1, key=""))
    with pytest.raises(LogError, match=r"row 1 \(line 2\): empty model key"):
        list(read_csv(log))


def test_a_row_longer_than_pythons_default_csv_field_limit_parses(tmp_path):
    arms = 6000
    feats = "|".join(f"{i / 7!r} {-i / 3!r}" for i in range(arms))
    assert len(feats) > 131_072
    log = tmp_path / "log.csv"
    log.write_text(
        HEADER + f'1,e1,m-a,{"|".join(f"x{i}" for i in range(arms))},x17,0.5,1,"{feats}"\n' + row(2)
    )
    first, second = list(read_csv(log))
    assert (
        first.features.shape == (arms, 2)
        and first.action == 17
        and second.source.endswith("row 2 (line 3)")
    )
