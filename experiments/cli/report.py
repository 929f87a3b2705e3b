"""The `syncbench report` command: (re)build DIR/report.html from DIR's results."""

from __future__ import annotations

from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("dir")


def run(args) -> int:
    from reports.page import build

    print(build(Path(args.dir)))
    return 0
