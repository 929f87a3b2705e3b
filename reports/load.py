"""Results -> pandas: runs.parquet and steps.parquet in the schema's types, with the keys the report groups by.

A run's configuration (`config`) and its condition (`condition`) are tuples of typed columns: the report groups by
them, never by display text. `label` and `condition_label` are built from the same columns, for display only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.results.dataset import has_results, read_runs, read_steps
from experiments.results.schema import RUNS, names
from strategies import get as strategy_class
from strategies.base import SERVER

# What makes two runs the same strategy configuration (repeats differ only by seed): the strategy with its
# param_* columns and these; and where it ran (a profile and real compute, or a simulation, are other machines).
STRATEGY_COLUMNS = ("strategy", "bucket_mb", "overlap", "compression", "powersgd_rank", "topk_ratio", "error_feedback",
                    "sync_every", "outer_optimizer")
MACHINE_COLUMNS = ("compute", "substrate")
# What a run was measured under: a verdict is given per condition, never averaged across conditions.
CONDITION_COLUMNS = ("link_bandwidth", "link_latency_s", "link_emulation", "link_heterogeneous", "link_ranks",
                     "straggler_ranks", "straggler_slowdown", "compute", "substrate", "sim_topology",
                     "sim_network_model", "sim_nic", "sim_oversubscription", "sim_gpus_per_node")


def load_runs(results_dir: Path) -> pd.DataFrame:
    """runs.parquet in the schema's types, plus: ok, distorted, bypasses_link, the group keys strategy_key, config,
    condition and series, and the display labels config_label, label (the series') and condition_label."""
    if not has_results(results_dir):
        raise FileNotFoundError(f"no runs.parquet in {str(results_dir)!r} and no runs/ dataset: run a sweep there "
                                f"first (syncbench run SWEEP.toml)")
    runs = read_runs(results_dir)  # every run's latest attempt, typed, display labels derived (either layout)
    if runs.empty:
        raise ValueError(f"{str(results_dir)!r} has no runs: nothing to report")
    runs["ok"] = runs["status"] == "ok"
    runs["distorted"] = runs["cores_oversubscribed"] | runs["gpu_shared"]
    # A backend's own allreduce (bytes not counted) on a python-emulated link never crossed the emulation: its
    # bytes moved unshaped over loopback. On a kernel-shaped link they cross the shaped NICs like any other.
    # The summary records it (bypasses_link); results written before it read false there and are derived here.
    derived = ~runs["bytes_counted"] & (runs["link_emulation"] == "python")
    runs["bypasses_link"] = runs["bypasses_link"].astype(bool) | derived if "bypasses_link" in runs else derived
    # results written before profile_synthetic: a synthetic profile's id names its source "synthetic"
    # (workloads/profile.py Profile.id), so an old synthetic run is never shown as measured
    runs["profile_synthetic"] = runs["profile_synthetic"] | runs["profile_id"].str.contains("-synthetic-")
    # strategy parameters only: param_norm is a measured column of the schema, and would split every seed apart
    params = sorted(c for c in runs.columns if c.startswith("param_") and c not in RUN_COLUMNS)
    runs["strategy_key"] = [group_key(row) for row in runs[list(STRATEGY_COLUMNS) + params].itertuples(index=False)]
    runs["config"] = [key + group_key(row) for key, row in zip(runs["strategy_key"],
                                                                runs[list(MACHINE_COLUMNS)].itertuples(index=False))]
    runs["condition"] = [group_key(row) for row in runs[list(CONDITION_COLUMNS)].itertuples(index=False)]
    # a figure's series: one configuration under one straggler setting (the figure's facets give the link)
    runs["series"] = [key + (tuple(ranks), slowdown) for key, ranks, slowdown
                      in zip(runs["config"], runs["straggler_ranks"], runs["straggler_slowdown"])]
    runs["config_label"] = _config_labels(runs)  # the straggler figure shows the straggler on its x axis instead
    runs["label"] = runs["config_label"] + _straggler_suffixes(runs)
    runs["condition_label"] = [condition_label(run) for _, run in runs.iterrows()]
    return runs


RUN_COLUMNS = frozenset(names(RUNS))


def group_key(values) -> tuple:
    """A hashable group key from typed values (NaN -> None, so that two missing values are the same key)."""
    return tuple(None if isinstance(v, float) and math.isnan(v) else v for v in values)


def _config_labels(runs: pd.DataFrame) -> pd.Series:
    """The configuration's display label: the strategy with its parameters, and what else varies in this sweep
    (bucket size, overlap, compute mode, simulated), so that every configuration has its own legend entry."""
    label = runs["strategy_label"].where(runs["strategy_label"] != "", runs["strategy"])
    if "param_comm" in runs:  # ddp over gloo beside ddp through a strategy: name gloo too
        ddp = runs["strategy"] == "ddp"
        if (~runs.loc[ddp, "param_comm"].fillna("").isin(["", "gloo"])).any():
            label = label.where(~ddp | (label != "ddp"), "ddp (comm=gloo)")
    label += [method_suffix(run) for run in runs.to_dict("records")]
    if runs["bucket_mb"].nunique(dropna=False) > 1:
        label += runs["bucket_mb"].map(lambda mb: "" if mb != mb else f" {mb:g}MiB")
    if runs["overlap"].nunique() > 1:
        label += runs["overlap"].map(lambda on: " +overlap" if on else "")
    if runs["compute"].nunique() > 1:
        label += runs["compute"].map(lambda mode: " [profile]" if mode == "profile" else "")
    return label + runs["substrate"].map(lambda s: " [simulated]" if s == "simgrid" else "")


def method_suffix(run) -> str:
    """' + fp16', ' + PowerSGD r=2', ' + top-k 1%', ' + local SGD H=4', ' + DiLoCo H=16': what the run trades for
    bandwidth (strategies/compression.py, local_sgd.py); '' for exact training every step (and older results)."""
    kind = run.get("compression") or "none"
    if kind in ("fp16", "bf16"):
        return f" + {kind}"
    if kind == "powersgd":
        return f" + PowerSGD r={run['powersgd_rank']}" + ("" if run["error_feedback"] else " no EF")
    if kind == "topk":
        return f" + top-k {run['topk_ratio'] * 100:g}%" + ("" if run["error_feedback"] else " no EF")
    sync_every = run.get("sync_every") or 1
    if sync_every > 1:
        return f" + {'DiLoCo' if run.get('outer_optimizer') == 'nesterov' else 'local SGD'} H={sync_every}"
    return ""


def _straggler_suffixes(runs: pd.DataFrame) -> list[str]:
    """' [rank 1 2x slower]' for a run with a straggler, so that a figure's series never mixes it with balanced runs."""
    return [f" [rank {','.join(map(str, ranks))} {slowdown:g}x slower]" if len(ranks) and slowdown != 1.0 else ""
            for ranks, slowdown in zip(runs["straggler_ranks"], runs["straggler_slowdown"])]


def condition_label(run) -> str:
    """The condition a run was measured under, in words: its link, and its straggler, compute mode and simulated
    platform when it has them."""
    parts = [str(run["link"])]
    if len(run["straggler_ranks"]) and run["straggler_slowdown"] != 1.0:
        ranks = ",".join(str(r) for r in run["straggler_ranks"])
        parts.append(f"rank {ranks} computing {run['straggler_slowdown']:g}x slower")
    if run["compute"] == "profile":
        parts.append("replayed compute profile")
    if run["substrate"] == "simgrid":
        sim = [str(run[c]) for c in ("sim_platform", "sim_network_model") if run[c]]
        sim += [f"{run['sim_nic']} NIC"] if run["sim_nic"] else []
        parts.append("simulated " + " ".join(sim))
    return ", ".join(parts)


def load_steps(results_dir: Path) -> pd.DataFrame | None:
    """steps.parquet in the schema's types, or None when the sweep did not record steps."""
    steps = read_steps(results_dir)
    return None if steps.empty else steps


STEP_LEVEL = 0.95  # the per-step interval's confidence: Student's t over a run's timed steps


def with_step_intervals(runs: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """runs with each run's per-step interval: step_time_lo/hi = the mean step time +- t(0.975, k-1) x sd / sqrt(k)
    over its k timed steps (a step's time: its slowest worker's compute + communication, as the summary
    computes it), and throughput_step_lo/hi, the run's throughput scaled by mean / (mean +- that half-width)
    (unbounded above when the half-width reaches the mean). NaN where the run has fewer than 2 timed steps
    or no steps were recorded: no variation to measure."""
    runs = runs.copy()
    for col in ("step_time_lo", "step_time_hi", "throughput_step_lo", "throughput_step_hi"):
        runs[col] = math.nan
    runs["timed_steps"] = 0
    if steps is None or steps.empty:
        return runs
    from scipy.special import stdtrit  # Student's t quantile (scipy.stats is slow to import)

    workers = steps[(steps["role"] == "worker") & steps["timed"]]
    per_step = (workers["compute_s"] + workers["comm_s"]).groupby([workers["run_id"], workers["step"]]).max()
    stats = per_step.groupby(level="run_id").agg(["mean", "std", "count"])
    stats = stats[stats["count"] >= 2]
    half = stdtrit(stats["count"] - 1, 0.5 + STEP_LEVEL / 2) * stats["std"] / np.sqrt(stats["count"])
    at = runs["run_id"].map(lambda run_id: run_id in half.index)
    ids = runs.loc[at, "run_id"]
    mean, h = stats.loc[ids, "mean"].to_numpy(), half.loc[ids].to_numpy()
    throughput = runs.loc[at, "throughput"].to_numpy(dtype=float)
    runs.loc[at, "timed_steps"] = stats.loc[ids, "count"].to_numpy()
    runs.loc[at, "step_time_lo"] = mean - h
    runs.loc[at, "step_time_hi"] = mean + h
    runs.loc[at, "throughput_step_lo"] = throughput * mean / (mean + h)
    runs.loc[at, "throughput_step_hi"] = np.where(mean > h, throughput * mean / np.maximum(mean - h, 1e-300), np.inf)
    return runs


def link_order(runs: pd.DataFrame) -> list[str]:
    """Link labels from the slowest emulated link to the fastest, 'full speed' (not emulated) last."""
    links = runs.groupby("link")["link_bandwidth"].first().fillna(math.inf).sort_values()
    return list(links.index)


def strategy_params(run) -> dict:
    """A run's strategy parameters, from its typed param_* columns (those its strategy accepts)."""
    try:
        accepted = strategy_class(run["strategy"]).parameters()
    except ValueError:
        return {}
    params = {k: (v.item() if hasattr(v, "item") else v)
              for k in accepted if (v := run.get(f"param_{k}")) is not None and not _missing(v)}
    return params | wrapper_settings(run)


def wrapper_settings(run) -> dict:
    """The run's compression and local-SGD settings when it used them (strategies.make applies them, so the model
    prices the compressed payload; a local-SGD step is priced as a synchronizing one); {} for exact every-step runs
    and for results older than these columns."""
    def value(key, cast):
        v = run.get(key)
        return cast(v.item() if hasattr(v, "item") else v)

    out = {}
    if (run.get("compression") or "none") != "none":
        out = {"compression": value("compression", str), "powersgd_rank": value("powersgd_rank", int),
               "powersgd_start": value("powersgd_start", int),
               "powersgd_warm_start": value("powersgd_warm_start", bool),
               "topk_ratio": value("topk_ratio", float), "error_feedback": value("error_feedback", bool)}
    if (run.get("sync_every") or 1) > 1:
        out |= {"sync_every": value("sync_every", int), "outer_optimizer": value("outer_optimizer", str),
                "outer_lr": value("outer_lr", float), "outer_momentum": value("outer_momentum", float)}
    return out


def is_server(strategy: str) -> bool:
    """The strategy keeps the parameters on server ranks (a parameter server): its critical path is a server's
    NIC, which every worker's push arrives at (the incast)."""
    try:
        return strategy_class(strategy).role == SERVER
    except ValueError:
        return False


def _missing(value) -> bool:
    """NaN (a float parameter not set) or '' (a text parameter not set): the strategy's default applies."""
    return (isinstance(value, float) and math.isnan(value)) or value == ""


METRICS = ("throughput", "step_time_s", "fast_step_s", "compute_s", "comm_s", "comm_fraction", "bytes_sent_per_worker",
           "bytes_recv_per_worker", "bytes_sent_per_server", "bytes_recv_per_server",
           "analytic_bytes_sent_per_worker", "analytic_rounds", "analytic_path_bytes", "exposed_comm_s",
           "comm_busy_s", "overlap_fraction")


def mean_per_config(ok: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean metrics over the repeats (seeds) of each group, with the spread of throughput between them
    (throughput_min/max), its interval (throughput_lo/hi: that spread widened by the runs' per-step intervals
    when the runs carry them), whether any run was distorted and whether every run was simulated (deterministic).
    `by` names typed keys ("config", "condition", "workers", ...); the display columns that go with them (label,
    link) are carried along."""
    carried = [c for c in ("label", "config_label", "link", "condition_label", "strategy", "compute")
               if c not in by and c in ok]
    groups = ok.groupby(by, sort=False, dropna=False)
    agg = groups[[c for c in METRICS if c in ok]].mean(numeric_only=True)
    agg[carried] = groups[carried].first()
    agg["throughput_min"] = groups["throughput"].min()
    agg["throughput_max"] = groups["throughput"].max()
    # the interval: the spread between repeats widened by each run's per-step interval (with_step_intervals)
    agg["throughput_lo"], agg["throughput_hi"] = agg["throughput_min"], agg["throughput_max"]
    if "throughput_step_lo" in ok:
        agg["throughput_lo"] = np.fmin(agg["throughput_min"], groups["throughput_step_lo"].min().to_numpy())
        agg["throughput_hi"] = np.fmax(agg["throughput_max"], groups["throughput_step_hi"].max().to_numpy())
        agg["timed_steps"] = groups["timed_steps"].min().to_numpy()
    agg["distorted"] = groups["distorted"].any()
    agg["bypasses"] = groups["bypasses_link"].any()
    agg["runs"] = groups.size()
    # simulated (SimGrid): the same platform and timeline give the same numbers on every seed, no sampling spread
    agg["simulated"] = groups["substrate"].agg(lambda s: bool((s == "simgrid").all()))
    return agg.reset_index()
