"""The `syncbench schema` command: the columns of the runs and steps tables."""

from __future__ import annotations


def add_arguments(p) -> None:
    """No arguments."""


def run(args) -> int:
    from experiments.results.describe import describe

    print(describe())
    return 0
