"""Results -> pandas -> plotly -> one self-contained report.html that works with no network.

`build(results_dir)` reads runs.parquet (one row per run), steps.parquet (one row per run, step and rank;
optional) and sweep.toml (optional) and writes results_dir/report.html: plotly's JavaScript is inlined
once, every figure is a <div> that uses it. One figure function per section, in the order of the page.
Every string that comes from the sweep (names, labels, errors) is escaped.
"""

from __future__ import annotations

import html
import json
import math
import os
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import plotly.offline

from reports.model import (
    EXTRAPOLATION_LINKS,
    GBIT,
    MB,
    TARGET_EFFICIENCIES,
    bandwidth_needed,
    calibrate,
    critical_path,
    extrapolate,
)
from strategies import make as make_strategy
from strategies import names as strategy_names

SECTIONS = {  # id -> heading, in page order
    "summary": "1. Summary",
    "throughput": "2. Throughput vs workers",
    "scaling": "3. Scaling efficiency",
    "step-time": "4. Step time: compute and communication",
    "traffic": "5. Traffic: measured vs analytic",
    "bandwidth": "6. Bandwidth requirement",
    "cost-model": "7. Cost model (alpha-beta)",
    "convergence": "8. Convergence",
    "stragglers": "9. Stragglers and slow links",
}
IDEAL = "ideal linear scaling"
COMPUTE_LINE = "compute time Ts (measured)"
LINK_LINE = "1/10/25/100 Gbit links"
REQUIREMENT_WORKERS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FACET_HEIGHT = 320  # pixels per row of facets


def esc(value) -> str:
    """HTML-escape anything for the page (and for plotly labels, which decode entities back to text)."""
    return html.escape(str(value), quote=True)


# ---- loading -----------------------------------------------------------------------------------------------

def strategy_label(strategy: str, params: str | None) -> str:
    """'ring' or 'decentralized (topology=ring)': the strategy with its non-empty parameters."""
    decoded = json.loads(params) if isinstance(params, str) and params.strip() else {}
    if not decoded:
        return strategy
    return f"{strategy} ({', '.join(f'{k}={v}' for k, v in sorted(decoded.items()))})"


def load_runs(results_dir: Path) -> pd.DataFrame:
    """runs.parquet plus derived columns: label, distorted (oversubscribed or a shared GPU), link order."""
    path = results_dir / "runs.parquet"
    if not path.exists():
        raise FileNotFoundError(f"no runs.parquet in {str(results_dir)!r}: run a sweep there first "
                                f"(syncbench run SWEEP.toml)")
    runs = _read_ours(path, ("run_id", "status", "strategy", "strategy_params", "workers", "device", "transport",
                             "oversubscribed", "link", "workload"))
    if runs.empty:
        raise ValueError(f"{str(path)!r} has no runs: nothing to report")
    runs["label"] = [strategy_label(s, p) for s, p in zip(runs["strategy"], runs["strategy_params"])]
    # Workers sharing one GPU: a CUDA run that could not give each worker its own GPU falls back from NCCL.
    shared_gpu = runs["device"].astype(str).str.startswith("cuda") & (runs["transport"] != "nccl") & (
        runs["workers"] > 1)
    runs["shared_gpu"] = shared_gpu
    runs["distorted"] = runs["oversubscribed"].astype(bool) | shared_gpu
    runs["ok"] = runs["status"] == "ok"
    return runs


def load_steps(results_dir: Path) -> pd.DataFrame | None:
    """steps.parquet, or None when the sweep did not record steps."""
    path = results_dir / "steps.parquet"
    return _read_ours(path, ("run_id", "step", "rank", "role")) if path.exists() else None


def _read_ours(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """A Parquet file written by syncbench; ValueError in one line for anything else (another tool's file)."""
    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises many kinds; all mean "not a Parquet file we can read"
        raise ValueError(f"{str(path)!r} is not a readable Parquet file ({type(e).__name__})") from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{str(path)!r} is not a syncbench results file: it has no column(s) {', '.join(missing)}")
    return frame


def link_order(runs: pd.DataFrame) -> list[str]:
    """Link labels from the slowest emulated link to the fastest, 'full speed' (not emulated) last."""
    links = runs.groupby("link")["link_bandwidth"].first().fillna(math.inf).sort_values()
    return list(links.index)


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
    """Shared layout: facet titles without 'column=' prefixes, a readable height, a white template."""
    fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    fig.update_layout(template="plotly_white", height=max(360, FACET_HEIGHT * rows + 120), title=title,
                      legend_title_text="", margin=dict(t=80, r=20, l=70, b=60))
    return fig


def mean_per_config(ok: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean metrics over repeats of one configuration (seeds), remembering whether any run was distorted."""
    metrics = [c for c in ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction",
                           "bytes_sent_per_worker", "bytes_recv_per_worker", "bytes_sent_per_server",
                           "bytes_recv_per_server", "analytic_bytes_sent_per_worker", "analytic_rounds",
                           "analytic_path_bytes") if c in ok]
    agg = ok.groupby(by, sort=False)[metrics].mean(numeric_only=True)
    agg["distorted"] = ok.groupby(by, sort=False)["distorted"].any()
    agg["runs"] = ok.groupby(by, sort=False).size()
    return agg.reset_index()


def per_worker_baseline(ok: pd.DataFrame) -> pd.DataFrame:
    """Throughput per worker of the smallest n per (workload, link): n=1 when the sweep has it."""
    rows = []
    for (workload, link), g in ok.groupby(["workload", "link"], sort=False):
        n0 = g["workers"].min()
        rows.append({"workload": workload, "link": link, "n0": n0,
                     "per_worker": g.loc[g["workers"] == n0, "throughput"].mean() / n0})
    return pd.DataFrame(rows)


def compute_time_per_workload(ok: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """workload -> (Ts, how it was measured): the median compute time of its fewest-worker undistorted runs."""
    out = {}
    for workload, g in ok.groupby("workload", sort=False):
        clean = g[~g["distorted"]] if (~g["distorted"]).any() else g
        n0 = clean["workers"].min()
        ts = float(clean.loc[clean["workers"] == n0, "compute_s"].median())
        out[workload] = (ts, f"median compute time of the {n0}-worker runs")
    return out


def strategy_specs(ok: pd.DataFrame) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(label, name, params) of the measured strategies the registry can model; 'label: why' of the others."""
    known = set(strategy_names())
    specs, skipped = [], []
    for (label, name, params), _ in ok.groupby(["label", "strategy", "strategy_params"], sort=False):
        if name not in known:
            skipped.append(f"{label}: not a registered strategy here")
            continue
        try:
            make_strategy(name, **json.loads(params or "{}"))
        except (ValueError, TypeError) as e:
            skipped.append(f"{label}: {e}")
            continue
        specs.append((label, name, params or "{}"))
    return specs, skipped


def not_modelled_note(ok: pd.DataFrame) -> str:
    """Names the measured strategies the model leaves out, and why."""
    _, skipped = strategy_specs(ok)
    return f'<p class="muted">Not modelled: {esc("; ".join(skipped))}.</p>' if skipped else ""


# ---- notes beside figures ---------------------------------------------------------------------------------

def distortion_note(rows: pd.DataFrame, what: str) -> str:
    """A visible warning when runs in a figure had more ranks than cores or workers sharing a GPU."""
    bad = rows[rows["distorted"]]
    if bad.empty:
        return ""
    parts = []
    over = bad[bad["oversubscribed"].astype(bool)]
    if not over.empty:
        configs = sorted({f"{r.workers} workers + {r.servers} servers on {r.cores} cores"
                          for r in over.itertuples()})
        parts.append(f"{len(over)} run(s) had more ranks than CPU cores ({'; '.join(configs)})")
    shared = bad[bad["shared_gpu"]]
    if not shared.empty:
        parts.append(f"{len(shared)} run(s) had several workers share a GPU "
                     f"(n = {', '.join(map(str, sorted(shared['workers'].unique())))})")
    return (f'<div class="note"><b>Distorted measurements:</b> {esc("; ".join(parts))} of the '
            f'{len(rows)} shown. Their {esc(what)} include contention for the machine, not only the network.'
            f'</div>')


def failed_note(runs: pd.DataFrame) -> str:
    """Says how many failed runs the figures leave out."""
    failed = int((~runs["ok"]).sum())
    return f'<p class="muted">{failed} failed run(s) are left out of the figures (see the runs table).</p>' \
        if failed else ""


# ---- 1. summary ---------------------------------------------------------------------------------------

def html_table(df: pd.DataFrame, formats: dict[str, str] | None = None, sortable: bool = False,
               table_id: str = "") -> str:
    """A plain HTML table; every cell escaped; numbers carry data-v so the sort compares values."""
    formats = formats or {}
    head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for col, value in zip(df.columns, row):
            if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                text = "" if pd.isna(value) else format(value, formats.get(col, ",.4g"))
                sort = "" if pd.isna(value) else f' data-v="{float(value)!r}"'
                cells.append(f'<td class="num"{sort}>{esc(text)}</td>')
            else:
                cells.append(f"<td>{esc('' if value is None else value)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    attrs = (f' id="{esc(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
    return (f'<div class="scroll"><table{attrs}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody>'
            f"</table></div>")


def not_emulated(ok: pd.DataFrame) -> pd.Series:
    """Runs whose bytes bypassed the emulated link: the backend's own allreduce (native) on a python-emulated link.

    On a kernel-shaped link (`emulation = "kernel"`, label "... kernel") native's bytes cross the shaped NICs too.
    """
    kernel = ok["link_emulation"] == "kernel" if "link_emulation" in ok else False
    return (ok["strategy"] == "native") & ok["link_bandwidth"].notna() & ~kernel


def best_strategies(ok: pd.DataFrame, links: list[str]) -> pd.DataFrame:
    """The fastest strategy per (workload, workers, link), by mean throughput, and its lead over the next.

    On an emulated link `native` ran at full speed (its bytes never pass the emulation), so it cannot win there.
    """
    agg = mean_per_config(ok[~not_emulated(ok)], ["workload", "workers", "link", "label"])
    rows = []
    for (workload, workers, link), g in agg.groupby(["workload", "workers", "link"]):
        g = g.sort_values("throughput", ascending=False)
        best = g.iloc[0]
        lead = (best["throughput"] / g.iloc[1]["throughput"] - 1) * 100 if len(g) > 1 else math.nan
        rows.append({"workload": workload, "workers": int(workers), "link": link, "best strategy": best["label"],
                     "samples/s": best["throughput"], "step time s": best["step_time_s"],
                     "comm share %": best["comm_fraction"] * 100, "lead over next %": lead,
                     "distorted": "yes" if best["distorted"] else ""})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["_link"] = df["link"].map({link: i for i, link in enumerate(links)})
    return df.sort_values(["workload", "_link", "workers"]).drop(columns="_link")


RUN_COLUMNS = {  # runs.parquet column -> runs-table heading
    "run_id": "run", "workload": "workload", "label": "strategy", "workers": "workers", "servers": "servers",
    "link": "link", "status": "status", "throughput": "samples/s", "step_time_s": "step s",
    "compute_s": "compute s", "comm_s": "comm s", "comm_fraction": "comm share",
    "bytes_sent_per_worker": "sent MB/worker", "bytes_recv_per_worker": "recv MB/worker",
    "final_loss": "final loss", "accuracy": "test accuracy", "oversubscribed": "oversubscribed", "seed": "seed",
    "error": "error",
}


def runs_table(runs: pd.DataFrame) -> str:
    """Every run, failed ones included, as a sortable table (click a heading)."""
    df = runs[[c for c in RUN_COLUMNS if c in runs]].copy()
    for col in ("bytes_sent_per_worker", "bytes_recv_per_worker"):
        df[col] = df[col] / MB
    df["oversubscribed"] = np.where(runs["distorted"], "yes", "")
    df = df.rename(columns=RUN_COLUMNS)
    return html_table(df, {"sent MB/worker": ",.3f", "recv MB/worker": ",.3f", "comm share": ".2f",
                           "workers": "d", "servers": "d", "seed": "d"}, sortable=True, table_id="runs")


def native_note(ok: pd.DataFrame) -> str:
    if not not_emulated(ok).any():
        return ""
    return ('<div class="note"><b>Not emulated:</b> <code>native</code> is the backend\'s own allreduce; its bytes '
            "never pass through the communicator, so the emulated link does not slow it. Its runs on emulated "
            "links show the real loopback network and are left out of this table; compare it on full-speed "
            "links.</div>")


def summary_section(runs: pd.DataFrame, sweep_text: str | None, links: list[str]) -> str:
    """The sweep, the machine, the best strategy per configuration and every run."""
    ok = runs[runs["ok"]]
    sweeps = ", ".join(esc(s) for s in runs["sweep"].unique())
    description = ""
    if sweep_text:
        try:
            parsed = tomllib.loads(sweep_text)
        except tomllib.TOMLDecodeError:
            parsed = {}
        if isinstance(parsed.get("description"), str):
            description = f"<p>{esc(parsed['description'])}</p>"
        description += f"<details><summary>sweep.toml</summary><pre>{esc(sweep_text)}</pre></details>"

    def values(col):
        return ", ".join(esc(v) for v in runs[col].dropna().astype(str).unique() if v) or "none"

    machine = (f"<p><b>Machine:</b> host {values('host')}; {values('cores')} CPU cores; GPU {values('gpu')}; "
               f"device {values('device')}; transport {values('transport')}.</p>")
    counts = (f"<p><b>Runs:</b> {len(runs)} ({int(runs['ok'].sum())} ok, {int((~runs['ok']).sum())} failed); "
              f"workloads {values('workload')}; strategies {', '.join(esc(s) for s in runs['label'].unique())}; "
              f"links {', '.join(esc(s) for s in links)}.</p>")
    best = best_strategies(ok, links)
    best_html = html_table(best, {"workers": "d", "samples/s": ",.1f", "step time s": ".3f",
                                  "comm share %": ".1f", "lead over next %": "+.1f"}) if not best.empty \
        else "<p>No run succeeded, so there is no best strategy.</p>"
    return (f"<p><b>Sweep:</b> {sweeps}</p>{description}{machine}{counts}"
            f"<h3>Best strategy per workload, workers and link (highest throughput)</h3>"
            f"{distortion_note(ok, 'throughputs')}{native_note(ok)}{best_html}"
            f"<h3>All runs</h3><p class=\"muted\">Click a column heading to sort. MB = 10^6 bytes; "
            f"times are means over timed steps, a step being the slowest rank's.</p>{runs_table(runs)}")


# ---- 2. throughput ------------------------------------------------------------------------------------

def throughput_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure:
    """Throughput vs workers, one line per strategy plus ideal linear scaling, faceted by workload and link."""
    agg = mean_per_config(ok, ["workload", "link", "label", "workers"])
    base = per_worker_baseline(ok)
    ideal = []
    for b in base.itertuples():
        for n in sorted(agg.loc[(agg["workload"] == b.workload) & (agg["link"] == b.link), "workers"].unique()):
            ideal.append({"workload": b.workload, "link": b.link, "label": IDEAL, "workers": n,
                          "throughput": b.per_worker * n})
    df = for_plot(pd.concat([agg, pd.DataFrame(ideal)], ignore_index=True))
    workloads = list(ok["workload"].unique())
    fig = px.line(df, x="workers", y="throughput", color="label", color_discrete_map=palette(ok),
                  facet_row="workload", facet_col="link",
                  markers=True, category_orders={"link": [esc(x) for x in links]},
                  labels={"workers": "workers (n)", "throughput": "throughput (samples/s)", "label": "strategy"})
    fig.for_each_trace(lambda t: t.update(line=dict(dash="dash", color="gray"), marker=dict(size=4))
                       if t.name == IDEAL else None)
    fig.update_xaxes(tickvals=sorted(ok["workers"].unique()))
    fig.update_yaxes(matches=None, rangemode="tozero")
    return tidy(fig, len(workloads), "Throughput (samples/s of the group) vs workers; dashed: ideal n x "
                                     "throughput(1)")


# ---- 3. scaling efficiency ------------------------------------------------------------------------------

def scaling_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure:
    """Scaling efficiency(n) = throughput(n) / (n x throughput(1)) vs workers."""
    agg = mean_per_config(ok, ["workload", "link", "label", "workers"])
    agg = agg.merge(per_worker_baseline(ok), on=["workload", "link"])
    agg["efficiency"] = agg["throughput"] / (agg["workers"] * agg["per_worker"])
    fig = px.line(for_plot(agg), x="workers", y="efficiency", color="label", color_discrete_map=palette(ok),
                  facet_row="workload",
                  facet_col="link", markers=True, category_orders={"link": [esc(x) for x in links]},
                  labels={"workers": "workers (n)", "label": "strategy",
                          "efficiency": "scaling efficiency (fraction of linear)"})
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_xaxes(tickvals=sorted(ok["workers"].unique()))
    fig.update_yaxes(rangemode="tozero")
    return tidy(fig, ok["workload"].nunique(), "Scaling efficiency(n) = throughput(n) / (n x throughput(1))")


# ---- 4. step time split ---------------------------------------------------------------------------------

def step_time_figure(ok: pd.DataFrame, links: list[str]) -> go.Figure:
    """Mean step time per strategy and n, stacked into compute and communication."""
    agg = mean_per_config(ok, ["workload", "link", "label", "workers"])
    agg["group"] = agg["workload"] + " · " + agg["link"]
    long = agg.melt(id_vars=["group", "label", "workers", "workload", "link"], value_vars=["compute_s", "comm_s"],
                    var_name="part", value_name="seconds")
    long["part"] = long["part"].map({"compute_s": "compute", "comm_s": "communication"})
    long["n"] = "n=" + long["workers"].astype(str)
    order = [f"{w} · {link}" for w in ok["workload"].unique() for link in links
             if ((agg["workload"] == w) & (agg["link"] == link)).any()]
    fig = px.bar(for_plot(long.sort_values("workers")), x="n", y="seconds", color="part", facet_row="group",
                 facet_col="label", barmode="stack",
                 category_orders={"group": [esc(g) for g in order], "part": ["compute", "communication"]},
                 labels={"n": "workers", "seconds": "time per step (s)", "part": ""})
    fig.update_yaxes(matches=None, rangemode="tozero")
    return tidy(fig, len(order), "Step time per strategy and n: compute + communication (mean over timed steps)")


# ---- 5. traffic -----------------------------------------------------------------------------------------

def traffic_figure(ok: pd.DataFrame) -> go.Figure:
    """Bytes per worker (and per server) per step: measured sent/received vs the strategy's analytic bytes."""
    agg = mean_per_config(ok[ok["workers"] > 1], ["workload", "label", "workers"])
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


def traffic_check(ok: pd.DataFrame) -> str:
    """One sentence: in how many runs the measured bytes equal the analytic bytes exactly."""
    both = ok.dropna(subset=["bytes_sent_per_worker", "analytic_bytes_sent_per_worker"])
    both = both[both["workers"] > 1]
    if both.empty:
        return "<p>No multi-worker run has both measured and analytic bytes to compare.</p>"
    same = np.isclose(both["bytes_sent_per_worker"], both["analytic_bytes_sent_per_worker"], rtol=1e-9, atol=0.5)
    off = both.loc[~same, "label"].unique()
    text = f"Measured bytes sent per worker equal the analytic bytes in {int(same.sum())} of {len(both)} runs."
    if len(off):
        text += f" Different in: {', '.join(off)}."
    hidden = ok.loc[ok["bytes_sent_per_worker"].isna() & (ok["workers"] > 1), "label"].unique()
    if len(hidden):
        text += f" No measured bytes (the backend hides them): {', '.join(hidden)}."
    return f"<p>{esc(text)}</p>"


# ---- 6. bandwidth requirement ------------------------------------------------------------------------

def requirement_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Bandwidth needed for P = 0.5/0.8/0.9 per workload, strategy and n, from measured compute time."""
    specs, _ = strategy_specs(ok)
    ts = compute_time_per_workload(ok)
    grid = sorted(set(REQUIREMENT_WORKERS) | {int(n) for n in ok["workers"].unique() if n > 1})
    rows = []
    for workload, g in ok.groupby("workload", sort=False):
        numel = int(g["numel"].iloc[0])
        measured = set(g["label"])
        for label, name, params in specs:
            if label not in measured:
                continue
            for n in grid:
                try:
                    rounds, path_bytes, _ = critical_path(name, n, numel, params)
                except (ValueError, NotImplementedError):
                    continue  # the strategy cannot run on n workers
                for p in TARGET_EFFICIENCIES:
                    s = bandwidth_needed(path_bytes, ts[workload][0], p)
                    rows.append({"workload": workload, "label": label, "workers": n, "target": f"P = {p:g}",
                                 "MB/s": s / MB if math.isfinite(s) else math.nan})
    return pd.DataFrame(rows)


def bandwidth_figure(ok: pd.DataFrame) -> go.Figure:
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
    fig.update_xaxes(tickvals=[n for n in REQUIREMENT_WORKERS], ticktext=[str(n) for n in REQUIREMENT_WORKERS])
    return tidy(fig, df["workload"].nunique(),
                "Bandwidth needed per NIC for parallel efficiency P (dotted: 1/10/25/100 Gbit links)")


# ---- 7. cost model --------------------------------------------------------------------------------------

def calibration(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per link, alpha and beta fitted to the measured comm time; and each run's predicted comm time."""
    usable = ok.dropna(subset=["analytic_rounds", "analytic_path_bytes", "comm_s"])
    usable = usable[usable["workers"] > 1]
    fits, predicted = [], []
    for link, g in usable.groupby("link", sort=False):
        fit = calibrate(g["analytic_rounds"], g["analytic_path_bytes"], g["comm_s"])
        fits.append({"link": link, "runs": fit.runs, "alpha us": fit.alpha * 1e6,
                     "fitted MB/s": fit.bandwidth / MB if math.isfinite(fit.bandwidth) else math.nan,
                     "link MB/s": g["link_bandwidth"].iloc[0] / MB, "rmse ms": fit.rmse * 1e3,
                     "alpha": fit.alpha, "beta": fit.beta})
        predicted.append(g.assign(predicted_s=fit.predict(g["analytic_rounds"], g["analytic_path_bytes"])))
    return pd.DataFrame(fits), (pd.concat(predicted) if predicted else usable.assign(predicted_s=[]))


def parity_figure(predicted: pd.DataFrame, ok: pd.DataFrame) -> go.Figure:
    """Predicted (alpha-beta, calibrated per link) vs measured communication time per step, one point per run."""
    if predicted.empty:
        return None
    fig = px.scatter(for_plot(predicted), x="comm_s", y="predicted_s", color="label", color_discrete_map=palette(ok),
                     symbol="link",
                     hover_data=["workload", "workers", "run_id"],
                     labels={"comm_s": "measured communication time per step (s)",
                             "predicted_s": "predicted communication time per step (s)", "label": "strategy"})
    top = float(np.nanmax([predicted["comm_s"].max(), predicted["predicted_s"].max()])) * 1.05 or 1.0
    fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="predicted = measured",
                             line=dict(dash="dash", color="gray")))
    return tidy(fig, 1, "Alpha-beta model vs measurement: predicted vs measured communication time")


def extrapolation_figure(ok: pd.DataFrame, alpha: float) -> go.Figure:
    """MODEL: communication time per step for n = 8..1024 at 1/10/25/100 Gbit, with the measured Ts."""
    specs, _ = strategy_specs(ok)
    ts = compute_time_per_workload(ok)
    frames = []
    for workload, g in ok.groupby("workload", sort=False):
        measured = set(g["label"])
        df = extrapolate(int(g["numel"].iloc[0]), [s for s in specs if s[0] in measured], alpha)
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
                f"MODEL, not measured: communication time per step at 1/10/25/100 Gbit "
                f"(alpha = {alpha * 1e6:.1f} us calibrated, beta = 1/bandwidth)")


def cost_model_section(ok: pd.DataFrame) -> tuple[str, list[go.Figure | None], str]:
    """Calibration table, parity plot and the labelled extrapolation."""
    fits, predicted = calibration(ok)
    if fits.empty:
        alpha = 0.0
        intro = ("<p>No multi-worker run has analytic rounds and bytes, so alpha and beta could not be "
                 "calibrated; the extrapolation below takes alpha = 0.</p>")
    else:
        alpha = float(fits["alpha"].median())
        intro = ("<p>Communication time per step = rounds x alpha + path_bytes x beta, with rounds and path_bytes "
                 "from each strategy's analytic traffic and alpha, beta fitted (least squares, non-negative) to "
                 "the measured communication time of this sweep's runs, one fit per link. fitted MB/s = 1/beta; "
                 "link MB/s is the emulated NIC (empty when not emulated).</p>"
                 + html_table(fits.drop(columns=["alpha", "beta"]),
                              {"runs": "d", "alpha us": ",.1f", "fitted MB/s": ",.1f", "link MB/s": ",.1f",
                               "rmse ms": ",.2f"}))
    intro += not_modelled_note(ok)
    figures = [parity_figure(predicted, ok), extrapolation_figure(ok, alpha)]
    model_label = ('<div class="model-label">MODEL, not a measurement: the alpha-beta model extrapolated to '
                   f'n = 8 ... 1024 workers at 1, 10, 25 and 100 Gbit, with alpha = {alpha * 1e6:.1f} us '
                   '(median of the calibrated alphas) and beta = 1/link bandwidth. The dashed line is the '
                   'measured compute time Ts: above it, communication costs more than compute (P < 0.5).</div>')
    return intro, figures, model_label


# ---- 8. convergence ------------------------------------------------------------------------------------

def loss_frame(ok: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and step: the workers' mean loss and the slowest worker's wall time."""
    workers = steps[(steps["role"] == "worker") & steps["run_id"].isin(ok["run_id"])]
    per_step = workers.groupby(["run_id", "step"]).agg(loss=("loss", "mean"), wall_s=("wall_s", "max"),
                                                       consensus_distance=("consensus_distance", "mean"))
    per_step = per_step.reset_index().merge(ok[["run_id", "label", "workload", "workers", "link", "distorted",
                                                "oversubscribed", "shared_gpu", "servers", "cores"]], on="run_id")
    per_step["n"] = "n=" + per_step["workers"].astype(str)
    return per_step.sort_values(["run_id", "step"])


def loss_figure(df: pd.DataFrame, ok: pd.DataFrame, x: str) -> go.Figure:
    """Training loss vs step (or vs wall time) per strategy; one line per run, faceted by workload and n."""
    df = df.dropna(subset=["loss"])
    xlabel = {"step": "step", "wall_s": "wall time since the first step (s)"}[x]
    fig = px.line(for_plot(df), x=x, y="loss", color="label", color_discrete_map=palette(ok),
                  line_dash="link", line_group="run_id",
                  facet_row="workload", facet_col="n",
                  category_orders={"n": [f"n={n}" for n in sorted(df["workers"].unique())]},
                  labels={x: xlabel, "loss": "training loss (mean over workers)", "label": "strategy"})
    return tidy(fig, df["workload"].nunique(), f"Loss vs {xlabel}")


def consensus_figure(df: pd.DataFrame, ok: pd.DataFrame) -> go.Figure:
    """Decentralized runs: distance of the workers' parameters from their average, per step."""
    df = df.dropna(subset=["consensus_distance"])
    fig = px.line(for_plot(df), x="step", y="consensus_distance", color="label", color_discrete_map=palette(ok),
                  line_dash="link",
                  line_group="run_id", facet_row="workload", facet_col="n", log_y=True,
                  category_orders={"n": [f"n={n}" for n in sorted(df["workers"].unique())]},
                  labels={"step": "step", "label": "strategy",
                          "consensus_distance": "consensus distance (parameter L2 units)"})
    return tidy(fig, df["workload"].nunique(), "Decentralized: consensus distance vs step")


def spectral_gap_figure(ok: pd.DataFrame) -> go.Figure:
    """Decentralized runs: the spectral gap of the topology's mixing matrix vs workers."""
    df = ok.dropna(subset=["spectral_gap"]).groupby(["label", "workers"], as_index=False)["spectral_gap"].mean()
    fig = px.line(for_plot(df), x="workers", y="spectral_gap", color="label", color_discrete_map=palette(ok),
                  markers=True,
                  labels={"workers": "workers (n)", "spectral_gap": "spectral gap (1 - |lambda_2|, unitless)",
                          "label": "strategy"})
    fig.update_xaxes(tickvals=sorted(df["workers"].unique()))
    fig.update_yaxes(rangemode="tozero")
    return tidy(fig, 1, "Decentralized: spectral gap of the topology (larger mixes faster)")


def convergence_section(ok: pd.DataFrame, steps: pd.DataFrame | None) -> tuple[str, list, str]:
    """Loss vs step and wall time; consensus distance and spectral gap for decentralized strategies."""
    if steps is None:
        return "<p>This sweep recorded no steps (no steps.parquet), so there is no convergence to show.</p>", [], ""
    df = loss_frame(ok, steps)
    figures, note = [], ""
    if df["loss"].notna().any():
        figures += [loss_figure(df, ok, "step"), loss_figure(df, ok, "wall_s")]
        note = distortion_note(ok[ok["run_id"].isin(df["run_id"])], "wall times")
        text = "<p>Mean loss of the workers at each step (warm-up steps included), one line per run.</p>"
    else:
        text = "<p>The steps carry no loss, so there is no convergence to show.</p>"
    if df["consensus_distance"].notna().any():
        figures.append(consensus_figure(df, ok))
    if ok["spectral_gap"].notna().any():
        figures.append(spectral_gap_figure(ok))
    return text, figures, note


# ---- 9. stragglers --------------------------------------------------------------------------------------

def imbalance(straggler: str, link: str) -> tuple[float, str]:
    """How a run was unbalanced, as (sort key, label): a compute slowdown, a slower NIC, or none."""
    spec = json.loads(straggler) if isinstance(straggler, str) and straggler.strip() else {}
    if spec.get("ranks") and spec.get("slowdown", 1.0) != 1.0:
        ranks = ",".join(str(r) for r in spec["ranks"])
        return float(spec["slowdown"]), f"rank {ranks} computes {spec['slowdown']:g}x slower"
    if "(heterogeneous)" in str(link):
        return 0.5, str(link)
    return 1.0, "balanced"


def stragglers_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Throughput of each unbalanced run relative to the same strategy's balanced run (same workers)."""
    df = ok.copy()
    keys = [imbalance(s, link) for s, link in zip(df["straggler"], df["link"])]
    df["order"] = [k for k, _ in keys]
    df["imbalance"] = [label for _, label in keys]
    df["base_link"] = df["link"].astype(str).str.replace(" (heterogeneous)", "", regex=False)
    keys = ["workload", "label", "workers", "base_link"]  # a slow NIC is compared with its uniform network
    balanced = df[df["imbalance"] == "balanced"].groupby(keys)["throughput"].mean()
    df["relative"] = [t / balanced.get(k, math.nan)
                      for t, k in zip(df["throughput"], df[keys].itertuples(index=False, name=None))]
    return df.sort_values(["order", "imbalance"])


def stragglers_figure(df: pd.DataFrame, ok: pd.DataFrame) -> go.Figure:
    fig = px.bar(for_plot(df), x="imbalance", y="relative", color="label", barmode="group",
                 color_discrete_map=palette(ok), facet_col="workload",
                 labels={"imbalance": "imbalance", "relative": "throughput / balanced throughput",
                         "label": "strategy"})
    fig.add_hline(y=1.0, line_dash="dot", line_color="gray")
    return tidy(fig, 1, "Throughput with one slow rank, relative to the same strategy with none")


def stragglers_section(ok: pd.DataFrame) -> str:
    has_straggler = ok["straggler"].astype(str).str.strip().ne("").any()
    has_slow_link = ok["link"].astype(str).str.contains("(heterogeneous)", regex=False).any()
    if not (has_straggler or has_slow_link):
        return "<p>This sweep has no straggler and no slower link: every rank had the same compute and NIC.</p>"
    df = stragglers_frame(ok)
    text = ("<p>A synchronous strategy waits for its slowest rank every step, so one slow rank slows the group; "
            "how much the others lose, and whether decentralized averaging or a parameter server hides it, is "
            "measured here, not assumed. A straggler's compute is stretched by a measured delay "
            "((slowdown - 1) x its own compute time).</p>")
    return text + distortion_note(df, "throughputs") + figure_html(stragglers_figure(df, ok))


# ---- the page ---------------------------------------------------------------------------------------------

def figure_html(fig: go.Figure | None) -> str:
    """A figure as a <div> using the page's one copy of plotly.js."""
    if fig is None:
        return '<p class="muted">Nothing to plot for this section.</p>'
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})


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


def section(section_id: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{SECTIONS[section_id]}</h2>{body}</section>'


def build(results_dir: str | os.PathLike) -> Path:
    """Write results_dir/report.html from its runs.parquet (and steps.parquet, sweep.toml); return its path."""
    results_dir = Path(results_dir)
    runs = load_runs(results_dir)
    steps = load_steps(results_dir)
    sweep_path = results_dir / "sweep.toml"
    sweep_text = sweep_path.read_text(encoding="utf-8", errors="replace") if sweep_path.exists() else None
    ok = runs[runs["ok"]]
    links = link_order(runs)
    skipped = failed_note(runs)

    parts = [section("summary", summary_section(runs, sweep_text, links))]
    if ok.empty:
        for sid in list(SECTIONS)[1:]:
            parts.append(section(sid, "<p>No run succeeded: nothing to plot.</p>"))
    else:
        parts.append(section("throughput", skipped + distortion_note(ok, "throughputs") + native_note(ok)
                             + figure_html(throughput_figure(ok, links))))
        parts.append(section("scaling", distortion_note(ok, "scaling efficiencies")
                             + figure_html(scaling_figure(ok, links))))
        parts.append(section("step-time", distortion_note(ok, "compute and communication times") + native_note(ok)
                             + figure_html(step_time_figure(ok, links))))
        parts.append(section("traffic", "<p>Bytes are per rank per step; analytic bytes come from each strategy's "
                             "stated traffic. MB = 10^6 bytes.</p>" + traffic_check(ok)
                             + figure_html(traffic_figure(ok))))
        ts = compute_time_per_workload(ok)
        ts_text = "; ".join(f"{w}: Ts = {t:.4g} s ({how})" for w, (t, how) in ts.items())
        parts.append(section("bandwidth", "<p>Parallel efficiency P = Ts / (Ts + Tt); the NIC bandwidth that gives "
                             "efficiency P is S = path_bytes x P / ((1 - P) x Ts), path_bytes being the bytes on "
                             "the critical path of the strategy's analytic traffic (for a parameter server, the "
                             "server's link). Latency is left out; the compute time is measured: "
                             f"{esc(ts_text)}.</p>" + not_modelled_note(ok)
                             + distortion_note(ok, "compute times (Ts)") + figure_html(bandwidth_figure(ok))))
        intro, figures, model_label = cost_model_section(ok)
        parts.append(section("cost-model", intro + distortion_note(ok, "communication times")
                             + figure_html(figures[0]) + model_label + figure_html(figures[1])))
        text, figures, note = convergence_section(ok, steps)
        parts.append(section("convergence", text + note + "".join(figure_html(f) for f in figures)))
        parts.append(section("stragglers", stragglers_section(ok)))

    title = f"syncbench report: {', '.join(str(s) for s in runs['sweep'].unique())}"
    nav = "".join(f'<a href="#{sid}">{heading}</a>' for sid, heading in SECTIONS.items())
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f"<style>{STYLE}</style><script>{plotly.offline.get_plotlyjs()}</script></head>"
            f"<body><h1>{esc(title)}</h1><nav>{nav}</nav>{''.join(parts)}"
            f"<script>{SORT_SCRIPT}</script></body></html>\n")
    out = results_dir / "report.html"
    tmp = out.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return out
