"""Docstring examples are run, so they cannot go stale (examples that need a broker are marked
``+SKIP`` where they stand)."""

import doctest
import importlib
import pkgutil

import pytest

import streambandit

MODULES = ["streambandit"] + [
    m.name
    for m in pkgutil.walk_packages(streambandit.__path__, "streambandit.")
    if not m.name.endswith("__main__")
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, (
        f"{result.failed} of {result.attempted} doctest examples failed in {name}"
    )
