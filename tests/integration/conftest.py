"""Integration fixtures: one real embedded broker process per test session."""

import gc
import uuid

import pytest

from streambandit.dev.tansu import EmbeddedBroker


@pytest.fixture(scope="session")
def broker():
    with EmbeddedBroker() as b:
        yield b
        # Kafka clients the tests dropped are destroyed now, while the broker still answers:
        # destroyed after it stopped, they log lost connections after pytest's summary line.
        gc.collect()


@pytest.fixture
def topics(broker):
    """A fresh, co-partitioned topic set (names unique to the test), with 2 partitions."""
    from streambandit.config.worker import Topics

    tag = uuid.uuid4().hex[:8]
    t = Topics(
        contexts=f"contexts-{tag}",
        rewards=f"rewards-{tag}",
        actions=f"actions-{tag}",
        joined=f"joined-{tag}",
        dead_letter=f"dead-letter-{tag}",
    )
    broker.create_topics(t.all(), partitions=2)
    return t
