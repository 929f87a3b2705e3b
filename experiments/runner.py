"""Run a sweep: one run at a time on Ray actors, each finished run appended to the results store.

Runs that share a world size reuse one worker group (an actor holding torch costs seconds to start), so
runs are executed grouped by world size, in file order within a group. A failing run records its error
and the sweep goes on; SIGINT/SIGTERM stop between writes, never inside one.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import platform
import signal
import sys
import time
from pathlib import Path

import pandas as pd

from experiments.group import GroupError, WorkerGroup
from experiments.ray_runtime import ensure_ray
from experiments.store import Store
from experiments.sweep import RunSpec, Sweep
from experiments.train import train


def run_sweep(sweep: Sweep, out_dir: str | Path, resume: bool = False, overwrite: bool = False,
              address: str | None = None, log=sys.stderr) -> pd.DataFrame:
    """Run every run of the sweep that is not already done; return runs.parquet as a DataFrame."""
    store = Store(out_dir)
    if not resume and not store.runs().empty:
        if not overwrite:
            raise FileExistsError(f"{store.dir} already holds results: pass --resume to complete them "
                                  f"or --overwrite to start again")
        for name in ("runs.parquet", "steps.parquet"):
            (store.dir / name).unlink(missing_ok=True)
    store.write_text("sweep.toml", sweep.source)
    done = store.done() if resume else set()
    todo = sorted((s for s in sweep.runs if s.run_id not in done), key=lambda s: s.world_size())
    print(f"sweep {sweep.name!r}: {len(sweep.runs)} runs, {len(sweep.runs) - len(todo)} already done, "
          f"results in {store.dir}", file=log)
    if not todo:
        return store.runs()

    started_ray = ensure_ray(address)
    previous = _stop_on_sigterm()
    group: WorkerGroup | None = None
    started = time.perf_counter()
    try:
        for i, spec in enumerate(todo, 1):
            world, cuda = spec.world_size(), spec.device == "cuda"
            if group is None or group.broken or group.world_size != world or group.uses_gpu != cuda:
                if group is not None:
                    group.shutdown()
                group = WorkerGroup(world, num_gpus=_gpus_per_actor(world) if cuda else 0,
                                    timeout=spec.timeout)
            eta = _eta(started, i - 1, len(todo))
            print(f"[run {i}/{len(todo)}] {spec.strategy} workers={spec.workers} {spec.workload} "
                  f"link={spec.link_label} steps={spec.steps}  (ETA sweep {eta})", file=log, flush=True)
            run_row, step_rows = _run_one(group, spec)
            store.append(run_row, step_rows)
            status = (f"{run_row['throughput']:.1f} samples/s, step {run_row['step_time_s'] * 1e3:.0f} ms, "
                      f"comm {run_row['comm_fraction'] * 100:.0f}%" if run_row["status"] == "ok"
                      else f"FAILED: {run_row['error'][:300]}")
            print(f"           -> {status}", file=log, flush=True)
    finally:
        if group is not None:
            group.shutdown()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if started_ray:
            import ray

            ray.shutdown()
    return store.runs()


def _run_one(group: WorkerGroup, spec: RunSpec) -> tuple[dict, list[dict]]:
    started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    try:
        results = group.run(train, spec, network=spec.network(), timeout=spec.timeout)
        error = ""
    except GroupError as e:
        results, error = None, str(e)
    meta = {"started_at": started_at, "duration_s": time.perf_counter() - start,
            "transport": group.backend, "gpu": group.gpu_name or "", "cores": group.cores,
            "host": group.host or platform.node()}
    return summarize(spec, results, error, meta)


def summarize(spec: RunSpec, results: list[dict] | None, error: str, meta: dict) -> tuple[dict, list[dict]]:
    """The run's row (config, status, the numbers DESIGN.md defines) and its step rows."""
    config = spec.strategy_config()
    servers = config.num_servers(spec.workers)
    row = {"run_id": spec.run_id, "sweep": spec.sweep, "workload": spec.workload, "dataset": spec.dataset,
           "image_size": spec.image_size, "batch_size": spec.batch_size, "steps": spec.steps,
           "warmup_steps": spec.warmup_steps, "device": spec.device, "seed": spec.seed, "lr": spec.lr,
           "strategy": spec.strategy, "strategy_params": json.dumps(spec.strategy_params, sort_keys=True),
           "workers": spec.workers, "servers": servers, "link": spec.link_label,
           "link_bandwidth": spec.network().default.bandwidth if spec.link else math.nan,
           "link_latency": spec.network().default.latency if spec.link else 0.0,
           "straggler": json.dumps(spec.straggler) if spec.straggler else "",
           "status": "failed" if results is None else "ok", "error": error,
           "oversubscribed": spec.workers + servers > meta["cores"] or (
               spec.device == "cuda" and spec.workers > 1 and meta.get("gpus", 1) < spec.workers),
           **meta}
    metrics = ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction", "bytes_sent_per_worker",
               "bytes_recv_per_worker", "bytes_sent_per_server", "bytes_recv_per_server",
               "analytic_bytes_sent_per_worker", "analytic_rounds", "analytic_path_bytes", "numel",
               "model_bytes", "final_loss", "param_norm", "consensus_distance", "spectral_gap", "accuracy")
    row.update({k: math.nan for k in metrics})
    if results is None:
        return row, []

    steps = pd.DataFrame([r for result in results for r in result["steps"]])
    steps.insert(0, "run_id", spec.run_id)
    workers = steps[(steps["role"] == "worker") & steps["timed"]].copy()
    servers_df = steps[(steps["role"] == "server") & steps["timed"]]
    # the group's step time is the slowest worker's compute + communication in that step
    workers["total_s"] = workers["compute_s"] + workers["comm_s"]
    slowest = workers.loc[workers.groupby("step")["total_s"].idxmax()]
    samples = workers.groupby("step")["samples"].sum()
    step_time = slowest.set_index("step")["total_s"]
    finals = [r["final"] for r in results[: spec.workers]]
    numel = int(finals[0]["numel"])
    traffic = config.traffic(spec.workers, numel, 4)
    analytic_workers = traffic.workers()
    row.update({
        "throughput": float(samples.sum() / step_time.sum()),
        "step_time_s": float(step_time.mean()),
        "compute_s": float(slowest["compute_s"].mean()),
        "comm_s": float(slowest["comm_s"].mean()),
        "comm_fraction": float(slowest["comm_s"].sum() / step_time.sum()),
        "bytes_sent_per_worker": float(workers["bytes_sent"].mean()),
        "bytes_recv_per_worker": float(workers["bytes_recv"].mean()),
        "bytes_sent_per_server": float(servers_df["bytes_sent"].mean()) if servers else math.nan,
        "bytes_recv_per_server": float(servers_df["bytes_recv"].mean()) if servers else math.nan,
        "analytic_bytes_sent_per_worker": (sum(r.bytes_sent for r in analytic_workers) / len(analytic_workers)
                                           if traffic.counted else math.nan),
        "analytic_rounds": float(traffic.rounds),
        "analytic_path_bytes": float(traffic.path_bytes),
        "numel": numel,
        "model_bytes": numel * 4,
        "final_loss": float(sum(f["loss"] for f in finals) / len(finals)),
        "param_norm": float(sum(f["param_norm"] for f in finals) / len(finals)),
        "accuracy": (float(sum(f["accuracy"] for f in finals) / len(finals))
                     if "accuracy" in finals[0] else math.nan),
    })
    if not config.exact:
        row["consensus_distance"] = float(sum(f["consensus_distance"] for f in finals) / len(finals))
        row["spectral_gap"] = float(config.spectral_gap(spec.workers))
    return row, steps.to_dict("records")


def _gpus_per_actor(world: int) -> float:
    """One GPU each when there are enough, else an equal share of the GPUs there are."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus < 1:
        raise RuntimeError("device = 'cuda' but the Ray cluster has no GPU: use device = 'cpu'")
    return 1.0 if gpus >= world else math.floor(gpus / world * 100) / 100


def _eta(started: float, finished: int, total: int) -> str:
    if finished == 0:
        return "unknown"
    left = (time.perf_counter() - started) / finished * (total - finished)
    return f"{int(left // 60)}m{int(left % 60):02d}s"


def _stop_on_sigterm():
    """SIGTERM behaves like Ctrl-C: the run in flight is abandoned, everything finished stays on disk."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        return None
