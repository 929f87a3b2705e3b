"""An external strategy package installed as the README says (a pyproject.toml with an entry point in
`syncbench.strategies`, `pip install --target DIR` and DIR on PYTHONPATH, as on a Ray cluster) is picked up by
`syncbench strategies`, `syncbench verify` and a sweep, each in a process of its own with its own embedded Ray."""

from __future__ import annotations

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


@pytest.mark.slow
@pytest.mark.ray
def test_an_installed_external_package_reaches_strategies_verify_and_a_sweep(tmp_path):
    package = tmp_path / "twin"
    package.mkdir()
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "syncbench_twin_ring.py").write_text(MODULE)
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(package)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    assert list(site.glob("syncbench_twin_ring-0.1.dist-info/entry_points.txt"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])

    def syncbench(*argv):
        done = subprocess.run([sys.executable, "-m", "experiments", *argv], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
        return done.stdout

    assert any(line.startswith("twin_ring ") for line in syncbench("strategies").splitlines())
    verified = syncbench("verify", "--workers", "2", "--numel", "1001", "--strategies", "twin_ring")
    assert "twin_ring" in verified
    (tmp_path / "twin.toml").write_text(SWEEP)
    ran = syncbench("run", str(tmp_path / "twin.toml"), "--out", str(tmp_path / "out"), "--no-report")
    rows = [line.split() for line in ran.splitlines() if line.split()[:1] == ["twin_ring"]]
    assert rows and all("ok" in row for row in rows), ran
