"""The results schema, defined once: every column of runs.parquet and steps.parquet with its type and meaning.

The runner writes rows through `conform`, the report reads them through `conform`, the report tests build
their fixtures from `row`; `syncbench schema` prints this. Units are in the names (_s seconds, _bytes bytes,
bandwidth in bytes/s); facts are typed columns (booleans, numbers, one column per strategy parameter), never
strings to parse back. A leaf module (pandas only): `experiments` imports it to write what `reports` reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # "str", "int", "float", "bool", "list[int]"
    meaning: str


_NA = {"str": "", "int": 0, "float": math.nan, "bool": False, "list[int]": ()}

RUNS: tuple[Column, ...] = (
    # what ran
    Column("run_id", "str", "content hash of every setting of the run (unique within a sweep)"),
    Column("sweep", "str", "the sweep's name"),
    Column("substrate", "str", "where it ran: 'ray' (actors over gloo/NCCL) or 'simgrid' (simulated)"),
    Column("workload", "str", "the model (resnet18, vgg16, tiny, ...)"),
    Column("dataset", "str", "synthetic or a real data set"),
    Column("image_size", "int", "input images are image_size x image_size pixels"),
    Column("batch_size", "int", "samples per worker per step"),
    Column("steps", "int", "steps run, warm-up included"),
    Column("warmup_steps", "int", "untimed steps first"),
    Column("device", "str", "cpu or cuda"),
    Column("seed", "int", "the run's random seed"),
    Column("lr", "float", "SGD learning rate"),
    Column("strategy", "str", "the registered strategy's name"),
    Column("strategy_label", "str", "the strategy with its non-default parameters, for display"),
    Column("strategy_params", "str", "the strategy's parameters as JSON (provenance; read the param_* columns)"),
    Column("param_servers", "int", "parameter_server: server ranks (0 for other strategies)"),
    Column("param_tree", "bool", "reduce_broadcast: binomial tree (false: flat)"),
    Column("param_topology", "str", "decentralized: the neighbour graph"),
    Column("param_weights", "str", "decentralized: uniform or metropolis mixing weights"),
    Column("workers", "int", "worker ranks"),
    Column("servers", "int", "server ranks (parameter server)"),
    Column("bytes_counted", "bool", "the communicator saw the strategy's bytes (false: inside a backend)"),
    # the network
    Column("link", "str", "the link's label, for display"),
    Column("link_bandwidth", "float", "each NIC's emulated bandwidth in bytes/s (NaN: not emulated)"),
    Column("link_latency_s", "float", "each NIC's emulated latency in seconds"),
    Column("link_emulation", "str", "who shapes the link: 'python', 'kernel' or '' (not emulated)"),
    Column("link_heterogeneous", "bool", "some rank's NIC differs from the default link"),
    Column("straggler_ranks", "list[int]", "ranks whose compute is slowed"),
    Column("straggler_slowdown", "float", "their compute time multiplier (1.0: no straggler)"),
    # compute and overlap
    Column("compute", "str", "'real' (the model computes) or 'profile' (a measured timeline is replayed)"),
    Column("profile_id", "str", "the compute profile replayed ('' in real mode)"),
    Column("profile_device", "str", "the device the profile was measured on"),
    Column("profile_step_s", "float", "the profile's own step time in seconds"),
    Column("bucket_mb", "float", "gradient bucket size in MiB = 2^20 bytes, as DDP's bucket_cap_mb (NaN: one flat "
                                 "bucket)"),
    Column("overlap", "bool", "buckets synchronized while backward runs"),
    # simulation (substrate = 'simgrid'; empty or NaN for measured runs)
    Column("sim_platform", "str", "the simulated platform, for display"),
    Column("sim_topology", "str", "star, fat_tree or nodes (of k GPUs)"),
    Column("sim_network_model", "str", "SimGrid's network model: 'tcp' (its corrections) or 'alpha_beta' (none)"),
    Column("sim_nic", "str", "'shared' (concurrent sends share a NIC) or 'fifo' (one at a time, as the emulation)"),
    Column("sim_oversubscription", "float", "fat tree: leaf uplink oversubscription (NaN elsewhere)"),
    Column("sim_gpus_per_node", "int", "nodes topology: GPUs per node (0 elsewhere)"),
    Column("compute_source", "str", "where a simulation's compute times came from (a profile id, or 'fixed')"),
    Column("sim_wall_s", "float", "wall time the simulation took, seconds"),
    Column("model_comm_s", "float", "the alpha-beta model's communication time for the same step, seconds"),
    # where and how it ran
    Column("status", "str", "'ok' or 'failed'"),
    Column("error", "str", "why it failed ('' when ok)"),
    Column("transport", "str", "gloo, nccl, threads, simgrid, or the sweep's p2p (sockets, sockets-unix, "
                               "sockets-tcp) when it carried the strategy's bytes"),
    Column("gpu", "str", "the GPU's name ('' on CPU)"),
    Column("cores", "int", "CPU cores of the machine (or cluster) the ranks shared"),
    Column("host", "str", "the host rank 0 ran on"),
    Column("cores_oversubscribed", "bool", "more ranks than CPU cores: compute times include contention"),
    Column("gpu_shared", "bool", "several workers shared one GPU (no NCCL): compute and transfers contend"),
    Column("started_at", "str", "ISO time the run started"),
    Column("duration_s", "float", "wall time of the whole run in seconds"),
    # the numbers (means over timed steps; a step is the slowest worker's)
    Column("throughput", "float", "samples per second of the whole group"),
    Column("step_time_s", "float", "mean step time in seconds"),
    Column("compute_s", "float", "mean compute time per step in seconds (slowest worker)"),
    Column("comm_s", "float", "mean exposed communication per step in seconds (slowest worker)"),
    Column("comm_fraction", "float", "communication's share of the step time"),
    Column("backward_end_s", "float", "time from step start to the end of backward, in seconds"),
    Column("exposed_comm_s", "float", "communication after backward ended (what the step waited for), seconds"),
    Column("comm_busy_s", "float", "time spent inside synchronization per step, hidden or not, seconds"),
    Column("overlap_fraction", "float", "share of communication hidden behind backward"),
    Column("buckets", "float", "gradient buckets per step"),
    Column("bytes_sent_per_worker", "float", "payload bytes a worker sent per step (measured)"),
    Column("bytes_recv_per_worker", "float", "payload bytes a worker received per step (measured)"),
    Column("bytes_sent_per_server", "float", "payload bytes a server sent per step (measured)"),
    Column("bytes_recv_per_server", "float", "payload bytes a server received per step (measured)"),
    Column("analytic_bytes_sent_per_worker", "float", "the strategy's analytic bytes per worker per step"),
    Column("analytic_rounds", "float", "sequential message rounds on the critical path (analytic)"),
    Column("analytic_path_bytes", "float", "bytes on the critical path through the busiest NIC (analytic)"),
    Column("numel", "int", "model parameters"),
    Column("model_bytes", "int", "model parameters in bytes (fp32)"),
    Column("final_loss", "float", "workers' mean training loss at the last step"),
    Column("param_norm", "float", "L2 norm of the final parameters"),
    Column("accuracy", "float", "held-out accuracy at the end (NaN: the data set has none)"),
    Column("consensus_distance", "float", "decentralized: mean distance of workers' parameters from their mean"),
    Column("spectral_gap", "float", "decentralized: 1 - |lambda_2| of the mixing matrix"),
)

STEPS: tuple[Column, ...] = (
    Column("run_id", "str", "the run"),
    Column("step", "int", "step index, warm-up included"),
    Column("rank", "int", "the rank"),
    Column("role", "str", "'worker' or 'server'"),
    Column("timed", "bool", "after warm-up"),
    Column("compute_s", "float", "forward + backward (+ optimizer) time in seconds"),
    Column("comm_s", "float", "exposed communication in seconds"),
    Column("bytes_sent", "int", "payload bytes sent in the step"),
    Column("bytes_recv", "int", "payload bytes received in the step"),
    Column("loss", "float", "training loss (NaN on servers)"),
    Column("samples", "int", "samples processed"),
    Column("consensus_distance", "float", "decentralized: distance from the workers' mean parameters"),
    Column("wall_s", "float", "seconds since the run's first step"),
    Column("backward_end_s", "float", "time from step start to the end of backward, seconds"),
    Column("comm_busy_s", "float", "time spent inside synchronization, seconds"),
    Column("exposed_comm_s", "float", "communication after backward ended, seconds (= comm_s)"),
    Column("overlap_fraction", "float", "share of this step's communication hidden behind backward"),
)

TABLES = {"runs": RUNS, "steps": STEPS}


def names(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in table]


def row(table: tuple[Column, ...], **values) -> dict:
    """One row with every column: the given values, typed defaults elsewhere; an unknown column is an error
    (a plug-in strategy's parameters are the exception: param_<name> columns of whatever type they have)."""
    unknown = {k for k in set(values) - set(names(table)) if not k.startswith("param_")}
    if unknown:
        raise KeyError(f"not columns of the schema: {', '.join(sorted(unknown))} (see experiments/results/schema.py)")
    extra = {k: v for k, v in values.items() if k not in names(table)}
    return {**{c.name: values.get(c.name, _NA[c.type]) for c in table}, **extra}


def conform(frame: pd.DataFrame, table: tuple[Column, ...], *, extra_ok: bool = True) -> pd.DataFrame:
    """The frame with every schema column present (typed defaults where missing) and typed as declared;
    columns beyond the schema are kept (extra_ok) or refused."""
    extra = [c for c in frame.columns if c not in names(table)]
    if extra and not extra_ok:
        raise KeyError(f"columns not in the schema: {', '.join(extra)} (see experiments/results/schema.py)")
    frame = frame.copy()
    for c in table:
        if c.name not in frame:
            frame[c.name] = [_NA[c.type]] * len(frame)
        elif c.type == "bool":
            frame[c.name] = frame[c.name].fillna(False).astype(bool)
        elif c.type == "float":
            frame[c.name] = pd.to_numeric(frame[c.name], errors="coerce").astype(float)
        elif c.type == "int":
            frame[c.name] = pd.to_numeric(frame[c.name], errors="coerce").fillna(0).astype("int64")
        elif c.type == "str":
            frame[c.name] = frame[c.name].fillna("").astype(str)
        else:  # list[int]
            frame[c.name] = [tuple(int(x) for x in v) if v is not None and len(v) else () for v in frame[c.name]]
    return frame[names(table) + [c for c in frame.columns if c not in names(table)]]


def strategy_label(strategy: str, params: dict) -> str:
    """'ring' or 'decentralized (topology=ring, weights=uniform)': the strategy with its parameters."""
    if not params:
        return strategy
    return f"{strategy} ({', '.join(f'{k}={v}' for k, v in sorted(params.items()))})"


def describe() -> str:
    """The schema as a plain table (`syncbench schema`)."""
    lines = []
    for title, table in TABLES.items():
        lines.append(f"# {title}.parquet")
        lines += [f"{c.name:32s} {c.type:10s} {c.meaning}" for c in table]
        lines.append("")
    return "\n".join(lines)
