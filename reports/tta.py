"""Time to target: when runs name a target, the verdict is time to target = steps to target x seconds
per step, shown as its two factors, each with its spread over the runs (seeds) of a configuration, beside the
throughput-only ranking.

Honest time on a small machine: convergence needs real arithmetic (compute = "real": steps to target), hardware
time needs the cluster's compute and links. A real-mode configuration's **profile twin** is the same configuration
(strategy, parameters, compression, sync period, workers, workload, batch, link, straggler, substrate) run with
compute = "profile": the measured or described compute of the target hardware replayed while the real bytes cross
the emulated link. When a twin exists, seconds per step come from it and time to target = the real runs' steps x the
twin's seconds per step; the table says which source each row used. Without one, both factors come from the same
real runs (on 2 shared cores their seconds per step are this machine's, not a cluster's).

Time to target carries the uncertainty of both its factors: its standard deviation is that of a product of
independent factors, sqrt(S^2 sd_N^2 + N^2 sd_S^2 + sd_N^2 sd_S^2) (N steps to target, S seconds per step, each
mean and sd over its runs), so steps that agree over seeds never hide seconds per step that do not.

A parameter server without a barrier (SSP, async, backups) does not step at its slowest rank's pace: its servers'
parameters advance at the fast workers' (the summary's fast_step_s), and its time to target is when they met the
target (experiments/pipeline/summary.py time_to_target). Its seconds per step are that pace, shown beside the
slowest rank's."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.load import group_key, method_suffix


def _spread(values: pd.Series) -> tuple[float, float]:
    """Mean and sample standard deviation (NaN with one value: no spread to give)."""
    values = values.dropna().astype(float)
    if values.empty:
        return math.nan, math.nan
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _pm(mean: float, sd: float, fmt: str) -> str:
    if not math.isfinite(mean):
        return "not reached"
    return format(mean, fmt) + (f" ± {format(sd, fmt)}" if math.isfinite(sd) else " (1 run)")


def product_sd(n_mean: float, n_sd: float, s_mean: float, s_sd: float) -> float:
    """The standard deviation of N x S for independent N and S: sqrt(S^2 sd_N^2 + N^2 sd_S^2 + sd_N^2 sd_S^2). A
    factor without a spread (NaN: one run) counts as exact; NaN when neither factor has one."""
    if not (math.isfinite(n_sd) or math.isfinite(s_sd)):
        return math.nan
    n_sd, s_sd = (n_sd if math.isfinite(n_sd) else 0.0), (s_sd if math.isfinite(s_sd) else 0.0)
    return math.sqrt(s_mean ** 2 * n_sd ** 2 + n_mean ** 2 * s_sd ** 2 + n_sd ** 2 * s_sd ** 2)


def _pace(runs: pd.DataFrame) -> pd.Series:
    """Each run's seconds per step for time to target: the fast workers' pace (fast_step_s) for a parameter
    server without a barrier, else the step time (the slowest rank's)."""
    fast = runs["fast_step_s"] if "fast_step_s" in runs else pd.Series(math.nan, index=runs.index)
    return fast.where(fast.notna(), runs["step_time_s"])


# What makes a profile-mode run the twin of a real-mode one: everything but the compute mode (and the seed)
TWIN_COLUMNS = ("strategy_key", "workers", "workload", "batch_size", "image_size", "link_bandwidth", "link_latency_s",
                "link_emulation", "link_heterogeneous", "straggler_slowdown", "substrate")


def _twin_key(run) -> tuple:
    return group_key(run[c] for c in TWIN_COLUMNS) + (tuple(run["straggler_ranks"]),)


def tta_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration and condition of the runs with a target: runs, how many reached it, steps to
    target, seconds per step (from the profile twin when there is one, else from the runs themselves; the fast
    workers' pace without a barrier, beside the slowest rank's) and time to target (mean over the runs that reached
    it, ± the spread of both factors: product_sd), bytes sent per worker per step, and the rank by time to target
    and by throughput alone. Beside exact ring in the same condition (strategy ring, no compression, sync_every 1):
    time to target and bytes per step as multiples of ring's, the bytes both as measured and as the runs' analytic
    traffic (each run's `traffic()` over its own timed steps, PowerSGD with its buckets' parameter shapes), and
    measured / analytic, which is 1 when the wire carried exactly the model's bytes."""
    runs = ok[ok["target_metric"].fillna("") != ""] if "target_metric" in ok else ok.iloc[0:0]
    profiled = ok.iloc[0:0] if runs.empty else ok[(ok["compute"] == "profile") & (ok["target_metric"].fillna("") == "")]
    twins: dict[tuple, list] = {}
    for _, run in profiled.iterrows():
        twins.setdefault(_twin_key(run), []).append(run)
    rows = []
    for (_, _), group in runs.groupby(["config", "condition"], sort=False, dropna=False):
        first = group.iloc[0]
        reached = group[group["target_reached"].astype(bool)]
        steps_mean, steps_sd = _spread(reached["steps_to_target"])
        twin = pd.DataFrame(twins.get(_twin_key(first), []))
        timed = group if twin.empty else twin  # the runs whose seconds per step count
        barrier_free = bool(_pace(timed).ne(timed["step_time_s"]).any())
        step_mean, step_sd = _spread(_pace(timed))
        slowest_mean, slowest_sd = _spread(timed["step_time_s"])
        if twin.empty:  # both factors from the same real runs: each run's own product
            time_mean, _ = _spread(reached["time_to_target_s"])
            source = "these real runs"
        else:  # steps from the real runs, seconds per step from the replayed hardware on the emulated link
            time_mean = steps_mean * step_mean
            devices = sorted({str(d) for d in twin.get("profile_device", pd.Series(dtype=str)).fillna("") if d})
            source = (f"profile twin ({len(twin)} run{'s' if len(twin) > 1 else ''}"
                      + (f", {', '.join(devices)}" if devices else "") + ")")
        if barrier_free:
            source += "; no barrier: the fastest worker's pace, at which the servers' parameters advance"
        time_sd = product_sd(steps_mean, steps_sd, step_mean, step_sd)
        if math.isfinite(time_sd) and not (math.isfinite(steps_sd) and math.isfinite(step_sd)):
            one = "steps to target" if not math.isfinite(steps_sd) else "seconds per step"
            time_text = f"{_pm(time_mean, time_sd, '.3f')} ({one}: 1 run, no spread)"
        else:
            time_text = _pm(time_mean, time_sd, ".3f")
        thr_mean, _ = _spread(group["throughput"] if twin.empty else twin["throughput"])
        rows.append({"configuration": first["config_label"], "condition": first["condition_label"],
                     "target": f"{first['target_metric']} {'>=' if first['target_metric'] == 'accuracy' else '<='} "
                               f"{first['target_value']:g}",
                     "runs": len(group), "reached": len(reached),
                     "steps to target": _pm(steps_mean, steps_sd, ".1f"),
                     "ms per step": _pm(step_mean * 1e3, step_sd * 1e3, ".2f"),
                     "slowest rank ms per step": _pm(slowest_mean * 1e3, slowest_sd * 1e3, ".2f"),
                     "seconds per step from": source,
                     "time to target s": time_text,
                     "MB sent/worker/step": float(group["bytes_sent_per_worker"].mean()) / 1e6,
                     "_bytes": float(group["bytes_sent_per_worker"].mean()),
                     "_analytic": float(group["analytic_bytes_sent_per_worker"].mean())
                     if "analytic_bytes_sent_per_worker" in group else math.nan,
                     "_ring": first["strategy"] == "ring" and method_suffix(first.to_dict()) == "",
                     "_time": time_mean if len(reached) == len(group) else math.inf,
                     "_time_sd": time_sd if math.isfinite(time_sd) else 0.0, "_throughput": thr_mean})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["rank by time to target"] = df.groupby("condition")["_time"].rank(method="min").astype(int)
    df["rank by throughput"] = df.groupby("condition")["_throughput"].rank(ascending=False, method="min")
    df["rank by throughput"] = df["rank by throughput"].astype(int)
    df.loc[~np.isfinite(df["_time"]), "rank by time to target"] = -1
    df = _versus_ring(df)
    return df.sort_values(["condition", "_time"], kind="stable").reset_index(drop=True)


def _ratio(a: float, b: float, fmt: str) -> str:
    return format(a / b, fmt) if math.isfinite(a) and math.isfinite(b) and b > 0 else "-"


def _versus_ring(df: pd.DataFrame) -> pd.DataFrame:
    """The x ring columns (and measured / analytic bytes) per condition that has exactly one exact ring row."""
    cols = {"x ring time": [], "bytes/step x ring": [], "analytic x ring": [], "bytes measured / analytic": []}
    for _, row in df.iterrows():
        rings = df[(df["condition"] == row["condition"]) & df["_ring"]]
        ring = rings.iloc[0] if len(rings) == 1 else None
        cols["x ring time"].append("-" if ring is None else _ratio(row["_time"], ring["_time"], ".2f"))
        cols["bytes/step x ring"].append("-" if ring is None else _ratio(row["_bytes"], ring["_bytes"], ".4f"))
        cols["analytic x ring"].append("-" if ring is None else _ratio(row["_analytic"], ring["_analytic"], ".4f"))
        cols["bytes measured / analytic"].append(_ratio(row["_bytes"], row["_analytic"], ".4f"))
    return df.assign(**cols)


def tta_verdicts(df: pd.DataFrame) -> list[str]:
    """Per condition: the fastest configuration to the target, its two factors, and whether throughput alone would
    have picked another one."""
    out = []
    for condition, group in df.groupby("condition", sort=False):
        done = group[np.isfinite(group["_time"])]
        if done.empty:
            out.append(f"{condition}: no configuration reached the target in every run.")
            continue
        best = done.iloc[0]
        fastest = group.sort_values("_throughput", ascending=False).iloc[0]
        line = (f"{condition}: {best['configuration']} reaches the target first: {best['time to target s']} s = "
                f"{best['steps to target']} steps x {best['ms per step']} ms per step (seconds per step from "
                f"{best['seconds per step from']}).")
        if len(done) > 1 and done.iloc[1]["_time"] - done.iloc[1]["_time_sd"] <= best["_time"] + best["_time_sd"]:
            line += (f" {done.iloc[1]['configuration']} ({done.iloc[1]['time to target s']} s) is within the spread: "
                     f"not a clear win.")
        if fastest["configuration"] != best["configuration"]:
            line += (f" Throughput alone would pick {fastest['configuration']}, which needs "
                     f"{fastest['time to target s']} s.")
        never = group[~np.isfinite(group["_time"])]
        if not never.empty:
            line += " Not reached in every run: " + ", ".join(never["configuration"]) + "."
        out.append(line)
    return out
