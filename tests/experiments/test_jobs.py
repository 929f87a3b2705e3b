"""A sweep submitted as a Ray job to a real head (`ray start --head` on loopback), results checked on disk.

The head gets its own temp dir and free ports, runs from this venv (so the job's `python` is ours), and is
stopped by killing the processes of its own session: `ray stop` would stop every Ray on the machine.
Token authentication stays on (RAY_AUTH_MODE=token) with a token of the test's own in RAY_AUTH_TOKEN.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
import ray  # noqa: F401 - puts Ray's vendored psutil on the import path

from experiments.results.dataset import read_runs, read_steps

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's bin: `ray`, and the `python` the job's entrypoint resolves
JOB_TIMEOUT_S = 240

SWEEP = """
name = "job"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 3
warmup_steps = 1
workers = 2
timeout = 60
[grid]
strategy = ["ring"]
"""

PORT_FLAGS = ("--port", "--dashboard-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
              "--node-manager-port", "--object-manager-port", "--ray-client-server-port",
              "--runtime-env-agent-port", "--metrics-export-port")
WORKER_PORTS = 64  # one per worker process (driver, job supervisor, actors, ...), a few dozen at most here


def _free_ports(n: int) -> list[int]:
    """n distinct ports free right now (bound together, so the OS gives n different ones)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _free_range(size: int) -> int:
    """The first port of `size` consecutive ports that are all free right now."""
    for _ in range(200):
        first = int.from_bytes(os.urandom(2), "big") % (60000 - 20000 - size) + 20000
        try:
            _free_ports_at(range(first, first + size))
            return first
        except OSError:
            continue
    raise RuntimeError(f"no {size} consecutive free ports found")


def _free_ports_at(ports) -> None:
    sockets = []
    try:
        for port in ports:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in sockets:
            s.close()


def _session_processes(sid: int) -> list:
    """Every live process of session `sid` (the head's `ray start` led it; Ray's daemons inherit it)."""
    import psutil  # vendored by Ray

    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def _stop_session(sid: int, grace_s: float = 5.0) -> list:
    """Stop the head's processes: SIGTERM the raylet, dashboard and workers, then the GCS, then SIGKILL."""
    import psutil  # vendored by Ray

    def name(p):
        try:
            return p.name()
        except psutil.Error:
            return ""

    def terminate(procs):
        for p in procs:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                pass
        return psutil.wait_procs(procs, timeout=grace_s)[1]

    procs = _session_processes(sid)
    alive = terminate([p for p in procs if name(p) != "gcs_server"])  # the GCS last: the others report to it
    alive = terminate([p for p in procs if name(p) == "gcs_server"] + alive)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return _session_processes(sid)


@pytest.fixture
def ray_head():
    """A Ray head on 127.0.0.1 with its own temp dir and ports; yields (dashboard URL, env); always stopped."""
    temp_dir = tempfile.mkdtemp(prefix="sbhead-")  # short: Ray's socket paths must stay under ~107 chars
    ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS))))
    first_worker_port = _free_range(WORKER_PORTS)
    # token authentication on, as on a real cluster, with a token of its own in the environment (RAY_AUTH_TOKEN):
    # the head, the job CLI and the job's driver all read it; ~/.ray/auth_token is neither read nor written
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": uuid.uuid4().hex, "RAY_USAGE_STATS_ENABLED": "0"}
    for var in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(var, None)
    # Ray replaces a loopback --node-ip-address by the host's IP, so none is given; the job API (dashboard)
    # listens on 127.0.0.1 only
    command = [str(BIN / "ray"), "start", "--head", "--num-cpus", "4",
               "--include-dashboard=true", "--dashboard-host", "127.0.0.1", "--temp-dir", temp_dir,
               "--min-worker-port", str(first_worker_port),
               "--max-worker-port", str(first_worker_port + WORKER_PORTS - 1), "--disable-usage-stats"]
    for flag, port in ports.items():
        command += [flag, str(port)]
    # its own session: every daemon `ray start` leaves behind is in it, and only those get stopped
    # (output to a file, not a pipe: the daemons would hold a pipe open after `ray start` returns)
    log = Path(temp_dir) / "ray-start.log"
    with open(log, "w") as f:
        head = subprocess.Popen(command, env=env, cwd=temp_dir, start_new_session=True, stdout=f,
                                stderr=subprocess.STDOUT)
    sid = head.pid
    try:
        head.wait(timeout=120)
        assert head.returncode == 0, f"ray start --head failed ({head.returncode}):\n{log.read_text()}"
        url = f"http://127.0.0.1:{ports['--dashboard-port']}"
        yield url, env
    finally:
        if head.poll() is None:
            head.kill()
        left = _stop_session(sid)
        assert not left, f"head processes still running after SIGKILL: {[p.pid for p in left]}"
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_sweep_as_a_ray_job_on_a_real_head(ray_head, tmp_path):
    url, env = ray_head
    sweep = tmp_path / "job.toml"
    sweep.write_text(SWEEP)
    out = tmp_path / "results"
    job_id = f"syncbench-test-{uuid.uuid4().hex[:8]}"
    runtime_env = json.dumps({"excludes": [".venv", "results", ".git", "*.egg-info", ".pytest_cache",
                                           ".ruff_cache", "__pycache__"]})
    command = [str(BIN / "ray"), "job", "submit", "--address", url, "--submission-id", job_id,
               "--working-dir", str(REPO), "--runtime-env-json", runtime_env, "--",
               "python", "-m", "experiments", "run", str(sweep), "--out", str(out), "--no-report"]
    start = time.monotonic()
    submit = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    log = submit.stdout + submit.stderr

    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(url, headers={"Authorization": f"Bearer {env['RAY_AUTH_TOKEN']}"})
    status = client.get_job_status(job_id)
    job_log = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, f"job {job_id} ended {status}:\n{log}\n{job_log}"
    assert submit.returncode == 0, log
    print(f"job {job_id} SUCCEEDED in {time.monotonic() - start:.0f} s")
    with pytest.raises(AuthenticationError):  # without the head's token, the job API refuses
        JobSubmissionClient(url, headers={"Authorization": "Bearer not-the-token"}).get_job_status(job_id)

    # the sweep joined the head's cluster (RAY_ADDRESS, set by Ray for the job) instead of starting its own Ray
    listed = subprocess.run([str(BIN / "ray"), "list", "actors", "--address", url, "--filter",
                             "class_name=GroupWorker", "--format", "json"], env=env, capture_output=True, text=True,
                            timeout=60)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    workers = json.loads(listed.stdout)
    assert len(workers) == 2, f"expected the run's 2 GroupWorker actors on the head, found {workers}"
    assert "Started a local Ray instance" not in job_log

    runs, steps = read_runs(out), read_steps(out)
    assert list(runs["status"]) == ["ok"], runs.to_dict("records")
    assert runs.loc[0, "strategy"] == "ring" and runs.loc[0, "workers"] == 2
    assert len(steps) == 3 * 2 and set(steps["run_id"]) == set(runs["run_id"])
    assert not list(out.glob("*.tmp"))
