"""The report: tables and figures from the fixture, the sections this sweep has on the page in order (the others
listed once at the end), the answer first, escaping, and offline self-containment."""

import math
import re

import pandas as pd
import plotly.graph_objects as go
import plotly.offline
import pytest

from experiments.results import schema
from reports import calibration, figures, load, sections, tables, verdicts
from reports.page import build
from reports.sections import SECTIONS


def ok_runs(path):
    runs = load.load_runs(path)
    return runs, runs[runs["ok"]], load.link_order(runs)


def test_link_order_puts_full_speed_last(results_dir):
    _, _, links = ok_runs(results_dir)
    assert links == ["1Gbit", "full speed"]


def test_figures_from_the_fixture(results_dir):
    runs, ok, links = ok_runs(results_dir)
    steps = load.load_steps(results_dir)

    throughput = figures.throughput_figure(ok, links)
    names = {t.name for t in throughput.data}
    assert figures.IDEAL in names and "ring" in names
    assert "throughput (samples/s)" in throughput.layout.yaxis.title.text

    scaling = figures.scaling_figure(ok, links)
    ring_1gbit = [t for t in scaling.data if t.name == "ring"][0]
    # efficiency from the results file itself: throughput(n) / (n x the 1-worker runs' mean throughput)
    written = pd.read_parquet(results_dir / "runs.parquet")
    at = written[written["link_bandwidth"] == 125e6]
    single = at.loc[at["workers"] == 1, "throughput"].mean()
    ring = at[at["strategy"] == "ring"].set_index("workers")["throughput"]
    assert list(ring_1gbit.x) == [1, 2, 4]
    assert list(ring_1gbit.y[1:]) == pytest.approx([ring[2] / (2 * single), ring[4] / (4 * single)], rel=1e-12)

    split = figures.step_time_figure(ok, links)
    assert {t.name for t in split.data} == {"compute", "communication"} and split.layout.barmode == "stack"

    traffic = figures.traffic_figure(ok)
    assert {"worker sent (measured)", "worker sent (analytic)", "server sent (measured)"} <= {
        t.name for t in traffic.data}
    assert "MB = 10^6 bytes" in traffic.layout.yaxis.title.text

    requirement = tables.requirement_frame(ok)
    assert set(requirement["target"]) == {"P = 0.5", "P = 0.8", "P = 0.9"}
    assert requirement["workers"].max() == 1024
    assert isinstance(figures.bandwidth_figure(ok), go.Figure)

    fits, predicted = calibration.calibration(ok)
    assert list(fits["link"]) == ["1Gbit", "full speed"] and (fits["alpha"] >= 0).all()
    # only the runs the model describes: no parameter server, no distorted run (ring and decentralized at n = 2)
    assert len(predicted) == 4 and set(predicted["strategy"]) == {"ring", "decentralized"}
    assert isinstance(figures.parity_figure(predicted, ok), go.Figure)
    model = figures.extrapolation_figure(ok, alpha=float(fits["alpha"].median()))
    assert model.layout.title.text.startswith("MODEL, not measured")
    assert sorted({x for t in model.data for x in t.x}) == [8, 16, 32, 64, 128, 256, 512, 1024]

    convergence = sections.convergence(sections.Results(runs, ok, steps, None, links))
    assert len(convergence["figures"]) == 4  # loss vs step and wall time, consensus, gap


def test_sections_in_order_the_absent_ones_listed_once_and_plotly_embedded_once(built_report):
    page = built_report.read_text()
    absent = page.split('<section id="not-in-this-sweep">')[1].split("</section>")[0]
    positions, number = [], 0
    for section in SECTIONS:
        if f'<section id="{section.id}">' not in page:  # nothing for it in this sweep: one line at the end
            assert f"<b>{section.title}</b>: " in absent
            continue
        number += 1
        tag = f'<section id="{section.id}"><h2>{number}. {section.title}</h2>'
        assert tag in page and section.title not in absent
        positions.append(page.index(tag))
    assert positions == sorted(positions)  # the page follows the one ordered list
    # the fixture has no loopback, overlap, emulation, simulation, straggler or target runs: those sections are absent
    absent_ids = {s.id for s in SECTIONS if f'<section id="{s.id}">' not in page}
    assert {"loopback", "overlap", "emulations", "substrates", "stragglers"} <= absent_ids
    assert absent.count("<li>") == len(absent_ids) == len(SECTIONS) - number
    assert page.index('<section id="runs">') > page.index('<section id="convergence">')  # the long table last
    plotly_js = plotly.offline.get_plotlyjs()
    assert page.count(plotly_js) == 1
    rest = page.replace(plotly_js, "")  # the bundle itself mentions its CDN; nothing else may load from one
    assert "<script src" not in rest and "cdn.plot.ly" not in rest and "https://" not in rest
    assert page.count('class="plotly-graph-div"') == 13  # with the teaching question's model figure and the map
    assert "MODEL, not a measurement" in page


def test_the_distorted_warning_appears_once_under_the_answer(built_report):
    page = built_report.read_text()
    assert page.count("Distorted measurements:") == 1
    assert page.index('<div class="answer">') < page.index("Distorted measurements:") < page.index("<b>Sweep:</b>")
    best = page.split('<section id="summary">')[1].split("</table>")[0]
    assert "<th>distorted</th>" in best and "<td>yes</td>" in best  # the affected runs are marked


def test_no_notes_when_nothing_is_distorted(tmp_path, fake_results):
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    runs["cores_oversubscribed"] = False
    runs.to_parquet(tmp_path / "runs.parquet")
    assert "Distorted" not in build(tmp_path).read_text()


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
    assert "1 run(s) failed; they are left out of the figures" in page
    figures = re.findall(r'Plotly\.newPlot\(.*?\)\s*\}', page, re.S)
    assert figures and not any("ring-8-1Gbit" in f for f in figures)


def test_without_steps_or_sweep_file(tmp_path, fake_results):
    fake_results(tmp_path, with_steps=False)
    (tmp_path / "sweep.toml").unlink()
    page = build(tmp_path).read_text()
    assert "no steps.parquet" in page
    assert page.count('class="plotly-graph-div"') == 9  # with the teaching question's model figure and the map


def test_all_runs_failed(tmp_path, fake_results):
    fake_results(tmp_path, with_steps=False)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    runs["status"] = "failed"
    runs["throughput"] = math.nan
    runs.to_parquet(tmp_path / "runs.parquet")
    page = build(tmp_path).read_text()
    assert "no run succeeded" in page and 'class="plotly-graph-div"' not in page


def test_missing_results_name_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no runs.parquet in"):
        build(tmp_path)


def test_stragglers_section_shows_relative_throughput(results_dir):
    runs = pd.read_parquet(results_dir / "runs.parquet")
    slow = runs[(runs["workers"] == 4) & (runs["link"] == "1Gbit")].copy()
    slow["run_id"] += "-straggler"
    slow["straggler_ranks"] = [[1]] * len(slow)
    slow["straggler_slowdown"] = 2.0
    slow["throughput"] /= 1.5
    pd.concat([runs, slow]).to_parquet(results_dir / "runs.parquet")
    page = build(results_dir).read_text()
    section = page.split('id="stragglers"')[1]
    assert "rank 1 computes 2x slower" in section and 'class="plotly-graph-div"' in section
    ok = load.load_runs(results_dir)
    df = tables.stragglers_frame(ok[ok["ok"]])
    ratios = df[df["imbalance"] != "balanced"]["relative"]
    assert len(ratios) == 3 and ratios.round(6).eq(round(1 / 1.5, 6)).all()


def test_no_straggler_says_so_in_one_line(results_dir):
    page = build(results_dir).read_text()
    assert 'id="stragglers"' not in page
    absent = page.split('<section id="not-in-this-sweep">')[1]
    assert "<b>Stragglers and slow links</b>: no straggler" in absent


def test_native_on_an_emulated_link_is_flagged_and_cannot_win(results_dir):
    runs = pd.read_parquet(results_dir / "runs.parquet")
    fast = runs[runs["strategy"] == "ring"].copy()
    fast["strategy"], fast["strategy_label"], fast["strategy_params"] = "native", "native", "{}"
    fast["bytes_counted"] = False
    fast["run_id"] += "-native"
    fast["throughput"] *= 100  # full loopback speed: it never paid the emulated link
    pd.concat([runs, fast]).to_parquet(results_dir / "runs.parquet")
    loaded = load.load_runs(results_dir)
    ok = loaded[loaded["ok"]]
    best = verdicts.best_strategies(ok, load.link_order(loaded))
    assert set(best.loc[best["link"] == "1Gbit", "best strategy"]) and \
        "native" not in set(best.loc[best["link"] == "1Gbit", "best strategy"])
    assert set(best.loc[best["link"] == "full speed", "best strategy"]) == {"native"}
    page = build(results_dir).read_text()
    assert page.count("Not on the emulated link:") == 1 and '<section id="loopback">' in page


def test_the_summary_opens_with_the_answer(built_report):
    """For each workload and condition at the largest worker count, a verdict first; the fixture has one run per
    configuration, so no lead is measured: each verdict is a tie that says why and shows the numbers."""
    summary = built_report.read_text().split('<section id="summary">')[1].split("</section>")[0]
    answer = summary.split('<div class="answer">')[1].split("</div>")[0]
    assert summary.index('<div class="answer">') < summary.index("<b>Sweep:</b>")
    sentences = answer.split("<p>")[1:]
    assert len(sentences) == 2  # resnet18 on 1Gbit and on full speed, each at n = 4
    for sentence in sentences:
        assert sentence.startswith("resnet18 on ") and ", 4 workers: tie, not distinguishable: " in sentence
        assert "samples/s (one run)" in sentence and "one run each" in sentence
        assert "x the throughput" not in sentence and "use " not in sentence


def test_best_strategy_table_leaves_out_a_single_worker(results_dir):
    runs, ok, links = ok_runs(results_dir)
    best = verdicts.best_strategies(ok, links)
    assert not best.empty and (best["workers"] > 1).all()


def test_scaling_efficiency_at_n_workers_is_throughput_over_n_times_the_one_worker_mean(results_dir):
    """Recomputed from the runs (was: 1.0 at one worker, which the code sets): throughput(n) / (n x the mean
    1-worker throughput of the workload and link)."""
    _, ok, _ = ok_runs(results_dir)
    eff = tables.scaling_efficiency(ok)
    multi = eff[eff["workers"] > 1]
    assert len(multi) == 2 * 3 * 2  # links x strategies x (2, 4 workers)
    for _, row in multi.iterrows():
        same = ok[(ok["link"] == row["link"]) & (ok["workload"] == row["workload"])]
        baseline = same.loc[same["workers"] == 1, "throughput"].mean()
        mine = same[(same["label"] == row["label"]) & (same["workers"] == row["workers"])]
        assert row["efficiency"] == pytest.approx(mine["throughput"].mean() / (row["workers"] * baseline), rel=1e-12)
    assert eff.loc[eff["workers"] == 1, "label"].nunique() == 3


def test_scaling_efficiency_is_per_compute_mode(tmp_path, fake_results):
    """A sweep with real and profile-mode runs: each has its own label and scales against its own single worker
    (a profile 4x faster than the real compute must not make the real runs look 4x less efficient)."""
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    profiled = runs.assign(run_id=runs["run_id"] + "-profile", compute="profile",
                           throughput=runs["throughput"] * 4)
    pd.concat([runs, profiled], ignore_index=True).to_parquet(tmp_path / "runs.parquet")
    _, ok, _ = ok_runs(tmp_path)
    assert {"ring", "ring [profile]"} <= set(ok["label"])
    eff = tables.scaling_efficiency(ok).set_index(["link", "label", "workers"])["efficiency"]
    written = pd.read_parquet(tmp_path / "runs.parquet")
    for link, at in (("1Gbit", written[written["link_bandwidth"] == 125e6]),
                     ("full speed", written[written["link_bandwidth"].isna()])):
        for compute, label in (("real", "ring"), ("profile", "ring [profile]")):
            mode = at[at["compute"] == compute]
            single = mode.loc[mode["workers"] == 1, "throughput"].mean()  # its own mode's single workers
            ring = mode[mode["strategy"] == "ring"].set_index("workers")["throughput"]
            for n in (2, 4):
                assert eff[(link, label, n)] == pytest.approx(ring[n] / (n * single), rel=1e-12), (link, label, n)
        assert eff[(link, "ring [profile]", 4)] == pytest.approx(eff[(link, "ring", 4)])
    figures.throughput_figure(ok, ["1Gbit", "full speed"])  # one dashed ideal line per compute mode


def test_python_and_kernel_emulated_runs_are_set_side_by_side(tmp_path, fake_results):
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    python = runs[runs["link"] == "1Gbit"].assign(link_emulation="python")
    kernel = python.assign(run_id=python["run_id"] + "-k", link="1Gbit kernel", link_emulation="kernel",
                           comm_s=python["comm_s"] * 1.25)
    pd.concat([runs[runs["link"] != "1Gbit"], python, kernel], ignore_index=True).to_parquet(
        tmp_path / "runs.parquet")
    _, ok, _ = ok_runs(tmp_path)
    frame = tables.emulations_frame(ok)
    assert len(frame) == 6 and set(frame["link"]) == {"1Gbit"}  # 3 strategies x workers 2, 4
    assert frame["python / kernel"].to_numpy() == pytest.approx(0.8)
    text = build(tmp_path).read_text()
    assert "Python-emulated vs kernel-shaped links" in text and 'id="emulations"' in text
    assert "fair" in text  # why FIFO emulation and shared TCP flows differ


def test_an_implausible_fit_is_shown_as_such_not_as_a_calibration(tmp_path, fake_results):
    """Communication 30x slower than its emulated link (cores contended, say) gives a fitted bandwidth far
    from the link's: the page says it is not a calibration and why."""
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    slow = runs["link"] == "1Gbit"
    runs.loc[slow, "comm_s"] *= 30
    runs.to_parquet(tmp_path / "runs.parquet")
    _, ok, _ = ok_runs(tmp_path)
    fits, _ = calibration.calibration(ok)
    one_gbit = fits[fits["link"] == "1Gbit"].iloc[0]
    assert one_gbit["plausible"] == "no" and "fitted bandwidth" in one_gbit["why not"]
    assert "likely cause" in one_gbit["why not"]
    cost = build(tmp_path).read_text().split('<section id="cost-model">')[1]
    assert "Not a calibration:" in cost and "1Gbit" in cost.split("Not a calibration:")[1][:200]


def test_workers_sharing_a_gpu_are_called_that_not_more_ranks_than_cores(tmp_path, fake_results):
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    runs["cores_oversubscribed"] = False
    runs["device"], runs["cores"] = "cuda", 16
    runs["gpu_shared"] = runs["workers"] > 1
    runs.to_parquet(tmp_path / "runs.parquet")
    text = build(tmp_path).read_text()
    assert "several workers share a GPU" in text and "more ranks than CPU cores" not in text


def test_the_fixture_is_the_schema(results_dir):
    """The fixture is built from the schema, so the report tests read exactly the runner's columns."""
    runs = pd.read_parquet(results_dir / "runs.parquet")
    assert list(runs.columns[:len(schema.RUNS)]) == schema.names(schema.RUNS)
    assert set(runs.columns) - set(schema.names(schema.RUNS)) <= {*schema.names(schema.DERIVED), "param_servers",
                                                                   "param_topology"}
    with pytest.raises(KeyError, match="not columns of the schema: oversubscribed"):
        schema.row(schema.RUNS, oversubscribed=True)


def test_simulated_runs_sit_beside_measured_and_modelled(tmp_path, fake_results):
    """A results directory holding measured and simulated runs of the same configuration: the section shows
    the three communication times side by side, and the figures never average a simulated run with a measured."""
    fake_results(tmp_path)
    runs = pd.read_parquet(tmp_path / "runs.parquet")
    sim = runs[(runs["strategy"] == "ring") & (runs["workers"] == 4) & (runs["link"] == "1Gbit")].copy()
    sim["run_id"] += "-sim"
    sim["substrate"], sim["transport"] = "simgrid", "simgrid"
    sim["sim_platform"], sim["sim_network_model"] = "star", "alpha_beta"
    sim["comm_s"] *= 0.9
    sim["model_comm_s"] = sim["comm_s"] * 0.95
    pd.concat([runs, sim]).to_parquet(tmp_path / "runs.parquet")
    _, ok, _ = ok_runs(tmp_path)
    assert "ring [simulated]" in set(ok["label"])
    df = tables.substrates_frame(ok)
    assert len(df) == 1
    row = df.iloc[0]
    measured = float(runs.loc[runs["run_id"] == "ring-4-1Gbit", "comm_s"].iloc[0]) * 1e3
    assert row["measured comm ms"] == pytest.approx(measured)
    assert row["simulated comm ms"] == pytest.approx(0.9 * measured)
    assert row["modelled comm ms"] == pytest.approx(0.9 * 0.95 * measured)
    section = build(tmp_path).read_text().split('<section id="substrates">')[1].split("</section>")[0]
    assert "simulated comm ms" in section and 'class="plotly-graph-div"' in section


def test_without_simulated_runs_the_closing_list_says_how_to_get_them(built_report):
    page = built_report.read_text()
    absent = page.split('<section id="not-in-this-sweep">')[1].split("</section>")[0]
    assert '<section id="substrates">' not in page
    assert "<b>Simulated, measured and modelled</b>: no simulated runs (syncbench simulate" in absent
