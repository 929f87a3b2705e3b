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
from dataclasses import dataclass, field

import pandas as pd

import strategies as registry
from strategies.cost import GBIT, Fabric, step_timeline, sync_seconds
from strategies.knobs import CHUNKS, PARTITIONS_MB, PIPELINE_MB, cheapest  # the values a run's unset knob tries too

MAX_WORKERS = 1024  # as `syncbench model`: counting a strategy's traffic grows about as n^2
MAX_RANKS_PER_NODE = 1024
MAX_MESSAGE_BYTES = 2**34
DEFAULT_WORKERS = tuple(2**i for i in range(1, 11))  # 2 .. 1,024
DEFAULT_BANDWIDTHS = tuple(g * GBIT for g in (1, 2.5, 5, 10, 25, 40, 100, 200, 400))
DEFAULT_SIZES = tuple(2**i for i in range(10, 31, 2))  # 1 KiB .. 1 GiB
DEFAULT_WITHIN = 0.02
# a lead under this is a tie: the model's own uncertainty, its agreement band with SimGrid's alpha_beta model
# (experiments.validate.TOLERANCE, tested equal). SimGrid put the colocated parameter server 0.15% to 0.36% ahead of
# a ring the model put 0.08% to 0.97% ahead (docs/map.md): a lead that small is not a winner.
TIE_BAND = 0.05
EXACT_TIE = 1e-9  # margins under this are equal times (a tie at any band)

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
SHORT = {"ring": "ring", "halving_doubling": "hd", "reduce_broadcast": "rb", "all_to_all": "a2a",
         "double_binary_tree": "dbt", "parameter_server": "ps", "hierarchical": "hier",
         "node_parameter_server": "nps", "naive_ring": "nring", "decentralized": "dec"}


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
        raise ValueError("no worker counts: accepted are whole numbers from 2 to 1,024, e.g. 2,4,8")
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


@dataclass
class StrategyMap:
    """The grid: one row per cell (typed columns, see COLUMNS) and how it was made."""

    cells: pd.DataFrame
    axis: str                  # 'bandwidth' (workers x bandwidth) or 'size' (workers x message size)
    measure: str               # 'step' or 'sync'
    within: float
    meta: dict = field(default_factory=dict)
    tie: float = TIE_BAND      # a lead under this fraction is a tie, not a winner


COLUMNS = {"workers": "int", "bandwidth_bytes_per_s": "float", "latency_s": "float", "message_bytes": "int",
           "ranks_per_node": "int", "winner": "str", "winner_params": "json", "winner_knob_at_edge": "bool",
           "time_s": "float", "tie": "bool",
           "runner_up": "str", "runner_up_params": "json", "runner_up_time_s": "float", "margin": "float",
           "worst": "str", "spread": "float", "strategies_priced": "int", "inexact_best": "str",
           "inexact_time_s": "float"}


def strategy_map(workload: Workload, workers=DEFAULT_WORKERS, bandwidths=DEFAULT_BANDWIDTHS, latency: float = 0.0,
                 ranks_per_node: int = 1, intra_bandwidth: float = math.inf, strategies=None,
                 placement: str = "colocated", inexact: bool = False, within: float = DEFAULT_WITHIN,
                 sizes=None, tie: float = TIE_BAND) -> StrategyMap:
    """The map: for each (workers, bandwidth) cell — or, with `sizes` and one bandwidth, each (workers, message
    size) cell of the collective alone — the winning exact strategy at its best knob, its seconds, the runner-up
    (the best other strategy), margin = runner-up / winner - 1, and spread = slowest strategy / winner - 1 (how
    much the choice changes the time). A cell whose margin is under `tie` is a tie (column tie): the winner is only
    the model's first of strategies it cannot separate. `inexact`: also the fastest inexact candidate, kept out of
    the ranking."""
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
            fabric = Fabric(bandwidth, latency, int(ranks_per_node), intra_bandwidth)
            best, why = best_per_strategy(names, int(n), here, fabric, placement)
            rows.append(_row(int(n), bandwidth, latency, numel * 4, int(ranks_per_node), best, why, here, fabric,
                             inexact, tie))
    cells = pd.DataFrame(rows, columns=list(COLUMNS))
    meta = {"workload": workload.label, "numel": workload.numel, "measure": "sync" if sizes else workload.measure,
            "compute_s": workload.compute_s, "strategies": names, "placement": placement,
            "intra_bandwidth_bytes_per_s": None if math.isinf(intra_bandwidth) else intra_bandwidth,
            "profile": getattr(workload.profile, "id", None), "bucket_mb": workload.bucket_mb,
            "tie_band": tie, "units": "seconds, bytes, bytes/s; margin and spread are fractions of time_s"}
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


# ---- output -----------------------------------------------------------------------------------------------

def fmt_bandwidth(b: float) -> str:
    return f"{b / GBIT:g} Gbit/s"


def fmt_size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"


def _column_value(m: StrategyMap, row) -> float:
    return row["message_bytes"] if m.axis == "size" else row["bandwidth_bytes_per_s"]


def _fmt_column(m: StrategyMap, value: float) -> str:
    return fmt_size(value) if m.axis == "size" else fmt_bandwidth(value)


def short_params(name: str, params: dict) -> str:
    """The knob values a cell shows: 'k=4 p=4' for a parameter server, 'c=8' for a tree, 'hd 0.5M' ..."""
    if name in ("parameter_server", "node_parameter_server"):
        where = "ded " if params.get("placement") == "dedicated" else ""
        return f"{where}k={params['servers']} p={params['partition_mb']:g}"
    if name == "double_binary_tree":
        return f"c={params['chunks']}"
    if name == "hierarchical":
        mb = params["pipeline_mb"]
        return f"{SHORT.get(params['inner'], params['inner'])} {'whole' if mb is None else f'{mb:g}M'}"
    return ""


def format_table(m: StrategyMap) -> str:
    """Rows: workers; columns: bandwidth (or message size); a cell: the winner, its knob, its lead over the
    runner-up. Then a legend and the crossovers in words."""
    df = m.cells
    columns = sorted({_column_value(m, r) for _, r in df.iterrows()})
    head = [f"# {m.meta.get('workload') or 'buffer'}: {m.meta['numel'] * 4 / 2**20:,.2f} MiB fp32; "
            f"{_measured(m)} priced by the model; latency "
            f"{df['latency_s'].iloc[0] * 1e6:g} us"
            + (f"; nodes of {int(df['ranks_per_node'].iloc[0])} ranks sharing a NIC"
               if df["ranks_per_node"].iloc[0] > 1 else "; one NIC per rank")]
    if m.axis == "size":
        link = fmt_bandwidth(df["bandwidth_bytes_per_s"].iloc[0])
        latency = df["latency_s"].iloc[0] * 1e6
        head[0] = f"# the collective alone: one allreduce of each size on {link}, latency {latency:g} us"
    head.append(f"# cell: winner [its best knob] +lead over the runner-up (% of the winner's time); a~b (lead): a tie, "
                f"the lead under {_pct(m.tie)}, the model's uncertainty (a is its first, not a winner)"
                if m.tie >= EXACT_TIE else "# cell: winner [its best knob] +lead over the runner-up (% of the "
                "winner's time); a~b: equal times, a tie")
    cells = {(r["workers"], _column_value(m, r)): r for _, r in df.iterrows()}
    grid = [["workers"] + [_fmt_column(m, c).replace(" ", "") for c in columns]]
    for n in sorted(df["workers"].unique()):
        line = [str(n)]
        for c in columns:
            line.append(cell_text(cells[(n, c)]))
        grid.append(line)
    widths = [max(len(line[i]) for line in grid) for i in range(len(grid[0]))]
    body = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths)) for line in grid]
    used = sorted(set(df["winner"]))
    legend = "# " + ", ".join(f"{SHORT.get(s, s)} = {s}" for s in used) + \
        "; k servers, p partition MiB, c chunks, ded = dedicated server machines" + \
        ("; *: the knob at the end of the values tried, a value beyond may be cheaper"
         if df["winner_knob_at_edge"].any() else "")
    out = head + body + [legend]
    if df["inexact_best"].astype(bool).any():
        out.append("# inexact, not ranked (not the same result; bytes only, codec time not priced): fastest per "
                   "cell vs the exact winner")
        for n in sorted(df["workers"].unique()):
            parts = []
            for c in columns:
                r = cells[(n, c)]
                parts.append(f"{r['inexact_best']} {r['inexact_time_s'] / r['time_s']:.2f}x")
            out.append(f"#   {n} workers: " + "; ".join(parts))
    return "\n".join(out + ["", "Crossovers:"] + [f"- {s}" for s in crossovers(m)])


def _measured(m: StrategyMap) -> str:
    if m.measure == "sync":
        return "one sync"
    if m.meta.get("profile"):
        bucket = m.meta.get("bucket_mb")
        return f"the profile's step ({'one bucket' if bucket is None else f'{bucket:g} MiB buckets'} overlapped " \
               f"with backward)"
    return f"the step (Ts {m.meta['compute_s']:g} s + one sync, no overlap)"


def cell_text(r) -> str:
    """A cell as the table and the heat map show it: 'hd +12%' (a winner, its knob, its lead), or 'ring~ps (0.97%)'
    (a tie: the lead under the map's tie band; the model's first, then the runner-up)."""
    knob = short_params(r["winner"], r["winner_params"]) + ("*" if r["winner_knob_at_edge"] else "")
    first = f"{SHORT.get(r['winner'], r['winner'])}{' ' + knob if knob else ''}"
    if r["tie"]:
        return f"{first}~{SHORT.get(r['runner_up'], r['runner_up'])} ({_pct(r['margin'] if r['margin'] > 0 else 0)})"
    return first + lead_text(r["margin"])


def lead_text(margin: float) -> str:
    """A cell's lead over the runner-up: ' +3.1%', ' tie' (equal times: the winner is the first ranked), ''."""
    if math.isnan(margin):
        return ""
    return " tie" if margin < 1e-9 else f" +{_pct(margin)}"


def _pct(fraction: float) -> str:
    pct = fraction * 100
    if 0 < pct < 1e-4:  # '6.5e-05%' reads as noise: say how small
        return "<0.0001%"
    return f"{pct:.2g}%" if pct < 10 else f"{pct:.0f}%"


# ---- the crossovers in words ------------------------------------------------------------------------------

LEAD = "\x00"  # where a sentence's worker count goes
TIED = "\x01"  # a segment of cells whose lead is under the tie band


def crossovers(m: StrategyMap) -> list[str]:
    """Sentences read off the grid, per worker count along the columns (bandwidth or message size): where the
    winner changes (between which two grid values), and from which value on the choice stops mattering (every
    ranked strategy within `within` of the winner at that value and every larger one). Consecutive worker
    counts whose sentences are the same are stated once ("at 4 to 128 workers, ...")."""
    df = m.cells
    what = "the step" if m.measure == "step" else "the sync"
    per_row = []  # (workers, sentences with LEAD for the place the worker count goes)
    for n in sorted(df["workers"].unique()):
        out = []
        row = df[df["workers"] == n].copy()
        row["_col"] = [_column_value(m, r) for _, r in row.iterrows()]
        row = row.sort_values("_col")
        values, winners, spreads = list(row["_col"]), list(row["winner"]), list(row["spread"])
        winners = [TIED if t else w for w, t in zip(winners, row["tie"])]  # a tie names no winner
        segments = []  # (winner or TIED, first value, last value)
        for v, w in zip(values, winners):
            if segments and segments[-1][0] == w:
                segments[-1][2] = v
            else:
                segments.append([w, v, v])
        lead = LEAD
        band = (f"no strategy leads by {_pct(m.tie)} (the model's uncertainty): a tie" if m.tie >= EXACT_TIE else
                "the best two take equal times: a tie")
        if len(segments) == 1:
            first, last = _fmt_column(m, values[0]), _fmt_column(m, values[-1])
            out.append(f"{lead}, {band} everywhere from {first} to {last}" if segments[0][0] == TIED else
                       f"{lead}, {segments[0][0]} wins everywhere from {first} to {last}")
        else:
            for (a, _, a_last), (b, b_first, _) in zip(segments, segments[1:]):
                upto, since = _fmt_column(m, a_last), _fmt_column(m, b_first)
                if a == TIED:
                    out.append(f"{lead}, {band} up to {upto}, {b} wins from {since} (the change lies between)")
                elif b == TIED:
                    out.append(f"{lead}, {a} wins up to {upto}, from {since} {band} (the change lies between)")
                elif m.axis == "size":
                    out.append(f"{lead}, {a} beats {b} up to {upto}, {b} wins from {since} (the crossover lies "
                               f"between)")
                else:
                    out.append(f"{lead}, {a} wins up to {upto}, {b} from {since} (the crossover lies between)")
        # from which column on the best two are within `within` of each other, then all ranked strategies
        margins = list(row["margin"].fillna(0.0))
        limit = f"under {_pct(m.within)}"
        settled = _settled_from(margins, m.within)
        if settled == len(values):
            out.append(f"{lead}, choosing between the best two still changes {what} by {_pct(m.within)} or more at "
                       f"the grid's largest value ({_fmt_column(m, values[-1])}: {row['runner_up'].iloc[-1]} takes "
                       f"{_pct(margins[-1])} longer than {row['winner'].iloc[-1]})")
        elif settled == 0:
            out.append(f"{lead}, choosing between the best two changes {what} by {limit} everywhere on the grid")
        else:
            out.append(f"{lead}, above {_fmt_column(m, values[settled - 1])} (from {_fmt_column(m, values[settled])}"
                       f" on the grid) choosing between the best two changes {what} by {limit}")
        everyone = _settled_from(spreads, m.within)
        if everyone == 0:
            out.append(f"{lead}, every ranked strategy is within {_pct(m.within)} of the winner everywhere on the "
                       f"grid: the choice changes {what} by {limit}")
        elif everyone < len(values):
            out.append(f"{lead}, above {_fmt_column(m, values[everyone - 1])} (from "
                       f"{_fmt_column(m, values[everyone])} on the grid) every ranked strategy is within "
                       f"{_pct(m.within)} of the winner: the choice changes {what} by {limit}")
        per_row.append((int(n), out))
    groups: list[tuple[int, int, list[str]]] = []
    for n, sentences in per_row:
        if groups and groups[-1][2] == sentences:
            groups[-1] = (groups[-1][0], n, sentences)
        else:
            groups.append((n, n, sentences))
    where = " on " + fmt_bandwidth(df["bandwidth_bytes_per_s"].iloc[0]) if m.axis == "size" else ""
    return [s.replace(LEAD, f"at {lo}{'' if lo == hi else f' to {hi}'} workers{where}")
            for lo, hi, sentences in groups for s in sentences]


def _settled_from(fractions: list[float], within: float) -> int:
    """The first index from which every fraction is under `within` (len: none, 0: all)."""
    settled = len(fractions)
    while settled > 0 and fractions[settled - 1] < within:
        settled -= 1
    return settled


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
