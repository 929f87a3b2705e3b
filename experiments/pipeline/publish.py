"""Copy a sweep's results into docs/results/<gpu or cpu name>/ so they can be committed with the code.

    python -m experiments.pipeline.publish results/scaling
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from experiments.results.dataset import read_runs


def publish(results_dir: str | Path, docs: str | Path = "docs/results") -> Path:
    results_dir = Path(results_dir)
    runs = read_runs(results_dir)
    names = [g for g in runs["gpu"].unique() if g] or [runs["host"].iloc[0]]
    target = Path(docs) / re.sub(r"[^A-Za-z0-9._-]+", "-", names[0]).strip("-") / results_dir.name
    target.mkdir(parents=True, exist_ok=True)
    # the runs in either layout (runs/ one file per run; runs.parquet from before), the report and the sweep
    for name in ("runs.parquet", "report.html", "sweep.toml", "sweep.resolved.json"):
        if (results_dir / name).exists():
            shutil.copy2(results_dir / name, target / name)
    if (results_dir / "runs").is_dir():
        shutil.copytree(results_dir / "runs", target / "runs", dirs_exist_ok=True)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m experiments.pipeline.publish RESULTS_DIR")
    print(publish(sys.argv[1]))
