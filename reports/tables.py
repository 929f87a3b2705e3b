"""The report's numbers as pandas tables, from the results schema's typed columns (no plotting, no HTML).

Everything a figure or a sentence of the report shows is computed here, once: loading, means over repeats,
the n = 1 baseline, the best strategy and why, the bandwidth requirement, the alpha-beta calibration and
whether it is plausible, convergence and straggler frames.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from reports.model import MB, TARGET_EFFICIENCIES, bandwidth_needed, calibrate, critical_path
from experiments.results.dataset import has_results, read_runs, read_steps
from experiments.results.schema import link_label
from strategies import get as strategy_class
from strategies import make as make_strategy
from strategies import names as strategy_names

REQUIREMENT_WORKERS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# A fit is implausible when its bandwidth is this far from the emulated link's, or its residuals this large.
PLAUSIBLE_BANDWIDTH_RATIO = 2.0
PLAUSIBLE_RMSE_SHARE = 0.25


# ---- loading -----------------------------------------------------------------------------------------------

def load_runs(results_dir: Path) -> pd.DataFrame:
    """runs.parquet in the schema's types, plus: label, distorted (cores oversubscribed or a GPU shared), ok."""
    if not has_results(results_dir):
        raise FileNotFoundError(f"no runs.parquet in {str(results_dir)!r} and no runs/ dataset: run a sweep there "
                                f"first (syncbench run SWEEP.toml)")
    runs = read_runs(results_dir)  # every run's latest attempt, typed, display labels derived (either layout)
    if runs.empty:
        raise ValueError(f"{str(results_dir)!r} has no runs: nothing to report")
    runs["label"] = runs["strategy_label"].where(runs["strategy_label"] != "", runs["strategy"])
    # runs with and without overlap (or with other bucket sizes) are different configurations, never averaged
    if runs["bucket_mb"].nunique(dropna=False) > 1:
        runs["label"] += runs["bucket_mb"].map(lambda mb: "" if mb != mb else f" {mb:g}MiB")
    if runs["overlap"].nunique() > 1:
        runs["label"] += runs["overlap"].map(lambda on: " +overlap" if on else "")
    # a replayed profile and the model computing for real are different machines: never averaged, and each
    # scales against its own single worker (per_worker_baseline)
    if runs["compute"].nunique() > 1:
        runs["label"] += np.where(runs["compute"] == "profile", " [profile]", "")
    runs["distorted"] = runs["cores_oversubscribed"] | runs["gpu_shared"]
    # a simulated run never averages with a measured one of the same strategy
    runs["label"] += np.where(runs["substrate"] == "simgrid", " [simulated]", "")
    runs["ok"] = runs["status"] == "ok"
    return runs


def load_steps(results_dir: Path) -> pd.DataFrame | None:
    """steps.parquet in the schema's types, or None when the sweep did not record steps."""
    steps = read_steps(results_dir)
    return None if steps.empty else steps


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


def not_emulated(ok: pd.DataFrame) -> pd.Series:
    """Runs whose bytes bypassed an emulated link: a backend's own bytes (not counted) under python emulation.
    On a kernel-shaped link they cross the shaped NICs like every other strategy's."""
    return ~ok["bytes_counted"] & (ok["link_emulation"] == "python")


def strategy_params(run) -> dict:
    """A run's strategy parameters, from its typed param_* columns (those its strategy accepts)."""
    try:
        accepted = strategy_class(run["strategy"]).parameters()
    except ValueError:
        return {}
    return {k: (v.item() if hasattr(v, "item") else v)
            for k in accepted if (v := run.get(f"param_{k}")) is not None and not _missing(v)}


def _missing(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


# ---- means and baselines ----------------------------------------------------------------------------------

def mean_per_config(ok: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Mean metrics over repeats of one configuration (seeds), remembering whether any run was distorted."""
    metrics = [c for c in ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction",
                           "bytes_sent_per_worker", "bytes_recv_per_worker", "bytes_sent_per_server",
                           "bytes_recv_per_server", "analytic_bytes_sent_per_worker", "analytic_rounds",
                           "analytic_path_bytes", "exposed_comm_s", "comm_busy_s", "overlap_fraction") if c in ok]
    agg = ok.groupby(by, sort=False)[metrics].mean(numeric_only=True)
    agg["distorted"] = ok.groupby(by, sort=False)["distorted"].any()
    agg["runs"] = ok.groupby(by, sort=False).size()
    return agg.reset_index()


def per_worker_baseline(ok: pd.DataFrame) -> pd.DataFrame:
    """Throughput per worker of the baseline per (workload, link, compute mode): the single worker with nothing
    to synchronize (every strategy's n = 1 run, averaged), else the smallest n the sweep has. Per compute mode:
    a profile-mode run scales against a profile-mode single worker, a real one against a real one."""
    rows = []
    for (workload, link, compute), g in ok.groupby(["workload", "link", "compute"], sort=False):
        n0 = g["workers"].min()
        rows.append({"workload": workload, "link": link, "compute": compute, "n0": n0,
                     "per_worker": g.loc[g["workers"] == n0, "throughput"].mean() / n0})
    return pd.DataFrame(rows, columns=["workload", "link", "compute", "n0", "per_worker"])


def scaling_efficiency(ok: pd.DataFrame) -> pd.DataFrame:
    """efficiency(n) = throughput(n) / (n x throughput(1)) per workload, link, compute mode, strategy and n; 1.0
    at n = 1 by definition (the baseline is the single worker of that compute mode, whichever strategy it was
    launched under)."""
    agg = mean_per_config(ok, ["workload", "link", "compute", "label", "workers"])
    agg = agg.merge(per_worker_baseline(ok), on=["workload", "link", "compute"])
    agg["efficiency"] = agg["throughput"] / (agg["workers"] * agg["per_worker"])
    agg.loc[agg["workers"] == agg["n0"], "efficiency"] = 1.0
    return agg


def compute_time_per_workload(ok: pd.DataFrame) -> dict[str, tuple[float, str]]:
    """workload -> (Ts, how it was measured): the median compute time of its fewest-worker undistorted runs."""
    out = {}
    for workload, g in ok.groupby("workload", sort=False):
        clean = g[~g["distorted"]] if (~g["distorted"]).any() else g
        n0 = clean["workers"].min()
        ts = float(clean.loc[clean["workers"] == n0, "compute_s"].median())
        out[workload] = (ts, f"median compute time of the {n0}-worker runs")
    return out


def strategy_specs(ok: pd.DataFrame) -> tuple[list[tuple[str, str, dict]], list[str]]:
    """(label, name, params) of the measured strategies the registry can model; 'label: why' of the others."""
    known = set(strategy_names())
    specs, skipped = [], []
    for label, g in ok.groupby("label", sort=False):
        run = g.iloc[0]
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


# ---- the answer: best strategy per configuration ----------------------------------------------------------

def best_strategies(ok: pd.DataFrame, links: list[str]) -> pd.DataFrame:
    """The fastest strategy per (workload, workers > 1, link), by mean throughput, its lead over the next, and
    the runner-up. A single worker has nothing to synchronize, so n = 1 is left out; a backend's own
    allreduce on a python-emulated link ran at full speed (its bytes never pass the emulation): it cannot win."""
    multi = ok[(ok["workers"] > 1) & ~not_emulated(ok)]
    agg = mean_per_config(multi, ["workload", "workers", "link", "label"])
    rows = []
    for (workload, workers, link), g in agg.groupby(["workload", "workers", "link"]):
        g = g.sort_values("throughput", ascending=False)
        best, runner_up = g.iloc[0], (g.iloc[1] if len(g) > 1 else None)
        rows.append({"workload": workload, "workers": int(workers), "link": link, "best strategy": best["label"],
                     "samples/s": best["throughput"], "step time s": best["step_time_s"],
                     "comm share %": best["comm_fraction"] * 100,
                     "lead over next %": (best["throughput"] / runner_up["throughput"] - 1) * 100
                     if runner_up is not None else math.nan,
                     "next": runner_up["label"] if runner_up is not None else "",
                     "distorted": "yes" if best["distorted"] else "",
                     "_best": best, "_next": runner_up})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["_link"] = df["link"].map({link: i for i, link in enumerate(links)})
    return df.sort_values(["workload", "_link", "workers"]).drop(columns="_link")


def verdicts(best: pd.DataFrame) -> list[str]:
    """For each workload and link at its largest worker count, one sentence a person can act on: which strategy
    wins, by how much, and why (rounds and bytes on the critical path, the strategies' analytic traffic)."""
    out = []
    if best.empty:
        return out
    for (workload, link), g in best.groupby(["workload", "link"], sort=False):
        row = g.loc[g["workers"].idxmax()]
        winner, runner_up = row["_best"], row["_next"]
        sentence = f"{workload} on {link}, {row['workers']} workers: use {row['best strategy']}"
        if runner_up is None:
            out.append(sentence + " (the only strategy measured).")
            continue
        sentence += (f", {winner['throughput'] / runner_up['throughput']:.2f}x the throughput of the next best, "
                     f"{runner_up['label']} ({winner['throughput']:,.1f} vs {runner_up['throughput']:,.1f} "
                     f"samples/s)")
        why = _why(winner, runner_up)
        out.append(sentence + (f": {why}." if why else ".") + (" Distorted by contention for the machine: see "
                                                                "the notes." if row["distorted"] else ""))
    return out


def _why(winner, runner_up) -> str:
    """The critical-path difference that explains a win (or says that compute, not communication, decided)."""
    parts = []
    w_bytes, r_bytes = winner["analytic_path_bytes"], runner_up["analytic_path_bytes"]
    w_rounds, r_rounds = winner["analytic_rounds"], runner_up["analytic_rounds"]
    if not (math.isfinite(w_bytes) and math.isfinite(r_bytes)):
        return ""
    if w_bytes < r_bytes:
        parts.append(f"{w_bytes / MB:,.1f} MB on its critical path against {r_bytes / MB:,.1f} MB")
    if w_rounds < r_rounds:
        parts.append(f"{w_rounds:.0f} message rounds against {r_rounds:.0f}")
    if not parts:
        w_comm, r_comm = winner["comm_s"], runner_up["comm_s"]
        return (f"it moves as many or more bytes in as many or more rounds, yet spent {w_comm * 1e3:,.1f} ms "
                f"communicating per step against {r_comm * 1e3:,.1f} ms (the measured transport, not the model, "
                f"decided)")
    return "it moves " + " and ".join(parts)


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
                try:
                    rounds, path_bytes, _ = critical_path(name, n, numel, params)
                except (ValueError, NotImplementedError):
                    continue  # the strategy cannot run on n workers
                for p in TARGET_EFFICIENCIES:
                    s = bandwidth_needed(path_bytes, ts[workload][0], p)
                    rows.append({"workload": workload, "label": label, "workers": n, "target": f"P = {p:g}",
                                 "MB/s": s / MB if math.isfinite(s) else math.nan})
    return pd.DataFrame(rows)


# ---- cost model -----------------------------------------------------------------------------------------

def calibration(ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per link, alpha and beta fitted to the measured comm time, whether the fit is plausible and, if not,
    the likely cause; and each run's predicted comm time."""
    usable = ok.dropna(subset=["analytic_rounds", "analytic_path_bytes", "comm_s"])
    usable = usable[(usable["workers"] > 1) & ~not_emulated(usable)]
    fits, predicted = [], []
    for link, g in usable.groupby("link", sort=False):
        fit = calibrate(g["analytic_rounds"], g["analytic_path_bytes"], g["comm_s"])
        link_bw = g["link_bandwidth"].iloc[0]
        problem = _implausible(fit, link_bw, float(g["comm_s"].mean()), bool(g["distorted"].any()))
        fits.append({"link": link, "runs": fit.runs, "alpha us": fit.alpha * 1e6,
                     "fitted MB/s": fit.bandwidth / MB if math.isfinite(fit.bandwidth) else math.nan,
                     "link MB/s": link_bw / MB, "rmse ms": fit.rmse * 1e3,
                     "plausible": "no" if problem else "yes", "why not": problem,
                     "alpha": fit.alpha, "beta": fit.beta})
        predicted.append(g.assign(predicted_s=fit.predict(g["analytic_rounds"], g["analytic_path_bytes"])))
    return pd.DataFrame(fits), (pd.concat(predicted) if predicted else usable.assign(predicted_s=[]))


def _implausible(fit, link_bandwidth: float, mean_comm_s: float, distorted: bool) -> str:
    """'' for a fit that describes the link; else what is wrong and its likely cause."""
    problems = []
    if math.isfinite(link_bandwidth) and link_bandwidth > 0:
        ratio = fit.bandwidth / link_bandwidth if math.isfinite(fit.bandwidth) else math.inf
        if not 1 / PLAUSIBLE_BANDWIDTH_RATIO <= ratio <= PLAUSIBLE_BANDWIDTH_RATIO:
            problems.append(f"fitted bandwidth {ratio:.2g}x the emulated link's")
    if mean_comm_s > 0 and fit.rmse > PLAUSIBLE_RMSE_SHARE * mean_comm_s:
        problems.append(f"residuals {fit.rmse / mean_comm_s:.0%} of the mean communication time")
    if fit.runs < 3:
        problems.append(f"only {fit.runs} run(s) to fit two parameters")
    if not problems:
        return ""
    cause = ("more ranks than cores: communication waits on ranks still computing" if distorted else
             "the transport's own costs (per-message overhead, loopback bandwidth), not the link, dominate")
    return "; ".join(problems) + f"; likely cause: {cause}"


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
    df = ok.copy()
    keys = [imbalance(run) for _, run in df.iterrows()]
    df["order"] = [k for k, _ in keys]
    df["imbalance"] = [label for _, label in keys]
    df["_bandwidth"] = df["link_bandwidth"].fillna(-1.0)
    keys = ["workload", "label", "workers", "_bandwidth", "link_latency_s"]  # a slow NIC vs its uniform network
    balanced = df[df["imbalance"] == "balanced"].groupby(keys)["throughput"].mean()
    df["relative"] = [t / balanced.get(k, math.nan)
                      for t, k in zip(df["throughput"], df[keys].itertuples(index=False, name=None))]
    return df.drop(columns="_bandwidth").sort_values(["order", "imbalance"])


# ---- the runs table -------------------------------------------------------------------------------------

RUN_COLUMNS = {  # runs.parquet column -> runs-table heading
    "run_id": "run", "workload": "workload", "label": "strategy", "workers": "workers", "servers": "servers",
    "link": "link", "compute": "compute", "status": "status", "throughput": "samples/s", "step_time_s": "step s",
    "compute_s": "compute s", "comm_s": "comm s", "comm_fraction": "comm share",
    "bytes_sent_per_worker": "sent MB/worker", "bytes_recv_per_worker": "recv MB/worker",
    "final_loss": "final loss", "accuracy": "test accuracy", "distorted": "distorted", "seed": "seed",
    "error": "error",
}


def runs_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Every run, failed ones included, with the runs table's headings and units (MB = 10^6 bytes)."""
    df = runs[[c for c in RUN_COLUMNS if c in runs]].copy()
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
    agg = mean_per_config(multi, ["workload", "link", "workers", "label", "compute", "overlap", "buckets_of"])
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
    # the same link but for who shapes it, from the typed columns (never parsed back from the display label)
    both["bandwidth"] = [link_label(b, lat, het, "") for b, lat, het in
                         zip(both["link_bandwidth"], both["link_latency_s"], both["link_heterogeneous"])]
    agg = mean_per_config(both, ["workload", "workers", "label", "bandwidth", "link_emulation"])
    wide = agg.pivot_table(index=["workload", "workers", "label", "bandwidth"], columns="link_emulation",
                           values="comm_s").dropna().reset_index()
    if wide.empty:
        return pd.DataFrame()
    hidden = set(ok.loc[~ok["bytes_counted"], "label"])
    return pd.DataFrame({
        "workload": wide["workload"], "workers": wide["workers"], "strategy": wide["label"],
        "link": wide["bandwidth"], "comm s, python": wide["python"], "comm s, kernel": wide["kernel"],
        "python / kernel": wide["python"] / wide["kernel"],
        "note": wide["label"].map(lambda label: "python: not slowed (the backend's bytes bypass the communicator)"
                                  if label in hidden else ""),
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
    keys = ["workload", "strategy_label", "workers", "link"]
    measured_comm = measured.groupby(keys + ["overlap"])["comm_s"].mean()
    rows = []
    for key, g in simulated.groupby(keys + ["sim_platform", "sim_network_model", "overlap"], sort=False):
        run = g.iloc[0]
        modelled = run["model_comm_s"]
        if not math.isfinite(modelled) and math.isfinite(run["link_bandwidth"]):
            try:
                rounds, path_bytes, _ = critical_path(run["strategy"], int(run["workers"]), int(run["numel"]),
                                                      strategy_params(run))
                modelled = rounds * run["link_latency_s"] + path_bytes / run["link_bandwidth"]
            except (ValueError, NotImplementedError):
                modelled = math.nan
        rows.append({"workload": key[0], "strategy": key[1], "workers": int(key[2]), "link": key[3],
                     "platform": key[4], "network model": key[5], "overlap": "on" if key[6] else "off",
                     "measured comm ms": measured_comm.get((*key[:4], key[6]), math.nan) * 1e3,
                     "simulated comm ms": g["comm_s"].mean() * 1e3,
                     "simulated step ms": g["step_time_s"].mean() * 1e3,
                     "modelled comm ms": modelled * 1e3})
    return pd.DataFrame(rows).sort_values(["workload", "link", "workers", "strategy"]).reset_index(drop=True)
