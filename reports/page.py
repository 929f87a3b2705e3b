"""The HTML page: results -> tables (reports/tables.py) -> figures (reports/figures.py) -> one report.html.

`build(results_dir)` reads runs.parquet (one row per run), steps.parquet (optional) and sweep.toml (optional)
and writes results_dir/report.html: plotly's JavaScript inlined once, every figure a <div> that uses it, with
no network. SECTIONS is the page, in order: one entry per section, its heading and the function that writes
its body. Every string that comes from the sweep (names, labels, errors) is escaped.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.offline

from reports import figures, tables
from reports.figures import esc


@dataclass(frozen=True)
class Results:
    """What every section reads: all runs, the successful ones, steps, the sweep file and the links in order."""

    runs: pd.DataFrame
    ok: pd.DataFrame
    steps: pd.DataFrame | None
    sweep_text: str | None
    links: list[str]


# ---- HTML pieces -----------------------------------------------------------------------------------------

def html_table(df: pd.DataFrame, formats: dict[str, str] | None = None, sortable: bool = False,
               table_id: str = "") -> str:
    """A plain HTML table; every cell escaped; numbers carry data-v so the sort compares values."""
    formats = formats or {}
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for col, value in zip(df.columns, row):
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
                text = "" if pd.isna(value) else format(value, formats.get(col, ",.4g"))
                sort = "" if pd.isna(value) else f' data-v="{float(value)!r}"'
                cells.append(f'<td class="num"{sort}>{esc(text)}</td>')
            else:
                cells.append(f"<td>{esc('' if value is None else value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>")


def figure_html(fig) -> str:
    """A figure as a <div> using the page's one copy of plotly.js."""
    if fig is None:
        return '<p class="muted">Nothing to plot for this section.</p>'
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})


def distortion_note(rows: pd.DataFrame, what: str) -> str:
    """A visible warning when runs in a figure had more ranks than cores or workers sharing a GPU."""
    bad = rows[rows["distorted"]]
    if bad.empty:
        return ""
    parts = []
    over = bad[bad["cores_oversubscribed"]]
    if not over.empty:
        configs = sorted({f"{r.workers} workers + {r.servers} servers on {r.cores} cores"
                          for r in over.itertuples()})
        parts.append(f"{len(over)} run(s) had more ranks than CPU cores ({'; '.join(configs)})")
    shared = bad[bad["gpu_shared"]]
    if not shared.empty:
        parts.append(f"{len(shared)} run(s) had several workers share a GPU "
                     f"(n = {', '.join(map(str, sorted(shared['workers'].unique())))})")
    return (f'<div class="note"><b>Distorted measurements:</b> {esc("; ".join(parts))} of the '
            f'{len(rows)} shown. Their {esc(what)} include contention for the machine, not only the network.'
            f'</div>')


def compute_note(rows: pd.DataFrame) -> str:
    """Which compute produced the figure: the model computing for real, or a replayed profile (and whose)."""
    profiled = rows[rows["compute"] == "profile"]
    if profiled.empty:
        return ""
    which = ", ".join(sorted({f"{r.profile_id} ({r.profile_device})" for r in profiled.itertuples()}))
    return (f'<p class="muted">Compute: {len(profiled)} of {len(rows)} runs replayed a measured compute profile '
            f'instead of computing ({esc(which)}); their compute times are the profile\'s.</p>')


def native_note(ok: pd.DataFrame) -> str:
    if not tables.not_emulated(ok).any():
        return ""
    return ('<div class="note"><b>Not emulated:</b> a backend\'s own allreduce (<code>native</code>, '
            '<code>ddp</code>) moves its bytes outside the communicator, so the python-emulated link does not '
            'slow it. Its runs on such links show the real loopback network and are left out of the best-strategy '
            'table; compare it on full-speed or kernel-shaped links.</div>')


def not_modelled_note(ok: pd.DataFrame) -> str:
    """Names the measured strategies the model leaves out, and why."""
    _, skipped = tables.strategy_specs(ok)
    return f'<p class="muted">Not modelled: {esc("; ".join(skipped))}.</p>' if skipped else ""


def failed_note(runs: pd.DataFrame) -> str:
    failed = int((~runs["ok"]).sum())
    return f'<p class="muted">{failed} failed run(s) are left out of the figures (see the runs table).</p>' \
        if failed else ""


# ---- the sections, in page order --------------------------------------------------------------------------

def summary_section(r: Results) -> str:
    """The answer first (which strategy, by how much, why), then the sweep, the machine and every run."""
    best = tables.best_strategies(r.ok, r.links)
    answers = tables.verdicts(best)
    answer_html = ("<div class=\"answer\">" + "".join(f"<p>{esc(a)}</p>" for a in answers) + "</div>") if answers \
        else "<p><b>No answer:</b> no multi-worker run succeeded, so no strategy can be compared.</p>"
    sweeps = ", ".join(esc(s) for s in r.runs["sweep"].unique())
    description = ""
    if r.sweep_text:
        try:
            parsed = tomllib.loads(r.sweep_text)
        except (tomllib.TOMLDecodeError, ValueError, RecursionError):  # a crafted file: nested deep, long numbers
            parsed = {}
        if isinstance(parsed.get("description"), str):
            description = f"<p>{esc(parsed['description'])}</p>"
        description += f"<details><summary>sweep.toml</summary><pre>{esc(r.sweep_text)}</pre></details>"

    def values(col):
        return ", ".join(esc(v) for v in r.runs[col].dropna().astype(str).unique() if v) or "none"

    machine = (f"<p><b>Machine:</b> host {values('host')}; {values('cores')} CPU cores; GPU {values('gpu')}; "
               f"device {values('device')}; transport {values('transport')}; compute {values('compute')}.</p>")
    counts = (f"<p><b>Runs:</b> {len(r.runs)} ({int(r.runs['ok'].sum())} ok, {int((~r.runs['ok']).sum())} "
              f"failed); workloads {values('workload')}; strategies "
              f"{', '.join(esc(s) for s in r.runs['label'].unique())}; links {', '.join(esc(s) for s in r.links)}.</p>")
    shown = best.drop(columns=["_best", "_next"]) if not best.empty else best
    best_html = html_table(shown, {"workers": "d", "samples/s": ",.1f", "step time s": ".3f",
                                   "comm share %": ".1f", "lead over next %": "+.1f"}) if not best.empty \
        else "<p>No multi-worker run succeeded, so there is no best strategy.</p>"
    return (f"{answer_html}{distortion_note(r.ok, 'throughputs')}<p><b>Sweep:</b> {sweeps}</p>{description}"
            f"{machine}{counts}<h3>Best strategy per workload, workers (n &gt; 1) and link (highest throughput)</h3>"
            f"{native_note(r.ok)}{compute_note(r.ok)}{best_html}"
            f"<h3>All runs</h3><p class=\"muted\">Click a column heading to sort. MB = 10^6 bytes; "
            f"times are means over timed steps, a step being the slowest rank's.</p>"
            + html_table(tables.runs_frame(r.runs), {"sent MB/worker": ",.3f", "recv MB/worker": ",.3f",
                                                      "comm share": ".2f", "workers": "d", "servers": "d",
                                                      "seed": "d"}, sortable=True, table_id="runs"))


def throughput_section(r: Results) -> str:
    return (failed_note(r.runs) + distortion_note(r.ok, "throughputs") + native_note(r.ok) + compute_note(r.ok)
            + figure_html(figures.throughput_figure(r.ok, r.links)))


def scaling_section(r: Results) -> str:
    base = tables.per_worker_baseline(r.ok)
    without_one = base[base["n0"] > 1]
    text = ("<p>The baseline is the single worker, which has nothing to synchronize: efficiency is 1.0 at "
            "n = 1 by definition.</p>")
    if not without_one.empty:
        text += (f'<p class="muted">No n = 1 run for {esc(", ".join(sorted(set(without_one["workload"]))))}: '
                 f"its smallest n is the baseline there.</p>")
    return (text + distortion_note(r.ok, "scaling efficiencies") + compute_note(r.ok)
            + figure_html(figures.scaling_figure(r.ok, r.links)))


def step_time_section(r: Results) -> str:
    return (distortion_note(r.ok, "compute and communication times") + native_note(r.ok) + compute_note(r.ok)
            + figure_html(figures.step_time_figure(r.ok, r.links)))


def traffic_section(r: Results) -> str:
    same, compared, differ, hidden = tables.traffic_agreement(r.ok)
    if compared == 0:
        text = "No multi-worker run has both measured and analytic bytes to compare."
    else:
        text = f"Measured bytes sent per worker equal the analytic bytes in {same} of {compared} runs."
        if differ:
            text += f" Different in: {', '.join(differ)}."
    if hidden:
        text += f" No measured bytes (the backend hides them): {', '.join(hidden)}."
    return ("<p>Bytes are per rank per step; analytic bytes come from each strategy's stated traffic. "
            f"MB = 10^6 bytes.</p><p>{esc(text)}</p>" + figure_html(figures.traffic_figure(r.ok)))


def bandwidth_section(r: Results) -> str:
    ts = tables.compute_time_per_workload(r.ok)
    ts_text = "; ".join(f"{w}: Ts = {t:.4g} s ({how})" for w, (t, how) in ts.items())
    return ("<p>Parallel efficiency P = Ts / (Ts + Tt); the NIC bandwidth that gives efficiency P is "
            "S = path_bytes x P / ((1 - P) x Ts), path_bytes being the bytes on the critical path of the "
            "strategy's analytic traffic (for a parameter server, the server's link). Latency is left out; the "
            f"compute time is measured: {esc(ts_text)}.</p>" + not_modelled_note(r.ok)
            + distortion_note(r.ok, "compute times (Ts)") + compute_note(r.ok)
            + figure_html(figures.bandwidth_figure(r.ok)))


def cost_model_section(r: Results) -> str:
    """Calibration table (implausible fits shown as such), parity plot and the labelled extrapolation."""
    fits, predicted = tables.calibration(r.ok)
    plausible = fits[fits["plausible"] == "yes"] if not fits.empty else fits
    if fits.empty:
        alpha = 0.0
        intro = ("<p>No multi-worker run has analytic rounds and bytes, so alpha and beta could not be "
                 "calibrated; the extrapolation below takes alpha = 0.</p>")
    else:
        alpha = float((plausible if not plausible.empty else fits)["alpha"].median())
        intro = ("<p>Communication time per step = rounds x alpha + path_bytes x beta, with rounds and path_bytes "
                 "from each strategy's analytic traffic and alpha, beta fitted (least squares, non-negative) to "
                 "the measured communication time of this sweep's runs, one fit per link. fitted MB/s = 1/beta; "
                 "link MB/s is the emulated NIC (empty when not emulated).</p>"
                 + html_table(fits.drop(columns=["alpha", "beta"]),
                              {"runs": "d", "alpha us": ",.1f", "fitted MB/s": ",.1f", "link MB/s": ",.1f",
                               "rmse ms": ",.2f"}))
        bad = fits[fits["plausible"] == "no"]
        if not bad.empty:
            intro += ('<div class="note"><b>Not a calibration:</b> the fit for '
                      + esc(", ".join(bad["link"])) + " does not describe its link ("
                      + esc(" | ".join(bad["why not"])) + "). Its alpha and beta are shown, not used"
                      + (": the extrapolation takes the plausible fits' alpha." if not plausible.empty
                         else "; with no plausible fit the extrapolation below is uncalibrated.") + "</div>")
    model_label = ('<div class="model-label">MODEL, not a measurement: the alpha-beta model extrapolated to '
                   f'n = 8 ... 1024 workers at 1, 10, 25 and 100 Gbit, with alpha = {alpha * 1e6:.1f} us '
                   '(median of the calibrated alphas) and beta = 1/link bandwidth. The dashed line is the '
                   'measured compute time Ts: above it, communication costs more than compute (P < 0.5).</div>')
    return (intro + not_modelled_note(r.ok) + distortion_note(r.ok, "communication times")
            + figure_html(figures.parity_figure(predicted, r.ok)) + model_label
            + figure_html(figures.extrapolation_figure(r.ok, alpha)))


def overlap_section(r: Results) -> str:
    """Exposed vs hidden communication, P with overlap, and what overlap buys in bandwidth."""
    frame = tables.overlap_frame(r.ok)
    if frame.empty:
        return "<p>No multi-worker run.</p>"
    return ("<p>Gradients are synchronized in buckets (DDP's grouping: reverse registration order, a 1 MiB first "
            "bucket, then bucket_mb MiB). With overlap a communication thread syncs each bucket as soon as its last "
            "gradient is ready, while backward goes on. <b>busy</b>: time inside bucket syncs per step; "
            "<b>exposed</b>: what the step waited for after backward (the rest was <b>hidden</b> behind backward); "
            "P = Ts / (Ts + exposed). S is the NIC bandwidth that gives P = 0.9: without overlap the whole "
            "critical-path traffic must fit in (1-P)/P x Ts; with overlap the measured hidden seconds add to that "
            "budget. ddp's communication is inside the backend: only its exposed part is measured. MB = 10^6 "
            "bytes, MiB = 2^20 bytes.</p>" + distortion_note(r.ok, "times") + native_note(r.ok)
            + compute_note(r.ok)
            + html_table(frame, {"workers": "d", "step s": ".3f", "Ts s": ".3f",
                                 "exposed s": ".3f", "busy s": ".3f", "hidden s": ".3f", "overlap fraction": ".2f",
                                 "P": ".3f", "S for P=0.9, no overlap MB/s": ",.1f",
                                 "S for P=0.9, measured overlap MB/s": ",.1f"}, sortable=True, table_id="overlap"))


def emulations_section(r: Results) -> str:
    """The same runs on python-emulated and kernel-shaped links, and why they can differ."""
    df = tables.emulations_frame(r.ok)
    if df.empty:
        return ("<p>This sweep has no configuration on both a python-emulated and a kernel-shaped link "
                "(<code>link = { bandwidth = \"1Gbit\", emulation = \"kernel\" }</code> on a "
                "<code>syncbench cluster up</code> cluster).</p>")
    return ("<p>Python emulation books each message on its sender's transmit side and its receiver's receive side, "
            "<b>one message at a time in the order they were sent</b>, each at the full link rate. On a "
            "kernel-shaped link concurrent TCP flows through one NIC <b>share</b> it. Where a rank sends to several "
            "peers at once, the two differ: a parameter server replying to n workers delivers the first reply "
            "after one transfer time under FIFO (that worker computes and pushes its next step while the others "
            "wait: pushes and replies pipeline), but all n replies together after n transfer times under fair "
            "sharing (every worker waits, then all push at once); a binomial broadcast's root likewise. Strategies "
            "whose ranks send one message at a time (ring, halving-doubling) agree within a few percent; TCP/IP "
            "headers add about 4-5% on the kernel side. Python emulation slows only the bytes the communicator "
            "sends: a backend's own collective (native, ddp) is slowed only by the kernel.</p>"
            + compute_note(r.ok)
            + html_table(df, {"workers": "d", "comm s, python": ".3f", "comm s, kernel": ".3f",
                              "python / kernel": ".2f"}, sortable=True, table_id="emulations"))


def substrates_section(r: Results) -> str:
    """Simulated (SimGrid), measured and modelled communication side by side, where a simulation ran."""
    df = tables.substrates_frame(r.ok)
    if df.empty:
        return ("<p>This sweep has no simulated runs. <code>syncbench simulate SWEEP.toml</code> runs the same "
                "strategy code on a SimGrid platform (up to thousands of ranks); its results directory, or one "
                "holding both kinds, shows them here beside the measured and the modelled times.</p>")
    text = ("<p>The same strategy code, three ways: measured on Ray actors over the (emulated) link, simulated on "
            "a SimGrid platform with the same NIC bandwidth and latency (the network model is named: "
            "<code>tcp</code> applies SimGrid's TCP corrections, about 97% goodput and latency x 13.01; "
            "<code>alpha_beta</code> none), and modelled (rounds x latency + critical-path bytes / bandwidth). "
            "Measured is empty where only a simulation covered the configuration.</p>")
    return (text + html_table(df, {"workers": "d", "measured comm ms": ",.1f", "simulated comm ms": ",.1f",
                                   "simulated step ms": ",.1f", "modelled comm ms": ",.1f"})
            + figure_html(figures.substrates_figure(df)))


def convergence_section(r: Results) -> str:
    """Loss vs step and wall time; consensus distance and spectral gap for decentralized strategies."""
    if r.steps is None:
        return "<p>This sweep recorded no steps (no steps.parquet), so there is no convergence to show.</p>"
    df = tables.loss_frame(r.ok, r.steps)
    figs, note = [], ""
    if df["loss"].notna().any():
        figs += [figures.loss_figure(df, r.ok, "step"), figures.loss_figure(df, r.ok, "wall_s")]
        note = distortion_note(r.ok[r.ok["run_id"].isin(df["run_id"])], "wall times")
        text = "<p>Mean loss of the workers at each step (warm-up steps included), one line per run.</p>"
    else:
        text = "<p>The steps carry no loss, so there is no convergence to show.</p>"
    if df["consensus_distance"].notna().any():
        figs.append(figures.consensus_figure(df, r.ok))
    if r.ok["spectral_gap"].notna().any():
        figs.append(figures.spectral_gap_figure(r.ok))
    return text + note + "".join(figure_html(f) for f in figs)


def stragglers_section(r: Results) -> str:
    if not tables.has_imbalance(r.ok):
        return "<p>This sweep has no straggler and no slower link: every rank had the same compute and NIC.</p>"
    df = tables.stragglers_frame(r.ok)
    text = ("<p>A synchronous strategy waits for its slowest rank every step, so one slow rank slows the group; "
            "how much the others lose, and whether decentralized averaging or a parameter server hides it, is "
            "measured here, not assumed. A straggler's compute is stretched by a measured delay "
            "((slowdown - 1) x its own compute time).</p>")
    return text + distortion_note(df, "throughputs") + figure_html(figures.stragglers_figure(df, r.ok))


@dataclass(frozen=True)
class Section:
    id: str
    title: str
    body: Callable[[Results], str]
    needs_runs: bool = True  # False: written even when no run succeeded


SECTIONS: tuple[Section, ...] = (
    Section("summary", "Summary", summary_section, needs_runs=False),
    Section("throughput", "Throughput vs workers", throughput_section),
    Section("scaling", "Scaling efficiency", scaling_section),
    Section("step-time", "Step time: compute and communication", step_time_section),
    Section("traffic", "Traffic: measured vs analytic", traffic_section),
    Section("bandwidth", "Bandwidth requirement", bandwidth_section),
    Section("cost-model", "Cost model (alpha-beta)", cost_model_section),
    Section("overlap", "Overlap: exposed vs hidden communication", overlap_section),
    Section("emulations", "Python-emulated vs kernel-shaped links", emulations_section),
    Section("substrates", "Simulated, measured and modelled", substrates_section),
    Section("convergence", "Convergence", convergence_section),
    Section("stragglers", "Stragglers and slow links", stragglers_section),
)


def heading(number: int, section: Section) -> str:
    return f"{number}. {section.title}"


# ---- the page ---------------------------------------------------------------------------------------------

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1400px;
       padding: 0 24px 48px; color: #222; }
h1 { margin-top: 24px; } h2 { border-bottom: 2px solid #ddd; padding-bottom: 4px; margin-top: 40px; }
nav a { margin-right: 14px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.sortable th { cursor: pointer; background: #f4f4f4; } table.sortable th:hover { background: #e8e8e8; }
.note { background: #fff4e0; border-left: 5px solid #e69500; padding: 8px 12px; margin: 8px 0; }
.answer { background: #eaf7ea; border-left: 5px solid #2e8b57; padding: 4px 12px; margin: 8px 0; font-size: 15px; }
.model-label { background: #eef3ff; border-left: 5px solid #3b6fd8; padding: 8px 12px; margin: 8px 0;
               font-weight: 600; }
.scroll { overflow-x: auto; } .muted { color: #666; } pre { background: #f7f7f7; padding: 8px; overflow-x: auto; }
"""

SORT_SCRIPT = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var up = th.dataset.dir !== "up"; th.dataset.dir = up ? "up" : "down";
      rows.sort(function (a, b) {
        var x = a.cells[col], y = b.cells[col], vx = x.dataset.v, vy = y.dataset.v, r;
        if (vx !== undefined && vy !== undefined) { r = parseFloat(vx) - parseFloat(vy); }
        else if (vx !== undefined) { r = -1; } else if (vy !== undefined) { r = 1; }
        else { r = x.textContent.localeCompare(y.textContent); }
        return up ? r : -r;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
});
"""


def build(results_dir: str | os.PathLike) -> Path:
    """Write results_dir/report.html from its runs.parquet (and steps.parquet, sweep.toml); return its path."""
    results_dir = Path(results_dir)
    runs = tables.load_runs(results_dir)
    sweep_path = results_dir / "sweep.toml"
    results = Results(runs=runs, ok=runs[runs["ok"]], steps=tables.load_steps(results_dir),
                      sweep_text=sweep_path.read_text(encoding="utf-8", errors="replace")
                      if sweep_path.exists() else None, links=tables.link_order(runs))
    parts = []
    for number, section in enumerate(SECTIONS, start=1):
        body = section.body(results) if not results.ok.empty or not section.needs_runs \
            else "<p>No run succeeded: nothing to plot.</p>"
        parts.append(f'<section id="{section.id}"><h2>{heading(number, section)}</h2>{body}</section>')
    nav = " ".join(f'<a href="#{s.id}">{esc(heading(i, s))}</a>' for i, s in enumerate(SECTIONS, start=1))
    title = "syncbench report: " + ", ".join(runs["sweep"].astype(str).unique())
    page = (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{STYLE}</style><script>{plotly.offline.get_plotlyjs()}</script></head><body>"
            f"<h1>{esc(title)}</h1><nav>{nav}</nav>{''.join(parts)}<script>{SORT_SCRIPT}</script></body></html>\n")
    out = results_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, out)
    return out

