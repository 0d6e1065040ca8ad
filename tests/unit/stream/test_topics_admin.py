"""What ``streambandit topics create`` asks of each topic (stream/topics_admin.py)."""

from streambandit.config.worker import Topics
from streambandit.stream.topics_admin import TopicStatus, default_replication, topic_configs


def test_every_topic_needs_two_replicas_in_sync_when_it_has_three_or_more():
    for replication in (3, 5):
        configs = topic_configs(Topics(), "snaps", replication)
        assert {c.get("min.insync.replicas") for c in configs.values()} == {"2"}
    # With fewer, the cluster's own setting: two of two would stop writes at any broker's loss.
    for replication in (1, 2, -1):
        assert not any(
            "min.insync.replicas" in c
            for c in topic_configs(Topics(), "snaps", replication).values()
        )


def test_inputs_take_the_brokers_time_the_joined_log_is_kept_and_snapshots_are_compacted():
    t = Topics()
    configs = topic_configs(t, "snaps", 1)
    assert set(configs) == {*t.all(), "snaps"}
    assert [
        c for c, v in configs.items() if v.get("message.timestamp.type") == "LogAppendTime"
    ] == [
        t.contexts,
        t.rewards,
        "snaps",
    ]
    assert configs[t.joined]["retention.ms"] == "-1"
    assert configs["snaps"]["cleanup.policy"] == "compact"
    assert "max.message.bytes" not in configs["snaps"]  # 512 KiB chunks fit Kafka's default 1 MB
    assert (
        int(topic_configs(t, "snaps", 1, max_chunk_bytes=4 << 20)["snaps"]["max.message.bytes"])
        > 4 << 20
    )
    # A learn-only worker's first input is the decisions topic, and contexts is not its topic.
    learn = topic_configs(t, None, 1, learn_only=True)
    assert (
        learn[t.decisions]["message.timestamp.type"] == "LogAppendTime" and t.contexts not in learn
    )


def test_three_replicas_or_as_many_as_there_are_brokers():
    assert [default_replication(n) for n in (0, 1, 2, 3, 7)] == [1, 1, 2, 3, 3]


def test_a_status_line_says_what_differs():
    assert str(TopicStatus("s", created=True, compacted=True)) == "created (compacted)"
    assert str(TopicStatus("j", created=False)) == "exists"
    st = TopicStatus(
        "r", created=False, differences=("4 partitions (asked 8)", "retention.ms=1 (asked -1)")
    )
    assert str(st) == "exists, differs: 4 partitions (asked 8); retention.ms=1 (asked -1)"
    planned = TopicStatus("j", created=False, would_create="8 partitions, replication 3")
    assert str(planned) == "missing, would create: 8 partitions, replication 3"
