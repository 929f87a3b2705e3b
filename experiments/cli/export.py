"""The `syncbench export` command: a results directory's runs and steps as one file per table."""

from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("dir", help="a results directory (the --out of run or simulate)")
    p.add_argument("--out", required=True, help="directory to write runs.<format> and steps.<format> into")
    p.add_argument("--format", default="parquet", choices=("parquet", "csv"), help="file format (default parquet)")


def run(args) -> int:
    from experiments.results.export import export

    for path in export(args.dir, args.out, args.format):
        print(path)
    return 0
