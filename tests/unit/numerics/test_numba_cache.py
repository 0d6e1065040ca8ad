"""The learners import and run where numba's usual cache directories are not writable and HOME is
unset: what the container's system user meets (site-packages owned by root, no home)."""

import os
import subprocess
import sys
from pathlib import Path

import streambandit.numerics.jit as jit

RUN = (
    "import numpy as np; from streambandit import make_policy; import streambandit.numerics.jit as j; "
    "p = make_policy('oful', dim=3); i = p.select(np.eye(3)); p.update(np.eye(3)[i], 1.0); "
    "print('ran', repr(j.CACHE_DIR))"
)
ROOT = Path(__file__).resolve().parents[3]


def run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "OPENBLAS_NUM_THREADS": "1",
        "NUMBA_CACHE_DIR": str(blocker / "numba"),
        "TMPDIR": str(tmp_path / "tmp"),
    }  # no HOME
    (tmp_path / "tmp").mkdir()
    return subprocess.run(
        [sys.executable, "-c", RUN],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


def test_an_unwritable_numba_cache_dir_and_no_home_still_run_the_learners(tmp_path):
    out = run(tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ran ") and "a-file" not in out.stdout


def nothing_writable_but(tmp_path, monkeypatch):
    """The container's case in this process: NUMBA_CACHE_DIR and the package not writable, no HOME."""
    real = jit._writable
    monkeypatch.setattr(jit._numba_config, "CACHE_DIR", str(tmp_path / "a-file" / "numba"))
    monkeypatch.setattr(jit, "_writable", lambda path: str(tmp_path) in path and real(path))
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(jit.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    (tmp_path / "a-file").write_text("")
    (tmp_path / "tmp").mkdir()


def test_with_neither_the_package_nor_a_home_writable_a_private_temporary_directory_is_used(
    tmp_path, monkeypatch
):
    nothing_writable_but(tmp_path, monkeypatch)
    chosen = jit._choose()
    assert chosen == str(tmp_path / "tmp" / f"streambandit-numba-{os.getuid()}")
    assert os.stat(chosen).st_mode & 0o777 == 0o700


def test_a_temporary_directory_others_can_write_is_never_used(tmp_path, monkeypatch):
    nothing_writable_but(tmp_path, monkeypatch)
    planted = tmp_path / "tmp" / f"streambandit-numba-{os.getuid()}"
    planted.mkdir()
    os.chmod(planted, 0o777)  # anyone could have put a pickle in it
    assert jit._choose() is None
