"""`syncbench bench --overlap`: what overlapping gradient buckets with backward buys, measured and predicted.

Profiles (resnet18, resnet50) are measured first, each on one Ray actor alone; then every strategy runs in
profile mode on 4 workers over emulated links, with overlap off (one flat bucket) and on with bucket_mb 1, 25
and one flat bucket, and the table prints the measured step time, exposed communication and overlap fraction
beside the timeline prediction (`predict_step`: the profile's timeline, each bucket's analytic traffic).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pandas as pd

import strategies
from strategies.base import PARAMETERS, SERVER
from strategies.cost import Timeline, comm_time, critical_path, overlap_timeline
from strategies.transport.link import Network
from workloads.buckets import make_buckets
from workloads.profile import Profile, load_profile, measure_profile, save_profile

# (overlap, bucket_mb) settings of the table: off with one flat bucket, on with 1 MiB, 25 MiB, one flat bucket
SETTINGS = ((False, None), (True, 1.0), (True, 25.0), (True, None))
DEFAULT_MODELS = ("resnet18", "resnet50")
DEFAULT_LINKS = ("1Gbit", "10Gbit")
DEFAULT_STRATEGIES = ("ring", "halving_doubling", "all_to_all", "reduce_broadcast", "parameter_server",
                      "decentralized", "native", "ddp")


def predict_step(profile: Profile, strategy: str, workers: int, bucket_mb: float | None, overlap: bool,
                 network: Network | None, params: dict | None = None) -> Timeline:
    """The step a profile-mode run should take: the profile's timeline, each bucket's analytic traffic over
    the emulated link (rounds x latency + critical-path bytes / bandwidth), buckets in order.

    A parameter server's workers run no optimizer (the servers do; their update is not in the model), and
    decentralized averaging follows the local step. Without an emulated link the communication is free here.
    """
    config = strategies.make(strategy, **(params or {}))
    buckets = make_buckets(profile.numels, bucket_mb, profile.itemsize)
    timed = []
    for bucket in buckets:
        ready = max(profile.params[i].ready_s for i in bucket.params)
        # a parameter server too: its partitions stream full duplex, so one sync's critical path (traffic(): the
        # busiest link, a worker's M or a server's n M / k, plus one partition's fan-out) is also its step's in
        # training (the next step's pushes wait for this step's compute)
        rounds, path_bytes, _ = critical_path(strategy, workers, bucket.numel, params, profile.itemsize)
        comm = 0.0 if network is None or workers == 1 else comm_time(rounds, path_bytes, network.default.bandwidth,
                                                                      network.default.latency)
        timed.append((ready, comm))
    optimizer = 0.0 if config.role == SERVER else profile.optimizer_s
    return overlap_timeline(profile.forward_s, profile.backward_s, optimizer, timed,
                            overlap=overlap and config.role != PARAMETERS, after_step=config.role == PARAMETERS)


def _measure_on_rank(ctx, model, batch_size, image_size):
    return measure_profile(model, batch_size, image_size, ctx.device).as_dict()


def measure_profiles(models, batch_size: int, image_size: int, out_dir: Path) -> dict[str, Path]:
    """Each model's profile measured on one worker actor alone (1 thread, the workers' allocator settings)."""
    from experiments.cluster.group import WorkerGroup
    from workloads.profile import profile_from_dict

    paths = {}
    with WorkerGroup(1) as group:
        for model in models:
            profile = profile_from_dict(group.run(_measure_on_rank, model, batch_size, image_size)[0])
            paths[model] = save_profile(profile, out_dir / f"{profile.id}.json")
    return paths


def overlap_bench(models=DEFAULT_MODELS, links=DEFAULT_LINKS, names=DEFAULT_STRATEGIES, workers: int = 4,
                  batch_size: int = 16, image_size: int = 32, steps: int = 4, warmup_steps: int = 1,
                  out: str | Path | None = None, address: str | None = None, log=None) -> pd.DataFrame:
    """Run the grid in profile mode; one row per run with measured and predicted step times."""
    from experiments.cluster.ray_runtime import ensure_ray, stop_ray
    from experiments.config.sweep import parse
    from experiments.pipeline.runner import run_sweep

    out_dir = Path(out) if out else Path(tempfile.mkdtemp(prefix="syncbench-overlap-"))
    started = ensure_ray(address, num_cpus=max(workers + 1, 2))
    try:
        paths = measure_profiles(models, batch_size, image_size, out_dir / "profiles")
        rows = []
        for model, path in paths.items():
            profile = load_profile(path)
            for overlap, bucket_mb in SETTINGS:
                defaults = {"workload": model, "batch_size": batch_size, "image_size": image_size, "steps": steps,
                            "warmup_steps": warmup_steps, "workers": workers, "compute": "profile",
                            "profile": str(path), "overlap": overlap}
                if bucket_mb is not None:
                    defaults["bucket_mb"] = bucket_mb
                sweep = parse({"name": f"overlap-{model}", "defaults": defaults,
                               "grid": {"strategy": list(names), "link": [_link(link) for link in links]},
                               "strategy_params": {"parameter_server": {"servers": 1}}})
                tag = f"{model}-{'on' if overlap else 'off'}-{bucket_mb or 'flat'}"
                runs = run_sweep(sweep, out_dir / tag, overwrite=True, address=address, **({"log": log} if log else {}))
                for _, run in runs.iterrows():
                    rows.append(_row(run, profile, bucket_mb, workers))
        # ddp always overlaps and decentralized never does: their runs repeat across settings; keep one
        table = pd.DataFrame(rows).drop_duplicates(["model", "link", "strategy", "overlap", "bucket_mb"])
        return table.reset_index(drop=True)
    finally:
        if started:
            stop_ray()


def _link(text: str):
    return "none" if text in ("none", "full speed") else {"bandwidth": text, "latency": "50us"}


def _row(run, profile: Profile, bucket_mb: float | None, workers: int) -> dict:
    network = Network.from_spec(_link_spec(run))
    predicted = predict_step(profile, run["strategy"], workers, bucket_mb, bool(run["overlap"]), network,
                             {"servers": 1} if run["strategy"] == "parameter_server" else None)
    counted = strategies.get(run["strategy"]).counted
    return {"model": profile.model, "link": run["link"], "strategy": run["strategy"],
            "overlap": "on" if run["overlap"] else "off",
            "bucket_mb": "flat" if bucket_mb is None else f"{bucket_mb:g}",
            "buckets": int(run["buckets"]) if run["status"] == "ok" else 0, "step_ms": run["step_time_s"] * 1e3,
            "predicted_ms": predicted.step_s * 1e3 if counted or network is None else math.nan,
            "exposed_ms": run["exposed_comm_s"] * 1e3, "busy_ms": run["comm_busy_s"] * 1e3,
            "overlap_fraction": run["overlap_fraction"], "status": run["status"]}


def _link_spec(run) -> dict | None:
    if not run["link_bandwidth"] == run["link_bandwidth"]:  # NaN: full speed
        return None
    return {"bandwidth": float(run["link_bandwidth"]), "latency": float(run["link_latency_s"])}


def format_overlap(table: pd.DataFrame) -> str:
    """The plain table: one line per model, link, strategy and setting."""
    lines = ["# profile mode, 4 workers; step and exposed communication: mean over timed steps of the slowest "
             "worker; predicted: the profile's timeline + each bucket's analytic traffic (ms; - where the backend "
             "hides its bytes from the emulated link)",
             f"{'model':>9} {'link':>12} {'strategy':>17} {'overlap':>7} {'bucket_mb':>9} {'buckets':>7} "
             f"{'step(ms)':>9} {'pred(ms)':>9} {'exposed(ms)':>11} {'busy(ms)':>9} {'overlap':>7}"]
    for _, r in table.iterrows():
        pred = "-" if not r["predicted_ms"] == r["predicted_ms"] else f"{r['predicted_ms']:.1f}"
        busy = "-" if not r["busy_ms"] == r["busy_ms"] else f"{r['busy_ms']:.1f}"
        frac = "-" if not r["overlap_fraction"] == r["overlap_fraction"] else f"{r['overlap_fraction']:.2f}"
        lines.append(f"{r['model']:>9} {r['link']:>12} {r['strategy']:>17} {r['overlap']:>7} {r['bucket_mb']:>9} "
                     f"{r['buckets']:>7} {r['step_ms']:>9.1f} {pred:>9} {r['exposed_ms']:>11.1f} {busy:>9} {frac:>7}")
    return "\n".join(lines)
