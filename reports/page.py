"""The HTML page: results -> sections (reports/sections.py) -> templates/report.html.j2 -> one report.html.

`build(results_dir)` reads runs.parquet (one row per run), steps.parquet (optional) and sweep.toml (optional)
and writes results_dir/report.html: plotly's JavaScript inlined once, every figure a <div> that uses it, with
no network. Warnings that concern many figures (distorted runs, runs that bypassed their link, replayed compute,
failed runs) are said once, at the top. The templates escape every string (autoescape).
"""

from __future__ import annotations

import os
from pathlib import Path

import jinja2
import plotly.offline
from markupsafe import Markup

from reports.load import link_order, load_runs, load_steps
from reports.sections import SECTIONS, Absent, Results

ENV = jinja2.Environment(loader=jinja2.PackageLoader("reports", "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


# ---- the warnings at the top --------------------------------------------------------------------------------

def warnings(r: Results) -> list[tuple[str, str]]:
    """(title, text) of each page-wide warning; the affected runs are marked in the tables."""
    out = []
    distorted = r.ok[r.ok["distorted"]]
    if not distorted.empty:
        parts = []
        over = distorted[distorted["cores_oversubscribed"]]
        if not over.empty:
            configs = sorted({f"{x.workers} workers + {x.servers} servers on {x.cores} cores"
                              for x in over.itertuples()})
            parts.append(f"{len(over)} run(s) had more ranks than CPU cores ({'; '.join(configs)})")
        shared = distorted[distorted["gpu_shared"]]
        if not shared.empty:
            parts.append(f"{len(shared)} run(s) had several workers share a GPU "
                         f"(n = {', '.join(map(str, sorted(shared['workers'].unique())))})")
        out.append(("Distorted measurements:", f"{'; '.join(parts)} of the {len(r.ok)} successful runs. Their "
                    "compute and communication times include contention for the machine, not only the network; "
                    "they are marked in the tables and left out of the cost model's calibration."))
    if r.ok["bypasses_link"].any():
        labels = ", ".join(r.ok.loc[r.ok["bypasses_link"], "label"].unique())
        out.append(("Not on the emulated link:", f"{labels} moved their bytes inside the backend (gloo), so the "
                    "python-emulated link did not shape them: they ran at loopback speed. They are kept out of "
                    "every comparison, figure and verdict with the shaped runs and shown apart in the loopback "
                    "reference; compare them on full-speed or kernel-shaped links."))
    profiled = r.ok[r.ok["compute"] == "profile"]
    if not profiled.empty:
        which = ", ".join(sorted({f"{x.profile_id} ({x.profile_device})" for x in profiled.itertuples()}))
        out.append(("Replayed compute:", f"{len(profiled)} of {len(r.ok)} runs replayed a measured compute profile "
                    f"instead of computing ({which}); their compute times are the profile's and their parameters "
                    "did not train."))
    failed = int((~r.runs["ok"]).sum())
    if failed:
        out.append(("Failed runs:", f"{failed} run(s) failed; they are left out of the figures (see the runs "
                    "table)."))
    return out


# ---- the page ---------------------------------------------------------------------------------------------

def render(r: Results) -> str:
    """The page's HTML: each section rendered from its template, absent ones listed once at the end."""
    shown, absent = [], []
    for section in SECTIONS:
        if r.ok.empty and section.needs_runs:
            absent.append((section, "no run succeeded: nothing to plot"))
            continue
        body = section.body(r)
        if isinstance(body, Absent):
            absent.append((section, body.reason))
            continue
        number = len(shown) + 1
        html = ENV.get_template(f"sections/{section.id}.html.j2").render(**body)
        shown.append({"id": section.id, "heading": f"{number}. {section.title}", "html": Markup(html)})
    title = "syncbench report: " + ", ".join(r.runs["sweep"].astype(str).unique())
    return ENV.get_template("report.html.j2").render(
        title=title, sections=shown, absent=absent, warnings=warnings(r),
        plotly_js=Markup(plotly.offline.get_plotlyjs()))


def build(results_dir: str | os.PathLike) -> Path:
    """Write results_dir/report.html from its runs.parquet (and steps.parquet, sweep.toml); return its path."""
    results_dir = Path(results_dir)
    runs = load_runs(results_dir)
    sweep_path = results_dir / "sweep.toml"
    results = Results(runs=runs, ok=runs[runs["ok"]], steps=load_steps(results_dir),
                      sweep_text=sweep_path.read_text(encoding="utf-8", errors="replace")
                      if sweep_path.exists() else None, links=link_order(runs))
    out = results_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(render(results), encoding="utf-8")
    os.replace(tmp, out)
    return out

