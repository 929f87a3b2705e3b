"""One report built from a real tiny sweep (the measured pipeline on thread ranks, no Ray), its numbers read back
from report.html and checked against runs.parquet: the runs table, the best-strategy table and its lead, the
traffic sentence and the compute time the bandwidth requirement uses.
"""

from __future__ import annotations

import html as html_lib
import re

import pytest

from experiments.config.sweep import parse
from experiments.pipeline.runner import run_sweep
from experiments.pipeline.substrate import ThreadSubstrate
from experiments.results.dataset import read_runs
from reports.page import build

SWEEP = {"name": "tiny-report", "defaults": {"workload": "tiny", "image_size": 8, "batch_size": 4, "steps": 3,
                                             "warmup_steps": 1},
         "grid": {"strategy": ["ring", "halving_doubling"], "workers": [1, 2]}}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-report")
    with open(out / "log.txt", "w") as log:
        run_sweep(parse(SWEEP, where="test"), out / "results", substrate=ThreadSubstrate(), log=log)
    page = build(out / "results").read_text()
    runs = read_runs(out / "results").set_index("run_id")
    assert (runs["status"] == "ok").all(), runs["error"].tolist()
    return page, runs


def _table(page: str, start: str) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """(headings, rows of (shown text, data-v)) of the first table whose opening matches the regex `start`."""
    at = re.search(start, page).start()
    table = page[at:page.index("</table>", at)]
    heads = [html_lib.unescape(h) for h in re.findall(r"<th>(.*?)</th>", table)]
    rows = []
    for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]:
        cells = re.findall(r'<td(?: class="num")?(?: data-v="([^"]*)")?>(.*?)</td>', tr, re.S)
        rows.append([(html_lib.unescape(text), value) for value, text in cells])
    return heads, rows


def test_the_runs_table_shows_runs_parquet_numbers(report):
    page, runs = report
    heads, rows = _table(page, '<table id="runs"')
    col = {h: i for i, h in enumerate(heads)}
    assert len(rows) == len(runs) == 4
    for row in rows:
        run = runs.loc[row[col["run id"]][0]]
        assert float(row[col["samples/s"]][1]) == pytest.approx(run["throughput"], rel=1e-12)
        assert float(row[col["step s"]][1]) == pytest.approx(run["step_time_s"], rel=1e-12)
        assert float(row[col["comm s"]][1]) == pytest.approx(run["comm_s"], rel=1e-12)
        assert float(row[col["comm share"]][1]) == pytest.approx(run["comm_fraction"], rel=1e-12)
        assert float(row[col["sent MB/worker"]][1]) == pytest.approx(run["bytes_sent_per_worker"] / 1e6, rel=1e-12)
        assert int(float(row[col["workers"]][1])) == run["workers"] and row[col["strategy"]][0] == run["strategy"]


def test_the_best_strategy_table_names_the_faster_run_and_its_lead(report):
    page, runs = report
    heads, rows = _table(page, r"<table>\s*<thead>\s*<tr>\s*<th>workload</th>\s*<th>condition</th>")
    col = {h: i for i, h in enumerate(heads)}
    pair = runs[runs["workers"] == 2].sort_values("throughput", ascending=False)
    winner, runner_up = pair.iloc[0], pair.iloc[1]
    [row] = rows
    assert row[col["best strategy"]][0] == winner["strategy"] and row[col["next"]][0] == runner_up["strategy"]
    assert float(row[col["samples/s"]][1]) == pytest.approx(winner["throughput"], rel=1e-12)
    lead = (winner["throughput"] / runner_up["throughput"] - 1) * 100
    assert float(row[col["lead over next %"]][1]) == pytest.approx(lead, rel=1e-9)
    assert row[col["verdict"]][0] == "tie"  # one run each: no spread to measure a lead against


def test_the_traffic_sentence_and_the_compute_time_come_from_the_runs(report):
    page, runs = report
    multi = runs[runs["workers"] > 1]
    same = int((multi["bytes_sent_per_worker"] == multi["analytic_bytes_sent_per_worker"]).sum())
    assert same == 2  # the measured pipeline's bytes are exact
    assert f"Measured bytes sent per worker equal the analytic bytes in {same} of {len(multi)} runs." in page
    ts = runs.loc[runs["workers"] == 1, "compute_s"].median()
    assert f"tiny: Ts = {ts:.4g} s (median compute time of the 1-worker runs, measured)" in page
