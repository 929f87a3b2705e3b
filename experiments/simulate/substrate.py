"""The simulated substrate: every rank a SimGrid actor on a simulated platform, compute replayed from a timeline
on the simulated clock, through the measured runs' own step loop (experiments/pipeline/train.py: run_steps).

`syncbench simulate SWEEP.toml` reads the ordinary sweep format (experiments/config/sweep.py): its grid,
strategies, stragglers and `link` (each rank's NIC bandwidth and latency, in the sweep's units) mean what they
mean for a measured run. A [simulate] table adds the platform and the compute timeline; a list value is one
more grid axis:

    [simulate]
    topology = ["star", "fat_tree"]     # star | fat_tree | nodes
    oversubscription = 4                # fat_tree: 4 = 4:1 (hosts_per_leaf = 16 by default)
    network_model = "tcp"               # tcp (SimGrid's default corrections) | alpha_beta (corrections off)
    nic = "shared"                      # shared (concurrent sends share the NIC, as TCP) | fifo (one at a time)
    profile = "experiments/config/profiles/resnet50-b8-s224-cpu.json"   # or forward_s/backward_s/optimizer_s
    bucket_mb = 25                      # DDP-style buckets (leave out: the sweep's bucket_mb)
    overlap = true                      # sync each bucket as soon as it is ready, while backward goes on

Without a timeline in [simulate], a run with compute = "profile" and a profile file replays that file.
Payloads are `meta` tensors of the real size (strategies/transport/simgrid.py): no values move, every byte is
counted and simulated, and the summary fails a run whose bytes differ from its strategy's traffic(). Rows go
to the results store with the measured runs' columns, `substrate = "simgrid"`, the platform and network
model named, the alpha-beta model's communication time beside the simulated one and `sim_wall_s` (how long
simulating took). Each simulation runs in a forked process: SimGrid's engine is one per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import math
import platform as platform_mod
import sys
from dataclasses import dataclass
from pathlib import Path

from experiments.config import sweep as sweep_mod
from experiments.config.sweep import RunSpec
from experiments.pipeline.substrate import Run, Substrate, now_utc
from experiments.pipeline.summary import summarize
from experiments.pipeline.trace import run_events
from experiments.pipeline.train import run_steps, server_loop, worker_role
from experiments.simulate.child import ChildRun, run_child, run_in_child, run_in_child_timed  # noqa: F401 - callers' path
from experiments.simulate.compute import SimulatedCompute, SimulatedUpdate, Timeline, param_shapes_of  # noqa: F401
from experiments.simulate.platform import Platform
from strategies import cost

PLATFORM_KEYS = ("topology", "network_model", "nic", "hosts_per_leaf", "oversubscription", "gpus_per_node",
                 "intra_bandwidth", "intra_latency")
COMPUTE_KEYS = ("profile", "forward_s", "backward_s", "optimizer_s")
RUN_KEYS = ("bucket_mb", "overlap")
SIMULATE_KEYS = PLATFORM_KEYS + COMPUTE_KEYS + RUN_KEYS
# SimGrid's Python actors are OS threads: the machine's thread and pid limits (pid_max is 32,768 by default) bound
# a simulation's actors well before memory does; 16,384 leaves the rest of the machine room
MAX_ACTORS = 16_384


def simulated_actors(spec: RunSpec, config) -> int:
    """The SimGrid actors a run needs: one per rank. (A parameter server without a global barrier serves all its
    workers from its one actor: strategies/parameter_server_async.py, ShardServer._run_interleaved; with several
    buckets one more per server checks their sizes beside it during the first step, not counted here.)"""
    return config.world_size(spec.workers)


@dataclass(frozen=True)
class SimSpec:
    """What one simulated run needs beside the RunSpec: the platform, the timeline, and the [simulate] table's
    buckets and overlap (None / False: the sweep's own)."""

    platform: Platform
    timeline: Timeline
    bucket_mb: float | None = None
    overlap: bool = False


# -- the substrate ------------------------------------------------------------------------------------------


class SimGridSubstrate(Substrate):
    name = "simgrid"
    failures_refusal = ("SimGrid 3.32's Python binding cannot turn a host off inside a simulated collective, which its "
                        "transport would not survive either; `syncbench faults --simulate` notices failures at step "
                        "boundaries and composes them over the simulated steps")
    heading, verb = "simulate", "sim"
    backend_allreduce = False  # no gloo/NCCL inside: a counted = False strategy's bytes would be invisible
    model_wrappers = False  # no torch.distributed ranks
    servers = True
    stragglers = True  # the simulated clock scales the straggler's compute
    wall_clock = False  # simulated seconds: a long timeline costs no wall time
    nodes = True  # ranks_per_node = k: the `nodes` platform, k ranks behind one NIC (load() places them)
    max_memory: int | None = None  # bytes a simulation may reach (--max-memory); None: what the machine has

    def __init__(self, pairs: list[tuple[RunSpec, SimSpec]], max_memory: int | None = None):
        self.pairs = pairs
        self.max_memory = max_memory  # bytes a simulation may reach (--max-memory); None: what the machine has

    def runs(self, sweep=None) -> list[Run]:
        return [Run(run_id(spec, sim), _effective(spec, sim), sim) for spec, sim in self.pairs]

    def problems(self, run: Run) -> list[str]:
        found = super().problems(run)
        spec = run.spec
        what = f"run {spec.strategy} x {spec.workers} workers"
        if not spec.link:
            found.append(f"{what} has no link: a simulation needs each rank's NIC, e.g. link = {{ bandwidth = "
                         f"\"1Gbit\", latency = \"50us\" }}")
        elif spec.link.get("ranks"):
            found.append(f"{what}: per-rank link overrides are not simulated yet: accepted is one link for every rank")
        elif spec.link.get("emulation", "python") != "python":
            found.append(f"{what}: link emulation = {spec.link['emulation']!r}: the simulated platform is the "
                         f"network; leave emulation out")
        actors = simulated_actors(spec, spec.strategy_config())
        if actors > MAX_ACTORS:
            found.append(f"{what}: {actors:,} SimGrid actors (each an OS thread, one per rank) exceed this "
                         f"simulator's {MAX_ACTORS:,}; accepted: at most {MAX_ACTORS:,} ranks (workers and "
                         f"dedicated servers)")
        elif refused := self.memory_refusal(run, actors):
            found.append(f"{what}: {refused}")
        if spec.device != "cpu":
            found.append(f"{what}: device = {spec.device!r}: a simulated rank computes on its timeline; accepted is "
                         f"device = \"cpu\" (the default)")
        if spec.compression != "none":
            found.append(f"{what}: compression = {spec.compression!r} computes on the gradients' values (top-k picks "
                         f"by them, PowerSGD orthogonalizes them), and a simulated rank's buffers hold none (meta "
                         f"tensors of the real size); accepted: compression = 'none' (the model prices compression: "
                         f"`syncbench model`)")
        if spec.dataset != "synthetic":
            found.append(f"{what}: dataset = {spec.dataset!r}: a simulated run moves no values, so nothing trains; "
                         f"accepted is dataset = \"synthetic\" (the default)")
        return found

    def memory_refusal(self, run: Run, actors: int) -> str | None:
        """Why the run's simulation would not fit in memory (experiments/simulate/memory.py), or None. The ranks
        alone first: a run refused by them is refused without pricing its messages."""
        from experiments.simulate import memory

        refused = memory.refusal(memory.estimate(actors, 0), self.max_memory, "its simulation")
        if refused:
            return refused
        config = run.spec.strategy_config()
        try:
            traffic = config.traffic(run.spec.workers, run.settings.timeline.numel, 4)
        except Exception:  # noqa: BLE001 - a strategy's own traffic error is reported where it is checked
            return None
        messages = sum(r.msgs_sent for r in traffic.ranks)
        return memory.refusal(memory.estimate(actors, messages), self.max_memory, "its simulation")

    @contextlib.contextmanager
    def session(self, runs: list[Run], store, log):
        yield self._execute

    def _execute(self, run: Run) -> tuple[dict, list[dict]]:
        started_at = now_utc()
        results, error, wall = simulate_in_child(run.spec, run.settings)
        row, steps = summarize_simulated(run.spec, run.settings, results, error, wall, started_at, run.run_id)
        return row, steps, run_events(row["run_id"], results)

    def describe(self, run: Run) -> str:
        spec, sim = run.spec, run.settings
        straggler = (f" straggler=ranks {spec.straggler['ranks']} x{spec.straggler['slowdown']:g}"
                     if spec.straggler else "")
        return (f"{spec.strategy} workers={spec.workers} {spec.workload} {sim.platform.label()} "
                f"model={sim.platform.network_model} overlap={spec.overlap}{straggler}")

    def outcome(self, row: dict) -> str:
        if row["status"] != "ok":
            return f"FAILED: {row['error'][:300]}"
        return (f"step {row['step_time_s'] * 1e3:.1f} ms simulated (comm {row['comm_s'] * 1e3:.1f} ms, model "
                f"{row['model_comm_s'] * 1e3:.1f} ms), simulated in {row['sim_wall_s']:.1f} s")


def _effective(spec: RunSpec, sim: SimSpec) -> RunSpec:
    """The RunSpec as simulated: the [simulate] table's buckets and overlap where it sets them (a role that
    never overlaps, decentralized averaging, records overlap = false as the sweep does)."""
    bucket_mb = sim.bucket_mb if sim.bucket_mb is not None else spec.bucket_mb
    overlap = (sim.overlap or spec.overlap) and worker_role(spec.strategy_config()).overlaps
    return dataclasses.replace(spec, bucket_mb=bucket_mb, overlap=bool(overlap))


def run_id(spec: RunSpec, sim: SimSpec) -> str:
    """The RunSpec's id plus a digest of the simulation settings (stable, so --resume works)."""
    blob = json.dumps({"platform": dataclasses.asdict(sim.platform), "compute": dataclasses.asdict(sim.timeline),
                       "bucket_mb": sim.bucket_mb, "overlap": sim.overlap}, sort_keys=True)
    return f"sim-{spec.run_id}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def load(path: str | Path, skip_invalid: bool = False) -> tuple[sweep_mod.Sweep, list[tuple[RunSpec, SimSpec]]]:
    """Parse and validate the sweep and its [simulate] table; every run paired with its simulation settings,
    refused here if the simulator cannot apply one of its settings."""
    data, text = sweep_mod.read_toml(path)
    table = data.pop("simulate", {})
    if not isinstance(table, dict):
        raise ValueError(f"{path}: simulate = {table!r}: expected a table ([simulate])")
    unknown = sorted(set(table) - set(SIMULATE_KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown [simulate] key(s) {unknown}: accepted are {', '.join(SIMULATE_KEYS)}")
    sweep_mod.check_simulate(table, str(path))  # types (no string "false" taken as true) and ranges
    if isinstance(data.get("defaults", {}), dict):  # SimGrid carries a simulated run's messages: p2p does not
        data["defaults"] = {"p2p": "gloo", **data.get("defaults", {})}  # apply; "gloo" keeps it out of the run id
    sweep = sweep_mod.parse(data, source=text, where=str(path), skip_invalid=skip_invalid, measured=False)
    axes = [(k, v if isinstance(v, list) else [v]) for k, v in table.items() if k in PLATFORM_KEYS + RUN_KEYS]
    fixed = {k: v for k, v in table.items() if k in COMPUTE_KEYS}
    substrate = SimGridSubstrate([])
    substrate.check([Run(spec.run_id, spec) for spec in sweep.runs])
    pairs = []
    for spec in sweep.runs:
        timeline = _timeline(spec, fixed, Path(path))
        for combo in itertools.product(*[values for _, values in axes]):
            point = dict(zip([k for k, _ in axes], combo))
            plat = Platform.parse({"bandwidth": spec.link["bandwidth"], "latency": spec.link.get("latency", "0s"),
                                   **{k: v for k, v in point.items() if k in PLATFORM_KEYS},
                                   **_nodes_of(spec, point, path)})
            pairs.append((spec, SimSpec(plat, timeline, point.get("bucket_mb"), bool(point.get("overlap", False)))))
    return sweep, pairs


def _nodes_of(spec: RunSpec, point: dict, where) -> dict:
    """The platform keys that place a run's ranks_per_node = k: the `nodes` topology with k ranks per node,
    the sweep's link.intra_* inside it ([simulate]'s intra_* where the link has none); {} for k = 1. A
    [simulate] topology or gpus_per_node that says otherwise is refused, naming both."""
    k = spec.ranks_per_node
    if k == 1:
        return {}
    topology, gpus = point.get("topology", "nodes"), point.get("gpus_per_node", k)
    if topology != "nodes" or gpus != k:
        raise ValueError(f"{where}: ranks_per_node = {k} places ranks in nodes of {k}, but [simulate] says "
                         f"topology = {topology!r}, gpus_per_node = {gpus!r}: leave them out or give topology = "
                         f"\"nodes\", gpus_per_node = {k}")
    intra = {key: spec.link[key] for key in ("intra_bandwidth", "intra_latency") if spec.link.get(key)}
    return {"topology": "nodes", "gpus_per_node": k, **intra}


def _timeline(spec: RunSpec, fixed: dict, where: Path) -> Timeline:
    """The compute timeline: a profile (checked against the run's model and batch) or fixed seconds."""
    from workloads.profile import load_profile

    if "profile" in fixed:
        profile_path = Path(fixed["profile"])
        if not profile_path.is_absolute() and not profile_path.exists():
            profile_path = where.parent / profile_path
    elif spec.compute == "profile" and spec.profile and not fixed:
        profile_path = Path(spec.profile)
    else:
        profile_path = None
    if profile_path is not None:
        profile = load_profile(profile_path)
        profile.check_run(spec.workload, spec.batch_size, spec.image_size, spec.num_classes, where=str(profile_path))
        return Timeline.from_profile(profile)
    missing = [k for k in ("forward_s", "backward_s", "optimizer_s") if k not in fixed]
    if missing:
        raise ValueError(f"{where}: [simulate] needs a compute timeline: profile = \"FILE.json\" (`syncbench profile` "
                         f"writes one) or all of forward_s, backward_s, optimizer_s (missing {', '.join(missing)})")
    for key in ("forward_s", "backward_s", "optimizer_s"):
        value = fixed[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise ValueError(f"{where}: [simulate] {key} = {value!r}: accepted is a number of seconds >= 0")
    from workloads.models import param_sizes

    return Timeline.fixed(float(fixed["forward_s"]), float(fixed["backward_s"]), float(fixed["optimizer_s"]),
                          tuple(param_sizes(spec.workload, spec.num_classes)))


def simulate_sweep(path: str | Path, out: str | Path, resume: bool = False, overwrite: bool = False,
                   log=None, skip_invalid: bool = False, max_memory: int | None = None):
    """`syncbench simulate`: the sweep file's runs on SimGrid through the one runner; the runs as a frame.
    `skip_invalid`: invalid grid points are left out and listed on `log` (and in the report), not refused.
    `max_memory`: bytes a simulation may reach (default: what the machine has available)."""
    from experiments.pipeline.runner import run_sweep

    log = log or sys.stderr  # (looked up now: a default bound at import outlives a replaced stderr)
    sweep, pairs = load(path, skip_invalid=skip_invalid)
    for point, reason in sweep.skipped:
        print(f"syncbench simulate: skipped grid point [{point}]: {reason}", file=log, flush=True)
    return run_sweep(sweep, out, resume=resume, overwrite=overwrite, log=log,
                     substrate=SimGridSubstrate(pairs, max_memory))


# -- one simulation: the step loop on simulated ranks ----------------------------------------------------------


def simulate(spec: RunSpec, sim: SimSpec) -> list[dict]:
    """Run the simulation in this process (once per process); every rank's {"steps": [...], "final": {...}}."""
    from strategies.transport.simgrid_run import run_simgrid
    from workloads.buckets import make_buckets

    config = spec.strategy_config()
    world = config.world_size(spec.workers)
    buckets = make_buckets(sim.timeline.numels, spec.bucket_mb)

    def rank_main(comm):
        if spec.ranks_per_node > 1:  # node-aware strategies group by it (the platform's nodes are the same)
            comm.set_nodes(spec.ranks_per_node)
        if comm.rank >= spec.workers:
            return server_loop(config)(comm, spec, config, buckets, SimulatedUpdate(comm, sim.timeline))
        compute = SimulatedCompute(comm, spec, sim.timeline, buckets)
        return run_steps(comm, spec, config, compute, buckets)

    return run_simgrid(world, rank_main, lambda sg: sim.platform.build(sg, world), sim.platform.config,
                       sim.platform.nic)


def summarize_simulated(spec: RunSpec, sim: SimSpec, results: list[dict] | None, error: str, wall: float,
                        started_at: str, rid: str | None = None) -> tuple[dict, list[dict]]:
    """The run's row in the one summary (experiments/pipeline/summary.py), plus what names the simulation."""
    plat = sim.platform
    timeline = sim.timeline
    meta = {"started_at": started_at, "duration_s": wall, "transport": "simgrid", "gpu": "", "cores": 0,
            "host": platform_mod.node(), "substrate": "simgrid", "run_id": rid or run_id(spec, sim),
            "sim_topology": plat.topology, "sim_network_model": plat.network_model, "sim_nic": plat.nic,
            # the platform as typed columns: its display label (sim_platform) is derived from them on read
            "sim_oversubscription": float(plat.oversubscription) if plat.topology == "fat_tree" else math.nan,
            "sim_hosts_per_leaf": plat.hosts_per_leaf if plat.topology == "fat_tree" else 0,
            "sim_gpus_per_node": plat.gpus_per_node if plat.topology == "nodes" else 0,
            "sim_intra_bandwidth": plat.intra_bandwidth if plat.topology == "nodes" else math.nan,
            "sim_intra_latency_s": plat.intra_latency if plat.topology == "nodes" else math.nan,
            "compute_source": timeline.source, "compute": "profile" if timeline.profile_id else "fixed",
            "sim_wall_s": wall, "cores_oversubscribed": False, "gpu_shared": False, "link_emulation": ""}
    row, steps = summarize(spec, results, error, meta)
    row["model_comm_s"] = model_comm_s(spec, sim)
    return row, steps


def fabric_of(platform: Platform) -> cost.Fabric:
    """The platform as the cost model prices it: the star's (or fat tree's: its oversubscription is not priced)
    per-rank NICs, or the `nodes` platform's NIC per node and intra-node links."""
    if platform.topology == "nodes":
        return cost.Fabric(platform.bandwidth, platform.latency, platform.gpus_per_node, platform.intra_bandwidth,
                           platform.intra_latency)
    return cost.Fabric(platform.bandwidth, platform.latency)


def model_comm_s(spec: RunSpec, sim: SimSpec, network: str = "alpha_beta") -> float:
    """The cost model's communication the same step waits for (strategies.cost.step_timeline, the one price): the
    run's buckets, ready when the timeline says, overlapped with backward or not as the run is; NaN where the
    model has no price (a strategy without per-level traffic on nodes). `network`: the physics priced (the stored
    column is alpha_beta's; `syncbench validate` prices its tcp cells with 'tcp')."""
    from workloads.buckets import make_buckets

    config = spec.strategy_config()
    timeline = sim.timeline
    buckets = make_buckets(timeline.numels, spec.bucket_mb)
    ready = [(max((timeline.ready_s[i] for i in b.params), default=0.0), b.numel) for b in buckets]
    shapes = param_shapes_of(spec, timeline.numels)
    bucket_shapes = [tuple(shapes[i] for i in sorted(b.params)) for b in buckets] if shapes else None
    try:
        fabric = dataclasses.replace(fabric_of(sim.platform), network=cost.NetworkModel.parse(network))
        predicted = cost.step_timeline(config, spec.workers, ready, fabric, timeline.forward_s,
                                       timeline.backward_s, timeline.optimizer_s, spec.overlap,
                                       bucket_shapes=bucket_shapes)
    except (ValueError, NotImplementedError):
        return math.nan
    return predicted.exposed_s


# -- the process a simulation runs in ------------------------------------------------------------------------


def simulate_in_child(spec: RunSpec, sim: SimSpec) -> tuple[list[dict] | None, str, float]:
    """simulate() in a fresh process: (results or None, error, simulation wall seconds)."""
    done = simulate_child(spec, sim)
    return done.result, done.error, done.wall_s


def simulate_child(spec: RunSpec, sim: SimSpec) -> ChildRun:
    """simulate() in a fresh process, the workload's shapes looked up here first: every simulation forked from
    this process then finds them cached instead of importing torchvision and building the model again."""
    param_shapes_of(spec, sim.timeline.numels)
    return run_child(lambda: simulate(spec, sim))
