"""Issue 23: the report tells the truth at a glance. Shaped and unshaped runs apart, facets with labelled shared
axes, a cost model fitted only where it applies, verdicts with their uncertainty and per condition, no scaling
efficiency without a baseline, no convergence curves for runs that did not train. Figures are read back from the
page (plotly's JSON), as a reader's browser gets them."""

import json
import re

import pandas as pd
import pytest

from reports import calibration, figures, load, tables, verdicts
from reports.page import build


def page_figures(html: str) -> list[dict]:
    """Every plotly figure on a page (or a part of one) as {"data": [...], "layout": {...}}."""
    decoder, out = json.JSONDecoder(), []
    for match in re.finditer(r'Plotly\.newPlot\(\s*"[^"]+",\s*', html):
        data, end = decoder.raw_decode(html, match.end())
        layout, _ = decoder.raw_decode(html, end + html[end:].index("{"))
        out.append({"data": data, "layout": layout})
    return out


def section(html: str, section_id: str) -> str:
    return html.split(f'<section id="{section_id}">')[1].split("</section>")[0]


def closing_list(html: str) -> str:
    return section(html, "not-in-this-sweep")


def edit_runs(path, edit) -> None:
    runs = pd.read_parquet(path / "runs.parquet")
    edit(runs).to_parquet(path / "runs.parquet")


def ok_runs(path) -> pd.DataFrame:
    runs = load.load_runs(path)
    return runs[runs["ok"]]


# ---- shaped and unshaped runs never share axes ---------------------------------------------------------------

@pytest.mark.slow  # the report built whole: out of make test-fast
def test_runs_that_bypassed_the_emulated_link_are_drawn_apart(results_dir):
    """native on a python-emulated link moved its bytes unshaped inside gloo: it is in the loopback reference, not
    in the throughput, scaling or step-time figures nor in the verdicts."""
    def add_native(runs):
        native = runs[(runs["strategy"] == "ring") & (runs["link"] == "1Gbit")].copy()
        native["strategy"], native["strategy_label"], native["bytes_counted"] = "native", "native", False
        native["run_id"] += "-native"
        native["throughput"] *= 3  # it never paid the emulated link
        return pd.concat([runs, native], ignore_index=True)

    edit_runs(results_dir, add_native)
    html = build(results_dir).read_text()
    for shaped in ("throughput", "scaling", "step-time"):
        for fig in page_figures(section(html, shaped)):
            names = {t.get("name", "") for t in fig["data"]}
            names |= {x for t in fig["data"] for x in t.get("x", []) if isinstance(x, str)}  # step time: on x
            assert not any(name.startswith("native") for name in names), (shaped, names)
    loopback = page_figures(section(html, "loopback"))
    assert len(loopback) == 1 and {t["name"] for t in loopback[0]["data"]} == {"native"}
    assert "NOT on the emulated link" in loopback[0]["layout"]["title"]["text"]
    best = verdicts.best_strategies(ok_runs(results_dir), ["1Gbit", "full speed"])
    assert "native" not in set(best["best strategy"]) | set(best["next"])


# ---- honest axes --------------------------------------------------------------------------------------------

@pytest.mark.slow  # the report built whole: out of make test-fast
def test_every_facet_has_a_labelled_or_shared_y_axis_with_units(built_report):
    figs = page_figures(built_report.read_text())
    assert len(figs) == 13  # with the teaching question's model figure and the strategy map
    for fig in figs:
        axes = {name: axis for name, axis in fig["layout"].items() if name.startswith("yaxis")}
        title = fig["layout"]["title"]["text"]
        for name, axis in axes.items():
            own = axis.get("title", {}).get("text")
            shared = axis.get("matches")
            assert own or (shared and axes["yaxis" + shared[1:]].get("title", {}).get("text")), (title, name)
            assert not own or "(" in own, f"{title}: y axis {own!r} has no unit"


@pytest.mark.slow  # the report built whole: out of make test-fast
def test_step_time_facets_share_one_y_scale(built_report):
    """A 0.2 s bar and a 1.5 s bar never reach the same height: every facet matches the first axis."""
    (fig,) = page_figures(section(built_report.read_text(), "step-time"))
    axes = {name: axis for name, axis in fig["layout"].items() if name.startswith("yaxis")}
    assert len(axes) == 6  # n = 1, 2, 4 x 2 links
    assert all(axis.get("matches") == "y" for name, axis in axes.items() if name != "yaxis")
    assert axes["yaxis"]["title"]["text"] == "time per step (s)"


# ---- the cost model only where it applies -------------------------------------------------------------------

def undistorted(runs):
    return runs.assign(cores_oversubscribed=False)


def test_calibration_leaves_out_overlapped_server_and_distorted_runs(tmp_path, fake_results):
    fake_results(tmp_path)

    def add_overlapped(runs):  # communication exactly 50 us per round + 1.05 x bytes / bandwidth
        runs = undistorted(runs).assign(comm_s=lambda r: r["analytic_rounds"] * 50e-6 + 1.05
                                        * r["analytic_path_bytes"] / r["link_bandwidth"].fillna(2e9))
        overlapped = runs[runs["strategy"] == "ring"].assign(overlap=True, comm_s=lambda r: r["comm_s"] * 20)
        overlapped["run_id"] += "-overlap"
        return pd.concat([runs, overlapped], ignore_index=True)

    edit_runs(tmp_path, add_overlapped)
    ok = ok_runs(tmp_path)
    fits, predicted = calibration.calibration(ok)
    assert set(predicted["strategy"]) == {"ring", "decentralized"} and not predicted["overlap"].any()
    assert (fits["runs"] == 4).all() and list(fits["plausible"]) == ["yes", "yes"]
    assert fits["alpha us"].to_numpy() == pytest.approx(50)
    assert calibration.extrapolation_alpha(fits, ok).calibrated


@pytest.mark.slow  # the report built whole: out of make test-fast
def test_an_alpha_far_above_latency_and_transport_cost_is_not_used(tmp_path, fake_results):
    """40 ms per round on a link with no latency: the bandwidth fits and the residuals are nil, yet alpha is 184x
    the transport's per-message cost. The fit is shown as implausible and the extrapolation does not use it."""
    fake_results(tmp_path)
    edit_runs(tmp_path, lambda runs: undistorted(runs).assign(
        comm_s=lambda r: r["analytic_rounds"] * 40e-3 + r["analytic_path_bytes"] / r["link_bandwidth"].fillna(2e9)))
    ok = ok_runs(tmp_path)
    fits, _ = calibration.calibration(ok)
    one_gbit = fits.set_index("link").loc["1Gbit"]
    assert one_gbit["alpha us"] == pytest.approx(40_000, rel=1e-6)
    assert one_gbit["plausible"] == "no" and "alpha 40,000 us is over 10x" in one_gbit["why not"]
    alpha = calibration.extrapolation_alpha(fits, ok)
    assert not alpha.calibrated and alpha.alpha == 0.0  # the links' own latency
    cost = section(build(tmp_path).read_text(), "cost-model")
    assert "Not a calibration:" in cost and "UNCALIBRATED" in cost
    (extrapolation,) = [f for f in page_figures(cost) if f["layout"]["title"]["text"].startswith("MODEL")]
    assert "alpha = 0.0 us UNCALIBRATED" in extrapolation["layout"]["title"]["text"]


# ---- verdicts with their uncertainty, per condition -----------------------------------------------------------

def with_repeats(path, fake_results, spread: float, decentralized_share: float | None = None) -> None:
    """Three seeds per configuration, throughputs x (1 - spread, 1, 1 + spread); decentralized optionally set to a
    share of ring's throughput."""
    fake_results(path)

    def repeat(runs):
        if decentralized_share is not None:
            ring = runs[runs["strategy"] == "ring"].set_index(["workers", "link"])["throughput"]
            dec = runs["strategy"] == "decentralized"
            runs.loc[dec, "throughput"] = [ring[(w, link)] * decentralized_share
                                           for w, link in zip(runs.loc[dec, "workers"], runs.loc[dec, "link"])]
        copies = [runs.assign(seed=seed, run_id=runs["run_id"] + f"-s{seed}",
                              throughput=runs["throughput"] * factor)
                  for seed, factor in enumerate((1 - spread, 1.0, 1 + spread))]
        return pd.concat(copies, ignore_index=True)

    edit_runs(path, repeat)


def answers(path) -> list[str]:
    ok = ok_runs(path)
    return verdicts.verdicts(verdicts.best_strategies(ok, load.link_order(ok)))


def test_one_run_each_is_a_tie_never_a_ratio(results_dir):
    sentences = answers(results_dir)
    assert len(sentences) == 2
    for sentence in sentences:
        assert "tie, not distinguishable" in sentence and "(one run)" in sentence
        assert "use " not in sentence and not re.search(r"\dx", sentence.split(" workers:")[1])


def test_a_lead_outside_the_spread_between_repeats_is_a_verdict_with_its_spread(tmp_path, fake_results):
    with_repeats(tmp_path, fake_results, spread=0.01)
    for sentence in answers(tmp_path):
        assert ", 4 workers: use ring, ring " in sentence and "over 3 runs" in sentence
        assert re.search(r"ring [\d,.]+ samples/s \([\d,.]+-[\d,.]+ over 3 runs\)", sentence)


def test_a_win_over_the_parameter_server_names_its_incast(tmp_path, fake_results):
    with_repeats(tmp_path, fake_results, spread=0.01)
    edit_runs(tmp_path, lambda runs: runs[runs["strategy"] != "decentralized"])
    one_gbit = [s for s in answers(tmp_path) if s.startswith("resnet18 on 1Gbit")]
    assert len(one_gbit) == 1 and "use ring" in one_gbit[0]
    assert "MB on its critical path against" in one_gbit[0] and "the parameter server's NIC (its incast)" in one_gbit[0]


def test_a_lead_inside_the_spread_between_repeats_is_a_tie(tmp_path, fake_results):
    with_repeats(tmp_path, fake_results, spread=0.05, decentralized_share=0.99)
    for sentence in answers(tmp_path):
        assert "tie, not distinguishable: ring" in sentence and "decentralized" in sentence
        assert "inside the intervals" in sentence and "parameter_server" not in sentence


def test_straggler_and_balanced_runs_get_one_verdict_each(results_dir):
    """Never averaged: the balanced verdict's numbers are the balanced runs' own."""
    def add_straggler(runs):
        slow = runs[(runs["workers"] == 4) & (runs["link"] == "1Gbit")].copy()
        slow["run_id"] += "-straggler"
        slow["straggler_ranks"] = [[1]] * len(slow)
        slow["straggler_slowdown"] = 2.0
        slow["throughput"] /= 1.5
        return pd.concat([runs, slow], ignore_index=True)

    edit_runs(results_dir, add_straggler)
    one_gbit = [s for s in answers(results_dir) if s.startswith("resnet18 on 1Gbit")]
    assert len(one_gbit) == 2
    balanced, straggler = sorted(one_gbit, key=lambda s: "slower" in s)
    assert balanced.startswith("resnet18 on 1Gbit, 4 workers:")
    assert straggler.startswith("resnet18 on 1Gbit, rank 1 computing 2x slower, 4 workers:")
    ring = ok_runs(results_dir).query("strategy == 'ring' and workers == 4 and link == '1Gbit'")
    alone = ring[ring["straggler_slowdown"] == 1.0]["throughput"].iloc[0]
    assert f"ring {alone:,.1f} samples/s" in balanced
    # and the figures draw the straggler runs as their own series, named in the legend
    fig = figures.throughput_figure(ok_runs(results_dir), ["1Gbit", "full speed"])
    ring_1gbit = [t for t in fig.data if t.name in ("ring", "ring [rank 1 2x slower]") and 4 in list(t.x)
                  and t.xaxis == "x"]  # the 1Gbit facet
    assert {t.name: t.y[list(t.x).index(4)] for t in ring_1gbit} == pytest.approx(
        {"ring": alone, "ring [rank 1 2x slower]": alone / 1.5})


# ---- scaling efficiency needs a baseline ---------------------------------------------------------------------

@pytest.mark.slow  # the report built whole: out of make test-fast
def test_without_a_one_worker_run_no_efficiency_is_shown(tmp_path, fake_results):
    fake_results(tmp_path)
    edit_runs(tmp_path, lambda runs: runs[runs["workers"] != 1])
    ok = ok_runs(tmp_path)
    assert tables.scaling_efficiency(ok)["efficiency"].isna().all()  # not 1.0 at n = 2
    html = build(tmp_path).read_text()
    assert '<section id="scaling">' not in html
    assert "<b>Scaling efficiency</b>: no 1-worker baseline" in closing_list(html)


def test_in_profile_mode_the_profile_is_the_baseline(tmp_path, fake_results):
    fake_results(tmp_path)
    edit_runs(tmp_path, lambda runs: runs[runs["workers"] != 1].assign(compute="profile", profile_step_s=0.2))
    eff = tables.scaling_efficiency(ok_runs(tmp_path)).set_index(["link", "label", "workers"])["efficiency"]
    ring = ok_runs(tmp_path).query("strategy == 'ring' and workers == 2 and link == '1Gbit'")["throughput"].iloc[0]
    assert eff[("1Gbit", "ring", 2)] == pytest.approx(ring / (2 * 32 / 0.2))


# ---- relevance: no convergence for runs that did not train; absent sections once ---------------------------

@pytest.mark.slow  # the report built whole: out of make test-fast
def test_profile_mode_has_no_convergence_curves(tmp_path, fake_results):
    fake_results(tmp_path)
    edit_runs(tmp_path, lambda runs: runs.assign(compute="profile", profile_step_s=0.2, profile_id="p1"))
    html = build(tmp_path).read_text()
    assert '<section id="convergence">' not in html
    assert "<b>Convergence</b>: profile mode: the runs replayed a compute profile" in closing_list(html)
    assert html.count("Replayed compute:") == 1
    headings = re.findall(r"<h2>([^<]*)</h2>", html)
    assert len(headings) == len(set(headings)) and headings[-1] == "Not in this sweep"


@pytest.mark.slow  # the report built whole: out of make test-fast
def test_the_runs_table_comes_last_labelled_by_strategy_and_the_axes_that_vary(built_report):
    html = built_report.read_text()
    headings = re.findall(r"<h2>([^<]*)</h2>", html)
    assert headings[-2:] == [f"{len(headings) - 1}. All runs", "Not in this sweep"]
    head = re.findall(r"<th>([^<]*)</th>", section(html, "runs"))
    assert head[:3] == ["strategy", "workers", "link"] and head[-1] == "run id"
    assert "workload" not in head and "seed" not in head  # one workload, one seed: the summary says them
