"""Session fixtures: one embedded Ray for the whole test session, and a reusable 2-actor worker group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RAY_FIXTURES = {"ray_session", "group2", "_shared_groups"}


def pytest_collection_modifyitems(config, items):
    """A test that asks for a Ray fixture is a Ray test, marked or not: `make test-fast` deselects them by marker."""
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Print the wall time of the whole run (make test-fast promises under 3 minutes on 2 cores)."""
    import time

    start = getattr(config, "_syncbench_start", None)
    if start is not None:
        took = time.monotonic() - start
        budget = float(os.environ.get("SYNCBENCH_TEST_BUDGET_S", "inf"))
        verdict = "" if took <= budget else f": OVER its budget of {budget:g} s"
        terminalreporter.write_line(f"syncbench: this test run took {took:.0f} s{verdict} "
                                    f"(marker expression: {config.getoption('markexpr') or 'none'})")


def pytest_configure(config):
    import time

    config._syncbench_start = time.monotonic()

# tests/plugin/ holds a strategy package shipped as a third-party one would be (a .dist-info with an entry point
# in `syncbench.strategies`). On the path of this session and of every Ray worker it starts, so that every
# generic test picks its `chain` strategy up through the same path a real plug-in takes, with no test edited.
PLUGIN_DIR = str(Path(__file__).resolve().parent / "plugin")
sys.path.insert(0, PLUGIN_DIR)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (PLUGIN_DIR, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture(scope="session")
def ray_session():
    """An embedded Ray with 10 logical CPUs on the 2 cores, no dashboard, own temp dir: the largest group a test
    starts (verify at 5 workers: 5 workers + 3 parameter servers) fits beside the shared 2-rank group."""
    import ray

    from experiments.cluster.ray_runtime import ensure_ray

    started = ensure_ray(num_cpus=10)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def _shared_groups():
    groups: dict = {}
    yield groups
    for group in groups.values():
        group.shutdown()


@pytest.fixture
def group2(ray_session, _shared_groups):
    """A healthy 2-rank gloo WorkerGroup shared across tests; replaced if an earlier test broke it.

    It lives for the whole session, so its ranks reserve a token 0.01 CPU each: at 1 CPU each they held 2 of the
    session's CPUs for good and a test's own 8-rank group waited for a placement that never came."""
    from experiments.cluster.group import WorkerGroup

    group = _shared_groups.get(2)
    if group is None or group.broken:
        if group is not None:
            group.shutdown()
        group = _shared_groups[2] = WorkerGroup(2, num_cpus=0.01, timeout=20)
    return group
