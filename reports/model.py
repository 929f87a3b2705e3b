"""The `syncbench model` table and the extrapolation, built on the cost model in strategies/cost.py (the formulas,
BytePS's optimum, calibration, the overlap timeline: re-exported here for the report's modules).

Units: bytes and seconds everywhere; MB = 10^6 bytes, Gbit = 10^9 bits.
"""

from __future__ import annotations

import functools
import math

import pandas as pd

from strategies import get as get_strategy
from strategies import make as make_strategy
from strategies import names as strategy_names
from strategies.cost import (  # noqa: F401 - re-exported: the report's modules price communication through here
    GBIT,
    MB,
    AlphaBeta,
    Fabric,
    NetworkModel,
    Timeline,
    bandwidth_for,
    bandwidth_needed,
    byteps_optimum,
    calibrate,
    comm_time,
    config_path,
    critical_path,
    node_cost,
    optimum_comm_s,
    overlap_timeline,
    parallel_efficiency,
    parse_strategy,
    pipeline_fill,
    step_timeline,
    sync_period,
    sync_seconds,
)
from workloads.buckets import make_buckets
from workloads.models import MODELS as WORKLOAD_MODELS
from workloads.models import default_num_classes, describe_size, param_count, param_shapes

MODELS = tuple(m for m in WORKLOAD_MODELS if m != "tiny")  # the torchvision models `syncbench model` knows
EXTRAPOLATION_WORKERS = (8, 16, 32, 64, 128, 256, 512, 1024)
EXTRAPOLATION_LINKS = {"1 Gbit": 1 * GBIT, "10 Gbit": 10 * GBIT, "25 Gbit": 25 * GBIT, "100 Gbit": 100 * GBIT}
TARGET_EFFICIENCIES = (0.5, 0.8, 0.9)
# `syncbench model --workers`: counting the analytic traffic of 1,024 workers takes ~5 s on one core, and it
# grows about as n^2, so 10,000 would take minutes
MAX_MODEL_WORKERS = 1024


@functools.cache
def model_numel(model: str, num_classes: int | None = None) -> int:
    """Parameter count of a model with `num_classes` outputs (default: the workload's, as sweeps size it; vgg16
    with 1,000 -> 138,357,544), counted by workloads; cached."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: known are {', '.join(MODELS)} (or give model bytes)")
    num_classes = default_num_classes(model) if num_classes is None else num_classes
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or not 2 <= num_classes <= 100_000:
        raise ValueError(f"bad num_classes {num_classes!r}: expected a whole number from 2 to 100,000")
    return param_count(model, num_classes=num_classes, image_size=224)


def inexact_note(config) -> str:
    """'' for an exact reduction; otherwise why the strategy is not an allreduce (it is compared by time to a
    target accuracy, not by step time alone)."""
    if not config.exact:
        return "NOT an allreduce: neighbour averaging (inexact)"
    if getattr(config, "staleness", 0) != 0 or getattr(config, "backups", 0):
        return "NOT exact: stale or dropped gradients"
    kind = getattr(getattr(config, "compression", None), "compression", "none")
    if kind != "none":
        return f"NOT exact: {kind} compressed gradients"
    if sync_period(config) > 1:
        return f"NOT exact: local steps, parameters averaged every {sync_period(config)} steps"
    return ""


# ---- the `syncbench model` table --------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def workload_shapes(workload: str, numel: int, num_classes: int | None = None):
    """The parameter shapes of a workload whose buffer holds `numel` elements (PowerSGD's bytes are per tensor),
    or None when they are not known (model bytes given, another class count): its traffic then takes the buffer as
    one tensor."""
    if workload not in WORKLOAD_MODELS:
        return None
    try:
        shapes = param_shapes(workload, default_num_classes(workload) if num_classes is None else num_classes)
    except ValueError:
        return None
    return shapes if sum(math.prod(shape) for shape in shapes) == numel else None


def model_table(model: str | None, model_bytes: float | None, workers: int, bandwidth: float,
                step_time: float | None, latency: float = 0.0, target_efficiency: float = 0.9,
                strategies: list[str] | None = None, num_classes: int | None = None, profile=None,
                bucket_mb: float | None = 25.0, ranks_per_node: int = 1,
                intra_bandwidth: float = math.inf, network: str = "alpha_beta") -> pd.DataFrame:
    """One row per strategy: communication time, efficiency P, step time Tp and bandwidth for the target P.

    Give `model` (a torchvision name) or `model_bytes` (fp32 gradient bytes), not both. bandwidth in bytes/s,
    step_time (the compute time Ts) and latency in seconds. With a `profile` (workloads.profile.Profile, measured
    or synthetic) the model, its classes and Ts come from it, and gradients are synchronized in `bucket_mb`
    buckets overlapped with backward as each bucket's gradients become ready: comm s is the busy time, exposed s
    what the step waits for, P = Ts / (Ts + exposed). With `ranks_per_node` > 1 the workers sit in nodes of that
    many sharing one NIC of `bandwidth` (intra_bandwidth inside a node): comm s is the slower level's time
    (strategies.cost.node_cost), the NIC's and intra-node bytes and the bottleneck get columns; a strategy with no
    per-level traffic gets a note instead of numbers. `network`: 'alpha_beta' (latency + bytes / bandwidth) or 'tcp'
    (SimGrid's LV08 corrections, strategies.cost.lv08_fabric), refused otherwise before any work.
    """
    network = NetworkModel.parse(network)
    model, numel, num_classes, step_time = _resolve_model(model, model_bytes, step_time, num_classes, profile)
    _check_inputs(workers, bandwidth, step_time, latency, target_efficiency, ranks_per_node, intra_bandwidth)
    labels, configs = _configs(strategies, int(workers), numel, ranks_per_node)

    buckets = make_buckets(profile.numels, bucket_mb, profile.itemsize) if profile is not None else ()
    fabric = Fabric(bandwidth, latency, int(ranks_per_node), intra_bandwidth, network=network)
    shapes = workload_shapes(model, numel, num_classes) if model is not None else None
    rows = []
    for label, config in zip(labels, configs):
        row = {"strategy": label, "workers": int(workers), "model_bytes": numel * 4, "exact": inexact_note(config)}
        try:
            rows.append(row | _priced_row(config, int(workers), numel, fabric, step_time, target_efficiency, shapes,
                                          profile, buckets))
        except (ValueError, NotImplementedError) as e:  # e.g. no per-level traffic on nodes
            rows.append(row | {"rounds": math.nan, "path_bytes": math.nan, "comm_s": math.nan,
                               "optimum_s": math.nan, "efficiency": math.nan, "step_s": math.nan,
                               "bandwidth_needed": math.nan, "note": str(e)})
    df = pd.DataFrame(rows)
    df.attrs.update(model=model or "", bandwidth=bandwidth, step_time=step_time, latency=latency,
                    target_efficiency=target_efficiency, numel=numel, num_classes=num_classes,
                    profile=profile, bucket_mb=bucket_mb, buckets=len(buckets), ranks_per_node=int(ranks_per_node),
                    intra_bandwidth=intra_bandwidth, network=network.value)
    return df


def _resolve_model(model, model_bytes, step_time, num_classes, profile) -> tuple:
    """(model, numel, num_classes, step_time): from the profile, the model's name or its bytes (one of them)."""
    if profile is not None:
        if model is not None or model_bytes is not None or step_time is not None:
            raise ValueError("a profile names the model and its step time: give it without model, model bytes or "
                             "step time")
        model, num_classes, step_time = profile.model, profile.num_classes, profile.step_s
    if (model is None) == (model_bytes is None):
        raise ValueError(f"give a model name or model bytes, not {'both' if model else 'neither'} "
                         f"(model={model!r}, model_bytes={model_bytes!r})")
    if model is not None:
        numel = profile.numel if profile is not None else model_numel(model, num_classes)
        num_classes = profile.num_classes if profile is not None else (
            default_num_classes(model) if num_classes is None else num_classes)
    else:
        if not model_bytes > 0:
            raise ValueError(f"bad model bytes {model_bytes!r}: expected a size > 0, e.g. 553.36MB")
        numel = round(model_bytes / 4)  # fp32
    return model, numel, num_classes, step_time


def _check_inputs(workers, bandwidth, step_time, latency, target_efficiency, ranks_per_node, intra_bandwidth) -> None:
    """ValueError naming the first bad number and what is accepted."""
    if isinstance(workers, bool) or int(workers) != workers or not 1 <= workers <= MAX_MODEL_WORKERS:
        raise ValueError(f"bad workers {workers!r}: expected a whole number from 1 to {MAX_MODEL_WORKERS:,}")
    if not 0 < bandwidth < math.inf:
        raise ValueError(f"bad bandwidth {bandwidth!r}: expected bytes/s greater than zero")
    if step_time is None or not 0 < step_time < math.inf:
        raise ValueError(f"bad step time {step_time!r}: expected the compute time per step in seconds, > 0")
    if not 0 <= latency < math.inf:
        raise ValueError(f"bad latency {latency!r}: expected seconds >= 0")
    if not 0 < target_efficiency < 1:
        raise ValueError(f"bad target efficiency {target_efficiency!r}: expected a number between 0 and 1")
    if isinstance(ranks_per_node, bool) or int(ranks_per_node) != ranks_per_node or not 1 <= ranks_per_node <= 1024:
        raise ValueError(f"bad ranks per node {ranks_per_node!r}: expected a whole number from 1 to 1024")
    if not intra_bandwidth > 0:
        raise ValueError(f"bad intra-node bandwidth {intra_bandwidth!r}: expected bytes/s greater than zero")


def _configs(strategies: list[str] | None, workers: int, numel: int, ranks_per_node: int) -> tuple[list, list]:
    """The strategies' labels (as given, or every known name) and their configs, each checked for its messages."""
    known = strategy_names()
    specs = [parse_strategy(text) for text in strategies] if strategies else [(name, {}) for name in known]
    # a node-aware strategy groups by the priced nodes unless its parameters say otherwise (as a sweep's run does)
    specs = [(name, {"ranks_per_node": int(ranks_per_node), **params}
              if name in known and "ranks_per_node" in get_strategy(name).parameters() else params)
             for name, params in specs]
    unknown = [n for n, _ in specs if n not in known]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}: known are {', '.join(known)}")
    labels = list(strategies) if strategies else known
    configs = []
    for label, (name, params) in zip(labels, specs):
        try:
            configs.append(make_strategy(name, **params))
            configs[-1].check_messages(workers, numel)  # before pricing: 1e-9 MiB partitions took 7 GB
        except TypeError as e:
            raise ValueError(f"strategy {label!r}: {e}") from None
    return labels, configs


def _path_bytes(config, workers, numel, fabric, itemsize, shapes) -> float:
    """One sync's bytes on the critical path: the busiest NIC's (on nodes: the busiest node NIC's)."""
    if fabric.ranks_per_node > 1:
        return node_cost(config, workers, numel, fabric.ranks_per_node, fabric.bandwidth, fabric.intra_bandwidth,
                         fabric.latency, fabric.intra_latency, itemsize).nic_bytes
    return config_path(config, workers, numel, itemsize, shapes)[1]


def _priced_row(config, workers, numel, fabric, step_time, target, shapes, profile, buckets) -> dict:
    """One strategy's row, every figure from the one price (strategies.cost.sync_seconds, step_timeline): comm s,
    P, step s and S, the NIC bandwidth at which the same price gives the target P (so S fed back gives it).
    With a profile, buckets overlapped with backward as each one's gradients become ready (a pipelining
    strategy's, the dedicated PS's, last fan-out under the next bucket); parameter averaging follows the step.
    On nodes (fabric.ranks_per_node > 1), with or without a profile: each level at its own bandwidth."""
    rounds, path_bytes, note = config_path(config, workers, numel, 4, shapes)
    optimum = optimum_comm_s(config, workers, numel * 4, fabric.bandwidth) if fabric.ranks_per_node == 1 \
        else math.nan  # BytePS's bound assumes a NIC per worker: not a bound for workers sharing one
    out = {"rounds": rounds, "path_bytes": path_bytes, "optimum_s": optimum, "note": note}
    if fabric.ranks_per_node > 1:
        levels = node_cost(config, workers, numel, fabric.ranks_per_node, fabric.bandwidth, fabric.intra_bandwidth,
                           fabric.latency, fabric.intra_latency)
        out |= {"path_bytes": levels.nic_bytes, "nic_bytes": levels.nic_bytes, "intra_bytes": levels.intra_bytes,
                "bottleneck": levels.bottleneck}
    if profile is None:
        def exposed(f: Fabric) -> float:
            return sync_seconds(config, workers, numel, f, 4, shapes)

        tt = exposed(fabric)
        out |= {"comm_s": tt, "efficiency": parallel_efficiency(step_time, tt), "step_s": step_time + tt}
    else:
        ready = [(max(profile.params[i].ready_s for i in b.params), b.numel) for b in buckets]
        bucket_shapes = [tuple(shapes[i] for i in sorted(b.params)) for b in buckets] if shapes else None

        def timeline(f: Fabric):
            return step_timeline(config, workers, ready, f, profile.forward_s, profile.backward_s,
                                 profile.optimizer_s, overlap=True, itemsize=profile.itemsize,
                                 bucket_shapes=bucket_shapes)

        def exposed(f: Fabric) -> float:
            return timeline(f).exposed_s

        t = timeline(fabric)
        step_time = profile.step_s
        out |= {"comm_s": t.busy_s, "exposed_s": t.exposed_s, "efficiency": parallel_efficiency(step_time,
                                                                                               t.exposed_s),
                "step_s": t.step_s, "path_bytes": sum(_path_bytes(config, workers, n, fabric, profile.itemsize, shape)
                                                      for (_, n), shape in zip(ready, bucket_shapes or
                                                                               [None] * len(ready)))}
    out["bandwidth_needed"] = bandwidth_for(
        lambda bw: parallel_efficiency(step_time, exposed(fabric.with_bandwidth(bw))), target)
    return out


def format_model_table(df: pd.DataFrame) -> str:
    """A plain table of model_table()'s rows, to paste into an issue."""
    a = df.attrs
    target = a.get("target_efficiency", 0.9)
    profile = a.get("profile")
    head = []
    if a:
        if a["model"]:
            what = describe_size(a["model"], a["num_classes"]) if profile is None else (
                f"{a['model']}, {a['num_classes']:,} classes: {a['numel']:,} parameters, "
                f"{a['numel'] * 4 / MB:,.2f} MB fp32")
        else:
            what = f"model: {a['numel']:,} parameters, {a['numel'] * 4 / MB:,.2f} MB fp32"
        ts = (f"compute time Ts {a['step_time']:g} s" if a["step_time"] == a["step_time"] else
              "compute time Ts not given (--step-time): bytes and times only, no P, step s or S")
        head = [f"# {what}; link {a['bandwidth'] / MB:,.2f} MB/s ({a['bandwidth'] / GBIT:g} Gbit/s), "
                f"latency {a['latency'] * 1e6:g} us; {ts}"]
        if a.get("network", "alpha_beta") == "tcp":
            head.append("# network tcp: SimGrid's LV08 priced (latency x 13.01, bandwidth x 0.97 and at most one "
                        "TCP window of 4 MiB per 2 route latencies, / 1.05 for the ACKs where a rank sends while it "
                        "receives); the optimum column stays BytePS's alpha-beta bound")
        if profile is not None:
            label = "SYNTHETIC profile (described, not measured)" if profile.synthetic else "measured profile"
            buckets = "one flat bucket" if a["bucket_mb"] is None else f"{a['bucket_mb']:g} MiB buckets"
            head.append(f"# {label} {profile.id}: {profile.device_name}; {a['buckets']} x {buckets} overlapped "
                        f"with backward; comm s = busy, exposed s = what the step waits for, P = Ts/(Ts+exposed)")
        head.append("# MB = 10^6 bytes, Gbit = 10^9 bits; S = bandwidth needed for the target efficiency; optimum = "
                    "BytePS's bound 2n(n-1)M/((n^2+kn-2k)B) with the strategy's k extra server NICs (k = 0: an "
                    "allreduce's); exact: blank for an exact reduction")
    nodes = "nic_bytes" in df  # nodes of several ranks: path MB is the busiest node NIC's
    if nodes and head:
        intra = "unlimited" if math.isinf(a["intra_bandwidth"]) else f"{a['intra_bandwidth'] / MB:,.2f} MB/s"
        head.insert(1, f"# nodes of {a['ranks_per_node']} workers sharing one NIC of the link above, {intra} inside "
                       f"a node; path MB = the busiest node NIC's bytes, bound = the level that takes longer")
    overlapped = "exposed_s" in df
    columns = ["strategy", "workers", "rounds", "path MB", "comm s"] + (["exposed s"] if overlapped else []) + (
        ["intra MB", "bound"] if nodes else []) + [
        "optimum s", "P", "step s", f"S for P={target:g} MB/s", "Gbit/s", "exact", "note"]
    lines = []
    for r in df.itertuples():
        exact = getattr(r, "exact", "")
        if math.isnan(r.comm_s):
            cells = [r.strategy, str(r.workers)] + ["-"] * (len(columns) - 4) + [exact, r.note]
        else:
            if math.isnan(r.bandwidth_needed):  # no compute time given: no requirement to state
                s = gbit = "-"
            elif math.isinf(r.bandwidth_needed):
                s = gbit = "unreachable"
            else:
                s, gbit = f"{r.bandwidth_needed / MB:,.0f}", f"{r.bandwidth_needed / GBIT:,.1f}"
            optimum = "-" if math.isnan(r.optimum_s) else f"{r.optimum_s:.3f}"
            cells = [r.strategy, str(r.workers), f"{r.rounds:,}", f"{r.path_bytes / MB:,.2f}", f"{r.comm_s:.3f}"]
            cells += [f"{r.exposed_s:.3f}"] if overlapped else []
            cells += [f"{r.intra_bytes / MB:,.2f}", r.bottleneck] if nodes else []
            cells += [optimum, "-" if math.isnan(r.efficiency) else f"{r.efficiency:.4f}",
                      "-" if math.isnan(r.step_s) else f"{r.step_s:.2f}", s, gbit, exact, r.note]
        lines.append(cells)
    widths = [max([len(c)] + [len(cells[i]) for cells in lines]) for i, c in enumerate(columns)]
    left = (0, len(columns) - 2, len(columns) - 1)  # strategy, exact and note left-aligned, numbers right
    fmt = "  ".join(f"{{:<{w}}}" if i in left else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = head + [fmt.format(*columns).rstrip()] + [fmt.format(*cells).rstrip() for cells in lines]
    return "\n".join(out)


# ---- the extrapolation --------------------------------------------------------------------------------

def extrapolate(numel: int, strategy_specs: list[tuple[str, str, str]], alpha: float,
                workers=EXTRAPOLATION_WORKERS, links: dict[str, float] | None = None,
                compute_s: float | None = None, shapes=None) -> pd.DataFrame:
    """Modelled comm time per step for each (label, name, params JSON) strategy, n and link; not measured.
    `shapes`: the buffer's tensors (workload_shapes), for strategies whose bytes depend on them."""
    links = EXTRAPOLATION_LINKS if links is None else links
    rows = []
    for label, name, params in strategy_specs:
        for n in workers:
            try:
                rounds, path_bytes, note = critical_path(name, n, numel, params, shapes=shapes)
            except (ValueError, NotImplementedError):
                continue  # this strategy cannot run on n workers (e.g. it needs a power of two)
            for link, bandwidth in links.items():
                tt = comm_time(rounds, path_bytes, bandwidth, alpha)
                row = {"strategy": label, "workers": n, "link": link, "bandwidth": bandwidth,
                       "rounds": rounds, "path_bytes": path_bytes, "comm_s": tt, "note": note}
                if compute_s is not None:
                    row |= {"efficiency": parallel_efficiency(compute_s, tt), "step_s": compute_s + tt}
                rows.append(row)
    return pd.DataFrame(rows)
