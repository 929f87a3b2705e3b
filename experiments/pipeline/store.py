"""The results store: a results directory with one writer at a time, each finished run appended to its dataset.

Runs go to DIR/runs/ and DIR/steps/ (experiments/results/dataset.py: one file per run and table, merged per batch
of runs, read as one dataset, so a sweep's cost is linear in its runs); results written before that layout
(DIR/runs.parquet and DIR/steps.parquet) still load and resume. A writer holds DIR/syncbench.lock (an flock: the
kernel releases it when the holder dies, so a crash never leaves a stale lock) and writes its pid, host and
command into it, so that a second writer is refused with one line naming the holder. A crash or a signal
between runs loses nothing already stored; one during a write leaves the stored runs intact and no temporary file.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import platform
import re
import shlex
import sys
import tempfile
from pathlib import Path

import pandas as pd

from experiments.results import dataset
from experiments.results.dataset import StoreError

__all__ = ["LOCK", "RAY_LOG", "RESULTS_ROOT", "Store", "StoreError", "default_dir"]

LOCK = "syncbench.lock"
RAY_LOG = "ray.log"  # what Ray's driver logs during a sweep (experiments/cluster/ray_runtime.py), not the progress
RESULTS_ROOT = Path("results")  # where a sweep's results go when --out is not given


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
    """A results directory: read it freely; `start` (or `with Store(...)`) makes this process its one writer."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._lock_fd: int | None = None
        self._seq: int | None = None
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
        dataset.check_contained(self.dir)  # no table folder, part or file the store writes is a link out of it

    # ---- one writer ----------------------------------------------------------------------------------------

    def lock(self) -> None:
        """Become the directory's one writer, or StoreError naming the process that is."""
        if self._lock_fd is not None:
            return
        path = self.dir / LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StoreError(f"cannot open the lock {str(path)!r}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise StoreError(f"{self.dir} is being written by {holder}: wait for it to finish, or choose another "
                             f"--out") from None
        holder = {"pid": os.getpid(), "host": platform.node(), "command": _command(),
                  "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError as e:
            os.close(fd)
            raise StoreError(f"cannot write the lock {str(path)!r}: {e.strerror}") from None
        self._lock_fd = fd

    def close(self) -> None:
        """Stop being the writer (the lock file stays, empty: removing it would race with the next writer)."""
        if self._lock_fd is not None:
            try:
                os.ftruncate(self._lock_fd, 0)
            except OSError:
                pass
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def __enter__(self) -> Store:
        self.lock()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    def start(self, resume: bool, overwrite: bool) -> None:
        """Before a sweep: take the lock; refuse to mix with earlier results unless resuming; --overwrite
        removes them."""
        self.lock()
        dataset.tidy(self.dir)
        if resume and not overwrite:
            dataset.check_parts(self.dir)  # every part, before any run (a truncated steps part broke the report)
        if resume or self.runs().empty:
            return
        if not overwrite:
            raise FileExistsError(f"{self.dir} already holds results: pass --resume to complete them "
                                  f"or --overwrite to start again")
        dataset.remove_all(self.dir)
        self._seq = None

    # ---- reading and writing --------------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        return dataset.read_runs(self.dir)

    def steps(self) -> pd.DataFrame:
        return dataset.read_steps(self.dir)

    def events(self, run_id: str | None = None) -> pd.DataFrame:
        return dataset.read_events(self.dir, run_id)

    def done(self) -> set[str]:
        """Run ids that finished successfully (resume skips them; failed runs are tried again)."""
        runs = self.runs()
        if runs.empty:
            return set()
        return set(runs.loc[runs["status"] == "ok", "run_id"])

    def append(self, run_row: dict, step_rows: list[dict], event_rows=()) -> None:
        """Add one run (a new file per table, whatever is stored already); a later attempt of the same run id, a
        failed one retried on resume, supersedes the earlier one."""
        if self._seq is None:
            self._seq = dataset.next_seq(self.dir)
        dataset.write_run(self.dir, self._seq, run_row, step_rows, event_rows)
        self._seq += 1
        if self._lock_fd is not None:  # only the directory's one writer merges (a batch per BATCH runs)
            dataset.merge(self.dir)

    def write_text(self, name: str, text: str) -> Path:
        return dataset.write_text_atomic(self.dir / name, text)


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the lock file."""
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return (f"pid {info['pid']} on {info['host']} since {info['since']} "
                f"({str(info['command'])[:120]})")
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not said which yet)"


def _command() -> str:
    argv = [Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python", *sys.argv[1:]]
    return shlex.join(argv)[:300]
