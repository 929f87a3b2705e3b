"""`syncbench map`: which strategy wins where, over a grid of workers x NIC bandwidth (a workload's step or one
sync) or, for the collective alone, workers x message size.

Every cell prices every candidate through the one price of a sync (strategies.cost.sync_seconds; with a profile,
step_timeline's buckets overlapped with backward), so the map and `syncbench model` cannot disagree. A strategy
with a knob is priced at each of its knob's values and the cheapest is kept (the value is shown): the parameter
server's servers and partition size, hierarchical's inner strategy and pipeline pieces, the double binary tree's
chunks. Inexact strategies (compression, local SGD, neighbour averaging) do not compute the same result: they
never enter the exact ranking and, when asked for, are priced beside it under their own label.

Units: bytes and seconds; Gbit = 10^9 bits; KiB/MiB = 2^10/2^20 bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

import strategies as registry
from reports.map_text import (  # noqa: F401 (the result and its words, named here for the map's callers)
    COLUMNS,
    EXACT_TIE,
    SHORT,
    TIE_BAND,
    StrategyMap,
    _pct,
    cell_text,
    crossovers,
    fmt_bandwidth,
    fmt_size,
    format_table,
    lead_text,
    short_params,
)
from strategies.cost import GBIT, Fabric, NetworkModel, step_timeline, sync_seconds
from strategies.knobs import CHUNKS, PARTITIONS_MB, PIPELINE_MB, cheapest  # the values a run's unset knob tries too

MAX_WORKERS = 16384  # as sweeps: every strategy's traffic counts in O(n) (16,384 workers: about 6 s a row)
MAX_RANKS_PER_NODE = 1024
MAX_MESSAGE_BYTES = 2**34
DEFAULT_WORKERS = tuple(2**i for i in range(1, 11))  # 2 .. 1,024
DEFAULT_BANDWIDTHS = tuple(g * GBIT for g in (1, 2.5, 5, 10, 25, 40, 100, 200, 400))
DEFAULT_SIZES = tuple(2**i for i in range(10, 31, 2))  # 1 KiB .. 1 GiB
DEFAULT_WITHIN = 0.02

# the exact strategies a map ranks by default, one NIC per rank; on nodes only those with per-level traffic
EXACT_FLAT = ("ring", "halving_doubling", "reduce_broadcast", "all_to_all", "double_binary_tree", "parameter_server")
EXACT_NODES = ("ring", "double_binary_tree", "hierarchical", "node_parameter_server")
# not ranked: their bytes are the backend's (priced as a ring, they would tie it), or a slower ring's
NOT_RANKED = {"native": "priced as a ring (the backend hides its bytes)",
              "ddp": "priced as a ring (the backend hides its bytes)"}
# inexact candidates, priced under their own label when asked for (codec time not priced: bytes only)
INEXACT = (("ring+fp16", "ring", {"compression": "fp16"}),
           ("ring+bf16", "ring", {"compression": "bf16"}),
           ("ring+powersgd_r4", "ring", {"compression": "powersgd", "powersgd_rank": 4}),
           ("ring+topk_1%", "ring", {"compression": "topk", "topk_ratio": 0.01}),
           ("ring+local_sgd_H8", "ring", {"sync_every": 8}),
           ("decentralized", "decentralized", {}))
# knob values at the end of the range tried that is not a true bound: a cheaper value may lie beyond (the cell
# says so with '*'); servers 1 and n, 1 chunk and an unpipelined hierarchical are true bounds
OPEN_EDGES = {"chunks": (max(CHUNKS),), "partition_mb": (min(PARTITIONS_MB), max(PARTITIONS_MB)),
              "pipeline_mb": (min(PIPELINE_MB),)}


# ---- what is mapped ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """What one cell prices: a buffer of numel fp32 elements synchronized once (measure 'sync'), or once per step
    after compute_s of compute (measure 'step'), or a profile's buckets overlapped with backward ('step')."""

    numel: int
    compute_s: float | None = None
    profile: object | None = None
    bucket_mb: float | None = 25.0
    shapes: tuple | None = None
    label: str = ""

    @property
    def measure(self) -> str:
        return "step" if self.compute_s is not None or self.profile is not None else "sync"


@dataclass(frozen=True)
class Candidate:
    """One strategy at one knob setting."""

    strategy: str
    params: tuple = ()  # sorted (key, value) pairs: hashable, in the order shown
    label: str = ""     # the inexact candidates' own name; the strategy's otherwise

    @property
    def name(self) -> str:
        return self.label or self.strategy

    def config(self):
        return registry.make(self.strategy, **dict(self.params))

    def at_open_edge(self) -> bool:
        """A knob at the end of its tried range where a value beyond might be cheaper (OPEN_EDGES)."""
        return any(v in OPEN_EDGES.get(k, ()) for k, v in self.params)

    def params_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isinf(v) else v) for k, v in self.params}


def _powers_up_to(n: int) -> list[int]:
    out = [2**i for i in range(n.bit_length()) if 2**i <= n]
    return out + ([n] if n not in out else [])


def knob_space(strategy: str, workers: int, ranks_per_node: int, placement: str = "colocated") -> list[Candidate]:
    """Every setting of a strategy's knob(s) the map tries at `workers` ranks (one candidate for a strategy with
    none). A node-aware strategy groups by the priced nodes (ranks_per_node is the user's, never a knob)."""
    k = ranks_per_node
    if strategy == "parameter_server":
        placements = ("colocated", "dedicated") if placement == "both" else (placement,)
        return [Candidate(strategy, (("partition_mb", p), ("placement", where), ("servers", s)))
                for where in placements for s in _powers_up_to(workers) for p in PARTITIONS_MB]
    if strategy == "node_parameter_server":
        nodes = -(-workers // k)
        return [Candidate(strategy, (("partition_mb", p), ("ranks_per_node", k), ("servers", s)))
                for s in _powers_up_to(max(nodes, 1)) for p in PARTITIONS_MB]
    if strategy == "double_binary_tree":
        return [Candidate(strategy, (("chunks", c), ("ranks_per_node", k))) for c in CHUNKS]
    if strategy == "hierarchical":
        return [Candidate(strategy, (("inner", inner), ("pipeline_mb", mb), ("ranks_per_node", k)))
                for inner in ("ring", "halving_doubling") for mb in PIPELINE_MB]
    return [Candidate(strategy)]


# ---- checking the request before any work -----------------------------------------------------------------

def _whole(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and float(value).is_integer()


def check_grid(workers, bandwidths, latency: float, ranks_per_node: int = 1, strategies=None,
               sizes=None, placement: str = "colocated", within: float = DEFAULT_WITHIN) -> list[str]:
    """The strategies to rank; ValueError naming the first bad value and what is accepted, before any pricing."""
    if not workers:
        raise ValueError(f"no worker counts: accepted are whole numbers from 2 to {MAX_WORKERS:,}, e.g. 2,4,8")
    for n in workers:
        if not _whole(n) or not 2 <= n <= MAX_WORKERS:
            raise ValueError(f"bad workers {n!r}: accepted are whole numbers from 2 to {MAX_WORKERS:,}")
    if not bandwidths:
        raise ValueError("no bandwidths: accepted are bytes/s greater than zero, e.g. 1Gbit,10Gbit")
    for b in bandwidths:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b < math.inf:
            raise ValueError(f"bad bandwidth {b!r}: accepted are bytes/s greater than zero and finite, e.g. 1Gbit")
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not 0 <= latency < math.inf:
        raise ValueError(f"bad latency {latency!r}: accepted are seconds >= 0, e.g. 50us")
    if not _whole(ranks_per_node) or not 1 <= ranks_per_node <= MAX_RANKS_PER_NODE:
        raise ValueError(f"bad ranks per node {ranks_per_node!r}: accepted are whole numbers from 1 to "
                         f"{MAX_RANKS_PER_NODE:,}")
    if sizes is not None:
        if not sizes:
            raise ValueError("no message sizes: accepted are sizes from 4 bytes to 16 GiB, e.g. 4K,1M")
        for s in sizes:
            if not _whole(s) or not 4 <= s <= MAX_MESSAGE_BYTES or s % 4:
                raise ValueError(f"bad message size {s!r}: accepted are whole fp32 elements, multiples of 4 bytes "
                                 f"from 4 to {MAX_MESSAGE_BYTES:,} (16 GiB)")
    if placement not in ("colocated", "dedicated", "both"):
        raise ValueError(f"bad parameter server placement {placement!r}: accepted are colocated, dedicated, both")
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not 0 < within < 1:
        raise ValueError(f"bad threshold {within!r}: accepted are fractions between 0 and 1, e.g. 0.02")
    default = EXACT_NODES if ranks_per_node > 1 else EXACT_FLAT
    chosen = list(strategies) if strategies else list(default)
    known = registry.names()
    for name in chosen:
        if name not in known:
            raise ValueError(f"unknown strategy {name!r}: accepted are {', '.join(known)}")
        config = registry.make(name) if name not in ("hierarchical", "node_parameter_server") else None
        if config is not None and not config.exact:
            raise ValueError(f"strategy {name!r} is not an exact allreduce: it is priced beside the ranking with "
                             f"--inexact, not in it; accepted are the exact ones, e.g. {', '.join(default)}")
        if name in NOT_RANKED:
            raise ValueError(f"strategy {name!r} is {NOT_RANKED[name]}: accepted are the strategies that state "
                             f"their bytes, e.g. {', '.join(default)}")
        if name in ("hierarchical", "node_parameter_server") and ranks_per_node == 1:
            raise ValueError(f"strategy {name!r} groups ranks in nodes: give ranks per node >= 2 with it")
    if len(set(chosen)) < 2:
        raise ValueError(f"a map ranks at least two strategies, got {chosen!r}")
    return chosen


# ---- pricing ----------------------------------------------------------------------------------------------

def price(candidate: Candidate, workers: int, workload: Workload, fabric: Fabric) -> float:
    """Seconds of one cell for one candidate: a sync of the buffer (sync_seconds) or a step (compute + sync, or a
    profile's step_timeline). ValueError / NotImplementedError: the candidate cannot run here."""
    config = candidate.config()
    if hasattr(config, "check_workers"):
        config.check_workers(workers)
    if workload.profile is None:
        comm = sync_seconds(config, workers, workload.numel, fabric, 4, workload.shapes)
        return comm if workload.compute_s is None else workload.compute_s + comm
    ready, bucket_shapes = _profile_buckets(workload)
    p = workload.profile
    return step_timeline(config, workers, list(ready), fabric, p.forward_s, p.backward_s, p.optimizer_s,
                         overlap=True, itemsize=p.itemsize, bucket_shapes=bucket_shapes).step_s


_BUCKETS: dict = {}


def _profile_buckets(workload: Workload):
    key = id(workload.profile), workload.bucket_mb, workload.shapes is None
    if key not in _BUCKETS or _BUCKETS[key][0] is not workload.profile:  # an id may be reused once freed
        from workloads.buckets import make_buckets

        p = workload.profile
        buckets = make_buckets(p.numels, workload.bucket_mb, p.itemsize)
        ready = tuple((max(p.params[i].ready_s for i in b.params), b.numel) for b in buckets)
        shapes = workload.shapes
        bucket_shapes = [tuple(shapes[i] for i in sorted(b.params)) for b in buckets] if shapes else None
        _BUCKETS[key] = workload.profile, ready, bucket_shapes
    return _BUCKETS[key][1:]


@dataclass(frozen=True)
class Best:
    """A strategy's cheapest knob setting in one cell."""

    candidate: Candidate
    seconds: float


def best_per_strategy(names, workers: int, workload: Workload, fabric: Fabric, placement: str = "colocated",
                      inexact: bool = False) -> tuple[dict[str, Best], dict[str, str]]:
    """{strategy: its cheapest setting} over each strategy's knob space, and {strategy: why none ran} for those
    that cannot run in this cell. Ties keep the first setting tried (the smallest knob)."""
    best: dict[str, Best] = {}
    why: dict[str, str] = {}
    groups = [(n, knob_space(n, workers, fabric.ranks_per_node, placement)) for n in names] if not inexact else \
        [(label, [Candidate(strategy, tuple(sorted(params.items())), label)]) for label, strategy, params in INEXACT]
    for name, candidates in groups:
        c, seconds, failed = cheapest(candidates, lambda c: price(c, workers, workload, fabric))
        if c is not None:
            best[name] = Best(c, seconds)
        else:
            why[name] = failed
    return best, why


def strategy_map(workload: Workload, workers=DEFAULT_WORKERS, bandwidths=DEFAULT_BANDWIDTHS, latency: float = 0.0,
                 ranks_per_node: int = 1, intra_bandwidth: float = math.inf, strategies=None,
                 placement: str = "colocated", inexact: bool = False, within: float = DEFAULT_WITHIN,
                 sizes=None, tie: float = TIE_BAND, network: str = "alpha_beta") -> StrategyMap:
    """The map: for each (workers, bandwidth) cell — or, with `sizes` and one bandwidth, each (workers, message
    size) cell of the collective alone — the winning exact strategy at its best knob, its seconds, the runner-up
    (the best other strategy), margin = runner-up / winner - 1, and spread = slowest strategy / winner - 1 (how
    much the choice changes the time). A cell whose margin is under `tie` is a tie (column tie): the winner is only
    the model's first of strategies it cannot separate. `inexact`: also the fastest inexact candidate, kept out of
    the ranking. `network`: the physics priced, 'alpha_beta' or 'tcp' (strategies.cost.NetworkModel)."""
    network = NetworkModel.parse(network)
    names = check_grid(workers, bandwidths, latency, ranks_per_node, strategies, sizes, placement, within)
    if isinstance(tie, bool) or not isinstance(tie, (int, float)) or not 0 <= tie < 1:
        raise ValueError(f"bad tie band {tie!r}: accepted are fractions from 0 (only equal times tie) to below 1, "
                         f"e.g. {TIE_BAND}")
    if sizes is not None and len(bandwidths) != 1:
        raise ValueError(f"the collective-alone map takes one bandwidth, got {len(bandwidths)}: give one")
    if sizes is not None and workload.measure == "step":
        raise ValueError("the collective-alone map prices a sync of each size: give no step time or profile")
    rows = []
    for n in workers:
        columns = [(bandwidths[0], s // 4) for s in sizes] if sizes is not None else \
            [(b, workload.numel) for b in bandwidths]
        for bandwidth, numel in columns:
            here = workload if sizes is None else Workload(numel=int(numel))
            fabric = Fabric(bandwidth, latency, int(ranks_per_node), intra_bandwidth, network=network)
            best, why = best_per_strategy(names, int(n), here, fabric, placement)
            rows.append(_row(int(n), bandwidth, latency, numel * 4, int(ranks_per_node), best, why, here, fabric,
                             inexact, tie))
    cells = pd.DataFrame(rows, columns=list(COLUMNS))
    meta = {"workload": workload.label, "numel": workload.numel, "measure": "sync" if sizes else workload.measure,
            "compute_s": workload.compute_s, "strategies": names, "placement": placement,
            "intra_bandwidth_bytes_per_s": None if math.isinf(intra_bandwidth) else intra_bandwidth,
            "profile": getattr(workload.profile, "id", None), "bucket_mb": workload.bucket_mb,
            "tie_band": tie, "network": network.value,
            "units": "seconds, bytes, bytes/s; margin and spread are fractions of time_s"}
    return StrategyMap(cells, "size" if sizes is not None else "bandwidth", meta["measure"], within, meta, tie)


def _row(n, bandwidth, latency, message_bytes, k, best, why, workload, fabric, inexact, tie) -> dict:
    ranked = sorted(best.values(), key=lambda b: b.seconds)
    row = {"workers": n, "bandwidth_bytes_per_s": float(bandwidth), "latency_s": float(latency),
           "message_bytes": int(message_bytes), "ranks_per_node": k, "strategies_priced": len(ranked),
           "inexact_best": "", "inexact_time_s": math.nan}
    if not ranked:
        reason = "; ".join(f"{name}: {text}" for name, text in why.items())
        raise ValueError(f"no strategy can run at {n} workers ({reason})")
    win = ranked[0]
    second = ranked[1] if len(ranked) > 1 else None
    row |= {"winner": win.candidate.name, "winner_params": win.candidate.params_dict(),
            "winner_knob_at_edge": win.candidate.at_open_edge(), "time_s": win.seconds,
            "runner_up": second.candidate.name if second else "",
            "runner_up_params": second.candidate.params_dict() if second else {},
            "runner_up_time_s": second.seconds if second else math.nan,
            "margin": second.seconds / win.seconds - 1 if second and win.seconds > 0 else math.nan,
            "worst": ranked[-1].candidate.name,
            "spread": ranked[-1].seconds / win.seconds - 1 if win.seconds > 0 else 0.0}
    row["tie"] = bool(second) and not row["margin"] >= max(tie, EXACT_TIE)  # NaN margin (0 s): a tie too
    if inexact:
        fast, _ = best_per_strategy((), n, workload, fabric, inexact=True)
        if fast:
            top = min(fast.values(), key=lambda b: b.seconds)
            row |= {"inexact_best": top.candidate.name, "inexact_time_s": top.seconds}
    return row


# ---- files ------------------------------------------------------------------------------------------------

def to_records(m: StrategyMap) -> list[dict]:
    out = []
    for r in m.cells.to_dict("records"):
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()})
    return out


def write(m: StrategyMap, out_dir) -> list:
    """DIR/map.csv (one row per cell, params as JSON text), DIR/map.json (meta, column types, cells, crossovers)
    and DIR/map.html (the heat map, self-contained); their paths."""
    from pathlib import Path

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    csv = m.cells.copy()
    for column in ("winner_params", "runner_up_params"):
        csv[column] = [json.dumps(p, sort_keys=True) for p in csv[column]]
    csv.to_csv(out_dir / "map.csv", index=False)
    columns = COLUMNS | ({"check": "str", "sim_winner_s": "float", "sim_runner_up_s": "float"}
                         if "check" in m.cells else {})
    doc = {"axis": m.axis, "measure": m.measure, "within": m.within, "meta": m.meta, "columns": columns,
           "cells": to_records(m), "crossovers": crossovers(m)}
    (out_dir / "map.json").write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    from reports.map_figure import write_html

    html = write_html(m, out_dir / "map.html")
    return [out_dir / "map.csv", out_dir / "map.json", html]
