"""The freeze watch tells a process that was stopped from one that was busy."""

import os
import signal
import subprocess
import sys
import time

from streambandit.stream.freeze import FreezeWatch

# A child that resets its watch, says so, works or sleeps as told for 1.5 s (being stopped by the
# parent meanwhile, or not), and prints the longest gap the watch saw.
_CHILD = """
import sys, time
from streambandit.stream.freeze import FreezeWatch
w = FreezeWatch(tick_s=0.05)
time.sleep(0.2)
w.reset()
print("ready", flush=True)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    if sys.argv[1] == "busy":
        sum(i * i for i in range(10_000))  # the interpreter kept busy, as a large batch keeps it
    else:
        time.sleep(0.01)
print(w.longest_gap_s(), flush=True)
"""


def _child(mode: str, stop_s: float) -> float:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, mode], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        if stop_s:
            time.sleep(0.2)
            os.kill(proc.pid, signal.SIGSTOP)
            time.sleep(stop_s)
            os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return float(out.strip())


def test_a_stopped_process_shows_a_gap_as_long_as_the_stop():
    assert _child("idle", stop_s=1.0) >= 1.0


def test_a_busy_process_shows_no_gap():
    # The main thread holds the interpreter's lock most of the time; the watch's thread still
    # ticks, within the interpreter's switch interval (5 ms) of each tick.
    assert _child("busy", stop_s=0) < 0.5


def test_reset_forgets_the_gaps_before_it_and_a_gap_still_open_counts():
    w = FreezeWatch(tick_s=60)  # no tick in this test: only the open gap
    try:
        time.sleep(0.2)
        assert w.longest_gap_s() >= 0.2
        w.reset()
        assert w.longest_gap_s() < 0.2
    finally:
        w.close()
