"""The answer: the fastest strategy per workload, condition and worker count, with its uncertainty.

Each measured configuration's throughput has an interval: the spread between its repeats (runs of one configuration
with other seeds) widened by every repeat's per-step interval (reports/load.py, with_step_intervals: Student's t
over the run's timed steps). A measured lead counts only when the best's interval lies wholly above every other's;
overlapping intervals are a tie, and so is one run each (a run's steps say nothing of how the next run, on another
seed and another moment of the machine, would go).

A simulated configuration (SimGrid) has no sampling interval: the same platform and compute timeline give the same
numbers on every seed, so one run is the answer and more seeds change nothing. A simulated lead is a lead; it is a
tie only inside a stated tolerance, SIMULATED_TIE: a difference smaller than what the simulator's own model of the
network resolves. Verdicts are per condition (link, straggler, compute mode, simulated platform), never averaged
across conditions; a condition holds one substrate, so a verdict never weighs a simulated run against a measured one.
"""

from __future__ import annotations

import math

import pandas as pd

from reports.load import STEP_LEVEL, is_server, mean_per_config
from reports.model import MB
from strategies.knobs import SLOWER_NOTED

SHOWN_IN_A_TIE = 3  # a tie names its fastest few; the best-strategy table has the rest
# Simulated runs are deterministic: a lead under this share of the slower's throughput is a tie. SimGrid's TCP model
# and the alpha-beta model it is checked against agree to a few percent, not better: a 1% difference is inside what
# the simulator resolves, anything larger is a lead of the simulated platform.
SIMULATED_TIE = 0.01


def lead_counts(best, other) -> bool:
    """Whether `best` (higher throughput) leads `other`: simulated, by more than SIMULATED_TIE; measured, with the
    best's interval wholly above the other's and more than one run each."""
    if best["simulated"] and other["simulated"]:
        return best["throughput"] > other["throughput"] * (1 + SIMULATED_TIE)
    return best["runs"] >= 2 and other["runs"] >= 2 and other["throughput_hi"] < best["throughput_lo"]


def best_strategies(ok: pd.DataFrame, links: list[str]) -> pd.DataFrame:
    """Per (workload, condition, workers > 1): the fastest configuration by mean throughput, its spread, the
    runner-up, and whether the lead counts ("clear": lead_counts) or not ("tie"). n = 1 has nothing to
    synchronize; runs whose bytes bypassed the emulated link did not pay for it and cannot take part."""
    multi = ok[(ok["workers"] > 1) & ~ok["bypasses_link"]]
    agg = mean_per_config(multi, ["workload", "condition", "workers", "config"])
    rows = []
    runs_of = dict(iter(multi.groupby(["workload", "condition", "workers"], sort=False)))
    for key, g in agg.groupby(["workload", "condition", "workers"], sort=False):
        g = g.sort_values("throughput", ascending=False)
        best = g.iloc[0]
        others = g.iloc[1:]
        tied = others[[not lead_counts(best, other) for _, other in others.iterrows()]]
        runner_up = others.iloc[0] if len(others) else None
        rows.append({"workload": best["workload"], "condition": best["condition_label"], "link": best["link"],
                     "workers": int(best["workers"]), "best strategy": best["config_label"],
                     "samples/s": best["throughput"], "interval samples/s": spread(best), "runs": int(best["runs"]),
                     "step time s": best["step_time_s"], "comm share %": best["comm_fraction"] * 100,
                     "lead over next %": (best["throughput"] / runner_up["throughput"] - 1) * 100
                     if runner_up is not None else math.nan,
                     "next": runner_up["config_label"] if runner_up is not None else "",
                     "verdict": "only one" if runner_up is None else ("tie" if len(tied) else "clear"),
                     "distorted": "yes" if best["distorted"] else "",
                     "_best": best, "_next": runner_up, "_tied": tied,
                     "_knobs": knob_notes(runs_of[key]) if key in runs_of else []})
    df = pd.DataFrame(rows)
    if df.empty:
        return df
    df["_link"] = df["link"].map({link: i for i, link in enumerate(links)})
    return df.sort_values(["workload", "_link", "condition", "workers"]).drop(columns="_link")


def spread(row) -> str:
    """'98.0-105.1': the interval (repeats and their steps); 'one run' when there is neither a spread between
    repeats nor a per-step interval to show; 'simulated: deterministic' for a simulated configuration."""
    if row["simulated"]:
        return "simulated: deterministic"
    lo, hi = row["throughput_lo"], row["throughput_hi"]
    if row["runs"] < 2 and not lo < hi:
        return "one run"
    return f"{lo:,.1f}-{hi:,.1f}" if math.isfinite(hi) else f"{lo:,.1f}-unbounded"


def verdicts(best: pd.DataFrame) -> list[str]:
    """For each workload and condition at its largest worker count, one sentence: which strategy to use, by how
    much and why (rounds and bytes on the critical path) when the lead is measured; a tie, with the numbers and
    their spread, when it is not."""
    out = []
    if best.empty:
        return out
    for _, g in best.groupby(["workload", "condition"], sort=False):
        row = g.loc[g["workers"].idxmax()]
        start = len(out)
        winner, runner_up, tied = row["_best"], row["_next"], row["_tied"]
        where = f"{row['workload']} on {row['condition']}, {row['workers']} workers"
        distorted = " Distorted by contention for the machine: see the note below." if row["distorted"] else ""
        if runner_up is None:
            out.append(f"{where}: {winner['config_label']} is the only strategy measured.{distorted}")
        elif row["verdict"] == "tie":
            names = [winner, *(r for _, r in tied.iterrows())]
            shown = ", ".join(_measured(r) for r in names[:SHOWN_IN_A_TIE])
            more = f" and {len(names) - SHOWN_IN_A_TIE} more" if len(names) > SHOWN_IN_A_TIE else ""
            if winner["simulated"]:
                out.append(f"{where}: tie within the stated {SIMULATED_TIE:.0%} tolerance: {shown}{more} (a lead of "
                           f"{row['lead over next %']:.2f}%; simulated runs are deterministic, so there is no "
                           f"sampling interval: the tie is the tolerance, not noise).{distorted}")
                continue
            why = ("one run each, so there is no spread between repeats to measure a lead against; repeat the "
                   "runs (repeats or seeds) to separate them" if (pd.Series([r["runs"] for r in names]) < 2).any()
                   else f"a lead of {row['lead over next %']:.1f}% is inside the intervals, which span the repeats "
                        f"and each run's {STEP_LEVEL:.0%} per-step interval")
            out.append(f"{where}: tie, not distinguishable: {shown}{more} ({why}).{distorted}")
        else:
            why = _why(winner, runner_up)
            simulated = (f" A simulated lead: deterministic, no sampling interval (a tie only under "
                         f"{SIMULATED_TIE:.0%})." if winner["simulated"] else "")
            out.append(f"{where}: use {winner['config_label']}, {_measured(winner)} against {_measured(runner_up)} "
                       f"for the next best, {winner['throughput'] / runner_up['throughput']:.2f}x"
                       + (f": {why}." if why else ".") + simulated + distorted)
        notes = row.get("_knobs") or []
        if notes and len(out) > start:
            out[-1] += " " + " ".join(notes)
    return out


def knob_notes(runs: pd.DataFrame) -> list[str]:
    """One sentence per configuration whose explicit size knob (the knob_* columns: strategies/knobs.py) is more
    than SLOWER_NOTED slower in the model than the knob's best value for that run; a value the model chose, or a
    run without a priced knob, says nothing."""
    if runs.empty or "knob" not in runs:
        return []
    slow = runs[(runs["knob"] != "") & ~runs["knob_chosen"].astype(bool)
                & (runs["knob_slowdown"] > 1 + SLOWER_NOTED)]
    out = []
    for label, g in slow.groupby("config_label", sort=False):
        r = g.loc[g["knob_slowdown"].idxmax()]
        knob = r["knob"]
        out.append(f"{label}: its {knob} = {_knob_value(r[f'param_{knob}'])} (set in the sweep) is "
                   f"{r['knob_slowdown']:.2f}x the model's time at {knob} = {_knob_value(r['knob_best'])}, the best "
                   f"for this run (more than {SLOWER_NOTED:.0%} slower; leave {knob} unset to take the model's "
                   f"best).")
    return out


def _knob_value(value) -> str:
    return "inf" if isinstance(value, float) and math.isinf(value) else f"{value:g}"


def _measured(row) -> str:
    """'ring 102.3 samples/s (98.0-105.1 over 3 runs)', '... (one run, its steps 99.0-104.2)', '... (one run)' or
    '... (simulated: deterministic)'."""
    interval = spread(row)
    if row["simulated"]:
        runs = interval
    elif row["runs"] < 2:
        runs = "one run" if interval == "one run" else f"one run, its steps {interval}"
    else:
        runs = f"{interval} over {int(row['runs'])} runs"
    return f"{row['config_label']} {row['throughput']:,.1f} samples/s ({runs})"


def _why(winner, runner_up) -> str:
    """The critical-path difference that explains a win (or says that the measured transport, not the model,
    decided)."""
    parts = []
    w_bytes, r_bytes = winner["analytic_path_bytes"], runner_up["analytic_path_bytes"]
    w_rounds, r_rounds = winner["analytic_rounds"], runner_up["analytic_rounds"]
    if not (math.isfinite(w_bytes) and math.isfinite(r_bytes)):
        return ""
    if w_bytes < r_bytes:
        incast = " into the parameter server's NIC (its incast)" if is_server(runner_up["strategy"]) else ""
        parts.append(f"{w_bytes / MB:,.1f} MB on its critical path against {r_bytes / MB:,.1f} MB{incast}")
    if w_rounds < r_rounds:
        parts.append(f"{w_rounds:.0f} message rounds against {r_rounds:.0f}")
    if not parts:
        w_comm, r_comm = winner["comm_s"], runner_up["comm_s"]
        decider = "the simulated network" if winner["simulated"] else "the measured transport"
        return (f"it moves as many or more bytes in as many or more rounds, yet spent {w_comm * 1e3:,.1f} ms "
                f"communicating per step against {r_comm * 1e3:,.1f} ms ({decider}, not the model, decided)")
    return "it moves " + " and ".join(parts)
