"""The table `syncbench run` prints after a sweep (issue 22 D3): every axis that varies has a column, and a
strategy parameter only one strategy uses is not an axis (blank where unused)."""

import pandas as pd

from experiments.cli.main import _print_runs
from experiments.results import schema


def _runs(rows):
    base = dict(sweep="t", workload="tiny", workers=4, status="ok", throughput=100.0, step_time_s=0.3, compute_s=0.2,
                comm_s=0.1, bytes_sent_per_worker=1e6, link_bandwidth=125e6, link_emulation="python",
                straggler_slowdown=1.0)
    return schema.conform(pd.DataFrame([schema.row(schema.RUNS, **(base | r)) for r in rows]), schema.RUNS)


def _header(capsys, runs) -> list[str]:
    _print_runs(runs)
    return capsys.readouterr().out.splitlines()[0].split()


def test_a_parameter_one_strategy_sets_once_is_not_a_column(capsys):
    runs = _runs([{"run_id": "a", "strategy": "ring"},
                  {"run_id": "b", "strategy": "parameter_server", "param_servers": 1, "param_staleness": "0"},
                  {"run_id": "c", "strategy": "decentralized", "param_topology": "ring"}])
    header = _header(capsys, runs)
    assert not [c for c in header if c.startswith("param_")], header


def test_a_parameter_that_varies_within_a_strategy_is_a_column_blank_for_the_others(capsys):
    runs = _runs([{"run_id": "a", "strategy": "ring"},
                  {"run_id": "b", "strategy": "parameter_server", "param_servers": 1},
                  {"run_id": "c", "strategy": "parameter_server", "param_servers": 2},
                  {"run_id": "d", "strategy": "ring", "seed": 1}])
    _print_runs(runs)
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert "param_servers" in header and "seed" in header
    assert not [c for c in header if c.startswith("param_") and c != "param_servers"], header
    ring = [line for line in lines[1:] if line.split()[0] == "ring"]
    assert len(ring) == 2 and all("nan" not in line.lower() and "none" not in line.lower() for line in ring), ring
    ps = sorted(line.split()[header.index("param_servers")] for line in lines[1:] if "parameter_server" in line)
    assert ps == ["1", "2"]
