"""The report's plotly figures, one function per figure, each drawing a frame that reports/tables.py computed.

Every text that reaches a figure is escaped (plotly reads `<b>`-style tags in labels). Units on every axis: a
faceted figure either shares its y axis (titled once per row) or titles every facet's own axis. Runs whose bytes
bypassed the emulated link are never drawn with shaped runs: they get their own loopback figure.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from reports.load import mean_per_config
from reports.model import EXTRAPOLATION_LINKS, GBIT, MB, TARGET_EFFICIENCIES, extrapolate, workload_shapes
from reports.tables import (
    REQUIREMENT_WORKERS,
    compute_time_per_workload,
    per_worker_baseline,
    requirement_frame,
    scaling_efficiency,
    strategy_specs,
)

IDEAL = "ideal linear scaling"
COMPUTE_LINE = "compute time Ts (measured)"
LINK_LINE = "1/10/25/100 Gbit links"
FACET_HEIGHT = 320  # pixels per row of facets


def esc(value) -> str:
    """HTML-escape anything for the page (and for plotly labels, which decode entities back to text)."""
    return html.escape(str(value), quote=True)


def for_plot(df: pd.DataFrame) -> pd.DataFrame:
    """A copy whose text columns are escaped, since plotly reads `<b>`-style tags in labels."""
    df = df.copy()
    for col in ("label", "workload", "link", "group", "part", "measure"):
        if col in df:
            df[col] = df[col].map(esc)
    return df


def palette(ok: pd.DataFrame) -> dict[str, str]:
    """One colour per strategy label, the same in every figure."""
    colors = px.colors.qualitative.Plotly + px.colors.qualitative.Dark24
    return {esc(label): colors[i % len(colors)] for i, label in enumerate(sorted(ok["label"].unique()))}


def tidy(fig: go.Figure, rows: int = 1, title: str = "") -> go.Figure:
    """Shared layout: facet titles without 'column=' prefixes, a readable height, a white template, and a title
    on every y axis that does not share another's scale (plotly express titles one axis per row)."""
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    ytitle = next((a.title.text for a in fig.select_yaxes() if a.title.text), None)
    if ytitle:
        fig.for_each_yaxis(lambda a: a.update(title_text=ytitle, showticklabels=True) if a.matches is None else None)
    fig.update_layout(template="plotly_white", height=max(360, FACET_HEIGHT * rows + 120), title=title,
                      legend_title_text="", margin=dict(t=80, r=20, l=70, b=60))
    return fig


def shaped(ok: pd.DataFrame) -> pd.DataFrame:
    """The runs whose bytes crossed the (emulated) link they are labelled with: the ones comparable on one axis."""
    return ok[~ok["bypasses_link"]]


def throughput_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure:
    """Throughput vs workers, one line per strategy plus ideal linear scaling, faceted by workload and link."""
    colors, ok = palette(ok), shaped(ok)
    agg = mean_per_config(ok, ["workload", "link", "series", "workers"])
    ideal = []
    base = per_worker_baseline(ok).dropna(subset=["per_worker"])
    several = base.groupby(["workload", "link"])["compute"].transform("nunique") > 1
    for b, both in zip(base.itertuples(), several):
        for n in sorted(agg.loc[(agg["workload"] == b.workload) & (agg["link"] == b.link), "workers"].unique()):
            ideal.append({"workload": b.workload, "link": b.link, "workers": n, "throughput": b.per_worker * n,
                          "label": f"{IDEAL} [{b.compute}]" if both else IDEAL})
    df = for_plot(pd.concat([agg, pd.DataFrame(ideal)], ignore_index=True))
    fig = px.line(df, x="workers", y="throughput", color="label", color_discrete_map=colors,
                  facet_row="workload", facet_col="link",
                  markers=True, category_orders={"link": [esc(x) for x in links if x in set(ok["link"])]},
                  labels={"workers": "workers (n)", "throughput": "throughput (samples/s)", "label": "strategy"})
    fig.for_each_trace(lambda t: t.update(line=dict(dash="dash", color="gray"), marker=dict(size=4))
                       if t.name.startswith(IDEAL) else None)
    fig.update_xaxes(tickvals=sorted(ok["workers"].unique()))
    fig.update_yaxes(matches=None, rangemode="tozero")
    return tidy(fig, ok["workload"].nunique(), "Throughput (samples/s of the group) vs workers; dashed: ideal "
                                               "n x throughput(1)")


def loopback_figure(ok: pd.DataFrame) -> go.Figure | None:
    """The loopback reference: runs whose bytes bypassed their python-emulated link (a backend's own allreduce),
    on their own axes, never beside the shaped runs they would appear to beat."""
    colors, ok = palette(ok), ok[ok["bypasses_link"]]
    if ok.empty:
        return None
    agg = mean_per_config(ok, ["workload", "link", "series", "workers"])
    fig = px.line(for_plot(agg), x="workers", y="throughput", color="label", color_discrete_map=colors,
                  facet_row="workload", facet_col="link", markers=True,
                  labels={"workers": "workers (n)", "throughput": "throughput (samples/s, unshaped loopback)",
                          "label": "strategy"})
    fig.update_xaxes(tickvals=sorted(ok["workers"].unique()))
    fig.update_yaxes(rangemode="tozero")
    return tidy(fig, ok["workload"].nunique(), "Loopback reference, NOT on the emulated link: throughput of runs "
                                               "whose bytes moved unshaped inside the backend")


def scaling_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure | None:
    """Scaling efficiency(n) = throughput(n) / (n x throughput(1)) vs workers, where there is a baseline."""
    colors, ok = palette(ok), shaped(ok)
    df = scaling_efficiency(ok).dropna(subset=["efficiency"])
    if df.empty:
        return None
    fig = px.line(for_plot(df), x="workers", y="efficiency", color="label",
                  color_discrete_map=colors, facet_row="workload",
                  facet_col="link", markers=True, category_orders={"link": [esc(x) for x in links]},
                  labels={"workers": "workers (n)", "label": "strategy",
                          "efficiency": "scaling efficiency (fraction of linear)"})
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_xaxes(tickvals=sorted(ok["workers"].unique()))
    fig.update_yaxes(rangemode="tozero")
    return tidy(fig, df["workload"].nunique(), "Scaling efficiency(n) = throughput(n) / (n x throughput(1))")


def step_time_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure:
    """Mean step time per strategy (x) and n (a column each), stacked into compute and communication."""
    ok = shaped(ok)
    agg = mean_per_config(ok, ["workload", "link", "series", "workers"])
    agg["group"] = agg["workload"] + " · " + agg["link"]
    long = agg.melt(id_vars=["group", "label", "workers", "workload", "link"], value_vars=["compute_s", "comm_s"],
                    var_name="part", value_name="seconds")
    long["part"] = long["part"].map({"compute_s": "compute", "comm_s": "communication"})
    long["n"] = "n=" + long["workers"].astype(str)
    order = [f"{w} · {link}" for w in ok["workload"].unique() for link in links
             if ((agg["workload"] == w) & (agg["link"] == link)).any()]
    fig = px.bar(for_plot(long.sort_values("workers")), x="label", y="seconds", color="part", facet_row="group",
                 facet_col="n", barmode="stack",
                 category_orders={"group": [esc(g) for g in order], "part": ["compute", "communication"],
                                  "label": [esc(x) for x in agg["label"].unique()]},
                 labels={"label": "strategy", "seconds": "time per step (s)", "part": ""})
    fig.update_yaxes(rangemode="tozero")  # one scale for every facet: a 0.2 s bar is lower than a 1.5 s one
    return tidy(fig, len(order), "Step time per strategy and n: compute + communication (mean over timed steps, "
                                 "one y scale for all)")


def traffic_figure(ok: pd.DataFrame) -> go.Figure:
    """Bytes per worker (and per server) per step: measured sent/received vs the strategy's analytic bytes."""
    agg = mean_per_config(ok[ok["workers"] > 1], ["workload", "series", "workers"])
    measures = {"bytes_sent_per_worker": "worker sent (measured)",
                "bytes_recv_per_worker": "worker received (measured)",
                "analytic_bytes_sent_per_worker": "worker sent (analytic)",
                "bytes_sent_per_server": "server sent (measured)",
                "bytes_recv_per_server": "server received (measured)"}
    long = agg.melt(id_vars=["workload", "label", "workers"], value_vars=list(measures),
                    var_name="measure", value_name="bytes").dropna(subset=["bytes"])
    long["measure"] = long["measure"].map(measures)
    long["MB"] = long["bytes"] / MB
    long = long.sort_values(["label", "workers"])
    long["config"] = long["label"].map(esc) + " n=" + long["workers"].astype(str)
    fig = px.bar(for_plot(long), x="config", y="MB", color="measure", barmode="group", facet_row="workload",
                 category_orders={"measure": list(measures.values())},
                 labels={"config": "strategy and workers", "MB": "MB per step (MB = 10^6 bytes)"})
    fig.update_yaxes(matches=None)
    return tidy(fig, ok["workload"].nunique(), "Bytes per rank per step: measured vs analytic")


def bandwidth_figure(ok: pd.DataFrame) -> go.Figure | None:
    """Link bandwidth needed for parallel efficiency 0.5, 0.8, 0.9 as n grows (zero latency, analytic bytes)."""
    df = requirement_frame(ok)
    if df.empty:
        return None
    df["text"], df["link"] = "", 0
    links = []  # reference lines: what 1/10/25/100 Gbit links carry, labelled at the right end
    for (workload, target), _ in df.groupby(["workload", "target"], sort=False):
        for gbit in (1, 10, 25, 100):
            links += [{"workload": workload, "target": target, "label": LINK_LINE, "workers": n,
                       "MB/s": gbit * GBIT / MB, "text": f"{gbit} Gbit" if n == REQUIREMENT_WORKERS[-1] else "",
                       "link": gbit} for n in (REQUIREMENT_WORKERS[0], REQUIREMENT_WORKERS[-1])]
    df = pd.concat([df, pd.DataFrame(links)], ignore_index=True)
    fig = px.line(for_plot(df), x="workers", y="MB/s", color="label", color_discrete_map=palette(ok),
                  facet_row="workload", facet_col="target",
                  markers=True, log_x=True, log_y=True, text="text", line_group="link",
                  category_orders={"target": [f"P = {p:g}" for p in TARGET_EFFICIENCIES]},
                  labels={"workers": "workers (n)", "MB/s": "bandwidth needed (MB/s, MB = 10^6 bytes)",
                          "label": "strategy"})
    fig.for_each_trace(lambda t: t.update(line=dict(dash="dot", color="#999", width=1), mode="lines+text",
                                          textposition="top left", textfont=dict(size=10, color="#777"))
                       if t.name == LINK_LINE else t.update(textposition="top center"))
    fig.update_xaxes(tickvals=list(REQUIREMENT_WORKERS), ticktext=[str(n) for n in REQUIREMENT_WORKERS])
    return tidy(fig, df["workload"].nunique(),
                "Bandwidth needed per NIC for parallel efficiency P (dotted: 1/10/25/100 Gbit links)")


def parity_figure(predicted: pd.DataFrame, ok: pd.DataFrame) -> go.Figure | None:
    """Predicted (alpha-beta, calibrated per link) vs measured communication time per step, one point per run."""
    if predicted.empty:
        return None
    fig = px.scatter(for_plot(predicted), x="comm_s", y="predicted_s", color="label", color_discrete_map=palette(ok),
                     symbol="link", hover_data=["workload", "workers", "run_id"],
                     labels={"comm_s": "measured communication time per step (s)",
                             "predicted_s": "predicted communication time per step (s)", "label": "strategy"})
    top = float(np.nanmax([predicted["comm_s"].max(), predicted["predicted_s"].max()])) * 1.05 or 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured",
                             line=dict(dash="dash", color="gray")))
    return tidy(fig, 1, "Alpha-beta model vs measurement: predicted vs measured communication time")


def extrapolation_figure(ok: pd.DataFrame, alpha: float, calibrated: bool = True) -> go.Figure | None:
    """MODEL: communication time per step for n = 8..1024 at 1/10/25/100 Gbit, with the measured Ts."""
    specs, _ = strategy_specs(ok)
    ts = compute_time_per_workload(ok)
    frames = []
    for workload, g in ok.groupby("workload", sort=False):
        measured = set(g["label"])
        numel = int(g["numel"].iloc[0])
        df = extrapolate(numel, [s for s in specs if s[0] in measured], alpha,
                         shapes=workload_shapes(workload, numel))
        df = df.rename(columns={"strategy": "label"})
        if df.empty:
            continue
        line = df[["workers", "link"]].drop_duplicates().assign(label=COMPUTE_LINE, comm_s=ts[workload][0])
        frames.append(pd.concat([df, line], ignore_index=True).assign(workload=workload))
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True)
    fig = px.line(for_plot(df), x="workers", y="comm_s", color="label", color_discrete_map=palette(ok),
                  facet_row="workload", facet_col="link",
                  markers=True, log_x=True, log_y=True, category_orders={"link": list(EXTRAPOLATION_LINKS)},
                  labels={"workers": "workers (n)", "comm_s": "modelled communication time per step (s)",
                          "label": "strategy"})
    fig.for_each_trace(lambda t: t.update(line=dict(dash="dash", color="gray"), marker=dict(size=3))
                       if t.name == esc(COMPUTE_LINE) else None)
    fig.update_xaxes(tickvals=list(df["workers"].unique()), ticktext=[str(n) for n in df["workers"].unique()])
    return tidy(fig, df["workload"].nunique(),
                f"MODEL, not measured: communication time per step at 1/10/25/100 Gbit (alpha = {alpha * 1e6:.1f} us "
                + ("calibrated" if calibrated else "UNCALIBRATED: the links' own latency") + ", beta = 1/bandwidth)")


def loss_figure(df: pd.DataFrame, ok: pd.DataFrame, x: str) -> go.Figure:
    """Training loss vs step (or vs wall time) per strategy; one line per run, faceted by workload and n."""
    df = df.dropna(subset=["loss"])
    xlabel = {"step": "step", "wall_s": "wall time since the first step (s)"}[x]
    fig = px.line(for_plot(df), x=x, y="loss", color="label", color_discrete_map=palette(ok),
                  line_dash="link", line_group="run_id", facet_row="workload", facet_col="n",
                  category_orders={"n": [f"n={n}" for n in sorted(df["workers"].unique())]},
                  labels={x: xlabel, "loss": "training loss (mean over workers)", "label": "strategy"})
    return tidy(fig, df["workload"].nunique(), f"Loss vs {xlabel}")


def consensus_figure(df: pd.DataFrame, ok: pd.DataFrame) -> go.Figure:
    """Decentralized runs: distance of the workers' parameters from their average, per step."""
    df = df.dropna(subset=["consensus_distance"])
    fig = px.line(for_plot(df), x="step", y="consensus_distance", color="label", color_discrete_map=palette(ok),
                  line_dash="link", line_group="run_id", facet_row="workload", facet_col="n", log_y=True,
                  category_orders={"n": [f"n={n}" for n in sorted(df["workers"].unique())]},
                  labels={"step": "step", "label": "strategy",
                          "consensus_distance": "consensus distance (parameter L2 units)"})
    return tidy(fig, df["workload"].nunique(), "Decentralized: consensus distance vs step")


def spectral_gap_figure(ok: pd.DataFrame) -> go.Figure:
    """Decentralized runs: the spectral gap of the topology's mixing matrix vs workers."""
    df = ok.dropna(subset=["spectral_gap"]).groupby(["series", "workers"], sort=False).agg(
        label=("label", "first"), spectral_gap=("spectral_gap", "mean")).reset_index()
    fig = px.line(for_plot(df), x="workers", y="spectral_gap", color="label", color_discrete_map=palette(ok),
                  markers=True,
                  labels={"workers": "workers (n)", "spectral_gap": "spectral gap (1 - |lambda_2|, unitless)",
                          "label": "strategy"})
    fig.update_xaxes(tickvals=sorted(df["workers"].unique()))
    fig.update_yaxes(rangemode="tozero")
    return tidy(fig, 1, "Decentralized: spectral gap of the topology (larger mixes faster)")


def stragglers_figure(df: pd.DataFrame, ok: pd.DataFrame) -> go.Figure:
    """Throughput with one slow rank (or NIC) relative to the same strategy with none."""
    fig = px.bar(for_plot(df), x="imbalance", y="relative", color="label", barmode="group",
                 color_discrete_map=palette(ok), facet_col="workload",
                 labels={"imbalance": "imbalance", "relative": "throughput / balanced throughput",
                         "label": "strategy"})
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    return tidy(fig, 1, "Throughput with one slow rank, relative to the same strategy with none")


def substrates_figure(df: pd.DataFrame) -> go.Figure | None:
    """Communication per step: measured, simulated and modelled side by side, per strategy and workers."""
    if df.empty:
        return None
    long = df.melt(id_vars=["workload", "strategy", "workers", "link", "platform", "network model"],
                   value_vars=["measured comm ms", "simulated comm ms", "modelled comm ms"],
                   var_name="measure", value_name="ms").dropna(subset=["ms"])
    long["config"] = long["strategy"].map(esc) + " n=" + long["workers"].astype(str) + " " + long["platform"].map(esc)
    fig = px.bar(for_plot(long), x="config", y="ms", color="measure", barmode="group", facet_row="workload",
                 log_y=True, labels={"config": "strategy, workers, simulated platform",
                                     "ms": "communication per step (ms, log scale)", "measure": ""})
    return tidy(fig, df["workload"].nunique(), "Communication per step: measured, simulated (SimGrid) and modelled")
