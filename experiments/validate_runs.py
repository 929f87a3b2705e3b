"""`syncbench validate --substrates emulated[,kernel]`: the matrix's small cells (n <= 8, no overlap) measured, beside
the model and SimGrid.

A cell's measurement is one synchronization of its bytes (ResNet-50's gradients, one flat bucket, no compute; with
local SGD one period of H steps) through the same step loop the simulator runs (experiments/pipeline/train.py's
run_steps: the strategy's role, its servers, compression and local SGD), on ranks that compute nothing:
- emulated: thread ranks of this process over syncbench's own link emulation (strategies/transport/link.py: a NIC per
  rank booked per message; the queues carry the bytes, the receiver waits until the link says they arrived);
- kernel: a process per rank, each in its own network namespace behind a veth shaped both ways by `tc tbf`, over
  real TCP (experiments/validate_kernel.py; root only; bandwidth only: a cell with a latency is refused).
Each measurement is the median over `repeats` syncs (each a run of its own), with their min and max, and the
same syncs with no link emulation at all (the floor: what copies, sums and compression cost this machine's cores,
which the model does not price). With `payload_scale` s > 1 the payload is 1/s of the cell's and every link's
bandwidth 1/s of the cell's: the bandwidth term (bytes / bandwidth) and the latency term are the cell's, the
machine's copy and sum work is 1/s of it; the model is priced for the run as made.

A cell a substrate cannot run is "not run" with the reason, never an agreement: more than 8 workers, overlap (it
replays a profile's backward), a strategy whose bytes move inside a backend (python emulation does not slow them),
a link faster than the emulation reaches on this machine's cores (EMULATION_CEILING), no root or a latency tbf
cannot add.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
from types import SimpleNamespace

import pandas as pd
import torch

from experiments.pipeline.compute import Compute
from experiments.pipeline.measured import params_digest
from experiments.pipeline.servers import server_loop
from experiments.pipeline.train import run_steps
from strategies.transport.link import parse_bandwidth
from workloads.buckets import make_buckets

SUBSTRATES = ("simgrid", "emulated", "kernel")
MAX_WORKERS = 8
# the fastest link python emulation is trusted to reach here: a rank's copy into and out of the queues and its sums
# run at a few GB/s on one core; above 10 Gbit/s (1.25 GB/s) the cores, not the emulated link, set the time
EMULATION_CEILING = parse_bandwidth("10Gbit")
MB_KNOBS = ("partition_mb", "pipeline_mb")  # size knobs in MiB, scaled with the payload
AGREE = 0.15  # measured within 15% of the model: agreement (issue's tolerance for emulated runs)


# -- what a rank computes: nothing, on the wall clock --------------------------------------------------------


class FlatCompute(Compute):
    """A worker that computes nothing: a flat gradient of the cell's parameters (rank-dependent values, restored
    every step), parameters equal on every rank; the optimizer is plain SGD on the flat buffer (outside the
    communication time), so the ranks' final parameters prove the synchronization agreed."""

    clock = staticmethod(time.perf_counter)
    threaded = True
    trains = False  # no loss
    wraps = False

    def __init__(self, rank: int, spec, numels: tuple[int, ...], shapes: tuple | None):
        self.spec, self.numel = spec, sum(numels)
        generator = torch.Generator().manual_seed(spec.seed + rank)
        self.gradient = torch.randn(self.numel, generator=generator)
        shapes = shapes or tuple((n,) for n in numels)
        self.flat = SimpleNamespace(params=torch.zeros(self.numel), grads=self.gradient.clone(),
                                    trainable=tuple(SimpleNamespace(shape=torch.Size(s)) for s in shapes))
        self.on_ready = None

    def begin_step(self) -> None:
        self.flat.grads.copy_(self.gradient)  # the sync left the average there: this step's own gradient again

    def forward_backward(self) -> tuple[float, int, float]:
        self.forward_end = time.perf_counter()
        return math.nan, self.spec.batch_size, 0.0

    def optimizer_step(self) -> None:
        self.flat.params.add_(self.flat.grads, alpha=-self.spec.lr)

    def take_parameters(self) -> None:
        self.flat.params.copy_(self.flat.grads)

    def server_update(self):
        return PassThroughUpdate(self.numel)

    def straggle(self, compute_s: float) -> None:
        """No straggler in a validation cell."""

    def synchronize(self) -> None:
        """Host tensors: nothing to wait for."""

    def loss_value(self, loss) -> float:
        return math.nan

    def consensus_distance(self, comm) -> float:
        return math.nan

    def final(self) -> dict:
        return {"param_norm": math.nan, "params_digest": params_digest(self.flat.params), "profile_id": "",
                "profile_device": "", "profile_synthetic": False, "profile_step_s": math.nan}


class PassThroughUpdate:
    """A server's update that takes no time: the reduced gradient goes back as the parameters (the simulated
    cell's optimizer time is 0 too)."""

    clock = staticmethod(time.perf_counter)
    dtype, device = torch.float32, torch.device("cpu")

    def __init__(self, numel: int):
        self.numel, self.busy_s = numel, 0.0

    def __call__(self, bucket, reduced: torch.Tensor, where: slice) -> torch.Tensor:
        return reduced


def rank_main(ctx, spec, numels: tuple[int, ...], shapes: tuple | None) -> dict:
    """One rank of a measured cell (thread rank or Ray actor): a server's loop, or the workers' step loop."""
    config = spec.strategy_config()
    buckets = make_buckets(numels, spec.bucket_mb)
    server = ctx.comm.rank >= spec.workers
    compute = None if server else FlatCompute(ctx.comm.rank, spec, numels, shapes)
    ctx.comm.barrier()  # every rank built: the sync starts together on every rank, as the simulated one does
    if server:
        return server_loop(config)(ctx.comm, spec, config, buckets, PassThroughUpdate(sum(numels)))
    return run_steps(ctx.comm, spec, config, compute, buckets)


# -- the run as made: payload and links scaled --------------------------------------------------------------


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s * 8 / 1e6:.6g}Mbit"


def scaled(cell, scale: float):
    """(cell with its links' bandwidth / scale, its parameters' sizes / scale, their shapes or None)."""
    from experiments.simulate.compute import param_shapes_of
    from experiments.validate import _timeline

    numels = _timeline(False).numels
    made = dataclasses.replace(cell, bandwidth=_rate(parse_bandwidth(cell.bandwidth) / scale))
    if scale == 1:
        return made, numels, param_shapes_of(cell.spec(), numels)
    return made, tuple(max(1, round(n / scale)) for n in numels), None


def run_spec(cell, scale: float):
    """The cell's RunSpec as measured: one period of H steps (one sync; with local SGD H - 1 steps without), nodes'
    intra link and the strategy's message sizes in MiB scaled with the payload."""
    import strategies

    made, _, _ = scaled(cell, scale)
    spec = made.spec()
    period = int(spec.sync_every)
    link = dict(spec.link)
    if "intra_bandwidth" in link:
        link["intra_bandwidth"] = _rate(parse_bandwidth(link["intra_bandwidth"]) / scale)
    params = dict(spec.strategy_params)
    defaults = strategies.get(spec.strategy).parameters()
    for knob in MB_KNOBS:  # a message size in MiB cuts the scaled payload into as many messages as the cell's
        if knob in defaults and scale != 1:
            params[knob] = params.get(knob, defaults[knob]) / scale
    return dataclasses.replace(spec, link=link, strategy_params=params, warmup_steps=0, steps=period)


def model_s(cell, scale: float) -> float:
    """The cost model's communication per step for the run as made (NaN where it has none)."""
    from experiments.simulate.compute import Timeline
    from experiments.simulate.substrate import SimSpec, model_comm_s
    from experiments.validate import _platform

    made, numels, _ = scaled(cell, scale)
    spec = run_spec(cell, scale)
    timeline = Timeline(0.0, 0.0, 0.0, numels, (0.0,) * len(numels), "one flat bucket, no compute")
    platform = _platform(made)
    if cell.ranks_per_node > 1:
        platform = dataclasses.replace(platform, intra_bandwidth=parse_bandwidth(spec.link["intra_bandwidth"]))
    return model_comm_s(spec, SimSpec(platform, timeline, overlap=False))


# -- what a substrate cannot run -----------------------------------------------------------------------------


def _common_refusal(cell, what: str) -> str:
    """The reasons shared by both measured substrates ('' if none)."""
    if cell.workers > MAX_WORKERS:
        return f"n = {cell.workers}: {what} runs are made at n <= {MAX_WORKERS} (every rank on this machine)"
    if cell.overlap:
        return (f"overlap: {what} runs synchronize once without compute; a step overlapped with backward replays a "
                f"profile (`syncbench run` with compute = \"profile\")")
    try:
        spec = cell.spec()
        config = spec.strategy_config()
        config.world_size(cell.workers)
    except (ValueError, TypeError) as e:
        return str(e)
    if config.wraps_model:
        return f"{spec.strategy} wraps a model (torch DDP): no model here, one flat bucket of its gradients"
    return ""


def emulated_refusal(cell, scale: float = 1.0) -> str:
    """Why thread ranks over python-emulated links cannot measure this cell ('' if they can)."""
    why = _common_refusal(cell, "emulated")
    if why:
        return why
    spec = run_spec(cell, scale)
    if scale != 1 and spec.compression in ("powersgd", "topk"):
        return (f"compression = {spec.compression!r} with --payload-scale {scale:g}: what it sends does not scale "
                f"with the payload (PowerSGD's rank x (rows + columns) per matrix, top-k's indices); run it at "
                f"--payload-scale 1")
    if not spec.strategy_config().counted:
        return (f"{spec.strategy} moves its bytes inside the backend's allreduce, which python link emulation does "
                f"not slow (the kernel-shaped cluster does)")
    rates = [("NIC", parse_bandwidth(spec.link["bandwidth"]))]
    if "intra_bandwidth" in spec.link:
        rates.append(("intra-node link", parse_bandwidth(spec.link["intra_bandwidth"])))
    for name, rate in rates:
        if rate > EMULATION_CEILING:
            return (f"the {name}'s {rate * 8 / 1e9:g} Gbit/s is beyond what python emulation reaches on "
                    f"{os.cpu_count()} cores (at most {EMULATION_CEILING * 8 / 1e9:g} Gbit/s: the copies and sums "
                    f"would set the time, not the link)" + ("; a --payload-scale s lowers it s times" if
                                                            scale == 1 else ""))
    return ""


def kernel_refusal(cell, scale: float = 1.0) -> str:
    """Why the kernel-shaped network cannot measure this cell here ('' if it can): experiments/validate_kernel.py."""
    from experiments.validate_kernel import kernel_refusal as refusal

    return refusal(cell, _common_refusal(cell, "kernel-shaped"), lambda: run_spec(cell, scale))


# -- one measured cell ---------------------------------------------------------------------------------------


def _threads(cell, scale: float, repeats: int, emulate: bool) -> tuple[list[float], float, float]:
    """(communication per step of each repeat, wall seconds, this process's CPU seconds) of the cell on thread
    ranks, with its links emulated or none. A repeat is a run of its own: one sync on ranks that start together,
    as SimGrid's (back to back without a barrier, the ranks' skew carries over and the next sync's first messages
    overlap the last one's tail: the flat reduce+broadcast at 3 ranks measured 0.75x its isolated sync). A failed run
    (bytes against the analytic traffic, the ranks' parameters) raises."""
    from experiments.pipeline.summary import summarize
    from strategies.transport.threads import run_threads

    spec = run_spec(cell, scale)
    _, numels, shapes = scaled(cell, scale)
    expected = model_s(cell, scale)
    timeout = 120.0 + 10 * spec.steps * (expected if math.isfinite(expected) else 10.0)
    spec = dataclasses.replace(spec, timeout=timeout)
    samples, start, cpu = [], time.perf_counter(), time.process_time()
    for _ in range(repeats):
        results = run_threads(spec.world_size(), lambda comm: rank_main(SimpleNamespace(comm=comm), spec, numels,
                                                                        shapes),
                              timeout=timeout, network=spec.network() if emulate else None,
                              ranks_per_node=spec.ranks_per_node, run_timeout=timeout)
        meta = {"started_at": "", "duration_s": 0.0, "transport": "threads", "gpu": "", "cores": os.cpu_count() or 1,
                "host": "", "substrate": "threads"}
        row, _ = summarize(spec, results, "", meta)
        if row["status"] != "ok":
            raise RuntimeError(row["error"])
        samples.append(float(row["comm_s"]))  # the slowest worker's, per step (local SGD: the period's mean)
    return samples, time.perf_counter() - start, time.process_time() - cpu


def measure_emulated(cell, repeats: int = 3, scale: float = 1.0) -> dict:
    """The cell on thread ranks over emulated links and with none (the floor): the measured row's numbers."""
    samples, wall, cpu = _threads(cell, scale, repeats, emulate=True)
    floor, floor_wall, floor_cpu = _threads(cell, scale, repeats, emulate=False)
    return {"measured_s": statistics.median(samples), "measured_min_s": min(samples),
            "measured_max_s": max(samples), "floor_s": statistics.median(floor), "repeats": len(samples),
            "wall_s": wall + floor_wall, "cpu_s": cpu + floor_cpu, "cpu_per_wall": cpu / wall if wall else math.nan}


def measured_row(cell, substrate: str, sim_s: float, repeats: int, scale: float) -> dict:
    """The cell's row for `substrate`: validate's columns (network_model: who shapes the link) plus the measured
    ones; "not run: <substrate>: <why>" where the substrate cannot run it."""
    made, numels, _ = scaled(cell, scale)
    row = {"substrate": substrate, "strategy": cell.variant.label, "workers": cell.workers,
           "bandwidth": cell.bandwidth, "latency": cell.latency, "ranks_per_node": cell.ranks_per_node,
           "overlap": cell.overlap, "network_model": "python" if substrate == "emulated" else "kernel",
           "payload_mb": sum(numels) * 4 / 1e6, "run_bandwidth": made.bandwidth, "sim_s": sim_s,
           "measured_s": math.nan, "measured_min_s": math.nan, "measured_max_s": math.nan, "floor_s": math.nan,
           "repeats": 0, "wall_s": 0.0, "cpu_s": 0.0, "cpu_per_wall": math.nan}
    why = emulated_refusal(cell, scale) if substrate == "emulated" else kernel_refusal(cell, scale)
    row["model_s"] = math.nan if why else model_s(cell, scale)
    if why:
        return row | {"status": f"not run: {substrate}: {why}"}
    try:
        if substrate == "emulated":
            row.update(measure_emulated(cell, repeats, scale))
        else:
            from experiments.validate_kernel import APPLIED, measure_kernel

            row.update(measure_kernel(cell, run_spec(cell, scale), scaled(cell, scale)[1], repeats),
                       link_applied=f"{made.bandwidth} 0us ({APPLIED})")
    except Exception as e:  # noqa: BLE001 - the cell fails, the matrix goes on
        return row | {"status": f"FAILED: {type(e).__name__}: {str(e)[:300]}"}
    if not math.isfinite(row["model_s"]):
        return row | {"status": "not run: model: no price for this cell"}
    return row | {"status": verdict(row["measured_s"], row["model_s"], row["floor_s"], row["measured_min_s"],
                                    row["measured_max_s"])}


def verdict(measured: float, model: float, floor: float, low: float, high: float) -> str:
    """agree (within AGREE of the model), or DIFF with the effect the measurement shows: the machine's floor (the
    same syncs without link emulation) covering at least half the gap, or the repeats' spread reaching the model;
    else the gap is unexplained."""
    gap = measured - model
    if abs(gap) <= AGREE * model:
        return "agree"
    if gap > 0 and floor >= 0.5 * gap:
        return f"DIFF: cores: the unshaped floor {floor:.3f} s is {floor / model:.0%} of the model"
    if low <= model * (1 + AGREE) and high >= model * (1 - AGREE):
        return f"DIFF: spread: repeats {low:.3f}-{high:.3f} s reach the model"
    return "DIFF: unexplained"


# -- the measured rows of a matrix ---------------------------------------------------------------------------

KEYS = ("strategy", "workers", "bandwidth", "latency", "ranks_per_node", "overlap")


def measured_frame(grid, frame: pd.DataFrame, substrates: tuple[str, ...], repeats: int, scale: float,
                   log=None) -> pd.DataFrame:
    """A row per (cell, measured substrate): every distinct cell of the grid (its network models are SimGrid's
    knob, measured once), SimGrid alpha_beta's seconds beside where the matrix simulated the cell."""
    log = sys.stderr if log is None else log
    simulated = frame[frame["network_model"] == "alpha_beta"].set_index(list(KEYS))["sim_s"] if len(frame) else {}
    seen, rows = set(), []
    measured = [s for s in substrates if s != "simgrid"]
    for cell in grid:
        key = (cell.variant.label, cell.workers, cell.bandwidth, cell.latency, cell.ranks_per_node, cell.overlap)
        if key in seen:
            continue
        seen.add(key)
        sim_s = float(simulated.get(key, math.nan)) if len(frame) else math.nan
        for substrate in measured:
            rows.append(measured_row(cell, substrate, sim_s, repeats, scale))
            r = rows[-1]
            print(f"[{substrate} {len(rows)}] {r['strategy']} n={r['workers']} k={r['ranks_per_node']} "
                  f"{r['bandwidth']} {r['latency']}: {r['status'][:100]} (measured {r['measured_s']:.4f} s, model "
                  f"{r['model_s']:.4f} s)", file=log, flush=True)
    out = pd.DataFrame(rows)
    if len(out):
        out["measured_over_model"] = out["measured_s"] / out["model_s"]
        out["measured_over_sim"] = out["measured_s"] / out["sim_s"]
    return out


def format_runs(runs: pd.DataFrame, scale: float, wall_s: float) -> str:
    """The measured rows as a plain table, with what ran them and how loaded the machine was."""
    if not len(runs):
        return "# measured: no cell"
    ran = runs[runs["measured_s"].notna()]
    priced = ran[ran["model_s"].notna()]
    lines = [f"# measured runs: one synchronization per repeat (median of the timed repeats, min-max), on thread "
             f"ranks over python-emulated links (emulated) or processes in namespaces over tbf-shaped veths, real TCP "
             f"(kernel: bandwidth only, no latency added; the first sync untimed); payload "
             f"{runs['payload_mb'].iloc[0]:.2f} MB"
             + (f" (1/{scale:g} of the cell's) at 1/{scale:g} of every link's bandwidth, latency as the cell's"
                if scale != 1 else " (the cell's) at the cell's links"),
             f"# floor (emulated): the same syncs with no link emulation (this machine's copies, sums, compression); "
             f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, wall {wall_s:.0f} s",
             f"# cells {len(runs)}, measured {len(ran)}, within {AGREE:.0%} of the model "
             f"{int((priced['status'] == 'agree').sum())}, DIFF {int(priced['status'].str.startswith('DIFF').sum())}, "
             f"not run {int(runs['status'].str.startswith('not run').sum())}, "
             f"failed {int(runs['status'].str.startswith('FAILED').sum())}"]
    if len(priced):
        lines.append(f"# measured / model: min {priced['measured_over_model'].min():.3f}, max "
                     f"{priced['measured_over_model'].max():.3f}")
    lines.append(f"{'strategy':>30s} {'n':>2s} {'k':>2s} {'link':>12s} {'substrate':>9s} {'model s':>8s} "
                 f"{'sim s':>8s} {'measured s':>10s} {'min-max':>15s} {'floor s':>8s} {'meas/model':>10s} "
                 f"{'meas/sim':>8s}  status")
    for r in runs.itertuples():
        lines.append(f"{r.strategy:>30s} {r.workers:2d} {r.ranks_per_node:2d} {r.bandwidth + ' ' + r.latency:>12s} "
                     f"{r.substrate:>9s} {r.model_s:8.4f} {r.sim_s:8.4f} {r.measured_s:10.4f} "
                     f"{f'{r.measured_min_s:.3f}-{r.measured_max_s:.3f}':>15s} {r.floor_s:8.4f} "
                     f"{r.measured_over_model:10.3f} {r.measured_over_sim:8.3f}  {r.status[:160]}")
    return "\n".join(lines)


# -- the command line ----------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    p.add_argument("--substrates", default="simgrid",
                   help="simgrid (default: the model and SimGrid), plus emulated (thread ranks over python-emulated "
                        "links) and/or kernel (a process per rank in its namespace over tbf-shaped veths, real TCP; "
                        "root; bandwidth only: cells with a latency are not run, use --links 1Gbit/0us), "
                        "comma-separated: the cells with n <= 8 and no overlap measured beside the model and SimGrid")
    p.add_argument("--repeats", type=int, default=3, help="timed synchronizations per measured cell (default 3)")
    p.add_argument("--payload-scale", type=float, default=10.0,
                   help="measured cells move 1/S of the cell's payload over links of 1/S its bandwidth (default 10: "
                        "the same bandwidth and latency terms, a tenth of the copies; 1: the cell's payload)")


def check_arguments(args) -> tuple[str, ...]:
    """The substrates asked for, every measured option checked before any work."""
    substrates = tuple(s.strip() for s in args.substrates.split(",") if s.strip())
    unknown = [s for s in substrates if s not in SUBSTRATES]
    if not substrates or unknown:
        raise ValueError(f"validate --substrates {args.substrates!r}: accepted are {', '.join(SUBSTRATES)}, "
                         f"comma-separated")
    if not 1 <= args.repeats <= 100:
        raise ValueError(f"validate --repeats {args.repeats}: accepted are 1 to 100")
    if not (math.isfinite(args.payload_scale) and 1 <= args.payload_scale <= 10_000):
        raise ValueError(f"validate --payload-scale {args.payload_scale:g}: accepted are 1 (the cell's payload) to "
                         f"10,000")
    if args.ps_sizing is not None and substrates != ("simgrid",):
        raise ValueError("validate --ps-sizing with --substrates: PS sizing is priced and simulated only")
    return ("simgrid",) + tuple(s for s in substrates if s != "simgrid")


def add_measured(grid, frame: pd.DataFrame, table: str, args) -> tuple[pd.DataFrame, str]:
    """The matrix's frame with a `substrate` column (simgrid) and, where --substrates asks, the measured rows after
    it; the table with theirs after it."""
    substrates = check_arguments(args)
    frame = frame.assign(substrate="simgrid")
    if substrates == ("simgrid",):
        return frame, table
    start = time.perf_counter()
    runs = measured_frame(grid, frame, substrates, args.repeats, args.payload_scale)
    return (pd.concat([frame, runs], ignore_index=True),
            table + "\n" + format_runs(runs, args.payload_scale, time.perf_counter() - start))
