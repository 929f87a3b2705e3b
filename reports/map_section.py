"""The report's "Where each strategy wins" section: the strategy map (reports/strategy_map.py) for the sweep's own
model and network, as a heat map on the page: workers x NIC bandwidth around the links the sweep ran on, each cell
the step (the sweep's measured compute time Ts + one sync of the model's gradients, no overlap) priced by the model
for every exact strategy at its best knob, the winner coloured, ties (a lead under the model's uncertainty) grey.
The cells the sweep measured are marked, with the strategy the runs found fastest there beside the model's."""

from __future__ import annotations

import math

import pandas as pd

from reports import figures, tables
from reports.map_figure import map_figure
from reports.strategy_map import (
    DEFAULT_BANDWIDTHS,
    EXACT_FLAT,
    EXACT_NODES,
    MAX_WORKERS,
    Workload,
    _pct,
    crossovers,
    strategy_map,
)

WORKERS = tuple(2**i for i in range(1, 9))  # 2 .. 256 beside the sweep's own counts: under a second to price
WORKERS_ON_NODES = tuple(2**i for i in range(1, 7))  # 2 .. 64: the node-aware prices are slower (8 s at 256 alone)
MAX_MAPS = 3  # workloads mapped on one page (the first ones, in the sweep's order)


def network(runs: pd.DataFrame) -> tuple[float, int, float] | None:
    """(latency s, ranks per node, intra-node bandwidth) the runs share most, from their emulated links; None if no
    run was on one."""
    linked = runs[runs["link_bandwidth"].notna() & (runs["link_bandwidth"] > 0)]
    if linked.empty:
        return None
    latency = float(linked["link_latency_s"].fillna(0.0).mode().iloc[0])
    k = int(linked["ranks_per_node"].clip(lower=1).mode().iloc[0])
    intra = math.inf
    if k > 1:
        same = linked.loc[linked["ranks_per_node"] == k, "link_intra_bandwidth"].dropna()
        intra = float(same.mode().iloc[0]) if not same.empty else math.inf
    return latency, k, intra


def measured_marks(runs: pd.DataFrame) -> dict:
    """{(workers, bandwidth): (mark, hover)}: the cells the sweep measured on the link, and which of its strategies
    ran fastest there (mean step time over repeats)."""
    out = {}
    linked = runs[runs["link_bandwidth"].notna() & (runs["workers"] > 1)]
    for (n, bandwidth), g in linked.groupby(["workers", "link_bandwidth"]):
        means = g.groupby("label")["step_time_s"].mean().sort_values()
        out[(int(n), float(bandwidth))] = (" \u25c6", f"measured here: {means.index[0]} fastest of {len(means)} "
                                                      f"({means.iloc[0]:.4g} s per step)")
    return out


def section(r):
    from reports.section_parts import Absent, figure

    runs = figures.shaped(r.ok)
    net = network(runs)
    if net is None:
        return Absent("no run on an emulated link: the map prices the sweep's model around the links it ran on")
    latency, k, intra = net
    ts = tables.compute_time_per_workload(runs)
    maps = []
    for workload, g in list(runs.groupby("workload", sort=False))[:MAX_MAPS]:
        numel = int(g["numel"].max())
        if numel <= 0:
            continue
        linked = g[g["link_bandwidth"].notna() & (g["link_bandwidth"] > 0)]
        bandwidths = sorted(set(DEFAULT_BANDWIDTHS) | set(linked["link_bandwidth"].astype(float)))
        grid = WORKERS_ON_NODES if k > 1 else WORKERS
        workers = sorted(set(grid) | {int(n) for n in g["workers"] if 2 <= n <= MAX_WORKERS})
        compute_s, how = ts[workload]
        m = strategy_map(Workload(numel, compute_s=compute_s if compute_s > 0 else None, label=workload), workers,
                         bandwidths, latency, k, intra, EXACT_NODES if k > 1 else EXACT_FLAT)
        maps.append({"workload": workload, "figure": figure(map_figure(m, measured_marks(linked))),
                     "crossovers": crossovers(m), "ts": f"{compute_s:.4g} s ({how})" if compute_s > 0 else "",
                     "mib": f"{numel * 4 / 2**20:,.2f}", "tie": _pct(m.tie), "within": _pct(m.within),
                     "strategies": ", ".join(m.meta["strategies"]), "latency_us": f"{latency * 1e6:g}",
                     "nodes": f"nodes of {k} ranks sharing a NIC" if k > 1 else "one NIC per rank",
                     "ties": int(m.cells["tie"].sum()), "cells": len(m.cells)})
    if not maps:
        return Absent("no workload with a known parameter count to price")
    return {"maps": maps}
