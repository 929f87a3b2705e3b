"""The teaching question: bytes per worker and communication time against n = 2..64 for naive ring, ring, a
parameter server (one dedicated server) and reduce + broadcast, on one link, for one model: the model's curves (each
strategy's analytic traffic, strategies/cost.py) with every run of these results that answers the same question
(simulated or measured, same strategy, link and model bytes) drawn through them.

The question as a teacher asked it is 100 MB on 1 Gbit/s; results that ran these strategies on a shaped link are
drawn at their own model bytes and link instead (the most common among their runs), so the curves meet their points.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

import strategies
from reports.figures import esc
from reports.model import GBIT, MB, comm_time, critical_path
from reports.reconcile import source

# (label, registered strategy, its parameters): the classic four, one dedicated server for the parameter server
STRATEGIES = (("naive ring", "naive_ring", {}), ("ring", "ring", {}),
              ("parameter server, 1 server", "parameter_server", {"servers": 1}),
              ("reduce + broadcast", "reduce_broadcast", {}))
WORKERS = tuple(range(2, 65))
MODEL_BYTES = 100e6
BANDWIDTH = 1 * GBIT
COLORS = ("#636EFA", "#EF553B", "#00CC96", "#AB63FA")
SYMBOLS = {"SimGrid alpha_beta": "circle-open", "SimGrid tcp": "diamond-open", "measured, emulated links": "square",
           "measured, kernel links": "x"}


def model_frame(model_bytes: float = MODEL_BYTES, bandwidth: float = BANDWIDTH, latency: float = 0.0,
                workers=WORKERS) -> pd.DataFrame:
    """Per strategy and n: MB a worker sends per step (the mean over workers, as a run's bytes_sent_per_worker),
    MB through the busiest NIC (the critical path: a server's for the parameter server, the root's for reduce +
    broadcast) and the communication time per step (rounds x
    latency + critical-path bytes / bandwidth), for one flat buffer of model_bytes (fp32)."""
    numel = round(model_bytes / 4)
    rows = []
    for label, name, params in STRATEGIES:
        config = strategies.make(name, **params)
        for n in workers:
            rounds, path, _ = critical_path(name, n, numel, params)
            sent = [r.bytes_sent for r in config.traffic(n, numel).workers()]
            rows.append({"strategy": label, "workers": n, "MB sent per worker": sum(sent) / len(sent) / MB,
                         "MB through the busiest NIC": path / MB,
                         "comm s": comm_time(rounds, path, bandwidth, latency)})
    return pd.DataFrame(rows)


def _answers(ok: pd.DataFrame) -> pd.DataFrame:
    """The runs that answer the question: these strategies (the parameter server with one dedicated server), exact
    every step, one flat buffer, no overlap, no straggler, one NIC per rank, on a shaped link."""
    if ok.empty:
        return ok
    labels = []
    for _, run in ok.iterrows():
        label = ""
        for name_label, name, _ in STRATEGIES:
            if run["strategy"] != name:
                continue
            if name == "parameter_server" and not (run.get("param_servers") == 1
                                                   and run.get("param_placement") == "dedicated"
                                                   and run.get("param_staleness") in (0, None)
                                                   and run.get("param_backups") in (0, None)):
                continue
            label = name_label
        labels.append(label)
    runs = ok.assign(_teaching=labels)
    keep = ((runs["_teaching"] != "") & (runs["workers"] > 1) & ~runs["overlap"] & runs["link_bandwidth"].notna()
            & runs["bucket_mb"].isna() & runs["compression"].fillna("").isin(["", "none"])
            & (runs["sync_every"].fillna(1) <= 1) & (runs["straggler_slowdown"] == 1.0)
            & ~runs["link_heterogeneous"] & (runs["ranks_per_node"] <= 1) & ~runs["bypasses_link"]
            & runs["sim_topology"].isin(["", "star"]))
    return runs[keep]


def condition(ok: pd.DataFrame) -> tuple[float, float, float, pd.DataFrame]:
    """(model bytes, bandwidth, latency, the runs at them): the results' most common condition among the runs
    that answer the question, else the teacher's 100 MB on 1 Gbit/s (and no runs)."""
    runs = _answers(ok)
    if runs.empty:
        return MODEL_BYTES, BANDWIDTH, 0.0, runs
    key = runs[["model_bytes", "link_bandwidth", "link_latency_s"]].value_counts().index[0]
    at = runs[(runs["model_bytes"] == key[0]) & (runs["link_bandwidth"] == key[1])
              & (runs["link_latency_s"] == key[2])]
    return float(key[0]), float(key[1]), float(key[2]), at


def teaching_figure(model: pd.DataFrame, runs: pd.DataFrame, model_bytes: float, bandwidth: float,
                    latency: float) -> go.Figure:
    """Left: MB per worker (solid) and through the busiest NIC (dotted); right: communication time per step. Lines:
    the model; markers: the runs, one symbol per source."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("bytes per step", "communication time per step"))
    for (label, _, _), color in zip(STRATEGIES, COLORS):
        m = model[model["strategy"] == label]
        fig.add_trace(go.Scatter(x=m["workers"], y=m["MB sent per worker"], mode="lines", line=dict(color=color),
                                 name=esc(f"{label}: sent per worker (model)"), legendgroup=esc(label)), 1, 1)
        fig.add_trace(go.Scatter(x=m["workers"], y=m["MB through the busiest NIC"], mode="lines",
                                 line=dict(color=color, dash="dot"), legendgroup=esc(label),
                                 name=esc(f"{label}: through the busiest NIC (model)")), 1, 1)
        fig.add_trace(go.Scatter(x=m["workers"], y=m["comm s"], mode="lines", line=dict(color=color),
                                 name=esc(f"{label} (model)"), legendgroup=esc(label), showlegend=False), 1, 2)
        at = runs[runs["_teaching"] == label] if not runs.empty else runs
        for kind, group in (at.groupby(at.apply(source, axis=1), sort=False) if not at.empty else ()):
            mean = group.groupby("workers")[["bytes_sent_per_worker", "comm_s"]].mean().reset_index()
            marker = dict(color=color, symbol=SYMBOLS.get(kind, "circle"), size=9)
            name = esc(f"{label}: {kind}")
            fig.add_trace(go.Scatter(x=mean["workers"], y=mean["bytes_sent_per_worker"] / MB, mode="markers",
                                     marker=marker, name=name, legendgroup=esc(label)), 1, 1)
            fig.add_trace(go.Scatter(x=mean["workers"], y=mean["comm_s"], mode="markers", marker=marker,
                                     name=name, legendgroup=esc(label), showlegend=False), 1, 2)
    ticks = [2, 4, 8, 16, 32, 64]
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=[str(t) for t in ticks], title_text="workers (n)")
    fig.update_yaxes(type="log", title_text="MB per step (MB = 10^6 bytes)", row=1, col=1)
    fig.update_yaxes(type="log", title_text="communication per step (s)", row=1, col=2)
    link = f"{bandwidth * 8 / 1e9:g} Gbit/s" + (f", {latency * 1e6:g} us" if latency else "")
    fig.update_layout(template="plotly_white", height=480, margin=dict(t=90, r=20, l=70, b=60),
                      title=esc(f"MODEL (lines) and runs (markers): {model_bytes / MB:,.2f} MB of fp32 gradients, "
                                f"one flat buffer, on {link} per NIC"))
    return fig


def table(model: pd.DataFrame, workers=(2, 4, 8, 16, 32, 64)) -> pd.DataFrame:
    """The model's numbers at a few n, one row per strategy and n, for the page."""
    return model[model["workers"].isin(workers)].reset_index(drop=True)


def points_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs drawn, per strategy, source and n: MB sent per worker and communication per step (mean of
    repeats), and the model's comm at that n as a multiple."""
    if runs.empty:
        return pd.DataFrame()
    runs = runs.assign(_source=runs.apply(source, axis=1))
    rows = []
    for (label, kind, n), group in runs.groupby(["_teaching", "_source", "workers"], sort=False):
        rows.append({"strategy": label, "source": kind, "workers": int(n),
                     "MB sent per worker": group["bytes_sent_per_worker"].mean() / MB,
                     "comm s": group["comm_s"].mean()})
    return pd.DataFrame(rows)


def with_model_ratio(points: pd.DataFrame, model: pd.DataFrame) -> pd.DataFrame:
    if points.empty:
        return points
    merged = points.merge(model[["strategy", "workers", "comm s"]].rename(columns={"comm s": "model comm s"}),
                          on=["strategy", "workers"], how="left")
    merged["comm / model"] = merged["comm s"] / merged["model comm s"]
    merged.loc[~(merged["model comm s"] > 0), "comm / model"] = math.nan
    return merged.sort_values(["strategy", "source", "workers"], kind="stable").reset_index(drop=True)
