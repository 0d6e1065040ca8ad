"""The ``streambandit`` command: one module per group of sub-commands, parsed in main.py."""

from streambandit.cli.commands import main

__all__ = ["main"]
