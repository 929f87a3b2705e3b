"""The strategy map's result (StrategyMap: one typed row per cell) and its words: the printed table, a cell's
text, the crossovers in sentences. Shared by the map (reports/strategy_map.py), its heat map
(reports/map_figure.py) and the report's section; it imports none of them.

Units: bytes and seconds; Gbit = 10^9 bits; KiB/MiB = 2^10/2^20 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from strategies.cost import GBIT

# a lead under this is a tie: the model's own uncertainty, its agreement band with SimGrid's alpha_beta model
# (experiments.validate.TOLERANCE, tested equal). SimGrid put the colocated parameter server 0.15% to 0.36% ahead of
# a ring the model put 0.08% to 0.97% ahead (docs/map.md): a lead that small is not a winner.
TIE_BAND = 0.05
EXACT_TIE = 1e-9  # margins under this are equal times (a tie at any band)
SHORT = {"ring": "ring", "halving_doubling": "hd", "reduce_broadcast": "rb", "all_to_all": "a2a",
         "double_binary_tree": "dbt", "parameter_server": "ps", "hierarchical": "hier",
         "node_parameter_server": "nps", "naive_ring": "nring", "decentralized": "dec"}


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
               if df["ranks_per_node"].iloc[0] > 1 else "; one NIC per rank")
            + ("; network tcp (SimGrid's LV08 corrections priced)" if m.meta.get("network") == "tcp" else "")]
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
