"""The report's numbers as pandas tables, from the results' typed columns (no plotting, no HTML).

Loading and the group keys are in reports/load.py, the verdicts in reports/verdicts.py, the cost model's
calibration in reports/calibration.py; here: the scaling baseline, the bandwidth requirement, traffic, overlap,
the emulations and substrates compared, convergence, stragglers and the runs table.
"""

from __future__ import annotations

import functools
import json
import math

import numpy as np
import pandas as pd

from reports.load import mean_per_config, strategy_params
from reports.model import (
    MB,
    TARGET_EFFICIENCIES,
    Fabric,
    bandwidth_for,
    critical_path,
    parallel_efficiency,
    sync_seconds,
    workload_shapes,
)
from strategies import make as make_strategy
from strategies import names as strategy_names

REQUIREMENT_WORKERS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# ---- baselines ---------------------------------------------------------------------------------------------

def per_worker_baseline(ok: pd.DataFrame) -> pd.DataFrame:
    """Throughput per worker of the baseline per (workload, link, compute mode), and where it came from: the
    single worker with nothing to synchronize (every strategy's n = 1 run, averaged); without one, in profile
    mode, the profile's own single-rank step time; else none (NaN), never the smallest n measured (which would
    make that n's efficiency 1.0 by construction). Per compute mode: profile runs scale against a profile."""
    rows = []
    for (workload, link, compute), g in ok.groupby(["workload", "link", "compute"], sort=False):
        single = g[g["workers"] == 1]
        profile_s = g["profile_step_s"].median() if compute == "profile" else math.nan
        if not single.empty:
            per_worker, source = single["throughput"].mean(), "the 1-worker runs"
        elif profile_s > 0:
            per_worker, source = g["batch_size"].median() / profile_s, "the compute profile's single-rank step"
        else:
            per_worker, source = math.nan, ""
        rows.append({"workload": workload, "link": link, "compute": compute, "per_worker": per_worker,
                     "baseline": source})
    return pd.DataFrame(rows, columns=["workload", "link", "compute", "per_worker", "baseline"])


def scaling_efficiency(ok: pd.DataFrame) -> pd.DataFrame:
    """efficiency(n) = throughput(n) / (n x throughput(1)) per workload, link, compute mode, configuration and n
    (1.0 at n = 1 by definition); NaN where per_worker_baseline has no baseline."""
    agg = mean_per_config(ok, ["workload", "link", "compute", "series", "workers"])
    agg = agg.merge(per_worker_baseline(ok), on=["workload", "link", "compute"])
    agg["efficiency"] = agg["throughput"] / (agg["workers"] * agg["per_worker"])
    agg.loc[(agg["workers"] == 1) & agg["per_worker"].notna(), "efficiency"] = 1.0
    return agg


def compute_time_per_workload(ok: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """workload -> (Ts, where it comes from): the median compute time of its fewest-worker undistorted runs, and
    whether those runs measured it, replayed a measured or a synthetic (described) profile, or simulated it."""
    out = {}
    for workload, g in ok.groupby("workload", sort=False):
        clean = g[~g["distorted"]] if (~g["distorted"]).any() else g
        n0 = clean["workers"].min()
        fewest = clean[clean["workers"] == n0]
        ts = float(fewest["compute_s"].median())
        out[workload] = (ts, f"median compute time of the {n0}-worker runs, {_compute_source(fewest)}")
    return out


def _compute_source(runs: pd.DataFrame) -> str:
    """Where these runs' compute times came from, in words: measured, a replayed profile (measured or synthetic),
    a simulated timeline; several joined with 'and'."""
    kinds = []
    real = runs[(runs["compute"] != "profile") & (runs["substrate"] != "simgrid")]
    if not real.empty:
        kinds.append("measured")
    profiled = runs[runs["compute"] == "profile"]
    if profiled["profile_synthetic"].any():
        kinds.append("replayed from a SYNTHETIC profile (described, not measured)")
    if (~profiled["profile_synthetic"]).any():
        kinds.append("replayed from a measured profile")
    if ((runs["substrate"] == "simgrid") & (runs["compute"] != "profile")).any():
        kinds.append("a simulation's fixed compute times")
    return " and ".join(kinds)


def strategy_specs(ok: pd.DataFrame) -> tuple[list[tuple[str, str, dict]], list[str]]:
    """(label, name, params) of the measured strategies the registry can model; 'label: why' of the others."""
    known = set(strategy_names())
    specs, skipped = [], []
    for _, g in ok.groupby("config", sort=False):
        run = g.iloc[0]
        label = run["label"]
        name = run["strategy"]
        if name not in known:
            skipped.append(f"{label}: not a registered strategy here")
            continue
        params = strategy_params(run)
        try:
            make_strategy(name, **params)
        except (ValueError, TypeError) as e:
            skipped.append(f"{label}: {e}")
            continue
        specs.append((label, name, params))
    return specs, skipped


# ---- traffic ---------------------------------------------------------------------------------------------

def traffic_agreement(ok: pd.DataFrame) -> tuple[int, int, list[str], list[str]]:
    """(runs whose measured bytes equal the analytic bytes, runs compared, labels that differ, labels whose
    bytes the backend hides)."""
    both = ok.dropna(subset=["bytes_sent_per_worker", "analytic_bytes_sent_per_worker"])
    both = both[(both["workers"] > 1) & both["bytes_counted"]]
    same = np.isclose(both["bytes_sent_per_worker"], both["analytic_bytes_sent_per_worker"], rtol=1e-9, atol=0.5)
    hidden = ok.loc[~ok["bytes_counted"] & (ok["workers"] > 1), "label"].unique()
    return int(same.sum()), len(both), list(both.loc[~same, "label"].unique()), list(hidden)


# ---- bandwidth requirement ------------------------------------------------------------------------------

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
                shapes = workload_shapes(workload, numel)
                try:  # the one price (strategies.cost.sync_seconds), the bandwidth at which it gives P
                    config = make_strategy(name, **(json.loads(params) if isinstance(params, str) else params or {}))
                    sync_seconds(config, n, numel, Fabric(1e9), 4, shapes)
                except (ValueError, NotImplementedError, TypeError):
                    continue  # the strategy cannot run on n workers
                for p in TARGET_EFFICIENCIES:
                    s = bandwidth_for(functools.partial(_efficiency_at, config, n, numel, shapes, ts[workload][0]), p)
                    rows.append({"workload": workload, "label": label, "workers": n, "target": f"P = {p:g}",
                                 "MB/s": s / MB if math.isfinite(s) else math.nan})
    return pd.DataFrame(rows)


def _efficiency_at(config, workers, numel, shapes, compute_s, bandwidth) -> float:
    return parallel_efficiency(compute_s, sync_seconds(config, workers, numel, Fabric(bandwidth), 4, shapes))


# ---- convergence -----------------------------------------------------------------------------------------

def loss_frame(ok: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per run and step: the workers' mean loss and the slowest worker's wall time."""
    workers = steps[(steps["role"] == "worker") & steps["run_id"].isin(ok["run_id"])]
    per_step = workers.groupby(["run_id", "step"]).agg(loss=("loss", "mean"), wall_s=("wall_s", "max"),
                                                       consensus_distance=("consensus_distance", "mean"))
    per_step = per_step.reset_index().merge(ok[["run_id", "label", "workload", "workers", "link", "distorted",
                                                "cores_oversubscribed", "gpu_shared", "servers", "cores"]],
                                            on="run_id")
    per_step["n"] = "n=" + per_step["workers"].astype(str)
    return per_step.sort_values(["run_id", "step"])


# ---- stragglers ------------------------------------------------------------------------------------------

def imbalance(run) -> tuple[float, str]:
    """How a run was unbalanced, as (sort key, label): a compute slowdown, a slower NIC, or none."""
    if len(run["straggler_ranks"]) and run["straggler_slowdown"] != 1.0:
        ranks = ",".join(str(r) for r in run["straggler_ranks"])
        return float(run["straggler_slowdown"]), f"rank {ranks} computes {run['straggler_slowdown']:g}x slower"
    if run["link_heterogeneous"]:
        return 0.5, f"{run['link']}"
    return 1.0, "balanced"


def has_imbalance(ok: pd.DataFrame) -> bool:
    return bool((ok["straggler_ranks"].map(len) > 0).any() or ok["link_heterogeneous"].any())


def stragglers_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Throughput of each unbalanced run relative to the same strategy's balanced run (same workers, same
    default link bandwidth and latency)."""
    df = ok.assign(label=ok["config_label"])  # the imbalance is on the x axis, not in the legend
    keys = [imbalance(run) for _, run in df.iterrows()]
    df["order"] = [k for k, _ in keys]
    df["imbalance"] = [label for _, label in keys]
    df["_bandwidth"] = df["link_bandwidth"].fillna(-1.0)
    keys = ["workload", "config", "workers", "_bandwidth", "link_latency_s"]  # a slow NIC vs its uniform network
    balanced = df[df["imbalance"] == "balanced"].groupby(keys)["throughput"].mean()
    df["relative"] = [t / balanced.get(k, math.nan)
                      for t, k in zip(df["throughput"], df[keys].itertuples(index=False, name=None))]
    return df.drop(columns="_bandwidth").sort_values(["order", "imbalance"])


# ---- the runs table -------------------------------------------------------------------------------------

RUN_COLUMNS = {  # runs.parquet column -> runs-table heading
    "label": "strategy", "workers": "workers", "workload": "workload", "link": "link", "compute": "compute",
    "servers": "servers", "seed": "seed", "status": "status", "throughput": "samples/s", "step_time_s": "step s",
    "compute_s": "compute s", "comm_s": "comm s", "comm_fraction": "comm share",
    "bytes_sent_per_worker": "sent MB/worker", "bytes_recv_per_worker": "recv MB/worker",
    "final_loss": "final loss", "accuracy": "test accuracy", "distorted": "distorted", "error": "error",
    "run_id": "run id",
}
AXES = ("workload", "link", "compute", "servers", "seed")  # shown only when they vary (the summary names the rest)


def runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run, failed ones included: labelled by strategy and the axes that vary, then its numbers (MB = 10^6
    bytes), its id last in its own column."""
    same = [c for c in AXES if runs[c].nunique(dropna=False) == 1]
    df = runs[[c for c in RUN_COLUMNS if c in runs and c not in same]].copy()
    for col in ("bytes_sent_per_worker", "bytes_recv_per_worker"):
        df[col] = df[col] / MB
    df["distorted"] = np.where(runs["cores_oversubscribed"], "cores",
                               np.where(runs["gpu_shared"], "GPU shared", ""))
    return df.rename(columns=RUN_COLUMNS)


# ---- overlap --------------------------------------------------------------------------------------------------

def overlap_frame(ok: pd.DataFrame, target: float = 0.9) -> pd.DataFrame:
    """Exposed vs hidden communication per multi-worker configuration, P = Ts / (Ts + exposed), and the NIC
    bandwidth for efficiency `target` without overlap and with the overlap measured.

    Without overlap all communication is exposed: S = path_bytes / ((1-P)/P x Ts). With overlap the hidden
    seconds (busy - exposed, communication that ran behind backward) add to that budget:
    S = path_bytes / ((1-P)/P x Ts + hidden). Runs whose backend hides its bytes (ddp) have no busy time.
    """
    multi = ok[(ok["workers"] > 1)]
    if multi.empty or "exposed_comm_s" not in multi:
        return pd.DataFrame()
    multi = multi.assign(buckets_of=multi["bucket_mb"].map(lambda mb: "flat" if mb != mb else f"{mb:g}"))
    agg = mean_per_config(multi, ["workload", "link", "workers", "series", "buckets_of"])
    budget = (1 - target) / target * agg["compute_s"]
    hidden = (agg["comm_busy_s"] - agg["exposed_comm_s"]).clip(lower=0)
    path = agg["analytic_path_bytes"]
    out = pd.DataFrame({
        "workload": agg["workload"], "link": agg["link"], "workers": agg["workers"], "strategy": agg["label"],
        "compute": agg["compute"], "bucket MiB": agg["buckets_of"], "step s": agg["step_time_s"],
        "Ts s": agg["compute_s"], "exposed s": agg["exposed_comm_s"], "busy s": agg["comm_busy_s"],
        "hidden s": hidden, "overlap fraction": agg["overlap_fraction"],
        "P": agg["compute_s"] / (agg["compute_s"] + agg["exposed_comm_s"]),
        f"S for P={target:g}, no overlap MB/s": path / budget / 1e6,
        f"S for P={target:g}, measured overlap MB/s": path / (budget + hidden.fillna(0)) / 1e6,
    })
    return out.sort_values(["workload", "link", "workers", "strategy"]).reset_index(drop=True)


# ---- python-emulated vs kernel-shaped links --------------------------------------------------------------

def emulations_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Communication per step of the same configuration on a python-emulated and a kernel-shaped link (same
    bandwidth): one row per (workload, workers > 1, strategy) that ran on both, with their ratio."""
    both = ok[ok["link_emulation"].isin(["python", "kernel"]) & (ok["workers"] > 1)].copy()  # n = 1 sends nothing
    if both.empty or both["link_emulation"].nunique() < 2:
        return pd.DataFrame()
    both["_bandwidth"] = both["link_bandwidth"]  # the pair is the same NIC (bandwidth, latency), shaped two ways
    agg = mean_per_config(both, ["workload", "workers", "series", "_bandwidth", "link_latency_s", "link_emulation"])
    wide = agg.pivot_table(index=["workload", "workers", "series", "_bandwidth", "link_latency_s"],
                           columns="link_emulation", values="comm_s").dropna()
    if wide.empty:
        return pd.DataFrame()
    python = agg[agg["link_emulation"] == "python"].set_index(list(wide.index.names))
    wide = wide.join(python[["label", "link", "bypasses"]]).reset_index()
    return pd.DataFrame({
        "workload": wide["workload"], "workers": wide["workers"], "strategy": wide["label"],
        "link": wide["link"], "comm s, python": wide["python"], "comm s, kernel": wide["kernel"],
        "python / kernel": wide["python"] / wide["kernel"],
        "note": wide["bypasses"].map(lambda bypasses: "python: not slowed (the backend's bytes bypass the "
                                     "communicator)" if bypasses else ""),
    })


# ---- simulated, measured and modelled -------------------------------------------------------------------

def substrates_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """Communication per step of the same strategy, workers and link: measured (Ray actors), simulated
    (SimGrid, per platform and network model) and modelled (alpha-beta: rounds x latency + critical-path bytes
    / bandwidth of the strategy's analytic traffic). Only configurations a simulation covered."""
    simulated = ok[ok["substrate"] == "simgrid"]
    if simulated.empty:
        return pd.DataFrame()
    measured = ok[(ok["substrate"] != "simgrid") & (ok["workers"] > 1)]
    keys = ["workload", "strategy_key", "workers", "link"]
    measured_comm = measured.groupby(keys + ["overlap"])["comm_s"].mean()
    rows = []
    for key, g in simulated.groupby(keys + ["sim_platform", "sim_network_model", "overlap"], sort=False):
        run = g.iloc[0]
        modelled = run["model_comm_s"]
        if not math.isfinite(modelled) and math.isfinite(run["link_bandwidth"]):
            try:
                rounds, path_bytes, _ = critical_path(run["strategy"], int(run["workers"]), int(run["numel"]),
                                                      strategy_params(run),
                                                      shapes=workload_shapes(run["workload"], int(run["numel"])))
                modelled = rounds * run["link_latency_s"] + path_bytes / run["link_bandwidth"]
            except (ValueError, NotImplementedError):
                modelled = math.nan
        rows.append({"workload": key[0], "strategy": run["strategy_label"] or run["strategy"],
                     "workers": int(key[2]), "link": key[3],
                     "platform": key[4], "network model": key[5], "overlap": "on" if key[6] else "off",
                     "measured comm ms": measured_comm.get((*key[:4], key[6]), math.nan) * 1e3,
                     "simulated comm ms": g["comm_s"].mean() * 1e3,
                     "simulated step ms": g["step_time_s"].mean() * 1e3,
                     "modelled comm ms": modelled * 1e3})
    return pd.DataFrame(rows).sort_values(["workload", "link", "workers", "strategy"]).reset_index(drop=True)
