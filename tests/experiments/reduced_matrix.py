"""The reduced validation matrix's rows (tests/experiments/test_validate.py's cells, model vs SimGrid alpha_beta),
computed in this process or in a process of its own.

`make test-fast` runs its thread-rank tests on one core (the GIL holds every rank of a test in one process) and
leaves the other idle; the matrix is about 20 s of CPU. So when the collected tests include the matrix's and no test
that measures wall-clock time or starts Ray (make test-fast's selection), tests/conftest.py starts the matrix here
in a process of its own, one simulation at a time on the idle core, as soon as collection ends; the matrix's tests
read its rows when they come to them. Any other selection computes them in the test process as before (`syncbench
validate --jobs 2`), so nothing runs beside a timing test. The cells, the simulations and the checks are the same
either way.

    python -m tests.experiments.reduced_matrix OUT.pickle JOBS   # what the background process runs
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 900  # the longest a test waits for the background rows (about 20 s of CPU on a quiet machine)


def compute(jobs: int) -> dict:
    """{(label, n, ranks per node, bandwidth, latency): the validate row} of every cell of the reduced matrix."""
    from experiments.validate import Cell, validate
    from tests.experiments.test_validate import BY_LABEL, _cells

    cells = _cells()
    frame = validate([Cell(BY_LABEL[label], n, b, lat, k) for label, n, k, b, lat in cells], jobs=jobs,
                     log=io.StringIO())
    return dict(zip(cells, frame.to_dict("records")))


class Background:
    """The matrix computing in a child process (one simulation at a time); rows() waits for it."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="syncbench-matrix-"))
        self.out, self.log = self.dir / "rows.pickle", self.dir / "stderr.txt"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.experiments.reduced_matrix", str(self.out), "1"],
                                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)

    def rows(self) -> dict:
        deadline = time.monotonic() + WAIT_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.stop()
            raise RuntimeError(f"the reduced matrix's process did not finish in {WAIT_S} s")
        if self.proc.returncode != 0 or not self.out.is_file():
            raise RuntimeError(f"the reduced matrix's process failed (exit status {self.proc.returncode}): "
                               f"{self.log.read_text()[-3000:]}")
        return pickle.loads(self.out.read_bytes())

    def stop(self) -> None:
        """Ends the process if it still runs (a session cut short) and removes its files."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for path in (self.out, Path(f"{self.out}.partial"), self.log):
            path.unlink(missing_ok=True)
        os.rmdir(self.dir)


if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)
    rows = compute(int(sys.argv[2]))
    partial = Path(sys.argv[1] + ".partial")
    partial.write_bytes(pickle.dumps(rows))
    partial.replace(sys.argv[1])  # whole or absent: never a half-written file read as the rows
