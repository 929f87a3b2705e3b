"""Signals (issue 27): SIGTERM to the process group of a running `syncbench run` (what `timeout`, systemd and Slurm
send) ends it within 10 s naming the signal, keeps the finished runs, and leaves no Ray process or temp dir; a
driver killed with SIGKILL leaves no Ray process or temp dir either (its reaper ends them).

Each test runs the command line in a session of its own, so that it signals only what that command started, never
the test session's Ray."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from experiments.pipeline.store import Store

REPO = Path(__file__).resolve().parents[2]

SWEEP = """
name = "signals"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
warmup_steps = 1
workers = 2
strategy = "ring"
timeout = 600
[grid]
steps = [3, 1000000]
"""


def _session_processes(sid: int) -> list[str]:
    """Live processes of session `sid`: 'pid cmdline'."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != b"Z":  # session id is field 6; zombies are already gone
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{name} {cmdline[:120]}")
        except (OSError, IndexError, ValueError):
            continue
    return found


def _naming(text: str) -> list[str]:
    """Live processes whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(name)
            except OSError:
                continue
    return found


@pytest.fixture
def short_tmp():
    """A temp dir with a short path: Ray's socket paths under it must stay within the 107 bytes of sun_path."""
    path = Path(tempfile.mkdtemp(prefix="sbsig", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timing
@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm_to_the_group", "sigkill_driver"])
def test_sigterm_to_the_group_ends_the_run_within_10s_and_leaves_no_ray_process_or_temp_dir(short_tmp, sig):
    (short_tmp / "s.toml").write_text(SWEEP)
    out = short_tmp / "out"
    log = open(short_tmp / "log", "w+")
    env = {**os.environ, "TMPDIR": str(short_tmp), "RAY_ADDRESS": ""}
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "run", str(short_tmp / "s.toml"), "--out", str(out),
                             "--no-report"], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "[run 2/2]" not in (short_tmp / "log").read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, (short_tmp / "log").read_text()
            time.sleep(0.5)
        assert "[run 2/2]" in (short_tmp / "log").read_text(), "the second run never started"
        time.sleep(1)  # the group (started for run 1, kept for run 2: same world size) is training
        assert list(short_tmp.glob("syncbench-ray-*")) and len(_session_processes(proc.pid)) > 1
        start = time.monotonic()
        if sig == signal.SIGTERM:
            os.killpg(proc.pid, sig)  # the driver, GCS, raylet and agents (Ray's workers have groups of their own)
        else:
            os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
        took = time.monotonic() - start
        reaped = time.monotonic() + 10  # SIGKILL: the reaper ends the rest after the driver is gone
        while (_session_processes(proc.pid) or _naming(str(short_tmp))) and time.monotonic() < reaped:
            time.sleep(0.25)
        text = (short_tmp / "log").read_text()
        assert _session_processes(proc.pid) == [] and _naming(str(short_tmp)) == [], text
        assert not list(short_tmp.glob("syncbench-ray-*")), text
        if sig == signal.SIGTERM:
            assert took < 10 and code == 128 + signal.SIGTERM, (took, code, text)
            assert "SIGTERM" in text and "Traceback" not in text, text
        runs = Store(out).runs()  # the finished run is kept
        assert runs["steps"].tolist() == [3] and runs["status"].tolist() == ["ok"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
