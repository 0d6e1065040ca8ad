"""With ``--log-format json`` every line a process writes on stderr is a JSON object: its log lines,
Python's warnings, uncaught exceptions of the main thread and of other threads, and the error a
command ends with. Each is made to happen in a child process whose whole stderr is then read."""

import json
import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import logging, sys, threading, warnings
    from streambandit.log_format import configure_logging, error_line
    configure_logging(logging.INFO, sys.argv[1])
    logging.getLogger("streambandit").info("started")
    warnings.warn("a warning")
    t = threading.Thread(target=lambda: 1 / 0, name="helper")
    t.start()
    t.join()
    error_line("the final error")
    raise RuntimeError("uncaught")
    """
)


def run(fmt):
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, fmt], capture_output=True, text=True, timeout=60
    )


def test_every_stderr_line_is_json_with_json_logs():
    out = run("json")
    assert out.returncode == 1
    lines = [json.loads(line) for line in out.stderr.splitlines()]  # each line parses
    assert [(d["level"], d["logger"]) for d in lines] == [
        ("INFO", "streambandit"),
        ("WARNING", "py.warnings"),
        ("CRITICAL", "streambandit"),
        ("ERROR", "streambandit"),
        ("CRITICAL", "streambandit"),
    ]
    assert "a warning" in lines[1]["message"]
    assert "thread helper" in lines[2]["message"] and "ZeroDivisionError" in lines[2]["exception"]
    assert lines[3]["message"] == "the final error"
    assert "RuntimeError: uncaught" in lines[4]["exception"]


def test_text_logs_keep_python_s_own_tracebacks_and_the_error_line():
    out = run("text")
    assert out.returncode == 1
    assert "streambandit: error: the final error\n" in out.stderr
    assert "py.warnings" in out.stderr and "Traceback" in out.stderr


REDACTED = textwrap.dedent(
    """
    import logging, sys, threading
    from streambandit.log_format import configure_logging, error_line
    from streambandit.redaction import hide
    configure_logging(logging.INFO, sys.argv[1])
    hide(["pw-log-format"])
    logging.getLogger("streambandit.kafka").warning("librdkafka says pw-log-format")
    t = threading.Thread(target=lambda: {}["pw-log-format"], name="helper")
    t.start()
    t.join()
    error_line("refused pw-log-format")
    raise RuntimeError("uncaught pw-log-format")
    """
)


def test_credentials_are_masked_in_every_line_of_either_format():
    for fmt in ("json", "text"):
        out = subprocess.run(
            [sys.executable, "-c", REDACTED, fmt], capture_output=True, text=True, timeout=60
        )
        assert out.returncode == 1
        assert "pw-log-format" not in out.stderr, fmt
        # each line still says what it said, the credential masked
        assert out.stderr.count("********") >= 4, out.stderr
        assert "KeyError" in out.stderr and "RuntimeError" in out.stderr


def test_verbose_logs_leave_out_numba_s_compile_internals():
    """-v (DEBUG) is the worker's detail, not the compiler's: numba logs each compile's passes at
    DEBUG, thousands of lines a kernel."""
    import logging
    import threading

    from streambandit.log_format import configure_logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger("numba").level
    hooks = sys.excepthook, threading.excepthook
    try:
        configure_logging(logging.DEBUG)
        assert logging.getLogger("streambandit").isEnabledFor(logging.DEBUG)
        assert not logging.getLogger("numba.core.ssa").isEnabledFor(logging.DEBUG)
        assert logging.getLogger("numba.core.ssa").isEnabledFor(logging.INFO)
    finally:
        root.handlers[:], _, _ = saved
        root.setLevel(saved[1])
        logging.getLogger("numba").setLevel(saved[2])
        logging.captureWarnings(False)
        sys.excepthook, threading.excepthook = hooks
