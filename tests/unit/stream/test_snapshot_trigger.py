"""When the worker snapshots a partition: after N updates or T seconds, within a bounded share of
its time (``snapshot_due``)."""

import pytest

from streambandit.config.models import parse_models_config
from streambandit.config.worker import WorkerConfig, snapshot_due

MODELS = parse_models_config(
    {
        "models": [
            {
                "match": "m*",
                "policy": "oful",
                "dim": 2,
                "reward_window_ms": 10,
                "default_reward": 0.0,
            }
        ]
    }
)


def config(**kw) -> WorkerConfig:
    return WorkerConfig(
        bootstrap_servers="unused:9092",
        models=MODELS,
        snapshot_every_updates=100,
        snapshot_interval_s=30.0,
        **kw,
    )


def test_due_after_enough_updates_or_enough_time():
    c = config()
    assert not snapshot_due(99, 29.9, 0.0, c)
    assert snapshot_due(100, 0.0, 0.0, c)
    assert snapshot_due(0, 30.0, 0.0, c)


def test_a_slow_snapshot_holds_the_next_one_back_to_the_configured_share():
    c = config(snapshot_max_share=0.1)
    # The last snapshot took 2 s: at most 10 % of the time means at least 18 s without one.
    assert not snapshot_due(10**6, 17.9, 2.0, c)
    assert snapshot_due(10**6, 18.0, 2.0, c)
    # 20 s at 100,000 models: the 30 s interval waits for 180 s.
    assert not snapshot_due(0, 179.0, 20.0, c)
    assert snapshot_due(0, 180.0, 20.0, c)
    # A share of 1: no bound.
    assert snapshot_due(100, 0.0, 20.0, config(snapshot_max_share=1.0))


@pytest.mark.parametrize("share", [0.0, -0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="snapshot_max_share"):
        config(snapshot_max_share=share)
