"""Traffic per level: runs whose ranks sat in nodes of k > 1 sharing one NIC, each strategy's bytes
through the busiest node's NIC and through the busiest intra-node port per step, each level's time on the run's
links, which level bounds it, and the measured communication beside that model.

The bytes are the strategy's own per-level traffic (strategies.cost.node_levels: levels() of hierarchical,
double_binary_tree, node_parameter_server, the ring's by neighbour), which the tests hold equal to the per-peer
byte counters; priced for one buffer of the model's elements per step (the buckets a run synchronized split the
same bytes, to within chunk rounding). Measured comm is the run's mean exposed communication per step (slowest
worker, mean over repeats).
"""

from __future__ import annotations

import math

import pandas as pd

import strategies
from reports.section_parts import Absent, Table
from strategies.cost import node_cost

KEYS = ["sweep", "workload", "link", "workers", "ranks_per_node", "label"]  # one row per configuration
COLUMNS = ["workload", "link", "workers", "nodes", "ranks/node", "strategy", "NIC MB/step", "intra MB/step",
           "NIC s", "intra s", "bound", "model comm s", "measured comm s", "measured / model", "note"]


def _number(value, default: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return default
    return default if math.isnan(value) else value


def run_config(run):
    """The strategy the run used, rebuilt from its typed param_* columns (None where it has no such parameter)."""
    cls = strategies.get(run["strategy"])
    params = {}
    for name, default in cls.parameters().items():
        value = run.get(f"param_{name}")
        if hasattr(value, "item"):
            value = value.item()
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        if isinstance(default, int) and not isinstance(default, bool) and isinstance(value, float) \
                and value.is_integer():
            value = int(value)  # pandas turns an int column with gaps into floats
        params[name] = value
    return cls(**params)


def level_row(run) -> dict:
    """One run (or the mean of its repeats) priced per level: bytes, each level's seconds, the bound, the model's
    comm s and measured / model; a strategy without per-level traffic gets a note instead of numbers."""
    k, workers = int(run["ranks_per_node"]), int(run["workers"])
    nic_bw = _number(run["link_bandwidth"], math.nan)
    intra_bw = _number(run.get("link_intra_bandwidth"), math.nan)
    note = "" if not math.isnan(intra_bw) else "intra-node link not recorded (results before it): taken as unlimited"
    row = {"workload": run["workload"], "link": run["link"], "workers": workers, "nodes": -(-workers // k),
           "ranks/node": k, "strategy": run["label"], "measured comm s": float(run["comm_s"])}
    try:
        config = run_config(run)
        cost = node_cost(config, workers, int(run["numel"]), k, nic_bw, math.inf if math.isnan(intra_bw) else intra_bw,
                         _number(run["link_latency_s"], 0.0), _number(run.get("link_intra_latency_s"), 0.0))
    except ValueError as e:  # no per-level traffic (its traffic() states totals), or not registered here
        return row | {"note": str(e).split(":")[0]}
    model = cost.time_s
    return row | {"NIC MB/step": cost.nic_bytes / 1e6, "intra MB/step": cost.intra_bytes / 1e6,
                  "NIC s": cost.nic_s, "intra s": cost.intra_s, "bound": "node NIC" if cost.bottleneck == "nic" else
                  "inside the node", "model comm s": model,
                  "measured / model": row["measured comm s"] / model if model > 0 else math.nan, "note": note}


def levels_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Successful runs on emulated links with ranks_per_node > 1, one row per configuration (repeats averaged)."""
    nodes = ok[(ok["ranks_per_node"] > 1) & ok["link_bandwidth"].notna() & ~ok["bypasses_link"]]
    if nodes.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = []
    for _, group in nodes.groupby(KEYS, sort=False, dropna=False):
        run = group.iloc[0].to_dict() | {"comm_s": group["comm_s"].mean()}
        rows.append(level_row(run))
    frame = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in frame:
            frame[col] = math.nan if col not in ("bound", "note") else ""
    frame["bound"], frame["note"] = frame["bound"].fillna(""), frame["note"].fillna("")
    return frame[COLUMNS].sort_values(["workload", "link", "workers", "ranks/node", "measured comm s"],
                                      kind="stable").reset_index(drop=True)


def level_verdicts(frame: pd.DataFrame) -> list[str]:
    """Per (workload, link, workers, k): the strategy with the least measured communication and the level that
    bounds it, with its lead over the flat ring when one ran."""
    out = []
    for (workload, link, workers, k), group in frame.groupby(["workload", "link", "workers", "ranks/node"],
                                                             sort=False):
        best = group.loc[group["measured comm s"].idxmin()]
        ring = group[group["strategy"] == "ring"]
        lead = ""
        if not ring.empty and best["strategy"] != "ring":
            lead = f", {best['measured comm s'] / ring['measured comm s'].iloc[0]:.2f}x the flat ring's"
        bound = f"; its bound is the {best['bound']}" if best["bound"] else ""
        out.append(f"{workload}, {workers} workers in nodes of {k}, {link}: {best['strategy']} communicates least "
                   f"({best['measured comm s']:.3f} s per step{lead}){bound}.")
    return out


def section(r):
    frame = levels_frame(r.ok)
    if frame.empty:
        return Absent("no run placed its ranks in nodes sharing a NIC (ranks_per_node > 1 on an emulated link)")
    return {"verdicts": level_verdicts(frame),
            "table": Table(frame, {"workers": "d", "nodes": "d", "ranks/node": "d", "NIC MB/step": ",.2f",
                                   "intra MB/step": ",.2f", "NIC s": ".4f", "intra s": ".4f", "model comm s": ".4f",
                                   "measured comm s": ".4f", "measured / model": ".2f"}, sortable=True, id="levels")}
