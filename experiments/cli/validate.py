"""The `syncbench validate` command: every strategy priced by the model and simulated on SimGrid, side by side
(its arguments and run live with the matrix, in experiments/validate.py)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from experiments.validate import add_arguments as validate_arguments

    validate_arguments(p)


def run(args) -> int:
    from experiments.validate import run as validate_run

    return validate_run(args)
