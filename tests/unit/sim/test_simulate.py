"""Every registered experiment runs at its tiny size, its numbers are finite and its files are
written; the command line runs one and refuses an unknown name."""

import subprocess
import sys

import numpy as np
import pytest

from streambandit.sim.experiments import EXPERIMENTS, load
from streambandit.sim.experiments.base import write_result


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_runs_at_tiny_size_and_writes_its_files(name, tmp_path):
    module = load(name)
    seen = []
    result = module.run(size="tiny", seeds=None, progress=seen.append)
    assert result.name == name and result.curves and result.summary.strip()
    assert sum(seen) == module.total_rounds(size="tiny", seeds=None)
    for c in result.curves:
        assert c.regret.shape == c.seconds.shape and c.regret.ndim == 1 and len(c.regret) > 0
        assert np.isfinite(c.regret).all() and np.isfinite(c.seconds).all()
        assert (np.diff(c.seconds) >= 0).all()  # cumulative time
        assert all(np.isfinite(v).all() and len(v) == len(c.regret) for v in c.extra.values())
    written = write_result(result, tmp_path, size="tiny")
    assert {p.suffix for p in written} >= {".csv", ".md"}
    assert all(p.stat().st_size > 0 for p in written)


def test_the_command_runs_an_experiment_and_refuses_an_unknown_one(tmp_path):
    name = next(iter(EXPERIMENTS))
    out = subprocess.run(
        [sys.executable, "-m", "streambandit", "simulate", name, "--tiny", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.md").exists()
    assert "rounds" in out.stderr  # the progress bar
    bad = subprocess.run(
        [sys.executable, "-m", "streambandit", "simulate", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown experiment 'nope'" in bad.stderr
