"""The `syncbench schema` command: the columns of the runs and steps tables, or (--settings) the sweep settings."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--settings", action="store_true",
                   help="list the sweep settings instead (name, type, default, accepted values, unit, meaning)")


def run(args) -> int:
    if args.settings:
        from experiments.config.settings_doc import plain

        print(plain(), end="")
        return 0
    from experiments.results.describe import describe

    print(describe())
    return 0
