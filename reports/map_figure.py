"""The strategy map's heat map: one self-contained HTML page (plotly's JavaScript inlined, no network), the cells
coloured by the winning strategy, each labelled with its knob and lead, the crossovers in words below.

Every text that reaches the figure or the page is escaped (plotly reads `<b>`-style tags in labels)."""

from __future__ import annotations

import html
import os
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline

from reports.map_text import (
    EXACT_TIE,
    StrategyMap,
    _column_value,
    _fmt_column,
    _pct,
    cell_text,
    crossovers,
    short_params,
)

COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
           "#bab0ac")
TIE_COLOUR = "#d9d9d9"  # a tie names no winner


# SimGrid spot checks: agrees on the winner, does not, could not run
MARKS = {"agree": " \u2713", "DIFFERS": " \u2717 SimGrid", "tie": " \u25cb", "not run": " (sim not run)"}


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def map_figure(m: StrategyMap, marks: dict | None = None) -> go.Figure:
    """Rows: workers; columns: bandwidth or message size (as categories, in order); colour: the winner.
    `marks`: {(workers, column value): (short mark, hover text)} added to those cells (the report's measured
    cells)."""
    marks = marks or {}
    df = m.cells
    columns = sorted({_column_value(m, r) for _, r in df.iterrows()})
    workers = sorted(df["workers"].unique())
    tied = f"tie (lead under {_pct(m.tie)})" if m.tie >= EXACT_TIE else "tie (equal times)"
    winners = sorted(set(df.loc[~df["tie"], "winner"])) + ([tied] if df["tie"].any() else [])
    index = {w: i for i, w in enumerate(winners)}
    cells = {(r["workers"], _column_value(m, r)): r for _, r in df.iterrows()}
    z, text, hover = [], [], []
    for n in workers:
        z_row, text_row, hover_row = [], [], []
        for c in columns:
            r = cells[(n, c)]
            knob = short_params(r["winner"], r["winner_params"]) + ("*" if r["winner_knob_at_edge"] else "")
            mark = MARKS.get(r.get("check", "")[:7], "")
            z_row.append(index[tied if r["tie"] else r["winner"]])
            extra, note = marks.get((n, c), ("", ""))
            text_row.append(esc(cell_text(r) + mark + extra))
            runner = f"{r['runner_up']} {short_params(r['runner_up'], r['runner_up_params'])}".strip() \
                if r["runner_up"] else "none"
            first = "first (a tie)" if r["tie"] else "winner"
            hover_row.append(esc(f"{n} workers, {_fmt_column(m, c)}: {first} {r['winner']} {knob} {r['time_s']:.4g} s; "
                                 f"runner-up {runner} {r['runner_up_time_s']:.4g} s (+{_pct(r['margin'])}); "
                                 f"slowest {r['worst']} +{_pct(r['spread'])}"
                                 + (f"; SimGrid: {r['check']}" if r.get("check") else "")
                                 + (f"; {note}" if note else "")))
        z.append(z_row)
        text.append(text_row)
        hover.append(hover_row)
    k = len(winners)
    scale = []
    for i in range(k):  # a step per winner: value i maps to colour i
        colour = TIE_COLOUR if winners[i] == tied else COLOURS[i % len(COLOURS)]
        scale += [[i / k, colour], [(i + 1) / k, colour]]
    fig = go.Figure(go.Heatmap(
        z=z, x=[esc(_fmt_column(m, c)) for c in columns], y=[str(n) for n in workers], text=text,
        texttemplate="%{text}", textfont={"size": 11}, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        colorscale=scale, zmin=-0.5, zmax=k - 0.5,
        colorbar={"tickvals": list(range(k)), "ticktext": [esc(w) for w in winners], "title": "winner"}))
    x_title = "message size (the collective alone; KiB = 2^10 bytes)" if m.axis == "size" else \
        "NIC bandwidth per rank (Gbit/s, 10^9 bits/s)"
    what = "one sync" if m.measure == "sync" else "step time"
    fig.update_layout(template="plotly_white", height=max(420, 48 * len(workers) + 160),
                      title=esc(f"Where each strategy wins ({what}, {m.meta.get('workload') or 'buffer'}): "
                                f"winner, its knob, its lead over the runner-up"),
                      xaxis={"title": esc(x_title), "type": "category"},
                      yaxis={"title": "workers (ranks)", "type": "category"})
    return fig


def write_html(m: StrategyMap, path) -> Path:
    """DIR/map.html: the heat map and the crossovers, plotly's JavaScript inlined once (opens offline)."""
    path = Path(path)
    figure = plotly.offline.plot(map_figure(m), output_type="div", include_plotlyjs=False)
    items = "\n".join(f"<li>{esc(s)}</li>" for s in crossovers(m))
    page = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>syncbench map</title>\n"
            f"<script type=\"text/javascript\">{plotly.offline.get_plotlyjs()}</script></head>\n<body>\n"
            f"<h1>Where each strategy wins</h1>\n<p>{esc(_caption(m))}</p>\n{figure}\n"
            f"<h2>Crossovers</h2>\n<ul>\n{items}\n</ul>\n</body></html>\n")
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _caption(m: StrategyMap) -> str:
    names = ", ".join(m.meta.get("strategies", []))
    return (f"From the analytic model (strategies.cost), not measured. Ranked exact strategies: {names}; each at "
            f"its best knob per cell. Lead: the runner-up's time over the winner's, minus one; a lead under "
            f"{_pct(m.tie)} is a tie (a~b, grey), inside the model's uncertainty. \u2713: SimGrid "
            f"agrees on the winner at that cell, \u2717: it does not, \u25cb: simulated at a tie (hover for the "
            f"times); *: the knob at the end of the values tried, a value beyond may be cheaper.")
