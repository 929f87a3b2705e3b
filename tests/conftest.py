"""Session fixtures: one embedded Ray for the whole test session, and a reusable 2-actor worker group."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

RAY_FIXTURES = {"ray_session", "group2", "_shared_groups", "lend_groups"}


# `make test-fast` is every test but those marked ray, netns, gpu, slow, simgrid or timing: a new test file is in it
# by default (a test asserting on wall-clock time carries @pytest.mark.timing and runs in make test only). The
# files below opt out as a whole (marked `slow` here; a single slow test elsewhere carries @pytest.mark.slow
# itself), each for its cost on 2 cores: whole training runs, simulations, sockets and subprocesses, a browser,
# or many more cases than the fast tier's 3-minute budget holds. Their numbers' bugs are caught in the fast tier by
# the hand-worked suites (tests/mutations.py checks that).
SLOW_MODULES = {
    # whole training runs, the pipeline, the CLI
    "experiments/test_cli_verbs.py", "experiments/test_ddp_hook.py", "experiments/test_faults.py",
    "experiments/test_hostile_input.py", "experiments/test_model_cli.py", "experiments/test_nodes_pipeline.py",
    "experiments/test_overlap.py", "experiments/test_pipeline.py", "experiments/test_stragglers.py",
    "experiments/test_train.py", "experiments/test_publish.py", "experiments/test_signals.py",
    "experiments/test_plugin_install.py", "experiments/test_jobs.py",
    # SimGrid simulations, clusters, Ray groups, GPUs, subprocesses
    "experiments/test_simulate.py", "experiments/test_simulate_scale.py", "experiments/test_ps_substrates.py",
    "experiments/test_cluster_netns.py",
    "experiments/test_group.py", "experiments/test_group_errors.py", "experiments/test_runner_ray.py",
    "experiments/test_faults_ray.py",
    "experiments/test_gpu.py", "experiments/test_p2p_default.py", "experiments/test_gpu_check.py",
    # the report built whole, in a browser, from a run
    "reports/test_browser.py", "reports/test_build.py", "reports/test_hostile_files.py",
    "reports/test_report_from_a_run.py", "reports/test_ps_section.py",
    # transports, emulated links, ported suites: many cases each, or wall-clock waits
    "strategies/test_emulation.py", "strategies/test_fake_transport.py", "strategies/test_nodes.py",
    "strategies/test_parameter_server.py", "strategies/test_peer_suites.py", "strategies/test_plugin.py",
    "strategies/test_sockets_faults.py", "strategies/test_transport_sockets.py", "strategies/test_transport_torch.py",
    # models and data sets built, the docs' links and commands
    "workloads/test_profile.py", "workloads/test_workloads_data.py", "workloads/test_workloads_flat.py",
    "workloads/test_workloads_models.py", "test_docs.py",
}
# Files whose tests run SimGrid simulations (marked `simgrid`; a single simulating test elsewhere carries
# @pytest.mark.simgrid itself). make test-fast leaves out every test marked ray, netns, gpu, slow, simgrid or
# timing; a simulating test cheap enough for it (the reduced validation matrix) carries `simgrid_fast` instead and
# is skipped, with the reason, where SimGrid is not installed.
SIMGRID_MODULES = {"experiments/test_simulate.py", "experiments/test_simulate_scale.py",
                   "experiments/test_ps_substrates.py"}
TESTS_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    """A test that asks for a Ray fixture is a Ray test, marked or not; a test in SLOW_MODULES is slow: `make
    test-fast` deselects both by marker. With SYNCBENCH_SKIP_TIMING_TESTS set (a loaded machine, CI) every
    `timing` test is skipped with the reason printed (pytest -rs), not failed. SYNCBENCH_TEST_SHUFFLE=<seed>
    runs the tests in that seed's random order."""
    for item in items:
        if RAY_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
        try:
            module = Path(item.path).resolve().relative_to(TESTS_DIR).as_posix()
        except ValueError:
            continue
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if module in SIMGRID_MODULES:
            item.add_marker(pytest.mark.simgrid)
    fast_simulations = [item for item in items if item.get_closest_marker("simgrid_fast")]
    if fast_simulations:  # in make test-fast: where SimGrid is missing, skipped with the reason, never failed
        from strategies.transport.simgrid import simgrid_available

        missing = simgrid_available()
        if missing:
            for item in fast_simulations:
                item.add_marker(pytest.mark.skip(reason=f"SimGrid is not usable here: {missing}"))
    shuffle = os.environ.get("SYNCBENCH_TEST_SHUFFLE")
    if shuffle:  # the tests in a random order (the seed's), to find tests that depend on the ones before them
        import random

        random.Random(shuffle).shuffle(items)
    if os.environ.get("SYNCBENCH_SKIP_TIMING_TESTS"):
        skip = pytest.mark.skip(reason=TIMING_SKIPPED)
        for item in items:
            if item.get_closest_marker("timing"):
                item.add_marker(skip)


def pytest_collection_finish(session):
    """make test-fast's reduced validation matrix (the tests asking for `reduced_matrix`) starts computing in a
    process of its own as soon as collection ends, on the core make test-fast's thread-rank tests leave idle
    (tests/experiments/reduced_matrix.py); only where no test selected measures wall-clock time or starts Ray, so
    that nothing runs beside those, and SimGrid is usable (else the matrix's tests skip with the reason)."""
    items = session.items
    wanted = any("reduced_matrix" in getattr(item, "fixturenames", ()) for item in items)
    beside = any(item.get_closest_marker(marker) for item in items for marker in ("timing", "ray"))
    if not wanted or beside or session.config.option.collectonly:
        return
    from strategies.transport.simgrid import simgrid_available

    if simgrid_available():
        return
    from tests.experiments.reduced_matrix import Background

    session.config._syncbench_matrix = Background()


def pytest_unconfigure(config):
    background = getattr(config, "_syncbench_matrix", None)
    if background is not None:
        background.stop()


TIMING_SKIPPED = ("SYNCBENCH_SKIP_TIMING_TESTS is set: this test asserts on measured wall-clock time (marker "
                  "`timing`), which a loaded machine stretches; run it on a quiet one")


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

    started = ensure_ray(num_cpus=10)  # started twice if Ray's 30 s raylet registration times out (load)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def _shared_groups():
    groups: dict = {}
    yield groups
    for group in groups.values():
        group.shutdown()


def _shared_group(groups: dict, world: int):
    """The session's shared CPU group of `world` ranks, started on first use; replaced if a test broke it.

    It lives for the whole session, so its ranks reserve a token 0.01 CPU each: at 1 CPU each they held 2 of the
    session's CPUs for good and a test's own 8-rank group waited for a placement that never came."""
    from experiments.cluster.group import WorkerGroup

    group = groups.get(world)
    if group is None or group.broken:
        if group is not None:
            group.shutdown()
        group = groups[world] = WorkerGroup(world, num_cpus=0.01, timeout=20)
    return group


@pytest.fixture
def group2(ray_session, _shared_groups):
    """A healthy 2-rank gloo WorkerGroup shared across tests; replaced if an earlier test broke it."""
    return _shared_group(_shared_groups, 2)


LENT_WORLD_SIZES = (1, 2)  # larger shared groups would keep an actor (~300 MB) per rank alive all session


class _Lent:
    """A shared group lent to code that starts and stops its own: stopping it leaves it running for the next test."""

    def __init__(self, group):
        object.__setattr__(self, "_group", group)

    def __getattr__(self, name):
        return getattr(self._group, name)

    def __setattr__(self, name, value) -> None:  # e.g. broken = True: the shared group is replaced next time
        setattr(self._group, name, value)

    def shutdown(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@pytest.fixture
def lend_groups(ray_session, _shared_groups, monkeypatch):
    """lend_groups(module, ...): in those modules, WorkerGroup(n) of 1 or 2 CPU ranks lends the session's shared
    group of n ranks instead of starting one (an actor holding torch costs seconds to start); any other group
    (more ranks, GPUs, pinned to nodes) starts as usual. For tests of what a command does with its group, not of
    the group's own start and stop (tests/experiments/test_group.py)."""
    from experiments.cluster.group import WorkerGroup

    def make(world_size, num_cpus=1, num_gpus=0, node_resources=None, **kwargs):
        if world_size in LENT_WORLD_SIZES and not num_gpus and node_resources is None:
            return _Lent(_shared_group(_shared_groups, world_size))
        return WorkerGroup(world_size, num_cpus=num_cpus, num_gpus=num_gpus, node_resources=node_resources, **kwargs)

    def lend(*modules):
        for module in modules:
            monkeypatch.setattr(module, "WorkerGroup", make)

    return lend
