"""The report: figures from the fixture, every section on the page, escaping, and offline self-containment."""

import math
import re

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import pytest

from reports import build as report
from reports.build import SECTIONS, build


def ok_runs(path):
    runs = report.load_runs(path)
    return runs, runs[runs["ok"]], report.link_order(runs)


def test_link_order_puts_full_speed_last(results_dir):
    _, _, links = ok_runs(results_dir)
    assert links == ["1Gbit", "full speed"]


def test_figures_from_the_fixture(results_dir):
    runs, ok, links = ok_runs(results_dir)
    steps = report.load_steps(results_dir)

    throughput = report.throughput_figure(ok, links)
    names = {t.name for t in throughput.data}
    assert report.IDEAL in names and "ring" in names
    assert "throughput (samples/s)" in throughput.layout.yaxis.title.text

    scaling = report.scaling_figure(ok, links)
    ring_1gbit = [t for t in scaling.data if t.name == "ring"][0]
    assert list(ring_1gbit.x) == [1, 2, 4] and ring_1gbit.y[0] == pytest.approx(1.0)

    split = report.step_time_figure(ok, links)
    assert {t.name for t in split.data} == {"compute", "communication"} and split.layout.barmode == "stack"

    traffic = report.traffic_figure(ok)
    assert {"worker sent (measured)", "worker sent (analytic)", "server sent (measured)"} <= {
        t.name for t in traffic.data}
    assert "MB = 10^6 bytes" in traffic.layout.yaxis.title.text

    requirement = report.requirement_frame(ok)
    assert set(requirement["target"]) == {"P = 0.5", "P = 0.8", "P = 0.9"}
    assert requirement["workers"].max() == 1024
    assert isinstance(report.bandwidth_figure(ok), go.Figure)

    fits, predicted = report.calibration(ok)
    assert list(fits["link"]) == ["1Gbit", "full speed"] and (fits["alpha"] >= 0).all()
    assert len(predicted) == 12  # multi-worker runs: 3 strategies x 2 n x 2 links
    assert isinstance(report.parity_figure(predicted, ok), go.Figure)
    model = report.extrapolation_figure(ok, alpha=float(fits["alpha"].median()))
    assert model.layout.title.text.startswith("MODEL, not measured")
    assert sorted({x for t in model.data for x in t.x}) == [8, 16, 32, 64, 128, 256, 512, 1024]

    text, figures, note = report.convergence_section(ok, steps)
    assert len(figures) == 4  # loss vs step, loss vs wall time, consensus distance, spectral gap
    assert "Distorted" in note


def test_every_section_present_and_plotly_embedded_once(built_report):
    page = built_report.read_text()
    for section_id, heading in SECTIONS.items():
        assert f'<section id="{section_id}"><h2>{heading}</h2>' in page
    plotly_js = plotly.offline.get_plotlyjs()
    assert page.count(plotly_js) == 1
    rest = page.replace(plotly_js, "")  # the bundle itself mentions its CDN; nothing else may load from one
    assert "<script src" not in rest and "cdn.plot.ly" not in rest and "https://" not in rest
    assert page.count('class="plotly-graph-div"') == 11
    assert "MODEL, not a measurement" in page


def test_notes_beside_distorted_figures(built_report):
    page = built_report.read_text()
    # summary, throughput, scaling, step time, bandwidth, cost model and convergence carry a note; traffic not
    assert page.count('<div class="note">') == 7
    traffic = page.split('<section id="traffic">')[1].split("</section>")[0]
    assert 'class="note"' not in traffic


def test_no_notes_when_nothing_is_distorted(tmp_path, fake_results):
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    runs["oversubscribed"] = False
    runs.to_parquet(tmp_path / "runs.parquet")
    assert '<div class="note">' not in build(tmp_path).read_text()


def test_sweep_names_are_escaped(built_report, evil_sweep):
    page = built_report.read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert evil_sweep not in page
    assert "<script>alert(1)" not in page
    # The failed run's error is in the table, escaped.
    assert "peer 5 timed out after 60 s &lt;b&gt;" in page


def test_failed_runs_in_table_not_in_figures(built_report):
    page = built_report.read_text()
    runs_table = page.split('<table id="runs"')[1].split("</table>")[0]
    assert "ring-8-1Gbit" in runs_table and "failed" in runs_table
    assert "1 failed run(s) are left out of the figures" in page
    figures = re.findall(r'Plotly\.newPlot\(.*?\)\s*\}', page, re.S)
    assert figures and not any("ring-8-1Gbit" in f for f in figures)


def test_without_steps_or_sweep_file(tmp_path, fake_results):
    fake_results(tmp_path, with_steps=False)
    (tmp_path / "sweep.toml").unlink()
    page = build(tmp_path).read_text()
    assert "no steps.parquet" in page
    assert page.count('class="plotly-graph-div"') == 7


def test_all_runs_failed(tmp_path, fake_results):
    fake_results(tmp_path, with_steps=False)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    runs["status"] = "failed"
    runs["throughput"] = math.nan
    runs.to_parquet(tmp_path / "runs.parquet")
    page = build(tmp_path).read_text()
    assert "No run succeeded" in page and 'class="plotly-graph-div"' not in page


def test_missing_results_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no runs.parquet in"):
        build(tmp_path)


def test_stragglers_section_shows_relative_throughput(results_dir):
    runs = pd.read_parquet(results_dir / "runs.parquet")
    slow = runs[(runs["workers"] == 4) & (runs["link"] == "1Gbit")].copy()
    slow["run_id"] += "-straggler"
    slow["straggler"] = '{"ranks": [1], "slowdown": 2.0}'
    slow["throughput"] /= 1.5
    pd.concat([runs, slow]).to_parquet(results_dir / "runs.parquet")
    page = build(results_dir).read_text()
    section = page.split('id="stragglers"')[1]
    assert "rank 1 computes 2x slower" in section and 'class="plotly-graph-div"' in section
    ok = report.load_runs(results_dir)
    df = report.stragglers_frame(ok[ok["ok"]])
    ratios = df[df["imbalance"] != "balanced"]["relative"]
    assert len(ratios) == 3 and ratios.round(6).eq(round(1 / 1.5, 6)).all()


def test_no_straggler_says_so(results_dir):
    section = build(results_dir).read_text().split('id="stragglers"')[1]
    assert "no straggler" in section and "plotly-graph-div" not in section.split("</section>")[0]


def test_native_on_an_emulated_link_is_flagged_and_cannot_win(results_dir):
    runs = pd.read_parquet(results_dir / "runs.parquet")
    fast = runs[runs["strategy"] == "ring"].copy()
    fast["strategy"], fast["strategy_params"] = "native", "{}"
    fast["run_id"] += "-native"
    fast["throughput"] *= 100  # full loopback speed: it never paid the emulated link
    pd.concat([runs, fast]).to_parquet(results_dir / "runs.parquet")
    loaded = report.load_runs(results_dir)
    ok = loaded[loaded["ok"]]
    best = report.best_strategies(ok, report.link_order(loaded))
    assert set(best.loc[best["link"] == "1Gbit", "best strategy"]) and \
        "native" not in set(best.loc[best["link"] == "1Gbit", "best strategy"])
    assert set(best.loc[best["link"] == "full speed", "best strategy"]) == {"native"}
    page = build(results_dir).read_text()
    assert page.count("Not emulated:") == 3  # summary, throughput, step time
