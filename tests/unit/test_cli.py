"""The command line runs the in-process simulation and reports bad input as an error, not a trace."""

import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "-m", "streambandit", *args], capture_output=True, text=True, timeout=120)


def test_simulate_ads_runs_and_learns_something():
    out = run("simulate-ads", "--requests", "3000", "--seed", "1")
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    requests, learner, best, random = int(last[0]), float(last[2]), float(last[3]), float(last[4])
    assert requests == 3000
    assert random < learner <= best


def test_unknown_policy_is_a_clear_error():
    out = run("simulate-ads", "--policy", "nope", "--requests", "10")
    assert out.returncode == 2
    assert "unknown policy 'nope'" in out.stderr and "Traceback" not in out.stderr


def test_bench_passes_its_options_to_the_benchmark():
    out = run("bench", "--quick", "--only", "oful_play,naive_oful")
    assert out.returncode == 0, out.stderr
    assert "Command: `streambandit bench peers --quick --only oful_play,naive_oful`" in out.stdout
    rows = [line for line in out.stdout.splitlines() if line.startswith("| streambandit oful, play()")
            or line.startswith("| naive numpy OFUL")]
    assert len(rows) >= 2 and "2,000" in rows[0]


def test_bench_with_a_bad_option_is_a_clear_error():
    out = run("bench", "peers", "--n", "0")
    assert out.returncode == 2
    assert "--n must be >= 1" in out.stderr and "Traceback" not in out.stderr


def test_bench_runs_the_checkout_benchmarks_by_name():
    out = run("bench", "memory", "--help")
    assert out.returncode == 0, out.stderr
    assert "python -m bench.memory" in out.stdout and "--quick" in out.stdout
