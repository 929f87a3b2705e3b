"""The "Failures" section: each strategy's measured seconds per step, priced by the failure model under a failure
rate, for each recovery mode that fits it; where the ranking changes with the rate.

MODEL, not a measurement: the step times are the sweep's, the failures and the recovery costs are the model's
(strategies/fault_cost.py) with the costs below, which the page lists. A parameter server without a barrier is
priced at its fastest worker's pace (fast_step_s), the rate its servers' parameters advance.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

import strategies
from strategies.base import SERVER
from strategies.fault_cost import FaultCosts, crossover_mtbf, expected_time, time_to_target
from strategies.faults import CHECKPOINT_RESTART, ELASTIC, ELASTIC_STRATEGIES, PS_SHRINK

STEPS = 10_000  # the step S every row is priced to
HOUR = 3600.0
# per-worker MTBFs: the study's 7.9 h for 1,024 GPUs (8,090 h per GPU), then ever harsher
MTBF_HOURS = (7.9 * 1024, 1000.0, 100.0, 10.0)
# assumed recovery costs, seconds (a heartbeat's detection, a restart of every rank, one checkpoint, re-forming the
# group, a replacement's start-up and parameter fetch); the page lists them
DETECT_S, RESTART_S, CHECKPOINT_S, REFORM_S, REJOIN_S = 10.0, 120.0, 10.0, 5.0, 120.0


def modes_of(strategy: str, params: dict) -> list[str]:
    """The priced recovery modes that fit a strategy (decentralized's re-weighting changes mixing, not time)."""
    config = strategies.make(strategy, **params)
    modes = [CHECKPOINT_RESTART]
    if strategy in ELASTIC_STRATEGIES:
        modes.append(ELASTIC)
    if config.role == SERVER and getattr(config, "placement", "") == "dedicated":
        modes.append(PS_SHRINK)
    return modes


def faults_frame(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (workload, link, largest worker count, strategy, mode): seconds per step and the expected hours
    to STEPS under each MTBF; the fastest at each MTBF marked by rank."""
    if ok.empty or "step_time_s" not in ok:
        return pd.DataFrame()
    rows = []
    for (workload, link), group in ok.groupby(["workload", "link"], sort=False):
        n = int(group["workers"].max())
        top = group[group["workers"] == n]
        if n < 2 or top["strategy_label"].nunique() < 2:
            continue
        for label, runs in top.groupby("strategy_label", sort=False):
            strategy = runs["strategy"].iloc[0]
            params = _params(runs.iloc[0])
            barrier_free = _barrier_free(runs)
            pace = runs["fast_step_s"] if barrier_free and "fast_step_s" in runs else runs["step_time_s"]
            step_s = float(pace.mean())
            if not (step_s > 0 and math.isfinite(step_s)):
                continue
            smaller = group[(group["workers"] == n - 1) & (group["strategy_label"] == label)]["step_time_s"]
            # n - 1 workers with the same batch each make (n - 1) / n of a step's progress per step
            shrunk = float(smaller.mean()) * n / (n - 1) if len(smaller) else step_s
            costs = FaultCosts(step_s=step_s, step_s_shrunk=shrunk, detect_s=DETECT_S, restart_s=RESTART_S,
                               checkpoint_s=CHECKPOINT_S, reform_s=REFORM_S, rejoin_s=REJOIN_S,
                               barrier_free=barrier_free)
            target = _steps_to_target(runs)
            for mode in modes_of(strategy, params):
                row = {"workload": workload, "link": link, "workers": n, "strategy": label, "mode": mode,
                       "s/step": step_s, "n-1 measured": bool(len(smaller)), "_costs": costs}
                for hours in MTBF_HOURS:
                    got = expected_time(mode, STEPS, n, hours * HOUR, costs)
                    row[_column(hours)] = got.seconds / HOUR
                if not math.isnan(target):  # beside time to step S: the measured steps to target, priced alike
                    row["steps to target"] = target
                    for hours in MTBF_HOURS:
                        row[_target_column(hours)] = time_to_target(mode, target, n, hours * HOUR, costs,
                                                                    STEPS) / HOUR
                rows.append(row)
    return pd.DataFrame(rows)


def _steps_to_target(runs: pd.DataFrame) -> float:
    """The runs' mean steps to their target (NaN: no target, or none reached it)."""
    if "steps_to_target" not in runs or "target_reached" not in runs:
        return math.nan
    reached = runs[runs["target_reached"].fillna(False).astype(bool)]["steps_to_target"].dropna()
    return float(reached.mean()) if len(reached) else math.nan


def _target_column(hours: float) -> str:
    return f"h to target, MTBF {hours:,.0f} h"


def _column(hours: float) -> str:
    return f"h to step {STEPS:,}, MTBF {hours:,.0f} h"


def _params(run) -> dict:
    declared = strategies.get(run["strategy"]).parameters()
    return {k: _plain(run[f"param_{k}"]) for k in declared if f"param_{k}" in run.index and not _missing(
        run[f"param_{k}"])}


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _barrier_free(runs: pd.DataFrame) -> bool:
    if runs["strategy"].iloc[0] != "parameter_server":
        return False
    staleness = runs["param_staleness"].iloc[0] if "param_staleness" in runs else 0
    backups = runs["param_backups"].iloc[0] if "param_backups" in runs else 0
    return str(staleness) not in ("0", "", "nan", "None") or (not _missing(backups) and int(backups) > 0)


def faults_verdicts(frame: pd.DataFrame) -> list[str]:
    """Per group: the fastest (strategy, mode) at the mildest and the harshest rate, and the MTBF where it
    changes."""
    out = []
    for (workload, link, n), group in frame.groupby(["workload", "link", "workers"], sort=False):
        mild, harsh = _column(MTBF_HOURS[0]), _column(MTBF_HOURS[-1])
        best_mild = group.loc[group[mild].idxmin()]
        best_harsh = group.loc[group[harsh].idxmin()] if np.isfinite(group[harsh]).any() else None
        head = f"{workload}, {n} workers, {link}: "
        if best_harsh is None:
            out.append(head + f"at an MTBF of {MTBF_HOURS[-1]:,.0f} h per worker no strategy and mode reaches step "
                              f"{STEPS:,} in the model.")
            continue
        if (best_mild["strategy"], best_mild["mode"]) == (best_harsh["strategy"], best_harsh["mode"]):
            out.append(head + f"{best_mild['strategy']} with {best_mild['mode']} is fastest to step {STEPS:,} at "
                              f"every MTBF shown ({MTBF_HOURS[-1]:,.0f} to {MTBF_HOURS[0]:,.0f} h per worker).")
            continue
        at = crossover_mtbf((best_mild["mode"], best_mild["_costs"]), (best_harsh["mode"], best_harsh["_costs"]),
                            STEPS, int(n))
        where = f" below an MTBF of about {at / HOUR:,.3g} h per worker" if at else ""
        out.append(head + f"{best_mild['strategy']} with {best_mild['mode']} is fastest to step {STEPS:,} when "
                          f"failures are rare; {best_harsh['strategy']} with {best_harsh['mode']} overtakes it{where} "
                          f"(the ranking changes with the failure rate).")
    return out


def section(r):
    from reports.section_parts import Absent, Table

    ok = r.ok[r.ok["recovery_mode"].fillna("") == ""] if "recovery_mode" in r.ok else r.ok  # priced: failure-free
    frame = faults_frame(ok)
    if frame.empty:
        return Absent("no two strategies measured at the same workload, link and worker count (>= 2) to price "
                      "under a failure rate")
    shown = frame[[c for c in frame.columns if not c.startswith("_")]]
    formats = {"workers": "d", "s/step": ".4f", **{_column(h): ",.2f" for h in MTBF_HOURS}}
    if "steps to target" in shown:
        formats.update({"steps to target": ",.0f", **{_target_column(h): ",.3f" for h in MTBF_HOURS}})
    return {"verdicts": faults_verdicts(frame), "table": Table(shown, formats, sortable=True, id="faults"),
            "steps": f"{STEPS:,}", "costs": {"detection": DETECT_S, "restart": RESTART_S, "checkpoint": CHECKPOINT_S,
                                            "re-forming": REFORM_S, "replacement joining": REJOIN_S}}
