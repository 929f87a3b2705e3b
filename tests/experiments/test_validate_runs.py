"""`syncbench validate --substrates emulated[,kernel]`: the small cells measured on thread ranks over python-emulated
links come near the model; a cell a measured substrate cannot run is "not run" with the reason, before any work;
the matrix's CSV carries the measured rows beside SimGrid's, with a substrate column."""

from __future__ import annotations

import argparse
import math

import pandas as pd
import pytest

from experiments import validate_runs
from experiments.validate import VARIANTS, Cell
from experiments.validate_runs import check_arguments, measured_row
from strategies.transport.simgrid import simgrid_available

BY_LABEL = {v.label: v for v in VARIANTS}
SCALE = 1000.0  # 102 kB over 10 Mbit/s links: the cell's bandwidth and latency terms, a thousandth of the copies


@pytest.mark.timing
@pytest.mark.parametrize("label,workers", [("ring", 2), ("ring", 3), ("ps dedicated k=1", 2),
                                           ("ps dedicated k=1", 3)])
def test_an_emulated_cell_measures_near_the_model(label, workers):
    row = measured_row(Cell(BY_LABEL[label], workers, "10Gbit", "5us"), "emulated", math.nan, 3, SCALE)
    assert row["substrate"] == "emulated" and row["network_model"] == "python"
    assert row["payload_mb"] == pytest.approx(0.1022, abs=0.001) and row["run_bandwidth"] == "10Mbit"
    assert row["repeats"] == 3 and row["measured_min_s"] <= row["measured_s"] <= row["measured_max_s"]
    assert math.isfinite(row["floor_s"]) and row["floor_s"] > 0
    # without the link emulation a cell takes its floor (about a tenth of the model here); booked twice, twice it
    assert 0.8 < row["measured_s"] / row["model_s"] < 1.8, row
    assert not row["status"].startswith(("FAILED", "not run")), row["status"]


def test_a_cell_a_measured_substrate_cannot_run_is_not_run_with_the_reason(monkeypatch):
    def no_work(*args, **kwargs):
        raise AssertionError("a refused cell was measured")

    monkeypatch.setattr(validate_runs, "measure_emulated", no_work)
    cases = [(Cell(BY_LABEL["ring"], 16, "1Gbit", "50us"), 10, "n = 16"),
             (Cell(BY_LABEL["ring"], 4, "1Gbit", "50us", overlap=True), 10, "overlap"),
             (Cell(BY_LABEL["native"], 4, "1Gbit", "50us"), 10, "backend's allreduce"),
             (Cell(BY_LABEL["ddp"], 4, "1Gbit", "50us"), 10, "wraps a model"),
             (Cell(BY_LABEL["ring"], 4, "100Gbit", "0us"), 1, "beyond what python emulation reaches"),
             (Cell(BY_LABEL["ring on nodes"], 4, "1Gbit", "50us", 4), 1, "intra-node link's 100 Gbit/s"),
             (Cell(BY_LABEL["ring + powersgd r=4"], 4, "1Gbit", "50us"), 10, "does not scale with the payload"),
             (Cell(BY_LABEL["ps colocated k=n"], 9, "1Gbit", "50us"), 10, "n = 9")]
    for cell, scale, reason in cases:
        row = measured_row(cell, "emulated", math.nan, 3, scale)
        assert row["status"].startswith("not run: emulated: ") and reason in row["status"], (cell, row["status"])
        assert math.isnan(row["measured_s"]) and row["status"] != "agree"

    monkeypatch.setattr("experiments.cluster.host.support_problem", lambda: "network namespaces and tc need root")
    row = measured_row(Cell(BY_LABEL["ring"], 4, "1Gbit", "0us"), "kernel", math.nan, 3, 10)
    assert row["status"] == "not run: kernel: no namespace cluster on this machine: network namespaces and tc need root"
    monkeypatch.setattr("experiments.cluster.host.support_problem", lambda: None)
    monkeypatch.setattr("experiments.validate_kernel.measure_kernel", no_work)
    cases = [(Cell(BY_LABEL["ring"], 4, "1Gbit", "50us"), "latency 50us: tbf shapes bandwidth only"),
             (Cell(BY_LABEL["ring"], 4, "1Gbit", "5us"), "no netem qdisc"),  # any latency: tbf cannot add it
             (Cell(BY_LABEL["hierarchical ring"], 4, "1Gbit", "0us", 4), "nodes"),
             (Cell(BY_LABEL["ring + local SGD H=4"], 4, "1Gbit", "0us"), "compression and local SGD"),
             (Cell(BY_LABEL["ring + topk 1%"], 4, "1Gbit", "0us"), "compression and local SGD"),
             (Cell(BY_LABEL["ps SSP s=2 k=2"], 4, "1Gbit", "0us"), "barrier-free servers"),
             (Cell(BY_LABEL["native"], 4, "1Gbit", "0us"), "inside the backend's allreduce"),
             (Cell(BY_LABEL["ring"], 9, "1Gbit", "0us"), "n = 9")]
    for cell, reason in cases:
        row = measured_row(cell, "kernel", math.nan, 3, 10)
        assert row["status"].startswith("not run: kernel: ") and reason in row["status"], (cell, row["status"])
        assert math.isnan(row["measured_s"]) and math.isnan(row["model_s"])


def _args(**given) -> argparse.Namespace:
    from experiments.cli.validate import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in given.items()]
    return parser.parse_args(flags)


@pytest.mark.parametrize("given,named", [({"substrates": "emulated,netns"}, "--substrates 'emulated,netns'"),
                                         ({"substrates": ","}, "--substrates ','"),
                                         ({"repeats": 0}, "--repeats 0"),
                                         ({"payload_scale": 0.5}, "--payload-scale 0.5"),
                                         ({"payload_scale": "nan"}, "--payload-scale nan"),
                                         ({"substrates": "emulated", "ps_sizing": "16"}, "--ps-sizing")])
def test_bad_measured_options_are_refused_naming_the_value(given, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        check_arguments(_args(**given))
    assert check_arguments(_args(substrates="emulated,simgrid")) == ("simgrid", "emulated")


def test_a_verdict_names_the_effect_it_measured():
    assert validate_runs.verdict(1.10, 1.0, 0.0, 1.0, 1.2) == "agree"
    assert validate_runs.verdict(1.40, 1.0, 0.3, 1.3, 1.5).startswith("DIFF: cores: the unshaped floor 0.300 s")
    assert validate_runs.verdict(1.40, 1.0, 0.0, 1.1, 1.6).startswith("DIFF: spread")
    assert validate_runs.verdict(0.50, 1.0, 0.4, 0.5, 0.5) == "DIFF: unexplained"


@pytest.mark.simgrid
@pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "simgrid present")
def test_the_matrix_writes_measured_rows_beside_simgrids(tmp_path):
    from experiments.cli.validate import run

    args = _args(workers="2", links="10Gbit/5us", strategies="ring,native", substrates="emulated", repeats=1,
                 payload_scale=SCALE, out=tmp_path)
    assert run(args) == 0
    frame = pd.read_csv(tmp_path / "validation.csv")
    assert set(frame["substrate"]) == {"simgrid", "emulated"}
    measured = frame[frame["substrate"] == "emulated"].set_index("strategy")
    simulated = frame[frame["substrate"] == "simgrid"].set_index("strategy")
    assert measured.loc["ring", "sim_s"] == pytest.approx(simulated.loc["ring", "sim_s"])
    assert measured.loc["ring", "measured_over_sim"] == pytest.approx(
        measured.loc["ring", "measured_s"] / simulated.loc["ring", "sim_s"])
    assert measured.loc["native", "status"].startswith("not run: emulated:")
    assert "# measured runs" in (tmp_path / "validation.txt").read_text()
