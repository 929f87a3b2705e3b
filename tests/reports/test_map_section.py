"""The report's "Where each strategy wins" section on the fixture results (resnet18, 1 Gbit/s with 50 us and full
speed, workers 1/2/4): the map it draws is `syncbench map`'s for the sweep's model, compute time and latency, with
the sweep's measured cells marked and ties grey; no emulated link, no map."""

from __future__ import annotations

import pytest

from reports import load, map_section, tables
from reports.sections import Absent, Results
from reports.strategy_map import EXACT_FLAT, Workload, crossovers, strategy_map
from tests.reports.conftest import NUMEL, make_results


def _results(path) -> Results:
    runs = load.load_runs(path)
    return Results(runs=runs, ok=runs[runs["ok"]], steps=None, sweep_text=None, links=load.link_order(runs))


def test_the_section_draws_the_models_map_for_the_sweeps_model_and_link(tmp_path):
    make_results(tmp_path)
    r = _results(tmp_path)
    body = map_section.section(r)
    assert [m["workload"] for m in body["maps"]] == ["resnet18"]
    shown = body["maps"][0]
    latency, k, intra = map_section.network(r.ok)
    assert (latency, k) == (pytest.approx(float(r.ok["link_latency_s"].dropna().mode().iloc[0])), 1)
    ts = tables.compute_time_per_workload(r.ok)["resnet18"][0]
    m = strategy_map(Workload(NUMEL, compute_s=ts), map_section.WORKERS,
                     sorted(set(map_section.DEFAULT_BANDWIDTHS) | {125e6}), latency, strategies=EXACT_FLAT)
    assert shown["crossovers"] == crossovers(m)  # the same grid, priced the same way
    assert shown["cells"] == len(m.cells) and shown["ties"] == int(m.cells["tie"].sum())
    page = str(shown["figure"])
    assert "measured here: " in page and "fastest of" in page  # the sweep's 2- and 4-worker cells on 1 Gbit/s
    marks = map_section.measured_marks(r.ok)
    assert set(marks) == {(2, 125e6), (4, 125e6)}
    for (n, _), (_, hover) in marks.items():
        runs = r.ok[(r.ok["workers"] == n) & (r.ok["link_bandwidth"] == 125e6)]
        fastest = runs.groupby("label")["step_time_s"].mean().idxmin()
        assert hover.startswith(f"measured here: {fastest} fastest of {runs['label'].nunique()}")


def test_without_an_emulated_link_the_section_says_why(tmp_path):
    make_results(tmp_path)
    r = _results(tmp_path)
    ok = r.ok[r.ok["link_bandwidth"].isna()]
    body = map_section.section(Results(runs=ok, ok=ok, steps=None, sweep_text=None, links=["full speed"]))
    assert isinstance(body, Absent) and "no run on an emulated link" in body.reason


@pytest.mark.slow  # the node map replays schedules (4 s): out of make test-fast
def test_on_nodes_the_section_ranks_the_node_aware_strategies_at_the_sweeps_node_size(tmp_path):
    # the per-level section's results: 4 workers in nodes of 2 sharing a 1 Gbit/s NIC, 100 Gbit/s inside a node
    from tests.reports.test_levels import INTRA, NIC, _results, _run

    r = _results(tmp_path, [_run("ring0", "ring", 0.20), _run("hier", "hierarchical", 0.14, inner="ring")])
    assert map_section.network(r.ok) == (0.0, 2, INTRA)
    shown = map_section.section(r)["maps"][0]
    assert shown["nodes"] == "nodes of 2 ranks sharing a NIC"
    assert shown["strategies"] == ", ".join(map_section.EXACT_NODES)
    assert "measured here: " in str(shown["figure"])
    assert set(map_section.measured_marks(r.ok)) == {(4, NIC)}
