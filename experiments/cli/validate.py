"""The `syncbench validate` command: every strategy priced by the model and simulated on SimGrid, side by side, and
with --substrates the small cells measured on emulated (and kernel-shaped) links (its arguments and run live with
the matrix, in experiments/validate.py and experiments/validate_runs.py)."""

from __future__ import annotations


def add_arguments(p) -> None:
    from experiments.validate import add_arguments as validate_arguments
    from experiments.validate_runs import add_arguments as measured_arguments

    validate_arguments(p)
    measured_arguments(p)


def run(args) -> int:
    import functools

    from experiments.validate import run as validate_run
    from experiments.validate_runs import add_measured, check_arguments

    check_arguments(args)  # the measured substrates' options, before any work
    args.measure = functools.partial(add_measured, args=args)  # after the matrix: its measured rows
    return validate_run(args)
