"""The failure tables, typed as the rest of the results: one row per run with failures and one per failure.

`syncbench faults --out DIR` writes DIR/fault_runs.parquet and DIR/failures.parquet beside runs/ and steps/
(each written atomically by the dataset's writer, an existing one never overwritten unless asked); `read(DIR)`
gives them back as frames in their types. The columns are the schema's (experiments/results/schema.py TABLES:
`syncbench schema` lists them). Seconds are measured on the ranks that ran (thread ranks or Ray actors:
`substrate` says which).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from experiments.results.dataset import _write_atomic
from experiments.results.schema import FAILURES, FAULT_RUNS, conform, to_arrow

FILES = {"fault_runs": FAULT_RUNS, "failures": FAILURES}


def write(directory: str | Path, runs: list[dict], failures: list[dict], overwrite: bool = False) -> list[Path]:
    """Both tables into `directory`; FileExistsError naming a file already there unless `overwrite`."""
    directory = Path(directory)
    paths = {name: directory / f"{name}.parquet" for name in FILES}
    there = [str(p) for p in paths.values() if p.exists()]
    if there and not overwrite:
        raise FileExistsError(f"{', '.join(there)} already exist(s): pass --overwrite to replace, or another --out")
    directory.mkdir(parents=True, exist_ok=True)
    for name, rows in (("fault_runs", runs), ("failures", failures)):
        _write_atomic(to_arrow(rows, FILES[name]), paths[name])
    return list(paths.values())


def read(directory: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fault_runs, failures) of `directory`, in the schema's types; FileNotFoundError naming a missing one."""
    out = []
    for name, table in FILES.items():
        path = Path(directory) / f"{name}.parquet"
        if not path.exists():
            raise FileNotFoundError(f"{path}: no failure results here (write them with `syncbench faults --out`)")
        out.append(conform(pq.read_table(path).to_pandas(), table))
    return out[0], out[1]
