"""The ``streambandit`` command: the parser and every sub-command in commands.py; warmup.py
compiles the kernels ahead."""

from streambandit.cli.commands import main

__all__ = ["main"]
