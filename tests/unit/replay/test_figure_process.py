"""The figure process: figures drawn by a forked child are the ones drawn in process, a child that
fails leaves the drawing to the parent, and no child outlives its parent's command."""

import os
import subprocess
import sys
import textwrap

import pytest

from streambandit.replay.figure_process import FigureProcess

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")


def _pid_and_value(x):
    return os.getpid(), x * 2


def _fails(_):
    raise RuntimeError("a figure that cannot be drawn")


def test_the_calls_run_in_the_child_and_their_results_come_back():
    with FigureProcess() as figures:
        [(pid, value), (pid2, value2)] = figures.draw(
            [(_pid_and_value, (21,), {}), (_pid_and_value, (), {"x": 1})]
        )
    assert (value, value2) == (42, 2)
    assert pid == pid2 != os.getpid()


def test_sent_calls_run_in_the_child_while_the_parent_goes_on(tmp_path):
    marker = tmp_path / "parent went on"
    with FigureProcess() as figures:
        figures.send([(_pid_and_value, (21,), {})])
        marker.write_text("written after send, before results")
        [(pid, value)] = figures.results()
    assert value == 42 and pid != os.getpid()


def test_a_child_that_fails_leaves_the_calls_to_the_parent():
    with FigureProcess() as figures:
        with pytest.raises(RuntimeError, match="cannot be drawn"):
            figures.draw([(_pid_and_value, (1,), {}), (_fails, (0,), {})])
    # The parent ran them itself (and raised as an in-process drawing would).


def test_a_second_draw_runs_in_process():
    with FigureProcess() as figures:
        figures.draw([(_pid_and_value, (1,), {})])
        [(pid, _)] = figures.draw([(_pid_and_value, (1,), {})])
    assert pid == os.getpid()


def test_no_child_outlives_the_command_and_no_output_is_written_twice(tmp_path):
    """A parent that never draws (an error in the replay) ends its child by closing the pipe;
    output buffered before the fork is written once."""
    script = textwrap.dedent(
        """
        import os, sys
        from streambandit.replay.figure_process import FigureProcess
        sys.stdout.write("before the fork\\n")  # buffered: stdout is a pipe
        with FigureProcess() as figures:
            print("child", figures._pid)
            sys.stdout.flush()
            raise SystemExit(3)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 3, out.stderr
    lines = out.stdout.splitlines()
    assert lines.count("before the fork") == 1
    child = int(lines[-1].split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # reaped by the parent, not left running or a zombie of init's


def test_replay_figures_from_the_child_are_written(tmp_path):
    """write_report with the figure process writes the same files as without it."""
    from streambandit.replay.report import write_report
    from streambandit.replay.runner import replay
    from tests.unit.replay.test_replay_runner import models_config, worker_log

    pytest.importorskip("matplotlib")
    config = models_config()
    result = replay(worker_log(config, 200)[0], config)
    with FigureProcess() as figures:
        written = write_report(result, tmp_path / "child", figures=figures)
    plain = write_report(result, tmp_path / "plain")
    assert [p.name for p in written] == [p.name for p in plain]
    assert (tmp_path / "child" / "replay.png").read_bytes()[:4] == b"\x89PNG"
