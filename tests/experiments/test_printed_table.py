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


def test_a_compression_parameter_shows_only_on_runs_with_that_compression(capsys):
    # every run carries powersgd_rank (its default 1); beside compression = "none" it is no setting, and two
    # PowerSGD ranks make it an axis, blank on the ring and top-k rows
    runs = _runs([{"run_id": "a", "strategy": "ring", "compression": "none"},
                  {"run_id": "b", "strategy": "ring", "compression": "powersgd", "powersgd_rank": 2},
                  {"run_id": "c", "strategy": "ring", "compression": "powersgd", "powersgd_rank": 4},
                  {"run_id": "d", "strategy": "ring", "compression": "topk", "powersgd_rank": 1}])
    _print_runs(runs)
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert "powersgd_rank" in header and "topk_ratio" not in header, header
    # the column's cells (pandas right-aligns each under its header)
    start = lines[0].index(" compression") + len(" compression")
    end = lines[0].index("powersgd_rank") + len("powersgd_rank")
    cells = {line.split()[1]: line[start:end].split()[-1] if line[start:end].split() else "" for line in lines[1:]}
    assert cells["none"] == "" and cells["topk"] == "", cells  # no rank beside another compression
    assert sorted(line[start:end].strip() for line in lines[1:] if " powersgd " in line) == ["2", "4"]
    # one PowerSGD rank beside other compressions: not an axis
    header = _header(capsys, runs[runs["run_id"] != "c"])
    assert "powersgd_rank" not in header, header


def test_a_size_knob_the_model_chose_is_marked_in_its_column(capsys):
    # the same PS at 1 MiB chosen by the model (the sweep left partition_mb unset) and at 16 MiB set by the sweep
    runs = _runs([{"run_id": "a", "strategy": "parameter_server", "param_partition_mb": 1.0, "knob": "partition_mb",
                   "knob_chosen": True, "knob_best": 1.0, "knob_slowdown": 1.0},
                  {"run_id": "b", "strategy": "parameter_server", "param_partition_mb": 16.0,
                   "knob": "partition_mb", "knob_chosen": False, "knob_best": 1.0, "knob_slowdown": 1.25}])
    _print_runs(runs)
    lines = capsys.readouterr().out.splitlines()
    assert "param_partition_mb" in lines[0].split()
    rows = [line.split() for line in lines[1:]]
    assert [r[r.index("parameter_server") + 1:r.index("parameter_server") + 3] for r in rows] == \
        [["1", "(model)"], ["16", "4"]], lines
