"""The "Failures measured" section: a sweep's runs that lost ranks in training (failures and recovery settings),
strategy by recovery mode: the time to reach the run's last step, the throughput over the run, the steps lost and
the seconds each failure cost; where the sweep has several failure rates, where the ranking of strategies changes.

Measured, not modelled (the model's section prices the same modes under a rate). A run its failure ended (mode
none, or a survivors' graph that fell apart) is shown with its completed steps and its cause.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = {"strategy_label": "strategy", "recovery_mode": "mode", "failure_setting": "failures",
           "failure_count": "failed", "completed_steps": "steps done", "steps_lost": "steps lost",
           "detection_s": "detection s",
           "recovery_s": "recovery s", "time_to_step_s": "s to last step", "run_throughput": "samples/s (run)",
           "throughput": "samples/s (steps)", "cause": "ended by"}


def fault_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with failures (every status: a run its failure ended is one of the results)."""
    if runs.empty or "recovery_mode" not in runs:
        return runs.iloc[0:0]
    return runs[runs["recovery_mode"].fillna("") != ""]


def faults_measured_frame(runs: pd.DataFrame) -> pd.DataFrame:
    frame = fault_runs(runs).copy()
    if frame.empty:
        return pd.DataFrame()
    frame["cause"] = [(e.split(": ", 1)[-1] if s != "ok" else "") for s, e in zip(frame["status"], frame["error"])]
    shown = frame[[c for c in COLUMNS if c in frame]].rename(columns=COLUMNS)
    return shown.sort_values(["failures", "strategy", "mode"]).reset_index(drop=True)


def verdicts(frame: pd.DataFrame) -> list[str]:
    """Per failure setting: the fastest strategy and mode to the last step; where the sweep has more than one,
    whether the fastest changes between them."""
    out, best = [], {}
    for rate, group in frame.groupby("failures", sort=False):
        done = group.dropna(subset=["s to last step"])
        if done.empty:
            out.append(f"{rate}: no run reached its last step.")
            continue
        top = done.loc[done["s to last step"].idxmin()]
        best[rate] = (top["strategy"], top["mode"])
        ended = group[group["s to last step"].isna()]
        lost = f"; {len(ended)} run(s) ended by the failure, their completed steps kept" if len(ended) else ""
        out.append(f"{rate}: {top['strategy']} with {top['mode']} reached its last step first "
                   f"({top['s to last step']:.2f} s, {top['samples/s (run)']:.1f} samples/s over the run){lost}.")
    if len(set(best.values())) > 1:
        out.append("The ranking changes with the failures: " + "; ".join(
            f"{rate}: {s} with {m}" for rate, (s, m) in best.items()) + ".")
    elif len(best) > 1:
        out.append("The same strategy and mode is fastest under every failure setting of the sweep.")
    return out


def section(r):
    from reports.section_parts import Absent, Table

    frame = faults_measured_frame(r.runs)
    if frame.empty:
        return Absent("no run with failures (the failures and recovery settings; docs/faults.md)")
    formats = {"failed": "d", "steps done": "d", "steps lost": "d", "detection s": ".4f", "recovery s": ".4f",
               "s to last step": ".2f", "samples/s (run)": ".1f", "samples/s (steps)": ".1f"}
    return {"verdicts": verdicts(frame), "table": Table(frame, formats, sortable=True, id="faults-measured"),
            "several": frame["failures"].nunique() > 1}
