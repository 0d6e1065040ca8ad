"""The side-by-side benchmark behind ``streambandit bench``: one seeded synthetic stream fed to
streambandit's learners and, in the same run, to the libraries a user would pick instead.

``stream`` builds the stream and scores regret, ``peers`` adapts each library to one
``run(arms, rewards) -> chosen`` call, ``inprocess`` times them (each in its own process, for
peak memory) and writes the table. The peer libraries are benchmark-only dependencies
(``pip install 'streambandit[bench]'``): nothing here imports them at module level.
"""

import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for the machine line of every benchmark report."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or ""
