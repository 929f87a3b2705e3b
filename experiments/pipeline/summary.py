"""From what every rank recorded to one row per run: the numbers DESIGN.md defines, computed once for every
substrate (measured and simulated runs alike; a substrate adds what names it through `meta`).

A run is ok only if it is honest: every worker's loss is finite (when it trains), and every rank's counted
bytes in every step equal what its strategy's `traffic()` declares for the buckets it synchronized. A strategy
that moves bytes outside the communicator must say so (`counted = False`); the run is then recorded with
bytes_counted = false, as bypassing the link the communicator emulates.
"""

from __future__ import annotations

import math

import pandas as pd

from experiments.config.sweep import RunSpec
from experiments.pipeline.trace import traced_steps
from experiments.results.schema import RUNS
from experiments.results.schema import row as schema_row


def summarize(spec: RunSpec, results: list[dict] | None, error: str, meta: dict,
              step_traffic=None) -> tuple[dict, list[dict]]:
    """The run's row (config, status, the numbers DESIGN.md defines) and its step rows.

    `step_traffic`: a run that lost ranks (experiments/pipeline/sweep_faults.py): a function of the bucket sizes
    giving {step: its declared traffic}, each step's bytes checked against its group's (its rows' ranks are
    positions in that group).

    `meta`: what the substrate knows of the run (started_at, duration_s, transport, gpu, cores, host; a
    substrate other than Ray adds `substrate` and its own columns); it overrides the row's defaults."""
    config = spec.strategy_config()
    strategy = config.unwrapped()  # the registered strategy under compression and local SGD
    servers = config.num_servers(spec.workers)
    row = _config_row(spec, config, strategy, servers, results, error, meta)
    row.update({k: math.nan for k in METRICS})
    if results is None:
        return schema_row(RUNS, **row), []

    steps = pd.DataFrame([r for result in results for r in result["steps"]])
    finals = [r["final"] for r in results[: spec.workers]]
    if finals[0].get("trained", True) and (bad_loss := _non_finite_loss(steps)):  # never an ok result
        row.update({"status": "failed", "error": bad_loss})
        return schema_row(RUNS, **row), []
    steps.insert(0, "run_id", row["run_id"])
    numel = int(finals[0]["numel"])
    traffic, per_step = _run_traffic(config, spec, steps, finals[0], numel)
    if step_traffic is not None:  # the group changed: each step's declared traffic in its group
        per_step = step_traffic(finals[0].get("bucket_numels") or [numel])
    mismatch = bytes_mismatch(steps, per_step or traffic, spec.strategy) if traffic["counted"] else ""
    mismatch = mismatch or ranks_disagree(config, spec, finals)
    if mismatch:
        row.update({"status": "failed", "error": mismatch})
        return schema_row(RUNS, **row), steps.to_dict("records")
    workers = steps[(steps["role"] == "worker") & steps["timed"]].copy()
    # the group's step time is the slowest worker's compute + communication in that step
    workers["total_s"] = workers["compute_s"] + workers["comm_s"]
    slowest = workers.loc[workers.groupby("step")["total_s"].idxmax()]
    row.update(_numbers(steps, workers, slowest, servers, traffic, finals, numel))
    row.update(_overlap_columns(slowest, finals[0]))
    barrier_free = bool(strategy.asynchronous)  # a parameter server's SSP, async or backups
    paces = workers.groupby("rank")["total_s"].mean()  # each worker's own seconds per step
    if barrier_free:
        row["fast_step_s"] = float(paces.min())
    row.update(time_to_target(spec, steps, row["step_time_s"], paces if barrier_free else None))
    if not config.exact:
        row["consensus_distance"] = float(sum(f["consensus_distance"] for f in finals) / len(finals))
        row["spectral_gap"] = float(config.spectral_gap(spec.workers))
    return schema_row(RUNS, **row), steps.to_dict("records")


METRICS = ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction", "bytes_sent_per_worker",
           "bytes_recv_per_worker", "bytes_sent_per_server", "bytes_recv_per_server",
           "analytic_bytes_sent_per_worker", "analytic_rounds", "analytic_path_bytes", "numel",
           "model_bytes", "final_loss", "param_norm", "consensus_distance", "spectral_gap", "accuracy",
           "buckets", "backward_end_s", "exposed_comm_s", "comm_busy_s", "overlap_fraction", "profile_step_s",
           "fast_step_s")  # NaN until the run's steps give them


def _config_row(spec: RunSpec, config, strategy, servers: int, results, error: str, meta: dict) -> dict:
    """The run's settings as it ran them, its status and what the substrate says (meta, which wins)."""
    network = spec.network()
    straggler = spec.straggler or {}
    return {"run_id": spec.run_id, "sweep": spec.sweep, "substrate": "ray", "workload": spec.workload,
            "dataset": spec.dataset, "image_size": spec.image_size, "batch_size": spec.batch_size,
            "steps": spec.steps, "warmup_steps": spec.warmup_steps, "device": spec.device, "seed": spec.seed,
            "repeat": spec.repeat,
            "lr": spec.lr, "strategy": spec.strategy,
            # every parameter the strategy ran with (defaults included), each a typed param_<name> column
            **{f"param_{k}": getattr(strategy, k) for k in type(strategy).parameters()},
            **spec.wrapper_settings(),  # compression and local SGD, typed columns of their own
            "workers": spec.workers, "servers": servers, "bytes_counted": bool(config.counted),
            "link_bandwidth": network.default.bandwidth if network else math.nan,
            "link_latency_s": network.default.latency if network else 0.0,
            "link_emulation": network.emulation if network else "",
            "bypasses_link": not config.counted and network is not None and network.emulation == "python",
            "link_heterogeneous": bool(network and network.overrides),
            "link_ranks": tuple(sorted(rank for rank, _ in network.overrides)) if network else (),
            "ranks_per_node": spec.ranks_per_node,
            "link_intra_bandwidth": network.intra.bandwidth if network and spec.ranks_per_node > 1 else math.nan,
            "link_intra_latency_s": network.intra.latency if network and spec.ranks_per_node > 1 else math.nan,
            **_knob_columns(spec.knob_choice),
            "straggler_ranks": tuple(straggler.get("ranks", ())),
            "straggler_slowdown": float(straggler.get("slowdown", 1.0)),
            "compute": spec.compute, "bucket_mb": spec.bucket_mb if spec.bucket_mb is not None else math.nan,
            "overlap": bool(spec.overlap), "trace_steps": traced_steps(spec), "profile_id": "", "profile_device": "",
            "status": "failed" if results is None else "ok", "error": error,
            "cores_oversubscribed": spec.workers + servers > meta["cores"],
            # GPU ranks sharing a GPU fall back from NCCL to gloo: their compute and transfers contend
            "gpu_shared": spec.device == "cuda" and spec.workers > 1 and meta["transport"] != "nccl",
            **meta}


def _non_finite_loss(steps: pd.DataFrame) -> str:
    """The first worker step whose loss is not finite, as an error; '' when every loss is."""
    worker_loss = steps.loc[steps["role"] == "worker", ["step", "rank", "loss"]]
    bad = worker_loss[~worker_loss["loss"].map(math.isfinite)]
    if bad.empty:
        return ""
    first = bad.sort_values(["step", "rank"]).iloc[0]
    return f"loss is {first['loss']} at step {int(first['step'])} on rank {int(first['rank'])}"


def _run_traffic(config, spec: RunSpec, steps: pd.DataFrame, final: dict, numel: int) -> tuple[dict, dict | None]:
    """The analytic traffic of one step (the timed steps' mean where it depends on the step) and, where it does,
    each step's."""
    numels = final.get("bucket_numels") or [numel]
    traffic = analytic_traffic(config, spec.workers, numels)
    per_step = None
    if final.get("step_bucket_numels"):  # ddp through a strategy: the buckets its reducer made, per step
        seen = final["step_bucket_numels"]
        per_step = {s: analytic_traffic(config, spec.workers, seen[min(s, len(seen) - 1)])
                    for s in sorted(set(steps["step"]))}
    elif config.step_dependent:  # compression's warm-up, local SGD's local steps: traffic depends on the step
        shapes = final.get("bucket_shapes")  # PowerSGD compresses each parameter of a bucket on its own
        per_step = {s: analytic_traffic(config, spec.workers, numels, s, shapes) for s in sorted(set(steps["step"]))}
        traffic = _mean_traffic([per_step[s] for s in sorted(set(steps.loc[steps["timed"], "step"]))], traffic)
    return traffic, per_step


def _numbers(steps: pd.DataFrame, workers: pd.DataFrame, slowest: pd.DataFrame, servers: int, traffic: dict,
             finals: list[dict], numel: int) -> dict:
    """Throughput, times, bytes (measured and analytic) and the final model's numbers over the timed steps."""
    servers_df = steps[(steps["role"] == "server") & steps["timed"]]
    samples = workers.groupby("step")["samples"].sum()
    step_time = slowest.set_index("step")["total_s"]
    analytic_workers = [sent for role, sent, _ in traffic["ranks"] if role == "worker"]
    return {
        "throughput": float(samples.sum() / step_time.sum()),
        "step_time_s": float(step_time.mean()),
        "compute_s": float(slowest["compute_s"].mean()),
        "comm_s": float(slowest["comm_s"].mean()),
        "comm_fraction": float(slowest["comm_s"].sum() / step_time.sum()),
        "bytes_sent_per_worker": float(workers["bytes_sent"].mean()),
        "bytes_recv_per_worker": float(workers["bytes_recv"].mean()),
        "bytes_sent_per_server": float(servers_df["bytes_sent"].mean()) if servers else math.nan,
        "bytes_recv_per_server": float(servers_df["bytes_recv"].mean()) if servers else math.nan,
        "analytic_bytes_sent_per_worker": (sum(analytic_workers) / len(analytic_workers)
                                           if traffic["counted"] else math.nan),
        "analytic_rounds": float(traffic["rounds"]),
        "analytic_path_bytes": float(traffic["path_bytes"]),
        "numel": numel,
        "model_bytes": numel * 4,
        "final_loss": float(sum(f["loss"] for f in finals) / len(finals)),
        "param_norm": float(sum(f["param_norm"] for f in finals) / len(finals)),
        "accuracy": (float(sum(f["accuracy"] for f in finals) / len(finals))
                     if "accuracy" in finals[0] else math.nan),
    }


def ranks_disagree(config, spec, finals: list[dict]) -> str:
    """Why the run must be recorded failed when a strategy declared exact and identical (every rank the same bits)
    leaves a worker's parameters different from rank 0's, else ''. Only where the declaration promises equal
    parameters at the end: synchronous (no staleness, no backups), averaging every step (sync_every = 1)."""
    digests = [f.get("params_digest") for f in finals]
    if not (config.exact and config.identical) or config.asynchronous \
            or getattr(spec, "sync_every", 1) != 1 or not all(digests):
        return ""
    for rank, digest in enumerate(digests):
        if digest != digests[0]:
            return (f"strategy {spec.strategy!r} is declared exact and identical, but worker rank {rank} ended with "
                    f"parameters different from rank 0's (checksum {digest} vs {digests[0]}): its synchronized "
                    f"buffers disagree")
    return ""


def analytic_traffic(config, workers: int, bucket_numels: list[int], step: int | None = None,
                     bucket_shapes: list | None = None) -> dict:
    """One step's analytic traffic: the strategy's `traffic()` summed over the buckets it synchronized (at
    `step`, its `step_traffic()` when it has one: compression's warm-up, local SGD's steps between syncs; with
    each bucket's parameter shapes, PowerSGD's per-tensor payload).

    ranks: per rank (workers, then servers) (role, bytes sent, bytes received); rounds and path_bytes summed;
    counted: whether the communicator sees these bytes at all."""
    ranks, rounds, path, counted = None, 0, 0, True
    for b, numel in enumerate(bucket_numels):
        shapes = {"shapes": bucket_shapes[b]} if bucket_shapes and step is not None else {}
        t = (config.traffic(workers, numel, 4) if step is None
             else config.step_traffic(workers, numel, 4, step, **shapes))
        per = [(r.role, r.bytes_sent, r.bytes_recv) for r in t.ranks]
        ranks = per if ranks is None else [(a[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(ranks, per)]
        rounds, path, counted = rounds + t.rounds, path + t.path_bytes, counted and t.counted
    return {"ranks": ranks or [], "rounds": rounds, "path_bytes": path, "counted": counted}


def time_to_target(spec: RunSpec, steps: pd.DataFrame, step_time_s: float,
                   paces: pd.Series | None = None) -> dict:
    """The first evaluation that meets the run's target: steps run by then, and time to target = those steps x
    seconds per step (its two factors are columns of their own).

    With a barrier (every synchronous strategy) the workers step together: the evaluation is the workers' mean at
    a step, and seconds per step the run's (its slowest rank's). Without one (a parameter server's SSP, async or
    backups: `paces`, each worker's mean seconds per step over the timed steps) the target is the servers'
    parameters', which every worker pulls and evaluates on its own clock: they reached it at the earliest of the
    workers' first evaluations that met it, each at that worker's steps x its own pace, not the slowest rank's."""
    if not spec.target:
        return {}
    metric, value = spec.target["metric"], spec.target["value"]
    out = {"target_metric": metric, "target_value": value, "eval_every": spec.eval_every, "target_reached": False,
           "steps_to_target": math.nan, "time_to_target_s": math.nan}
    if "eval_value" not in steps:
        return out
    worker_evals = steps[steps["role"] == "worker"].dropna(subset=["eval_value"])
    worker_evals = worker_evals[worker_evals["eval_value"] >= value if metric == "accuracy"
                                else worker_evals["eval_value"] <= value]
    if paces is not None:  # no barrier: the first worker, by its own clock, to hold parameters that meet it
        firsts = worker_evals.groupby("rank")["step"].min() + 1
        if not firsts.empty:
            times = firsts * paces.reindex(firsts.index)
            rank = times.idxmin()
            out.update(target_reached=True, steps_to_target=float(firsts[rank]), time_to_target_s=float(times[rank]))
        return out
    evals = steps[(steps["role"] == "worker")].groupby("step")["eval_value"].mean().dropna()
    met = evals[evals >= value] if metric == "accuracy" else evals[evals <= value]
    if not met.empty:
        reached = int(met.index[0]) + 1
        out.update(target_reached=True, steps_to_target=float(reached), time_to_target_s=reached * step_time_s)
    return out


def _mean_traffic(per_step: list[dict], fallback: dict) -> dict:
    """The average step's analytic traffic over these steps (local SGD: a sync step's bytes / H on average)."""
    if not per_step:
        return fallback
    n = len(per_step)
    ranks = [(r[0], sum(t["ranks"][i][1] for t in per_step) / n, sum(t["ranks"][i][2] for t in per_step) / n)
             for i, r in enumerate(per_step[0]["ranks"])]
    return {"ranks": ranks, "rounds": sum(t["rounds"] for t in per_step) / n,
            "path_bytes": sum(t["path_bytes"] for t in per_step) / n, "counted": per_step[0]["counted"]}


def bytes_mismatch(steps: pd.DataFrame, traffic: dict, strategy: str) -> str:
    """'' when every rank sent and received exactly its declared bytes in every step, else the first miss.
    `traffic`: one step's analytic traffic for every step, or {step: that step's} when it depends on the step."""
    for row in steps.itertuples():
        declared = traffic[row.step] if "ranks" not in traffic else traffic
        _, sent, recv = declared["ranks"][row.rank]
        if (row.bytes_sent, row.bytes_recv) != (sent, recv):
            return (f"rank {row.rank} step {row.step}: measured {row.bytes_sent:,} bytes sent / {row.bytes_recv:,} "
                    f"received, strategy {strategy!r} declares {sent:,} / {recv:,} in its traffic(): its bytes "
                    f"moved outside the communicator's counters (declare counted = False) or its traffic() is "
                    f"wrong")
    return ""


def _overlap_columns(slowest: pd.DataFrame, final: dict) -> dict:
    """Buckets and overlap: means over the slowest worker of each timed step; the profile a run replayed.

    exposed_comm_s is the communication the step waited for (= comm_s); comm_busy_s the time some bucket was in
    flight (inside a sync, or started and not yet waited for: the dedicated parameter server's pipelined
    buckets); overlap_fraction = 1 - exposed / busy, the share hidden behind backward (NaN for ddp, whose
    communication is inside the backend, and when nothing moved).
    """
    def mean(column):
        return float(slowest[column].mean()) if column in slowest else math.nan

    busy = float(slowest["comm_busy_s"].sum()) if "comm_busy_s" in slowest else math.nan
    hidden = 1 - float(slowest["comm_s"].sum()) / busy if busy > 0 else math.nan
    return {"buckets": float(final.get("buckets", 1)), "backward_end_s": mean("backward_end_s"),
            "exposed_comm_s": mean("comm_s"), "comm_busy_s": mean("comm_busy_s"),
            "overlap_fraction": min(1.0, max(0.0, hidden)) if math.isfinite(hidden) else math.nan,
            "profile_id": final.get("profile_id", ""), "profile_device": final.get("profile_device", ""),
            "profile_synthetic": bool(final.get("profile_synthetic", False)),
            "profile_step_s": float(final.get("profile_step_s", math.nan))}


def _knob_columns(choice: dict | None) -> dict:
    """The run's size knob as the model priced it (RunSpec.knob_choice), as the knob_* columns."""
    if not choice:
        return {"knob": "", "knob_chosen": False, "knob_best": math.nan, "knob_slowdown": math.nan}
    best = choice["best"]
    return {"knob": choice["knob"], "knob_chosen": bool(choice["chosen"]),
            "knob_best": float(best), "knob_slowdown": float(choice["slowdown"])}
