"""The HTML page: results -> sections (reports/sections.py) -> templates/report.html.j2 -> one report.html.

`build(results_dir)` reads the runs (one row per run), the steps (optional) and sweep.toml (optional)
and writes results_dir/report.html: plotly's JavaScript inlined once, every figure a <div> that uses it, with
no network. Sections this sweep has nothing for are listed once, at the end. The templates escape every string
(autoescape).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2
import plotly.offline
from markupsafe import Markup

from experiments.results.dataset import check_contained, read_events, write_text_atomic
from reports.load import link_order, load_runs, load_steps, with_step_intervals
from reports.sections import SECTIONS, Absent, Results

ENV = jinja2.Environment(loader=jinja2.PackageLoader("reports", "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


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
        title=title, sections=shown, absent=absent,
        plotly_js=Markup(plotly.offline.get_plotlyjs()))


def build(results_dir: str | os.PathLike) -> Path:
    """Write results_dir/report.html from its runs (and steps, sweep.toml); return its path."""
    results_dir = Path(results_dir)
    check_contained(results_dir)  # before any work: report.html and its tmp are never written through a link
    steps = load_steps(results_dir)
    runs = with_step_intervals(load_runs(results_dir), steps)
    sweep_path = results_dir / "sweep.toml"
    results = Results(runs=runs, ok=runs[runs["ok"]], steps=steps,
                      sweep_text=sweep_path.read_text(encoding="utf-8", errors="replace")
                      if sweep_path.exists() else None, links=link_order(runs), skipped=_skipped(results_dir),
                      events=read_events(results_dir))
    # replaced whole or not at all; a full or read-only disk: StoreError in one line, no report.html.tmp left
    return write_text_atomic(results_dir / "report.html", render(results))


def _skipped(results_dir: Path) -> tuple[tuple[str, str], ...]:
    """The grid points a `--skip-invalid` sweep left out (skipped.json), as (point, why); () when none or unreadable."""
    path = results_dir / "skipped.json"
    try:
        items = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
        return tuple((str(i["point"]), str(i["reason"])) for i in items)
    except (OSError, ValueError, TypeError, KeyError):
        return ()

