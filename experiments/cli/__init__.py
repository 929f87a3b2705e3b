"""The `syncbench` command line: parse arguments, hand each command to its job's package."""

from experiments.cli.main import main

__all__ = ["main"]
