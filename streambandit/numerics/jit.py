"""Where numba keeps the compiled kernels, chosen before the first one is compiled.

numba caches a compiled function beside its source (``__pycache__``) or in the user's cache
directory. In a container neither may be writable (site-packages owned by root, a system user
with no home), and numba then refuses to compile a cached function at all ("cannot cache
function ...: no locator available"). So the directory is chosen here, in this order:
``NUMBA_CACHE_DIR`` if writable, beside the sources if writable (numba's default), the user's
cache directory, and a private directory in the system's temporary directory; when none is
writable the kernels are compiled in every process (seconds at start-up) instead of failing.
Every module with kernels decorates them ``njit(cache=CACHE)``.

A directory in a shared temporary directory is used only if this user created it and no one
else can write it: numba's cache files are pickles, loaded as code.
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile

from numba.core import config as _numba_config

__all__ = ["CACHE", "CACHE_DIR"]

log = logging.getLogger("streambandit")


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def _private(path: str) -> bool:
    """``path`` exists or is made as this user's alone (mode 0700), and is writable."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    mine = stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022
    return mine and _writable(path)


def _choose() -> str | None:
    """The cache directory ("" for numba's default beside the sources), or None: no caching."""
    configured = _numba_config.CACHE_DIR
    if configured and _writable(configured):
        return configured
    if _writable(os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")):
        return ""
    home = os.environ.get("XDG_CACHE_HOME") or (
        os.path.join(os.environ["HOME"], ".cache") if os.environ.get("HOME") else ""
    )
    if home and _writable(os.path.join(home, "streambandit", "numba")):
        return os.path.join(home, "streambandit", "numba")
    private = os.path.join(tempfile.gettempdir(), f"streambandit-numba-{os.getuid()}")
    if _private(private):
        return private
    return None


CACHE_DIR = _choose()
CACHE = CACHE_DIR is not None
if CACHE_DIR is not None:
    _numba_config.CACHE_DIR = (
        CACHE_DIR  # numba's locators read it when a function is first compiled
    )
else:
    log.warning(
        "no writable directory for numba's cache (NUMBA_CACHE_DIR, the package, HOME, the temporary "
        "directory): the kernels are compiled in this process; set NUMBA_CACHE_DIR to a writable directory"
    )
