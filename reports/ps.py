"""Parameter server vs allreduce: the PS runs of a sweep beside BytePS's optimum and beside the best
exact allreduce measured in the same sweep, on the same link and workers; with a straggler, samples/s and the
workers' idle fraction of synchronous, SSP, async and backups; one verdict per condition with the report's tie
rule (a lead inside the intervals, repeats and their steps, is a tie). Shaped links only, grouped by typed
param_* columns."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.load import mean_per_config
from reports.verdicts import SIMULATED_TIE, lead_counts
from strategies import get as strategy_class
from strategies.base import GRADIENTS
from strategies.cost import byteps_optimum

PS = "parameter_server"
KEYS = ["sweep", "workload", "condition", "workers"]  # what a PS run is compared within


def _p(run, name, default):
    value = run.get(f"param_{name}")
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value.is_integer() and isinstance(default, int):
        return int(value)  # pandas turns an int column with gaps into floats
    return default if value is None or (isinstance(value, float) and math.isnan(value)) or value == "" else value


def scheme(run) -> str:
    """'synchronous', 'SSP s=2', 'async' or 'backups b=1': how the run's servers wait for workers."""
    staleness, backups = _p(run, "staleness", 0), _p(run, "backups", 0)
    if staleness == "async":
        return "async"
    if staleness:
        return f"SSP s={staleness}"
    return f"backups b={backups}" if backups else "synchronous"


def formula_s(run) -> float:
    """BytePS's t = 2n(n-1)M / ((n^2 + kn - 2k) B) for the run: k its dedicated servers (colocated servers bring no
    NIC of their own: k = 0), M its model bytes, B its link's bandwidth; NaN without an emulated bandwidth."""
    bandwidth = run["link_bandwidth"]
    if not (isinstance(bandwidth, float) and math.isfinite(bandwidth) and bandwidth > 0):
        return math.nan
    k = int(_p(run, "servers", 1)) if _p(run, "placement", "dedicated") == "dedicated" else 0
    return byteps_optimum(int(run["workers"]), k, float(run["model_bytes"]), bandwidth)


def _exact_allreduce(run) -> bool:
    if run["strategy"] == PS or (run.get("compression") or "none") != "none" or (run.get("sync_every") or 1) > 1:
        return False
    try:
        cls = strategy_class(run["strategy"])
    except ValueError:
        return False
    return bool(cls.exact) and cls.role == GRADIENTS


def _candidates(ok: pd.DataFrame) -> pd.DataFrame:
    """Shaped multi-worker runs on an emulated bandwidth, with their kind (ps / allreduce / other)."""
    runs = ok[(ok["workers"] > 1) & ~ok["bypasses_link"] & np.isfinite(ok["link_bandwidth"].astype(float))].copy()
    runs["_kind"] = ["ps" if r["strategy"] == PS else "allreduce" if _exact_allreduce(r) else "other"
                     for r in runs.to_dict("records")]
    return runs[runs["_kind"] != "other"]


def has_ps(ok: pd.DataFrame) -> bool:
    return bool((_candidates(ok)["_kind"] == "ps").any())


def _agg(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean per configuration within sweep, workload, condition and workers, with comm_s's spread and the kind."""
    agg = mean_per_config(runs, KEYS + ["config"])
    groups = runs.groupby(KEYS + ["config"], sort=False, dropna=False)
    first = groups.first().reset_index()
    for col in ("_kind", "sweep", "strategy", "model_bytes", "link_bandwidth", "straggler_slowdown"):
        agg[col] = first[col].values
    agg["comm_min"], agg["comm_max"] = groups["comm_s"].min().values, groups["comm_s"].max().values
    params = [c for c in runs.columns if c.startswith("param_")]
    agg[params] = first[params].values
    return agg


def _reference(group: pd.DataFrame):
    """Ring when it ran in this group, else the exact allreduce with the most samples/s; None without one."""
    allreduce = group[group["_kind"] == "allreduce"]
    if allreduce.empty:
        return None
    ring = allreduce[allreduce["strategy"] == "ring"]
    return (ring if not ring.empty else allreduce).sort_values("throughput", ascending=False).iloc[0]


def _pm(low: float, high: float, fmt: str, runs: int, simulated: bool = False) -> str:
    if simulated:
        return "simulated: deterministic"
    return "one run" if runs < 2 else f"{format(low, fmt)}-{format(high, fmt)}"


def comm_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Synchronous PS runs without a straggler: k, placement, mode, partitions, measured communication per step
    (mean and range over repeats), BytePS's formula, their ratio, and the allreduce of the same sweep and link."""
    runs = _candidates(ok)
    runs = runs[runs["straggler_slowdown"] == 1.0]
    rows = []
    for _, group in _agg(runs).groupby(KEYS, sort=False, dropna=False):
        ref = _reference(group)
        for _, ps in group[group["_kind"] == "ps"].iterrows():
            if scheme(ps) != "synchronous":
                continue
            formula = formula_s(ps)
            rows.append({"workload": ps["workload"], "link": ps["link"], "workers": int(ps["workers"]),
                         "k": int(_p(ps, "servers", 1)), "placement": _p(ps, "placement", "dedicated"),
                         "mode": _p(ps, "mode", "update"), "partition MB": float(_p(ps, "partition_mb", 4.0)),
                         "configuration": ps["config_label"], "runs": int(ps["runs"]),
                         "comm s": ps["comm_s"],
                         "comm range s": _pm(ps["comm_min"], ps["comm_max"], ".3f", ps["runs"], ps["simulated"]),
                         "BytePS formula s": formula, "measured / formula": ps["comm_s"] / formula,
                         "allreduce": ref["config_label"] if ref is not None else "none in this sweep",
                         "allreduce comm s": ref["comm_s"] if ref is not None else math.nan,
                         "PS / allreduce": ps["comm_s"] / ref["comm_s"] if ref is not None else math.nan})
    return pd.DataFrame(rows)


def idle(steps: pd.DataFrame | None, run_ids: list[str]) -> dict:
    """From the steps of these runs (timed ones): the workers' idle fraction (time not computing over compute +
    communication, summed over worker rows), the servers' seconds per step held at the staleness bound, dropped
    pushes per step, and the mean and largest staleness applied. NaN where the steps do not say."""
    out = {"idle": math.nan, "bound": math.nan, "dropped": math.nan, "stale_mean": math.nan, "stale_max": math.nan}
    if steps is None:
        return out
    s = steps[steps["run_id"].isin(run_ids) & steps["timed"]]
    workers, servers = s[s["role"] == "worker"], s[s["role"] == "server"]
    busy = (workers["compute_s"] + workers["comm_s"]).sum()
    if busy > 0:
        out["idle"] = float(workers["comm_s"].sum() / busy)
    if not servers.empty:
        per_step = servers.groupby(["run_id", "step"])
        out["bound"] = float(per_step["bound_wait_s"].sum().mean())
        out["dropped"] = float(per_step["dropped_pushes"].sum().mean())
        stale = [x for v in servers["staleness"] for x in v]
        if stale:
            out["stale_mean"], out["stale_max"] = float(np.mean(stale)), float(max(stale))
    return out


def straggler_frame(ok: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Conditions with a straggler: samples/s (range over repeats) and idle fraction of every PS scheme and of the
    allreduce in the same sweep and condition."""
    runs = _candidates(ok)
    runs = runs[runs["straggler_slowdown"] != 1.0]
    rows = []
    for _, group in _agg(runs).groupby(KEYS, sort=False, dropna=False):
        if not (group["_kind"] == "ps").any():
            continue
        for _, row in group.sort_values("throughput", ascending=False).iterrows():
            ids = runs.loc[runs["config"].map(lambda c, k=row["config"]: c == k)
                           & runs["condition"].map(lambda c, k=row["condition"]: c == k)
                           & (runs["workers"] == row["workers"]) & (runs["sweep"] == row["sweep"]), "run_id"]
            w = idle(steps, list(ids))
            rows.append({"workload": row["workload"], "condition": row["condition_label"],
                         "workers": int(row["workers"]), "configuration": row["config_label"],
                         "scheme": scheme(row) if row["_kind"] == "ps" else "allreduce", "runs": int(row["runs"]),
                         "samples/s": row["throughput"],
                         # the slowest rank's pace sets samples/s; without a barrier the servers' parameters
                         # advance at the fastest worker's (time to target uses it)
                         "slowest rank s/step": row["step_time_s"], "fastest worker s/step": row["fast_step_s"],
                         "range samples/s": _pm(row["throughput_lo"], row["throughput_hi"], ",.1f", row["runs"],
                                                row["simulated"]),
                         "workers idle %": w["idle"] * 100, "held at bound s/step": w["bound"],
                         "dropped pushes/step": w["dropped"], "staleness mean": w["stale_mean"],
                         "staleness max": w["stale_max"]})
    return pd.DataFrame(rows)


def ps_verdicts(ok: pd.DataFrame) -> list[str]:
    """Per sweep, workload, condition and workers with both kinds: the PS configuration with the most samples/s
    against the allreduce (ring, or the best exact one) with the report's tie rule (reports/verdicts.py
    lead_counts): measured, a lead counts only outside the intervals (the spread between repeats widened by their
    per-step intervals; one run each: a tie); simulated (deterministic), any lead over SIMULATED_TIE counts."""
    out = []
    for _, group in _agg(_candidates(ok)).groupby(KEYS, sort=False, dropna=False):
        ref, ps = _reference(group), group[group["_kind"] == "ps"]
        if ref is None or ps.empty:
            continue
        best = ps.sort_values("throughput", ascending=False).iloc[0]
        where = f"{best['workload']} on {best['condition_label']}, {int(best['workers'])} workers"
        ratio = best["throughput"] / ref["throughput"]
        numbers = (f"{best['config_label']} {best['throughput']:,.1f} samples/s "
                   f"({_pm(best['throughput_lo'], best['throughput_hi'], ',.1f', best['runs'], best['simulated'])}) "
                   f"against {ref['config_label']} {ref['throughput']:,.1f} "
                   f"({_pm(ref['throughput_lo'], ref['throughput_hi'], ',.1f', ref['runs'], ref['simulated'])})")
        stale = "" if scheme(best) in ("synchronous",) else \
            f" ({scheme(best)} trades gradient staleness for speed: see time to target for what it costs)"
        simulated = bool(best["simulated"] and ref["simulated"])
        outside = (f"a simulated lead (deterministic: no sampling interval, a tie only under {SIMULATED_TIE:.0%})"
                   if simulated else "outside the intervals (repeats and their steps)")
        if lead_counts(best, ref) and ratio > 1:
            out.append(f"{where}: the parameter server wins: {numbers}, {ratio:.2f}x {ref['config_label']}'s "
                       f"samples/s, {outside}{stale}.")
        elif lead_counts(ref, best) and ratio < 1:
            out.append(f"{where}: no PS configuration wins: {ref['config_label']} is "
                       f"{1 / ratio:.2f}x the best one: {numbers}" + (f", {outside}." if simulated else "."))
        elif simulated:
            out.append(f"{where}: tie within the stated {SIMULATED_TIE:.0%} tolerance: {numbers}, {ratio:.3f}x "
                       f"(simulated runs are deterministic: no sampling interval).")
        elif best["runs"] < 2 or ref["runs"] < 2:
            out.append(f"{where}: tie, not distinguishable: {numbers}, {ratio:.2f}x; one run each, so there is no "
                       f"spread between repeats to measure a lead against.")
        else:
            out.append(f"{where}: tie, not distinguishable: {numbers}, {ratio:.2f}x, inside the spread between "
                       f"repeats and their steps.")
    return out
