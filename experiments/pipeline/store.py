"""The results store: DIR/runs.parquet (one row per run) and DIR/steps.parquet (one row per step and rank).

Every finished run is appended atomically (write a temporary file, then rename), steps first and the run
row last, so a run counts as done only once both are on disk. A crash or a signal between runs loses
nothing already measured; one during a write leaves the previous files intact.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

RUNS = "runs.parquet"
STEPS = "steps.parquet"


class Store:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def runs(self) -> pd.DataFrame:
        path = self.dir / RUNS
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()

    def steps(self) -> pd.DataFrame:
        path = self.dir / STEPS
        return pd.read_parquet(path) if path.exists() else pd.DataFrame()

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


def _write_atomic(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_suffix(".parquet.tmp")
    frame.to_parquet(tmp, index=False)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
