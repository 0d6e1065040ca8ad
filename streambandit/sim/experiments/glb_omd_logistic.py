"""GLB-OMD paper, synthetic logistic (Bernoulli) bandit at S = 3, 5, 7: glb_omd vs glm_ucb_refit vs oful."""

from __future__ import annotations

from typing import Callable

from streambandit.sim.experiments import _glb_omd_exp

SIZES = _glb_omd_exp.SIZES
NAME = "glb-omd-logistic"
_LINK = "logistic"


def total_rounds(*, size: str, seeds: int | None) -> int:
    return _glb_omd_exp.total_rounds(_LINK, size=size, seeds=seeds)


def run(*, size: str, seeds: int | None, progress: Callable[[int], None]):
    return _glb_omd_exp.run(_LINK, NAME, size=size, seeds=seeds, progress=progress)
