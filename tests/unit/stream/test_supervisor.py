"""``serve --processes N``'s supervisor, with children that are short Python commands (no broker):
the restart rule, a failed child restarted, a refused configuration stopping all, SIGTERM reaching
every child, and no child outliving a supervisor killed outright."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from streambandit.stream.supervisor import CONFIG_ERROR, RestartPolicy, Supervisor


def test_the_delay_doubles_while_a_child_fails_quickly_and_resets_once_it_ran_long():
    p = RestartPolicy(first_s=1.0, max_s=5.0, stable_s=60.0)
    assert [p.after_failure(0.5) for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert p.after_failure(61.0) == 0.0
    assert p.after_failure(0.1) == 1.0


def child(script: str):
    """A command(i) running ``script`` with ``i`` and a scratch directory ``d`` defined."""

    def command(i: int) -> list[str]:
        return [sys.executable, "-c", f"i = {i}\n" + textwrap.dedent(script)]

    return command


def fast_policy() -> RestartPolicy:
    return RestartPolicy(first_s=0.05, max_s=0.1)


def test_a_failed_child_is_restarted_and_sigterm_stops_every_child(tmp_path):
    script = f"""
        import pathlib, signal, sys, time
        d = pathlib.Path({str(tmp_path)!r})
        runs = len(list(d.glob(f"{{i}}-*")))
        (d / f"{{i}}-{{runs}}").touch()
        if i == 1 and runs < 2:
            sys.exit(1)  # child 1 fails twice, then runs
        signal.signal(signal.SIGTERM, lambda *_: ((d / f"stopped-{{i}}").touch(), sys.exit(0)))
        while True:
            time.sleep(0.05)
        """
    sup = Supervisor(child(script), 3, poll_s=0.02, policy=fast_policy, leave_gap_s=0.1)
    stopper = _stop_when(
        sup,
        lambda: (
            (tmp_path / "1-2").exists()
            and (tmp_path / "0-0").exists()
            and (tmp_path / "2-0").exists()
        ),
    )
    assert sup.run(max_seconds=30) == 0
    stopper.join()
    assert sup.restarts == 2
    assert sorted(p.name for p in tmp_path.glob("stopped-*")) == [
        "stopped-0",
        "stopped-1",
        "stopped-2",
    ]


def test_sigterm_stops_the_children_one_at_a_time_with_a_gap_between(tmp_path):
    """The next child is sent SIGTERM only once the one before has exited and ``leave_gap_s``
    has passed: two members leaving at once, or one inside the rebalance the other's leave
    started, wedge the embedded broker's group (bench/results/group_restarts.md)."""
    script = f"""
        import pathlib, signal, sys, time
        d = pathlib.Path({str(tmp_path)!r})

        def stop(*_):
            (d / f"term-{{i}}").write_text(repr(time.time()))
            time.sleep(0.3)  # a clean stop takes a while
            (d / f"exit-{{i}}").write_text(repr(time.time()))
            sys.exit(0)

        signal.signal(signal.SIGTERM, stop)
        (d / f"up-{{i}}").touch()
        while True:
            time.sleep(0.05)
        """
    sup = Supervisor(child(script), 3, poll_s=0.02, leave_gap_s=0.5)
    stopper = _stop_when(sup, lambda: len(list(tmp_path.glob("up-*"))) == 3)
    started = time.monotonic()
    assert sup.run(max_seconds=30) == 0
    stopper.join()
    at = {p.name: float(p.read_text()) for p in tmp_path.glob("*-*") if not p.name.startswith("up")}
    for i in (1, 2):
        assert at[f"term-{i}"] >= at[f"exit-{i - 1}"] + 0.5
    assert time.monotonic() - started < 10


def test_a_refused_configuration_stops_all_and_is_the_exit_code(tmp_path):
    script = f"""
        import sys, time
        if i == 0:
            sys.exit({CONFIG_ERROR})
        time.sleep(60)
        """
    sup = Supervisor(child(script), 2, poll_s=0.02, policy=fast_policy)
    started = time.monotonic()
    assert sup.run(max_seconds=30) == CONFIG_ERROR
    assert time.monotonic() - started < 10 and sup.restarts == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_children_die_with_a_supervisor_killed_outright(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from streambandit.stream.supervisor import Supervisor
        write_pid = "import os; open({str(tmp_path)!r} + '/pid-%d', 'w').write(str(os.getpid()))"
        cmd = lambda i: [sys.executable, "-c", write_pid % i + "; import time; time.sleep(120)"]
        Supervisor(cmd, 2, poll_s=0.02).run()
        """)
    sup = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("pid-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid-*")]
    assert len(pids) == 2
    sup.send_signal(signal.SIGKILL)
    sup.wait(10)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (dead, not yet reaped by init) counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _stop_when(sup: Supervisor, ready):
    import threading

    def watch() -> None:
        deadline = time.monotonic() + 25
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.02)
        sup.stop()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t
