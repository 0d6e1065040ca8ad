"""The watchdog that ends a worker stuck in a librdkafka call (stream/watchdog.py), with a call
that blocks in its place and an action that records instead of exiting."""

import threading
import time

from streambandit.stream.watchdog import Watchdog


def test_a_call_that_outlives_its_timeout_and_the_grace_is_reported_once():
    said: list[str] = []
    dog = Watchdog(said.append, grace_s=0.2)
    release = threading.Event()

    def stuck():
        with dog.bound("send_offsets_to_transaction", 0.1):
            release.wait(5)  # a call that ignores its own timeout

    t = threading.Thread(target=stuck)
    t.start()
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    release.set()
    t.join()
    assert len(said) == 1
    assert "send_offsets_to_transaction has not returned" in said[0]


def test_calls_that_return_in_time_are_not_reported():
    said: list[str] = []
    dog = Watchdog(said.append, grace_s=0.2)
    for _ in range(5):
        with dog.bound("commit_transaction", 0.1):
            time.sleep(0.05)
    time.sleep(0.5)
    assert said == []


def test_without_an_action_nothing_watches():
    dog = Watchdog(None, grace_s=0.01)
    with dog.bound("abort_transaction", 0.01):
        time.sleep(0.05)
    assert dog._thread is None
