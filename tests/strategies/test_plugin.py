"""A strategy that is not built in reaches every generic test through the entry-point group, as a third-party
package's would: tests/plugin/ ships `chain` with a .dist-info (see tests/conftest.py), and no test names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import strategies
from strategies.base import StrategyConfig
from strategies.registry import contract_problems, register

ROOT = Path(__file__).resolve().parents[2]

# The generic tests: each takes its strategies from the registry, so each must have collected `chain`.
GENERIC = [
    "tests/strategies/test_strategy_matrix.py::test_results_and_traffic",
    "tests/strategies/test_strategy_matrix.py::test_every_rank_bitwise_identical",
    "tests/strategies/test_strategy_matrix.py::test_int64",
    "tests/strategies/test_peer_suites.py::test_mpich_allred",
    "tests/strategies/test_peer_suites.py::test_mpich_allred_float_identical_on_every_rank",
    "tests/strategies/test_peer_suites.py::test_mpi4py_allreduce_counts_below_world_size",
    "tests/strategies/test_peer_suites.py::test_gloo_allreduce_fixture_large_prime_counts",
]


def test_the_plugin_registers_through_its_entry_point_not_a_built_in_line():
    assert "chain" in strategies.names()
    cls = strategies.get("chain")
    assert cls.__module__ == "syncbench_chain_plugin.chain"
    assert "chain" not in (ROOT / "strategies" / "__init__.py").read_text()


def test_every_generic_test_collects_the_plugin():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *GENERIC], cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    ids = collected.stdout.splitlines()
    for test in GENERIC:
        assert any(line.startswith(test) and "chain" in line for line in ids), f"{test} did not collect chain"


def _strategy_class(**attrs):
    """A config class with the given attributes over a complete, valid one (the plug-in's own)."""
    base = strategies.get("chain")
    return type("Broken", (base,), attrs)


@pytest.mark.parametrize("attrs, missing", [
    ({"name": "broken one"}, "`name` that is an identifier"),
    ({"name": "broken", "summary": ""}, "one-line `summary`"),
    ({"name": "broken", "role": "weights"}, "`role` among"),
    ({"name": "broken", "runtime": object}, "`runtime` that is a Strategy subclass"),
    ({"name": "broken", "ops": ("sum", "median")}, "`ops` drawn from"),
    ({"name": "broken", "identical": False}, "an exact strategy must leave every rank bitwise identical"),
    ({"name": "broken", "exact": False, "identical": False}, "a `mixing_matrix` method"),
    ({"name": "broken", "variants": ({"hops": 2},)}, "variant {'hops': 2}"),
    ({"name": "broken", "counted": False}, "`counted = False` to agree with traffic().counted"),
])
def test_a_strategy_missing_part_of_the_contract_is_refused_naming_it(attrs, missing):
    cls = _strategy_class(**attrs)
    with pytest.raises(ValueError, match="cannot be registered") as info:
        register(cls)
    assert missing in str(info.value)
    assert "broken" not in strategies.names()


def test_a_strategy_without_traffic_is_refused():
    cls = type("NoTraffic", (StrategyConfig,), {"name": "no_traffic", "summary": "s",
                                                "runtime": strategies.get("ring").runtime})
    assert any("traffic(workers, numel, itemsize)" in p for p in contract_problems(cls))


def _broken_plugin(tmp_path: Path) -> Path:
    """A third-party package on the path (a .dist-info with an entry point) whose module raises on import."""
    (tmp_path / "syncbench_broken_plugin").mkdir()
    (tmp_path / "syncbench_broken_plugin" / "__init__.py").write_text("")
    (tmp_path / "syncbench_broken_plugin" / "boom.py").write_text("raise ImportError('needs libfoo.so.3')\n")
    info = tmp_path / "syncbench_broken_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: syncbench-broken-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[syncbench.strategies]\nboom = syncbench_broken_plugin.boom:BoomConfig\n")
    return tmp_path


def test_a_plugin_that_raises_on_import_is_skipped_in_one_line_and_named(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_broken_plugin(tmp_path)), os.environ["PYTHONPATH"]])}
    listed = subprocess.run([sys.executable, "-m", "experiments", "strategies"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    why = "plug-in strategy 'boom' = syncbench_broken_plugin.boom:BoomConfig (package syncbench-broken-plugin 0.1) " \
          "skipped: ImportError: needs libfoo.so.3"
    assert listed.stderr == f"syncbench: {why}\n"
    assert f"boom               SKIPPED: {why}" in listed.stdout and "chain" in listed.stdout  # the others load
    model = subprocess.run([sys.executable, "-m", "experiments", "model", "--model", "resnet18", "--workers", "4",
                            "--bandwidth", "10Gbit", "--step-time", "0.1"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
    assert model.returncode == 0 and "Traceback" not in model.stderr, model.stderr
    assert model.stderr.count("\n") == 1 and "ring" in model.stdout
