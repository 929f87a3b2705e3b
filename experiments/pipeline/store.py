"""The results store: DIR/runs.parquet (one row per run) and DIR/steps.parquet (one row per step and rank).

Every finished run is appended atomically (write a temporary file, then rename), steps first and the run
row last, so a run counts as done only once both are on disk. A crash or a signal between runs loses
nothing already measured; one during a write leaves the previous files intact.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import pandas as pd

RUNS = "runs.parquet"
STEPS = "steps.parquet"
RESULTS_ROOT = Path("results")  # where a sweep's results go when --out is not given
# the columns the store itself reads: a Parquet file without them is not one of ours (another tool's file, say)
RUN_COLUMNS = ("run_id", "status")
STEP_COLUMNS = ("run_id",)


class StoreError(ValueError):
    """A results directory that cannot be used: not creatable, not writable, or holding someone else's files."""


def default_dir(sweep_name: str) -> tuple[Path, str]:
    """results/<a safe directory name made from the sweep name>, and a note when the name had to change.

    A sweep file is input from whoever wrote it: its name must not choose where results are written
    (name = "/tmp/x" or "../../x"), so everything but letters, digits, '.', '_' and '-' becomes '_'.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", sweep_name).strip("._-")[:100] or "sweep"
    note = "" if safe == sweep_name else (f"sweep name {sweep_name!r} is not a safe directory name: "
                                          f"results go to {RESULTS_ROOT / safe} (use --out to choose)")
    return RESULTS_ROOT / safe, note


class Store:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StoreError(f"results directory {str(self.dir)!r} is a file, not a directory") from None
        except NotADirectoryError:
            raise StoreError(f"results directory {str(self.dir)!r}: a part of that path is a file, "
                             f"not a directory") from None
        except OSError as e:
            raise StoreError(f"cannot create results directory {str(self.dir)!r}: {e.strerror}") from None
        try:  # a real write, not os.access: it also catches a read-only file system (and root is no exception)
            with tempfile.TemporaryFile(dir=self.dir):
                pass
        except OSError as e:
            raise StoreError(f"results directory {str(self.dir)!r} is not writable: {e.strerror}") from None

    def start(self, resume: bool, overwrite: bool) -> None:
        """Before a sweep: refuse to mix with earlier results unless resuming; --overwrite removes them."""
        if resume or self.runs().empty:
            return
        if not overwrite:
            raise FileExistsError(f"{self.dir} already holds results: pass --resume to complete them "
                                  f"or --overwrite to start again")
        for name in (RUNS, STEPS):
            (self.dir / name).unlink(missing_ok=True)

    def runs(self) -> pd.DataFrame:
        return _read(self.dir / RUNS, RUN_COLUMNS)

    def steps(self) -> pd.DataFrame:
        return _read(self.dir / STEPS, STEP_COLUMNS)

    def done(self) -> set[str]:
        """Run ids that finished successfully (resume skips them; failed runs are tried again)."""
        runs = self.runs()
        if runs.empty:
            return set()
        return set(runs.loc[runs["status"] == "ok", "run_id"])

    def append(self, run_row: dict, step_rows: list[dict]) -> None:
        """Add one run, replacing any earlier attempt of the same run id (a failed one, on resume)."""
        run_id = run_row["run_id"]
        steps = self.steps()
        if not steps.empty:
            steps = steps[steps["run_id"] != run_id]
        new_steps = pd.DataFrame(step_rows)
        if not new_steps.empty:
            steps = new_steps if steps.empty else pd.concat([steps, new_steps], ignore_index=True)
        if not steps.empty:
            _write_atomic(steps, self.dir / STEPS)
        runs = self.runs()
        if not runs.empty:
            runs = runs[runs["run_id"] != run_id]
        row = pd.DataFrame([run_row])
        runs = row if runs.empty else pd.concat([runs, row], ignore_index=True)
        _write_atomic(runs, self.dir / RUNS)

    def write_text(self, name: str, text: str) -> Path:
        path = self.dir / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        return path


def _read(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A Parquet file of ours, or an empty frame when there is none; StoreError for anything else."""
    if not path.exists():
        return pd.DataFrame()
    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds; all mean "not a Parquet file we can read"
        raise StoreError(f"{str(path)!r} is not a readable Parquet file ({type(e).__name__}): move it away or "
                         f"choose another --out") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing and not frame.empty:
        raise StoreError(f"{str(path)!r} is not a syncbench results file (no column(s) {', '.join(missing)}): "
                         f"move it away or choose another --out")
    return frame


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(".parquet.tmp")
    frame.to_parquet(tmp, index=False)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
