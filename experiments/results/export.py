"""`syncbench export`: a results directory's tables as one file each, for pandas, a notebook or a spreadsheet.

The runs/ and steps/ folders hold one Parquet part per run (experiments/results/dataset.py): a run stored again
supersedes its earlier attempt, and a column (a strategy's param_*) may appear only in later parts. A plain
`pandas.read_parquet(DIR/runs)` takes the first part's columns and keeps every attempt, so it must not be used;
`load_runs` / `load_steps` (and this export) read the parts as the report does: every column, latest attempt only.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from experiments.results.dataset import TABLES, StoreError, check_contained, create_temp, discard, read_runs, read_steps

FORMATS = ("parquet", "csv")


def load_runs(results_dir: str | Path) -> pd.DataFrame:
    """One row per run of a results directory (its latest attempt), every column in the schema's types
    (`syncbench schema` says what each means), strategy parameters as param_<name> (None where the run's strategy
    has no such parameter)."""
    return read_runs(_checked_dir(results_dir))


def load_steps(results_dir: str | Path) -> pd.DataFrame:
    """One row per step and rank of every run's latest attempt (join with load_runs on run_id)."""
    return read_steps(_checked_dir(results_dir))


def export(results_dir: str | Path, out: str | Path, fmt: str = "parquet") -> list[Path]:
    """Write OUT/runs.<fmt> and OUT/steps.<fmt> (each replaced whole or not at all); their paths."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt!r}: accepted are {', '.join(FORMATS)}")
    results_dir, out = _checked_dir(results_dir), Path(out)
    inside = {results_dir.resolve() / name for name in ("", *TABLES)}
    if out.resolve() in inside:
        raise ValueError(f"--out {str(out)!r} is the results directory or one of its tables: choose a directory "
                         f"of its own, e.g. {str(results_dir / 'export')!r}")
    frames = {"runs": load_runs(results_dir), "steps": load_steps(results_dir)}
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot create --out {str(out)!r}: {e.strerror or e}") from None
    written = []
    for table, frame in frames.items():
        path = out / f"{table}.{fmt}"
        _write(_plain(frame), path, fmt)
        written.append(path)
    return written


def _checked_dir(results_dir: str | Path) -> Path:
    results_dir = Path(results_dir)
    if not (results_dir / "runs").is_dir() and not (results_dir / "runs.parquet").exists():
        raise FileNotFoundError(f"{str(results_dir)!r} holds no results (no runs/ folder): give the --out of a "
                                f"`syncbench run` or `simulate`")
    check_contained(results_dir)
    return results_dir


def _plain(frame: pd.DataFrame) -> pd.DataFrame:
    """Columns a file can hold: a strategy parameter whose values differ in type between strategies (staleness:
    an integer or "async") as text, tuples as lists."""
    frame = frame.copy()
    for column in [c for c in frame.columns if frame[c].dtype == "object"]:
        values = [v for v in frame[column] if v is not None and v == v]
        kinds = {type(v) for v in values}
        if kinds <= {tuple, list}:
            frame[column] = [list(v) if isinstance(v, tuple) else v for v in frame[column]]
        elif len(kinds) > 1 and not kinds <= {int, float}:  # (1 and 1e-4 are both numbers)
            frame[column] = [None if v is None or v != v else str(v) for v in frame[column]]
    return frame


def _write(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    """One file replaced whole or not at all, never through a link (as the store writes its parts)."""
    tmp = path.with_name(path.name + ".tmp")
    if path.is_symlink():
        raise StoreError(f"{str(path)!r} is a symbolic link: export replaces files, never writes through a link; "
                         f"remove it or choose another --out")
    try:
        with create_temp(tmp) as f:
            if fmt == "parquet":
                pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), f)
            else:
                f.write(frame.to_csv(index=False).encode("utf-8"))
        tmp.replace(path)
    except OSError as e:
        discard(tmp)
        raise StoreError(f"cannot write {str(path)!r}: {e.strerror or e}") from None
