"""The papers' experiments (``streambandit simulate NAME``): one module each, found by name."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "load"]

# name on the command line -> module in this package
EXPERIMENTS = {
    "glb-omd-logistic": "glb_omd_logistic",
    "glb-omd-poisson": "glb_omd_poisson",
    "hvt-ucb": "hvt_ucb",
    "dbs-linucb": "dbs_linucb",
    "bkb": "bkb",
}


def load(name: str) -> ModuleType:
    """The experiment module called ``name``; ValueError listing the known ones otherwise."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(EXPERIMENTS)}")
    return importlib.import_module(f"streambandit.sim.experiments.{EXPERIMENTS[name]}")
