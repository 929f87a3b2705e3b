"""An external strategy package installed as the README says (a pyproject.toml with an entry point in
`syncbench.strategies`, `pip install --target DIR` and DIR on PYTHONPATH, as on a Ray cluster) is picked up by
`syncbench strategies`, `syncbench verify` and a sweep, run through the command line's entry point in a process
of their own that has only the installed package on its path, with one embedded Ray for verify and the sweep (each
command leaves a Ray it did not start running: one Ray start, not two)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "syncbench-twin-ring"
version = "0.1"

[project.entry-points."syncbench.strategies"]
twin_ring = "syncbench_twin_ring:TwinRingConfig"
"""

MODULE = '''"""ring under another name: its algorithm is known to be right, so the test checks the plumbing."""

from dataclasses import dataclass

from strategies.ring import RingConfig


@dataclass(frozen=True)
class TwinRingConfig(RingConfig):
    name = "twin_ring"
    summary = "ring allreduce, shipped as an external package"
'''

SWEEP = """
name = "twin"
[defaults]
workload = "tiny"
image_size = 8
batch_size = 4
steps = 2
warmup_steps = 1
[grid]
strategy = ["twin_ring"]
workers = [2]
"""


# the commands of a shell session, in one process: the installed package found through PYTHONPATH alone
COMMANDS = """
import json, sys
from experiments.cli.main import main
from experiments.cluster.ray_runtime import ensure_ray, stop_ray

ensure_ray(num_cpus=4)
try:
    for argv in json.loads(sys.argv[1]):
        print("=== syncbench", *argv, flush=True)
        status = main(argv)
        sys.stdout.flush()
        if status:
            raise SystemExit(f"syncbench {' '.join(argv)}: exit status {status}")
finally:
    stop_ray()
"""


@pytest.mark.slow
@pytest.mark.ray
def test_an_installed_external_package_reaches_strategies_verify_and_a_sweep(tmp_path):
    package = tmp_path / "twin"
    package.mkdir()
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "syncbench_twin_ring.py").write_text(MODULE)
    site = tmp_path / "site"
    # a real install (a wheel built by setuptools, its .dist-info with the entry point), offline and without a
    # build environment of its own: nothing to download, setuptools is the venv's
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--no-index", "--disable-pip-version-check", "--no-compile", "--target", str(site),
                          str(package)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    assert list(site.glob("syncbench_twin_ring-0.1.dist-info/entry_points.txt"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    (tmp_path / "twin.toml").write_text(SWEEP)
    commands = [["strategies"], ["verify", "--workers", "2", "--numel", "1001", "--strategies", "twin_ring"],
                ["run", str(tmp_path / "twin.toml"), "--out", str(tmp_path / "out"), "--no-report"]]
    done = subprocess.run([sys.executable, "-c", COMMANDS, json.dumps(commands)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    listed, verified, ran = done.stdout.split("=== syncbench ")[1:]
    assert any(line.startswith("twin_ring ") for line in listed.splitlines()), listed
    assert "twin_ring" in verified and " yes " in verified, verified
    rows = [line.split() for line in ran.splitlines() if line.split()[:1] == ["twin_ring"]]
    assert rows and all("ok" in row for row in rows), ran
