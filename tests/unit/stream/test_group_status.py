import json

from streambandit.stream.group_status import (
    GroupStatus,
    Owner,
    SnapshotInfo,
    format_table,
    status_rows,
)


def rows():
    return status_rows(
        "contexts",
        "rewards",
        [0, 1],
        owners={
            ("contexts", 0): Owner("w-0-abc", "w-0", "/10.0.0.5"),
            ("rewards", 0): Owner("w-0-abc", "w-0", "/10.0.0.5"),
        },
        committed={
            ("contexts", 0): 90,
            ("rewards", 0): 40,
            ("contexts", 1): None,
            ("rewards", 1): None,
        },
        ends={("contexts", 0): 100, ("rewards", 0): 40, ("contexts", 1): 7, ("rewards", 1): 0},
        snapshots={
            0: SnapshotInfo(created_ms=50_000, contexts_offset=80, rewards_offset=35, models=12),
            1: None,
        },
        now_ms=80_000,
    )


def test_each_input_partition_has_its_lag_and_its_snapshots_position_in_that_input():
    r = rows()
    assert [(x.topic, x.partition) for x in r] == [
        ("contexts", 0),
        ("rewards", 0),
        ("contexts", 1),
        ("rewards", 1),
    ]
    assert [x.lag for x in r] == [10, 0, 7, 0]  # nothing committed: from the earliest offset
    assert [x.snapshot_offset for x in r] == [80, 35, None, None]
    assert r[0].snapshot_age_s == 30.0 and r[0].models == 12 and r[2].models is None
    assert r[0].owner.client_id == "w-0" and r[2].owner is None


def test_the_table_has_a_line_per_input_partition_and_the_json_every_field():
    status = GroupStatus("ads", "Stable", 1, "directory /snaps", rows())
    lines = format_table(status).splitlines()
    assert lines[0] == "group ads: Stable, 1 member(s); snapshots from directory /snaps"
    assert lines[1].split() == [
        "topic",
        "partition",
        "owner",
        "committed",
        "end",
        "lag",
        "snapshot",
        "at",
        "age",
        "models",
    ]
    assert lines[2].split() == [
        "contexts",
        "0",
        "w-0",
        "(/10.0.0.5)",
        "90",
        "100",
        "10",
        "80",
        "30",
        "s",
        "12",
    ]
    assert lines[4].split() == ["contexts", "1", "-", "-", "7", "7", "-", "-", "-"]
    back = json.loads(json.dumps(status.as_dict()))
    assert back["rows"][0]["owner"] == {
        "member_id": "w-0-abc",
        "client_id": "w-0",
        "host": "/10.0.0.5",
    }
