"""`syncbench simulate SWEEP.toml`: a sweep file plus a [simulate] table -> simulated runs in the results store.

The sweep is the ordinary format (experiments/config/sweep.py): its grid, strategies and `link` (each rank's
NIC bandwidth and latency, in the sweep's units) mean what they mean for a measured run. The [simulate] table
adds the platform and the compute timeline; a list value is one more grid axis:

    [simulate]
    topology = ["star", "fat_tree"]     # star | fat_tree | nodes
    oversubscription = 4                # fat_tree: 4 = 4:1 (hosts_per_leaf = 16 by default)
    network_model = "tcp"               # tcp (SimGrid's default corrections) | alpha_beta (corrections off)
    nic = "shared"                      # shared (concurrent sends share the NIC, as TCP) | fifo (one at a time)
    profile = "experiments/config/profiles/resnet50-b8-s224-cpu.json"   # or forward_s/backward_s/optimizer_s
    bucket_mb = 25                      # DDP-style buckets (leave out: one flat bucket)
    overlap = true                      # sync each bucket as soon as it is ready, while backward goes on

Rows go to runs.parquet/steps.parquet with the same columns as measured runs, `substrate = "simgrid"`, the
platform and network model named, the alpha-beta model's communication time beside the simulated one, and
`sim_wall_s` (how long simulating took). Measured bytes are checked against the analytic traffic per rank.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import itertools
import json
import math
import platform as platform_mod
import sys
from pathlib import Path

import pandas as pd

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import RunSpec
from experiments.pipeline.store import Store, default_dir
from experiments.pipeline.summary import summarize
from experiments.simulate.platform import Platform
from experiments.simulate.run import Compute, SimSpec, check_simulable, simulate_in_child

PLATFORM_KEYS = ("topology", "network_model", "nic", "hosts_per_leaf", "oversubscription", "gpus_per_node",
                 "intra_bandwidth", "intra_latency")
COMPUTE_KEYS = ("profile", "forward_s", "backward_s", "optimizer_s")
RUN_KEYS = ("bucket_mb", "overlap")
SIMULATE_KEYS = PLATFORM_KEYS + COMPUTE_KEYS + RUN_KEYS


def load(path: str | Path) -> tuple[sweep_mod.Sweep, list[tuple[RunSpec, SimSpec]]]:
    """Parse and validate the sweep and its [simulate] table; every run paired with its simulation settings."""
    data, text = sweep_mod.read_toml(path)
    table = data.pop("simulate", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: simulate = {table!r}: expected a table ([simulate])")
    unknown = sorted(set(table) - set(SIMULATE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown [simulate] key(s) {unknown}: accepted are {', '.join(SIMULATE_KEYS)}")
    sweep = sweep_mod.parse(data, source=text, where=str(path))
    axes = [(k, v if isinstance(v, list) else [v]) for k, v in table.items() if k in PLATFORM_KEYS + RUN_KEYS]
    fixed = {k: v for k, v in table.items() if k in COMPUTE_KEYS}
    pairs = []
    for spec in sweep.runs:
        check_simulable(spec.strategy)
        if not spec.link:
            raise ValueError(f"{path}: run {spec.strategy} x {spec.workers} has no link: a simulation needs each "
                             f"rank's NIC, e.g. link = {{ bandwidth = \"1Gbit\", latency = \"50us\" }}")
        if spec.link.get("ranks"):
            raise ValueError(f"{path}: per-rank link overrides are not simulated yet: accepted is one link for "
                             f"every rank")
        compute = _compute(spec, fixed, path)
        for combo in itertools.product(*[values for _, values in axes]):
            point = dict(zip([k for k, _ in axes], combo))
            plat = Platform.parse({"bandwidth": spec.link["bandwidth"], "latency": spec.link.get("latency", "0s"),
                                   **{k: v for k, v in point.items() if k in PLATFORM_KEYS}})
            pairs.append((spec, SimSpec(plat, compute, point.get("bucket_mb"), bool(point.get("overlap", False)))))
    return sweep, pairs


def _compute(spec: RunSpec, fixed: dict, where: Path) -> Compute:
    """The compute timeline: a profile (checked against the run's model and batch) or fixed seconds."""
    if "profile" in fixed:
        from workloads.profile import load_profile

        profile_path = Path(fixed["profile"])
        if not profile_path.is_absolute() and not profile_path.exists():
            profile_path = where.parent / profile_path
        profile = load_profile(profile_path)
        profile.check_run(spec.workload, spec.batch_size, spec.image_size, spec.num_classes, where=str(profile_path))
        return Compute.from_profile(profile)
    missing = [k for k in ("forward_s", "backward_s", "optimizer_s") if k not in fixed]
    if missing:
        raise ValueError(f"{where}: [simulate] needs a compute timeline: profile = \"FILE.json\" (`syncbench profile` "
                         f"writes one) or all of forward_s, backward_s, optimizer_s (missing {', '.join(missing)})")
    for key in ("forward_s", "backward_s", "optimizer_s"):
        value = fixed[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{where}: [simulate] {key} = {value!r}: accepted is a number of seconds >= 0")
    from workloads.models import param_sizes

    return Compute.fixed(float(fixed["forward_s"]), float(fixed["backward_s"]), float(fixed["optimizer_s"]),
                         tuple(param_sizes(spec.workload, spec.num_classes)))


def run_id(spec: RunSpec, sim: SimSpec) -> str:
    """The RunSpec's id plus a digest of the simulation settings (stable, so --resume works)."""
    blob = json.dumps({"platform": dataclasses.asdict(sim.platform), "compute": dataclasses.asdict(sim.compute),
                       "bucket_mb": sim.bucket_mb, "overlap": sim.overlap}, sort_keys=True)
    return f"sim-{spec.run_id}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def run_simulations(path: str | Path, out: str | Path | None = None, resume: bool = False,
                    overwrite: bool = False, log=sys.stderr) -> tuple[pd.DataFrame, Path]:
    """Simulate every run of the sweep not already done; return runs.parquet and the results directory."""
    sweep, pairs = load(path)
    if out is None:  # the sweep file's name never chooses a path outside results/
        out, note = default_dir(sweep.name)
        if note:
            print(f"syncbench simulate: {note}", file=log)
    store = Store(out)
    store.start(resume, overwrite)
    store.write_text("sweep.toml", sweep.source)
    done = store.done() if resume else set()
    todo = [(s, sim) for s, sim in pairs if run_id(s, sim) not in done]
    print(f"simulate {sweep.name!r}: {len(pairs)} runs, {len(pairs) - len(todo)} already done, results in "
          f"{store.dir}", file=log, flush=True)
    for i, (spec, sim) in enumerate(todo, 1):
        print(f"[sim {i}/{len(todo)}] {spec.strategy} workers={spec.workers} {spec.workload} "
              f"{sim.platform.label()} model={sim.platform.network_model} overlap={sim.overlap}", file=log, flush=True)
        started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        results, error, wall = simulate_in_child(spec, sim)
        row, steps = summarize_simulated(spec, sim, results, error, wall, started_at)
        store.append(row, steps)
        status = (f"step {row['step_time_s'] * 1e3:.1f} ms simulated (comm {row['comm_s'] * 1e3:.1f} ms, model "
                  f"{row['model_comm_s'] * 1e3:.1f} ms), simulated in {wall:.1f} s" if row["status"] == "ok"
                  else f"FAILED: {row['error'][:300]}")
        print(f"           -> {status}", file=log, flush=True)
    return store.runs(), store.dir


def summarize_simulated(spec: RunSpec, sim: SimSpec, results: list[dict] | None, error: str, wall: float,
                        started_at: str) -> tuple[dict, list[dict]]:
    """The run's row in the measured runs' schema (the same definitions), plus what names the simulation."""
    meta = {"started_at": started_at, "duration_s": wall, "transport": "simgrid", "gpu": "", "cores": 0,
            "host": platform_mod.node()}
    row, _ = summarize(spec, None, error, meta)  # the config columns and NaN metrics, as for any run
    rid = run_id(spec, sim)
    plat = sim.platform
    config = spec.strategy_config()
    traffic = _traffic(config, spec.workers, sim)
    link = plat.bandwidth
    row.update({"run_id": rid, "substrate": "simgrid", "sim_platform": plat.label(), "sim_topology": plat.topology,
                "sim_network_model": plat.network_model, "sim_nic": plat.nic,
                "sim_oversubscription": float(plat.oversubscription) if plat.topology == "fat_tree" else math.nan,
                "sim_gpus_per_node": plat.gpus_per_node if plat.topology == "nodes" else 0,
                "compute_source": sim.compute.source, "bucket_mb": sim.bucket_mb if sim.bucket_mb else math.nan,
                "overlap": sim.overlap, "sim_wall_s": wall, "cores_oversubscribed": False, "gpu_shared": False,
                "link_emulation": "", "compute": "profile" if sim.compute.profile_id else "fixed",
                "profile_id": sim.compute.profile_id, "profile_device": sim.compute.profile_device,
                "profile_step_s": (sim.compute.forward_s + sim.compute.backward_s + sim.compute.optimizer_s
                                   if sim.compute.profile_id else math.nan),
                "buckets": float(len(traffic["sizes"])),
                "model_comm_s": traffic["rounds"] * plat.latency + traffic["path_bytes"] / link})
    if results is None:
        return row, []
    steps = pd.DataFrame([r for result in results for r in result["steps"]])
    steps.insert(0, "run_id", rid)
    mismatch = _bytes_mismatch(steps, traffic["ranks"])
    if mismatch:
        row.update({"status": "failed", "error": mismatch})
        return row, steps.to_dict("records")
    workers = steps[(steps["role"] == "worker") & steps["timed"]].copy()
    servers = steps[(steps["role"] == "server") & steps["timed"]]
    workers["total_s"] = workers["compute_s"] + workers["comm_s"]
    slowest = workers.loc[workers.groupby("step")["total_s"].idxmax()]
    step_time = slowest.set_index("step")["total_s"]
    analytic_workers = [r for r in traffic["ranks"] if r[0] == "worker"]
    row.update({
        "status": "ok", "error": "",
        "throughput": float(workers.groupby("step")["samples"].sum().sum() / step_time.sum()),
        "step_time_s": float(step_time.mean()),
        "compute_s": float(slowest["compute_s"].mean()),
        "comm_s": float(slowest["comm_s"].mean()),
        "comm_fraction": float(slowest["comm_s"].sum() / step_time.sum()),
        "backward_end_s": float(slowest["backward_end_s"].mean()),
        "exposed_comm_s": float(slowest["comm_s"].mean()),
        "comm_busy_s": float(slowest["comm_busy_s"].mean()),
        "overlap_fraction": (float(1 - slowest["comm_s"].sum() / slowest["comm_busy_s"].sum())
                             if slowest["comm_busy_s"].sum() > 0 else math.nan),
        "bytes_sent_per_worker": float(workers["bytes_sent"].mean()),
        "bytes_recv_per_worker": float(workers["bytes_recv"].mean()),
        "bytes_sent_per_server": float(servers["bytes_sent"].mean()) if len(servers) else math.nan,
        "bytes_recv_per_server": float(servers["bytes_recv"].mean()) if len(servers) else math.nan,
        "analytic_bytes_sent_per_worker": sum(r[1] for r in analytic_workers) / len(analytic_workers),
        "analytic_rounds": float(traffic["rounds"]),
        "analytic_path_bytes": float(traffic["path_bytes"]),
        "numel": sim.compute.numel,
        "model_bytes": sim.compute.numel * 4,
        "spectral_gap": float(config.spectral_gap(spec.workers)) if not config.exact else math.nan,
    })
    return row, steps.to_dict("records")


def _traffic(config, workers: int, sim: SimSpec) -> dict:
    """The analytic traffic of one step: summed over the buckets that are synchronized (per rank)."""
    from workloads.buckets import make_buckets

    if config.role == "parameters":
        sizes = [sim.compute.numel]
    else:
        sizes = [b.numel for b in make_buckets(sim.compute.numels, sim.bucket_mb)]
    ranks, rounds, path = None, 0, 0
    for numel in sizes:
        t = config.traffic(workers, numel, 4)
        per = [(r.role, r.bytes_sent, r.bytes_recv) for r in t.ranks]
        ranks = per if ranks is None else [(a[0], a[1] + b[1], a[2] + b[2]) for a, b in zip(ranks, per)]
        rounds += t.rounds
        path += t.path_bytes
    return {"ranks": ranks, "rounds": rounds, "path_bytes": path, "sizes": sizes}


def _bytes_mismatch(steps: pd.DataFrame, analytic: list[tuple[str, int, int]]) -> str:
    """'' when every rank sent and received exactly its analytic bytes in every step, else the first miss."""
    for row in steps.itertuples():
        role, sent, recv = analytic[row.rank]
        if (row.bytes_sent, row.bytes_recv) != (sent, recv):
            return (f"rank {row.rank} step {row.step}: measured {row.bytes_sent} bytes sent / {row.bytes_recv} "
                    f"received, the analytic traffic says {sent} / {recv}")
    return ""


def format_runs(runs: pd.DataFrame) -> str:
    """The plain table `syncbench simulate` prints: simulated beside the alpha-beta model."""
    if runs.empty:
        return ""
    table = runs[["strategy", "workers", "sim_platform", "sim_network_model", "overlap", "status", "step_time_s",
                  "compute_s", "comm_s", "model_comm_s", "bytes_sent_per_worker", "sim_wall_s"]].copy()
    table["bytes_sent_per_worker"] = table["bytes_sent_per_worker"] / 1e6
    table = table.rename(columns={"sim_platform": "platform", "sim_network_model": "model", "step_time_s": "step s",
                                  "compute_s": "compute s", "comm_s": "comm s", "model_comm_s": "alpha-beta s",
                                  "bytes_sent_per_worker": "MB sent/worker", "sim_wall_s": "wall s"})
    with pd.option_context("display.width", 200, "display.max_rows", 500, "display.max_colwidth", 60,
                           "display.float_format", "{:.3f}".format):
        return table.to_string(index=False)
