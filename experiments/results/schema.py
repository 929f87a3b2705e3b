"""The results schema, defined once: every column of the runs and steps tables with its Arrow type and meaning.

The pipeline writes rows through `to_arrow` (typed Parquet, no pandas guessing), readers get pandas frames
through `conform`, the report tests build their fixtures from `row`; `syncbench schema` prints `describe()`.
Units are in the names (_s seconds, _bytes bytes, bandwidth in bytes/s). Facts are typed columns: a strategy's
parameters are `param_<name>` columns typed as the strategy declares them (never JSON text), and display labels
(the link's, the strategy's, the simulated platform's) are derived from typed columns on read, never stored.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import typing
from dataclasses import fields

import pandas as pd
import pyarrow as pa

from experiments.results.columns import _SCALARS, BOOL, FLOAT, INT, INTS, PARAM, STR, TIME, Column  # noqa: F401
from experiments.results.fault_tables import FAILURES, FAULT_RUNS
from experiments.results.labels import (  # noqa: F401 - read from here by the report
    link_label,
    platform_label,
    rate_label,
    strategy_label,
    time_label,
    type_name,
)

RUNS: tuple[Column, ...] = (
    # what ran
    Column("run_id", STR, "content hash of every setting of the run (unique within a sweep)"),
    Column("sweep", STR, "the sweep's name"),
    Column("substrate", STR, "where it ran: 'ray' (actors over gloo/NCCL) or 'simgrid' (simulated)"),
    Column("workload", STR, "the model (resnet18, vgg16, tiny, ...)"),
    Column("dataset", STR, "synthetic or a real data set"),
    Column("image_size", INT, "input images are image_size x image_size pixels"),
    Column("batch_size", INT, "samples per worker per step"),
    Column("steps", INT, "steps run, warm-up included"),
    Column("warmup_steps", INT, "untimed steps first"),
    Column("device", STR, "cpu or cuda"),
    Column("seed", INT, "the run's random seed"),
    Column("repeat", INT, "which of the sweep's `repeats` of its configuration (0-based; its seed is seed + repeat)"),
    Column("lr", FLOAT, "SGD learning rate"),
    Column("strategy", STR, "the registered strategy's name"),
    Column("workers", INT, "worker ranks"),
    Column("servers", INT, "server ranks (parameter server)"),
    Column("bytes_counted", BOOL, "the communicator saw the strategy's bytes (false: inside a backend)"),
    Column("bypasses_link", BOOL, "the run's bytes moved outside the python-emulated link, unshaped (native, ddp "
                                  "over gloo); false in results before it: the report derives it from bytes_counted"),
    # the network
    Column("link_bandwidth", FLOAT, "each NIC's emulated bandwidth in bytes/s (NaN: not emulated)"),
    Column("link_latency_s", FLOAT, "each NIC's emulated latency in seconds"),
    Column("link_emulation", STR, "who shapes the link: 'python', 'kernel' or '' (not emulated)"),
    Column("link_heterogeneous", BOOL, "some rank's NIC differs from the default link"),
    Column("link_ranks", INTS, "the ranks with a link of their own in this run (link.ranks.<r>: it applies only to "
                               "runs that have rank r); empty: every rank on the default link, or results before it"),
    Column("ranks_per_node", INT, "ranks per node sharing one NIC (the run setting; 0 in results written before it "
                                  "existed: one rank per node)"),
    Column("link_intra_bandwidth", FLOAT, "ranks_per_node > 1: the link between two ranks of a node in bytes/s (inf: "
                                          "unlimited; NaN: one rank per node, no emulated link, or results before it)"),
    Column("link_intra_latency_s", FLOAT, "ranks_per_node > 1: that link's per-message latency in seconds (NaN as "
                                          "above)"),
    # the strategy's size knob (partition_mb, pipeline_mb, chunks: strategies/knobs.py) as the model priced it
    Column("knob", STR, "the strategy's size knob the model priced for the run, its value in param_<knob> ('': no "
                        "size knob, no link to price it on, or a run the model cannot price)"),
    Column("knob_chosen", BOOL, "the sweep left the knob unset and the model chose its value (the cheapest tried)"),
    Column("knob_best", FLOAT, "the model's cheapest value of the knob for the run's workers, servers, buckets and "
                               "link (NaN: not priced)"),
    Column("knob_slowdown", FLOAT, "the model's price of the run's knob value over the best value's (1.0: the run "
                                   "uses the best; NaN: not priced)"),
    Column("straggler_ranks", INTS, "ranks whose compute is slowed"),
    Column("straggler_slowdown", FLOAT, "their compute time multiplier (1.0: no straggler)"),
    # compute and overlap
    Column("compute", STR, "'real' (the model computes) or 'profile' (a measured timeline is replayed)"),
    Column("profile_id", STR, "the compute profile replayed ('' in real mode)"),
    Column("profile_device", STR, "the device the profile was measured on (synthetic: the hardware it describes)"),
    Column("profile_synthetic", BOOL, "the replayed profile was described by a user (syncbench profile --synthetic), "
                                      "not measured"),
    Column("profile_step_s", FLOAT, "the profile's own step time in seconds"),
    Column("bucket_mb", FLOAT, "gradient bucket size in MiB = 2^20 bytes, as DDP's bucket_cap_mb (NaN: one "
                              "flat bucket)"),
    Column("overlap", BOOL, "buckets synchronized while backward runs"),
    Column("trace_steps", INT, "steps after warm-up whose every phase and message is in the events table (0: none, "
                               "and in results written before tracing)"),
    # compression and local SGD (strategies/compression.py, strategies/local_sgd.py): run settings
    Column("compression", STR, "'none', 'fp16', 'bf16', 'powersgd' or 'topk': what the gradients travel as"),
    Column("powersgd_rank", INT, "PowerSGD: rank of the low-rank approximation"),
    Column("powersgd_start", INT, "PowerSGD: steps averaged uncompressed first"),
    Column("powersgd_warm_start", BOOL, "PowerSGD: Q reused from the previous step"),
    Column("topk_ratio", FLOAT, "top-k: share of the entries each worker sends"),
    Column("error_feedback", BOOL, "PowerSGD and top-k: what was not sent is added to the next gradient"),
    Column("sync_every", INT, "local SGD: parameters averaged every sync_every steps (1: every step)"),
    Column("outer_optimizer", STR, "local SGD: 'none' (the average) or 'nesterov' (DiLoCo's outer step)"),
    Column("outer_lr", FLOAT, "DiLoCo: the outer optimizer's learning rate"),
    Column("outer_momentum", FLOAT, "DiLoCo: the outer optimizer's Nesterov momentum"),
    # time to target: steps to target x seconds per step (step_time_s), both measured in this run
    Column("target_metric", STR, "'accuracy' or 'loss' on the held-out split ('' : the run has no target)"),
    Column("target_value", FLOAT, "the accuracy to reach (>=) or the loss to get under (<=)"),
    Column("eval_every", INT, "steps between held-out evaluations (and after the last step)"),
    Column("target_reached", BOOL, "an evaluation met the target"),
    Column("steps_to_target", FLOAT, "steps run when an evaluation first met the target (NaN: never)"),
    Column("time_to_target_s", FLOAT, "steps_to_target x seconds per step, seconds (NaN: never reached): step_time_s, "
                                      "or without a barrier (a parameter server's SSP, async, backups) the pace of "
                                      "the worker whose pulled parameters met the target first"),
    # simulation (substrate = 'simgrid'; empty or NaN for measured runs)
    Column("sim_topology", STR, "star, fat_tree or nodes (of k GPUs)"),
    Column("sim_network_model", STR, "SimGrid's network model: 'tcp' (its corrections) or 'alpha_beta' (none)"),
    Column("sim_nic", STR, "'shared' (concurrent sends share a NIC) or 'fifo' (one at a time, as the emulation)"),
    Column("sim_oversubscription", FLOAT, "fat tree: leaf uplink oversubscription (NaN elsewhere)"),
    Column("sim_hosts_per_leaf", INT, "fat tree: ranks per leaf switch (0 elsewhere)"),
    Column("sim_gpus_per_node", INT, "nodes topology: GPUs per node (0 elsewhere)"),
    Column("sim_intra_bandwidth", FLOAT, "nodes topology: the link inside a node in bytes/s (NaN elsewhere)"),
    Column("sim_intra_latency_s", FLOAT, "nodes topology: its latency in seconds (NaN elsewhere)"),
    Column("compute_source", STR, "where a simulation's compute times came from (a profile id, or 'fixed')"),
    Column("sim_wall_s", FLOAT, "wall time the simulation took, seconds"),
    Column("model_comm_s", FLOAT, "the alpha-beta model's communication time for the same step, seconds"),
    # where and how it ran
    Column("status", STR, "'ok' or 'failed'"),
    Column("error", STR, "why it failed ('' when ok)"),
    Column("transport", STR, "gloo, nccl, threads, simgrid, or the sweep's p2p (sockets, sockets-unix, "
                             "sockets-tcp) when it carried the strategy's bytes"),
    Column("gpu", STR, "the GPU's name ('' on CPU)"),
    Column("cores", INT, "CPU cores of the machine (or cluster) the ranks shared"),
    Column("host", STR, "the host rank 0 ran on"),
    Column("cores_oversubscribed", BOOL, "more ranks than CPU cores: compute times include contention"),
    Column("gpu_shared", BOOL, "several workers shared one GPU (no NCCL): compute and transfers contend"),
    Column("started_at", TIME, "when the run started (UTC)"),
    Column("duration_s", FLOAT, "wall time of the whole run in seconds"),
    # the numbers (means over timed steps; a step is the slowest worker's)
    Column("throughput", FLOAT, "samples per second of the whole group"),
    Column("step_time_s", FLOAT, "mean step time in seconds"),
    Column("fast_step_s", FLOAT, "a parameter server without a barrier (SSP, async, backups): the fastest "
                                 "worker's mean seconds per step (compute + communication), the pace at which the "
                                 "servers' parameters advance; step_time_s is the slowest rank's (NaN elsewhere)"),
    Column("compute_s", FLOAT, "mean compute time per step in seconds (slowest worker)"),
    Column("comm_s", FLOAT, "mean exposed communication per step in seconds (slowest worker)"),
    Column("comm_fraction", FLOAT, "communication's share of the step time"),
    Column("backward_end_s", FLOAT, "time from step start to the end of backward, in seconds"),
    Column("exposed_comm_s", FLOAT, "communication after backward ended (what the step waited for), seconds"),
    Column("comm_busy_s", FLOAT, "time some bucket was in flight (syncing, or started and not yet waited for) "
                                 "per step, hidden or not, seconds"),
    Column("overlap_fraction", FLOAT, "share of communication hidden behind backward"),
    Column("buckets", FLOAT, "gradient buckets per step"),
    Column("bytes_sent_per_worker", FLOAT, "payload bytes a worker sent per step (measured)"),
    Column("bytes_recv_per_worker", FLOAT, "payload bytes a worker received per step (measured)"),
    Column("bytes_sent_per_server", FLOAT, "payload bytes a server sent per step (measured)"),
    Column("bytes_recv_per_server", FLOAT, "payload bytes a server received per step (measured)"),
    Column("analytic_bytes_sent_per_worker", FLOAT, "the strategy's analytic bytes per worker per step"),
    Column("analytic_rounds", FLOAT, "sequential message rounds on the critical path (analytic)"),
    Column("analytic_path_bytes", FLOAT, "bytes on the critical path through the busiest NIC (analytic)"),
    Column("numel", INT, "model parameters"),
    Column("model_bytes", INT, "model parameters in bytes (fp32)"),
    Column("final_loss", FLOAT, "workers' mean training loss at the last step"),
    Column("param_norm", FLOAT, "L2 norm of the final parameters"),
    Column("accuracy", FLOAT, "held-out accuracy at the end (NaN: the data set has none)"),
    Column("consensus_distance", FLOAT, "decentralized: mean distance of workers' parameters from their mean"),
    Column("spectral_gap", FLOAT, "decentralized: 1 - |lambda_2| of the mixing matrix"),
    # a run with failures (failures and recovery settings; experiments/pipeline/sweep_faults.py)
    Column("recovery_mode", STR, "the run's recovery mode: none, checkpoint_restart, elastic, ps_shrink, reweight "
                                 "('' for a run without failures)"),
    Column("failure_setting", STR, "the run's failures as set: 'rank r at step s, ...' (a schedule) or 'MTBF x s "
                                   "per worker, seed k' ('' for a run without failures)"),
    Column("failure_mtbf_s", FLOAT, "the failures' mean time between failures per worker, seconds (NaN: a schedule "
                                    "or no failures)"),
    Column("recovery_checkpoint_every", INT, "checkpoint_restart: steps between checkpoints (0: another mode)"),
    Column("recovery_rejoin_steps", INT, "elastic, ps_shrink: steps until a replacement joins (-1: never or another "
                                         "mode)"),
    Column("failure_count", INT, "failures that happened in the run"),
    Column("failure_steps", INTS, "the step each failure happened in (0-based), in order"),
    Column("failure_ranks", INTS, "the worker slot of each failure, in order"),
    Column("completed_steps", INT, "steps completed (the run's steps, or where a failure without recovery ended it)"),
    Column("steps_run", INT, "steps executed, those redone after a restart included"),
    Column("steps_lost", INT, "completed steps thrown away and redone, over all failures"),
    Column("detection_s", FLOAT, "mean seconds from a death to its detection (every survivor stopped; NaN: none)"),
    Column("recovery_s", FLOAT, "mean seconds from a detection to the recovered group's first step (NaN: none)"),
    Column("recovery_max_s", FLOAT, "the longest failure's detection + recovery seconds (NaN: none)"),
    Column("time_to_step_s", FLOAT, "wall seconds from the run's first step to its last completed step, "
                                    "recoveries included (NaN: it ended before its last step)"),
    Column("run_throughput", FLOAT, "samples per second over the run's timed steps on its wall clock: their "
                                    "samples / the time from the end of warm-up to the last completed step, "
                                    "recoveries and redone steps included (NaN: no timed step completed)"),
    Column("outage_count", INT, "links that went down in the run (failures.schedule's { link, step, seconds })"),
    Column("outage_held_s", FLOAT, "seconds the down links held their ranks' messages, over all outages (NaN: "
                                   "none)"),
    Column("outage_failures", INT, "outages that outlasted the communicator's timeout and became the rank's "
                                   "failure"),
)

STEPS: tuple[Column, ...] = (
    Column("run_id", STR, "the run"),
    Column("step", INT, "step index, warm-up included"),
    Column("rank", INT, "the rank"),
    Column("role", STR, "'worker' or 'server'"),
    Column("timed", BOOL, "after warm-up"),
    Column("compute_s", FLOAT, "forward + backward (+ optimizer) time in seconds"),
    Column("comm_s", FLOAT, "exposed communication in seconds"),
    Column("bytes_sent", INT, "payload bytes sent in the step"),
    Column("bytes_recv", INT, "payload bytes received in the step"),
    Column("loss", FLOAT, "training loss (NaN on servers)"),
    Column("samples", INT, "samples processed"),
    Column("consensus_distance", FLOAT, "decentralized: distance from the workers' mean parameters"),
    Column("wall_s", FLOAT, "seconds since the run's first step"),
    Column("backward_end_s", FLOAT, "time from step start to the end of backward, seconds"),
    Column("comm_busy_s", FLOAT, "time spent inside synchronization, seconds"),
    Column("exposed_comm_s", FLOAT, "communication after backward ended, seconds (= comm_s)"),
    Column("overlap_fraction", FLOAT, "share of this step's communication hidden behind backward"),
    # a parameter server without a global barrier (staleness s, "async", backups): on its server rows
    Column("staleness", INTS, "parameter server, staleness s or async: the staleness of every gradient this server "
                              "applied in the step (updates between the pusher's read and its push)"),
    Column("bound_wait_s", FLOAT, "parameter server, staleness s: seconds this server held the step's replies at "
                                  "the staleness bound, summed over workers"),
    Column("dropped_pushes", INT, "parameter server with backups: late pushes of the step this server dropped"),
    Column("eval_value", FLOAT, "a run with a target: this worker's held-out accuracy or loss after the step "
                                "(NaN: not evaluated)"),
)

# The traced steps (trace_steps after warm-up): one row per event of a rank, on one clock per run
# (experiments/pipeline/trace.py records them, experiments/results/events.py reads them).
EVENTS: tuple[Column, ...] = (
    Column("run_id", STR, "the run"),
    Column("step", INT, "step index, warm-up included"),
    Column("rank", INT, "the rank that recorded the event"),
    Column("kind", STR, "'phase' (a compute or exposed-communication phase), 'bucket_ready' (a bucket's last "
                        "gradient ready), 'bucket_sync' (a bucket's sync, started to done) or 'message'"),
    Column("name", STR, "phase: forward, backward, forward+backward, straggle, after backward, optimizer, apply "
                        "(compute), sync in backward, sync (exposed communication); message: send or recv"),
    Column("thread", STR, "'main' (the training loop) or 'comm' (the communication thread of an overlapped run)"),
    Column("bucket", INT, "the gradient bucket (-1: none)"),
    Column("peer", INT, "a message's other rank (-1: none)"),
    Column("nbytes", INT, "a message's payload bytes (0 otherwise)"),
    Column("seq", INT, "a message's place in its rank's posting order (-1 otherwise)"),
    Column("start_s", FLOAT, "seconds since the run's first recorded event (a message: when it was posted)"),
    Column("end_s", FLOAT, "seconds since the run's first recorded event (a message: when its wait completed)"),
)

# Not stored: display labels built on read from the typed columns (results written before the typed schema
# stored them; those stored labels are kept).
DERIVED: tuple[Column, ...] = (
    Column("link", STR, "the link, for display: bandwidth and latency, '(rank r on its own link)', 'kernel' when "
                        "kernel-shaped, or 'full speed' (from the link_* columns)"),
    Column("strategy_label", STR, "the strategy with its non-default parameters, for display (from param_*)"),
    Column("sim_platform", STR, "the simulated platform, for display (from the sim_* and link_* columns)"),
)

TABLES = {"runs": RUNS, "steps": STEPS, "events": EVENTS, "fault_runs": FAULT_RUNS, "failures": FAILURES}


def names(table: tuple[Column, ...]) -> list[str]:
    return [c.name for c in table]


def _default(type_: pa.DataType):
    """What a missing value reads as in pandas: '' for text, 0 for counts, NaN for measures, False, (), NaT."""
    if type_ == STR:
        return ""
    if type_ == INT:
        return 0
    if type_ == FLOAT:
        return math.nan
    if type_ == BOOL:
        return False
    if type_ == INTS:
        return ()
    return pd.NaT


def row(table: tuple[Column, ...], **values) -> dict:
    """One row with every column: the given values, typed defaults elsewhere; an unknown column is an error
    (strategy parameters are the exception: param_<name> columns, typed by the strategy's declaration)."""
    _check_keys(values, table)
    extra = {k: v for k, v in values.items() if k not in names(table)}
    return {**{c.name: values.get(c.name, _default(c.type)) for c in table}, **extra}


def _check_keys(keys, table: tuple[Column, ...]) -> None:
    derived = sorted(set(keys) & set(names(DERIVED))) if table is RUNS else []
    if derived:
        raise KeyError(f"{', '.join(derived)}: derived on read from typed columns, never stored (see "
                       f"experiments/results/schema.py DERIVED)")
    allowed = set(names(table))
    unknown = sorted(k for k in keys if k not in allowed and not (table is RUNS and k.startswith(PARAM)))
    if unknown:
        raise KeyError(f"not columns of the schema: {', '.join(unknown)} (see experiments/results/schema.py)")


# ---- strategy parameters ------------------------------------------------------------------------------------

@functools.cache
def parameter_types(strategy: str) -> dict[str, tuple[pa.DataType, object]]:
    """A registered strategy's parameters: name -> (Arrow type, default). Types come from the strategy config's
    annotations (bool, int, float, str, or one of them | None); anything else is refused, naming it."""
    import strategies

    cls = strategies.get(strategy)
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: fall back to the default's type
        hints = {}
    out = {}
    declared_names = cls.parameters()  # fields that are run settings (ddp's compression) are no param_* column
    for f in fields(cls):
        if f.name not in declared_names:
            continue
        declared = hints.get(f.name, type(f.default))
        members = {a for a in typing.get_args(declared) if a is not type(None)} or {declared}
        if not members <= set(_SCALARS):
            raise TypeError(f"strategy {strategy!r} parameter {f.name!r} is declared {declared!r}: a results "
                            f"column holds bool, int, float, str or a union of them (| None allowed)")
        out[f.name] = (_union([m for m in _SCALARS if m in members]), f.default)
    return out


def _union(members: list[type]) -> pa.DataType:
    """One scalar type, or for a union (staleness: int | str) a struct with one field per member type, exactly
    one of them set: Parquet has no union type, and text would lose the type."""
    if len(members) == 1:
        return _SCALARS[members[0]]
    return pa.struct([(m.__name__, _SCALARS[m]) for m in members])


def _param_type(strategy: str, name: str, value) -> pa.DataType:
    """The column type of param_<name> for a run of `strategy`: its declaration, else the value's own type."""
    try:
        declared = parameter_types(strategy)
    except ValueError:  # not registered here (a plug-in not installed): the value's Python type
        declared = {}
    if name in declared:
        return declared[name][0]
    for python_type, arrow in _SCALARS.items():
        if isinstance(value, python_type):
            return arrow
    raise TypeError(f"{PARAM}{name} = {value!r}: a strategy parameter must be a bool, int, float or str")


# ---- writing: rows -> a typed Arrow table ---------------------------------------------------------------------

def to_arrow(rows: list[dict], table: tuple[Column, ...]) -> pa.Table:
    """Rows as an Arrow table in the schema's types (missing columns null); strategy parameters typed by the
    run's strategy. A value that is not of its column's type is a TypeError naming the column and the value."""
    keys = {k for r in rows for k in r}
    _check_keys(keys, table)
    columns = {c.name: c.type for c in table}
    for name in sorted(k for k in keys if k.startswith(PARAM) and k not in columns):
        first = next(r for r in rows if r.get(name) is not None)
        columns[name] = _param_type(first.get("strategy", ""), name[len(PARAM):], first[name])
    typed = [{name: _cell(r.get(name), type_, name) for name, type_ in columns.items()} for r in rows]
    return pa.Table.from_pylist(typed, schema=pa.schema(list(columns.items())))


def _cell(value, type_: pa.DataType, column: str):
    """One value in its column's Python type, or None (null); TypeError for a value of another type."""
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if pa.types.is_struct(type_):  # a union: the member field of the value's own type
        for member in type_:
            if type(value).__name__ == member.name:
                return {member.name: _cell(value, member.type, column)}
        accepted = " or ".join(m.name for m in type_)
        raise TypeError(f"column {column} = {value!r} ({type(value).__name__}): accepted is {accepted}")
    if hasattr(value, "item") and not isinstance(value, (list, tuple)) and getattr(value, "ndim", 0) == 0:
        value = value.item()  # numpy scalars
    if type_ == FLOAT and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if type_ == INT and isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and math.isnan(value):
            return None
        if float(value).is_integer():
            return int(value)
    elif type_ == BOOL and isinstance(value, bool):
        return value
    elif type_ == STR and isinstance(value, str):
        return value
    elif type_ == INTS and (isinstance(value, (list, tuple)) or hasattr(value, "tolist")):
        items = list(value.tolist() if hasattr(value, "tolist") else value)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in items):
            return items
    elif type_ == TIME and isinstance(value, (str, dt.datetime)):
        try:
            when = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
        except ValueError:
            pass
        else:
            return when if when.tzinfo else when.replace(tzinfo=dt.UTC)
    accepted = _TYPE_NAMES.get(type_, str(type_))
    raise TypeError(f"column {column} = {value!r} ({type(value).__name__}): accepted is {accepted}")


_TYPE_NAMES = {STR: "a str", INT: "an integer", FLOAT: "a number", BOOL: "a bool (True/False, never a string)",
               INTS: "a list of integers", TIME: "an ISO time or a datetime"}


# ---- reading: any frame of ours -> pandas in the schema's types ---------------------------------------------

def conform(frame: pd.DataFrame, table: tuple[Column, ...], *, extra_ok: bool = True) -> pd.DataFrame:
    """The frame with every schema column present (typed defaults where missing) and typed as declared, strategy
    parameters as Python values (None where a run's strategy has no such parameter) and, for runs, the derived
    display labels; columns beyond the schema are kept (extra_ok) or refused."""
    params = sorted(c for c in frame.columns if c.startswith(PARAM) and c not in names(table)) if table is RUNS else []
    known = set(names(table)) | set(params) | (set(names(DERIVED)) if table is RUNS else set())
    extra = [c for c in frame.columns if c not in known]
    if extra and not extra_ok:
        raise KeyError(f"columns not in the schema: {', '.join(extra)} (see experiments/results/schema.py)")
    missing = {c.name: [_default(c.type)] * len(frame) for c in table if c.name not in frame}
    # the missing columns joined at once: one insert per column fragments the frame (pandas warns of it)
    frame = pd.concat([frame, pd.DataFrame(missing, index=frame.index)], axis=1) if missing else frame.copy()
    for c in table:
        if c.name in missing:
            continue
        if c.type == BOOL:
            frame[c.name] = frame[c.name].fillna(False).astype(bool)
        elif c.type == FLOAT:
            frame[c.name] = pd.to_numeric(frame[c.name], errors="coerce").astype(float)
        elif c.type == INT:
            frame[c.name] = pd.to_numeric(frame[c.name], errors="coerce").fillna(0).astype("int64")
        elif c.type == STR:
            frame[c.name] = frame[c.name].fillna("").astype(str)
        elif c.type == TIME:  # ISO text (results written before the typed schema) or timestamps
            frame[c.name] = pd.to_datetime(frame[c.name], utc=True, errors="coerce", format="ISO8601")
        else:  # list of ints
            frame[c.name] = [tuple(int(x) for x in v) if hasattr(v, "__len__") else () for v in frame[c.name]]
    for name in params:  # Python values in the declared type, None where the run's strategy has no such parameter
        values = [_param_value(s, name[len(PARAM):], v) for s, v in zip(frame["strategy"], frame[name])]
        frame[name] = pd.Series(values, index=frame.index, dtype=object)
    if table is RUNS:
        frame = frame.copy()  # one block again after the columns above (pandas warns of a fragmented frame)
        _derive_labels(frame, params)
    order = names(table) + (names(DERIVED) if table is RUNS else []) + params
    return frame[order + [c for c in frame.columns if c not in order]]


def _param_value(strategy: str, name: str, value):
    """A stored parameter as the strategy declares it (pandas turns an int column with gaps into floats); None
    for a parameter the run's strategy does not have (results before the typed schema stored 0, '' or False)."""
    value = _python(value)
    try:
        declared = _declared(strategy)
    except (ValueError, TypeError):  # not registered here: as stored
        return value
    if name not in declared or value is None:
        return None
    if declared[name] == INT and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _declared(strategy: str) -> dict[str, pa.DataType]:
    return {k: t for k, (t, _) in parameter_types(strategy).items()}


def _python(value):
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, dict):  # a union's struct: its one member that is set
        return next((_python(v) for v in value.values() if _python(v) is not None), None)
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and math.isnan(value) else value


def _derive_labels(frame: pd.DataFrame, params: list[str]) -> None:
    """Fill link, strategy_label and sim_platform from the typed columns where no stored label exists."""
    derived = {
        "link": [link_label(r.link_bandwidth, r.link_latency_s, r.link_heterogeneous, r.link_emulation, r.link_ranks)
                 for r in frame[["link_bandwidth", "link_latency_s", "link_heterogeneous", "link_emulation",
                                 "link_ranks"]].itertuples(index=False)],
        "strategy_label": [strategy_label(s, nondefault_params(s, {p[len(PARAM):]: row[p] for p in params}))
                           for s, row in zip(frame["strategy"], frame[params].to_dict("records")
                                             if params else [{}] * len(frame))],
        "sim_platform": [platform_label(r) if r["substrate"] == "simgrid" and r["sim_topology"] else ""
                         for r in frame.to_dict("records")],
    }
    for name, values in derived.items():
        values = pd.Series(values, index=frame.index, dtype=object)
        if name in frame:
            stored = frame[name].fillna("").astype(str)
            frame[name] = stored.where(stored != "", values)
        else:
            frame[name] = values


# ---- display labels, from typed values ---------------------------------------------------------------------

def nondefault_params(strategy: str, params: dict) -> dict:
    """The parameters that differ from the strategy's defaults (all of them when it is not registered here)."""
    try:
        defaults = {k: d for k, (_, d) in parameter_types(strategy).items()}
    except (ValueError, TypeError):
        defaults = {}
    if defaults:
        params = {k: v for k, v in params.items() if k in defaults}
    return {k: v for k, v in params.items() if v is not None and (k not in defaults or v != defaults[k])}
