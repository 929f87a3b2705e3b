"""The "Failures measured" section: a sweep's runs that lost ranks in training (failures and recovery settings),
strategy by recovery mode: the time to reach the run's last step and its target, the throughput over the run, the
steps lost and the seconds each failure cost; per failure setting, which is first (with the run-to-run spread where
the sweep repeats its runs) and where that changes with the failure rate; beside each run with a failure rate, the
model's expected time to its last step under the same rate (strategies/fault_cost.py), priced with the sweep's
own failure-free seconds per step and measured detection and recovery seconds.

Measured, not modelled, but for the model's column. A run its failure ended (mode none, or a survivors' graph that
fell apart) is shown with its completed steps and its cause.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from strategies.fault_cost import FaultCosts, expected_time
from strategies.faults import CHECKPOINT_RESTART, ELASTIC, PS_SHRINK

COLUMNS = {"strategy_label": "strategy", "recovery_mode": "mode", "failure_setting": "failures", "status": "status",
           "failure_count": "failed", "model_failures": "model failed", "completed_steps": "steps done",
           "steps_lost": "steps lost", "detection_s": "detection s", "recovery_s": "recovery s",
           "time_to_step_s": "s to last step", "model_s": "model s to last step", "model_ratio": "measured / model",
           "steps_to_target": "steps to target", "time_to_target_s": "s to target",
           "run_throughput": "samples/s (run)", "throughput": "samples/s (steps)", "cause": "ended by"}
METRICS = {"s to last step": "the last step", "s to target": "the target"}
CELL = ["strategy", "mode"]


def fault_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs with failures (every status: a run its failure ended is one of the results)."""
    if runs.empty or "recovery_mode" not in runs:
        return runs.iloc[0:0]
    return runs[runs["recovery_mode"].fillna("") != ""]


def faults_measured_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run with failures, the model's expectation beside it; failure settings mildest first (the
    longest MTBF; schedules after the rates), then strategy and mode."""
    frame = fault_runs(runs).copy()
    if frame.empty:
        return pd.DataFrame()
    frame["cause"] = [(e.split(": ", 1)[-1] if s != "ok" else "") for s, e in zip(frame["status"], frame["error"])]
    model = model_expectations(frame)
    frame["model_s"], frame["model_failures"] = model["seconds"], model["failures"]
    frame["model_ratio"] = frame["time_to_step_s"] / frame["model_s"]
    if "time_to_target_s" in frame and "target_reached" in frame:  # a run without a target has no time to it
        frame.loc[~frame["target_reached"].fillna(False).astype(bool), ["time_to_target_s", "steps_to_target"]] = \
            math.nan
    frame["_mtbf"] = _mtbf(frame)
    frame = frame.sort_values(["_mtbf", "failure_setting", "strategy_label", "recovery_mode"],
                              ascending=[False, True, True, True], na_position="last")
    shown = frame[[c for c in COLUMNS if c in frame]].rename(columns=COLUMNS)
    if shown["model s to last step"].isna().all():
        shown = shown.drop(columns=["model s to last step", "measured / model", "model failed"])
    return shown.dropna(axis=1, how="all").reset_index(drop=True)


def _mtbf(frame: pd.DataFrame) -> pd.Series:
    return frame["failure_mtbf_s"] if "failure_mtbf_s" in frame else pd.Series(math.nan, index=frame.index)


# -- the model's expectation under the run's rate, priced with the sweep's own measured costs ---------------------

def model_expectations(frame: pd.DataFrame) -> pd.DataFrame:
    """Per run with a failure rate (failure_mtbf_s) and a priced mode: the model's expected seconds to the run's
    last step and the failures expected on the way (NaN elsewhere), strategies/fault_cost.expected_time with:
    - step_s: the wall seconds per step of the same cell's runs in which no failure landed (time_to_step_s /
      steps: warm-up, evaluations, checkpoints and the first segment's start included, as in the failed runs);
    - detection and recovery: the cell's measured means over its failures (checkpoint_restart: the restart;
      elastic: the re-forming; ps_shrink: both stop the group, so both are its detection);
    - a replacement joins `recovery_rejoin_steps` steps after the re-formed group's first (rejoin_s = detection +
      recovery + that many steps); a survivors' step counts as a step (step_s_shrunk = step_s: the thread ranks
      keep each worker's batch, the group's global batch shrinks).
    A cell is the sweep, workload, strategy, mode, workers, steps and recovery settings."""
    out = pd.DataFrame({"seconds": math.nan, "failures": math.nan}, index=frame.index)
    needed = {"failure_mtbf_s", "recovery_checkpoint_every", "recovery_rejoin_steps", "time_to_step_s"}
    if needed - set(frame.columns):
        return out
    keys = [k for k in ("sweep", "workload", "strategy_label", "recovery_mode", "workers", "steps",
                        "recovery_checkpoint_every", "recovery_rejoin_steps") if k in frame]
    for _, cell in frame.groupby(keys, sort=False, dropna=False):
        costs = _measured_costs(cell)
        if costs is None:
            continue
        for index, run in cell.iterrows():
            mtbf, mode = float(run["failure_mtbf_s"]), run["recovery_mode"]
            if not (math.isfinite(mtbf) and mode in (CHECKPOINT_RESTART, ELASTIC, PS_SHRINK)):
                continue
            if mode != CHECKPOINT_RESTART and int(run["recovery_rejoin_steps"]) < 0:
                continue  # a slot missing for good: the model's price needs its replacement
            every = int(run["recovery_checkpoint_every"]) if mode == CHECKPOINT_RESTART else None
            if every is not None and every < 1:
                continue  # results written before the interval was recorded
            got = expected_time(mode, int(run["steps"]), int(run["workers"]), mtbf, costs[mode == PS_SHRINK],
                                checkpoint_every=every)
            out.loc[index] = (got.seconds, got.failures)
    return out


def _measured_costs(cell: pd.DataFrame) -> tuple[FaultCosts, FaultCosts] | None:
    """(elastic and checkpoint_restart's costs, ps_shrink's) from a cell's runs; None without a failure-free run
    (no seconds per step to price) or, where failures landed, without their measured seconds."""
    clean = cell[(cell["failure_count"] == 0) & np.isfinite(cell["time_to_step_s"])]
    if clean.empty:
        return None
    step_s = float((clean["time_to_step_s"] / clean["steps"]).mean())
    failed = cell[cell["failure_count"] > 0]
    weights = failed["failure_count"]
    detect = _weighted(failed["detection_s"], weights)
    recover = _weighted(failed["recovery_s"], weights)
    if failed.empty:
        detect = recover = 0.0  # nothing failed in the cell: no failure is priced at a rate it never saw
    if not (math.isfinite(detect) and math.isfinite(recover)):
        return None
    rejoin = int(cell["recovery_rejoin_steps"].iloc[0])
    rejoin_s = detect + recover + max(rejoin, 0) * step_s
    own = FaultCosts(step_s=step_s, step_s_shrunk=step_s, detect_s=detect, restart_s=recover, reform_s=recover,
                     rejoin_s=rejoin_s)
    shrink = FaultCosts(step_s=step_s, step_s_shrunk=step_s, detect_s=detect + recover, rejoin_s=rejoin_s)
    return own, shrink


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    ok = np.isfinite(values) & (weights > 0)
    return float((values[ok] * weights[ok]).sum() / weights[ok].sum()) if ok.any() else math.nan


# -- the verdicts: who is first per failure setting, with the spread, and where that changes ----------------------

def cells(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (failure setting, strategy, mode): runs, how many reached `metric` (and passed the run's checks), and
    its mean, lowest and highest."""
    rows = []
    for (setting, strategy, mode), group in frame.groupby(["failures", *CELL], sort=False):
        ok = group[group["status"] == "ok"] if "status" in group else group  # a failed check: not a result
        values = ok[metric].dropna() if metric in ok else pd.Series(dtype=float)
        rows.append({"failures": setting, "strategy": strategy, "mode": mode, "runs": len(group),
                     "reached": len(values), "mean": values.mean() if len(values) else math.nan,
                     "low": values.min() if len(values) else math.nan,
                     "high": values.max() if len(values) else math.nan})
    return pd.DataFrame(rows)


def _clear(first, second) -> bool:
    """The first is ahead beyond the run-to-run spread: each has two runs or more and its slowest beat the other's
    fastest (one run each: the spread is not measured, so no lead is clear)."""
    return first["reached"] >= 2 and second["reached"] >= 2 and first["high"] < second["low"]


def _spread(cell) -> str:
    if cell["reached"] < 2:
        return f"{cell['mean']:.2f} s, one run"
    return f"{cell['mean']:.2f} s, {cell['low']:.2f}-{cell['high']:.2f} over {cell['reached']} runs"


def _first(group: pd.DataFrame):
    """(leader, the runner-up or None, cells that did not reach in every run) of one setting's cells."""
    whole = group[(group["reached"] == group["runs"]) & (group["reached"] > 0)].sort_values("mean")
    short = group[group["reached"] < group["runs"]]
    if whole.empty:
        return None, None, short
    return whole.iloc[0], (whole.iloc[1] if len(whole) > 1 else None), short


def verdicts(frame: pd.DataFrame) -> list[str]:
    """Per failure setting and metric (the last step; the target where runs had one): the order of strategy and
    mode on the mean, the first with its spread, and whether its lead is clear of the spread; then, where the
    sweep has several settings, whether the first changes with them and whether that change is measured (clear
    leads at both) or within the spread."""
    out = []
    for metric, what in METRICS.items():
        if metric not in frame or (metric == "s to target" and frame[metric].isna().all()):
            continue
        table = cells(frame, metric)
        firsts = {}
        for setting, group in table.groupby("failures", sort=False):
            top, second, short = _first(group)
            ended = (f"; {int((short['runs'] - short['reached']).sum())} run(s) did not reach it "
                     f"({', '.join(f'{s} with {m}' for s, m in zip(short['strategy'], short['mode']))})"
                     if len(short) else "")
            if top is None:
                out.append(f"{setting}: no strategy and mode reached {what} in every run{ended}.")
                continue
            clear = second is not None and _clear(top, second)
            firsts[setting] = (top["strategy"], top["mode"], clear or second is None)
            order = " < ".join(f"{s} with {m}" for s, m in zip(*_ordered(group)))
            if second is None:
                lead = "the only one to reach it in every run"
            elif clear:
                lead = (f"ahead of {second['strategy']} with {second['mode']} ({_spread(second)}) beyond the repeats' "
                        f"spread")
            elif top["reached"] < 2 or second["reached"] < 2:
                lead = (f"ahead of {second['strategy']} with {second['mode']} ({_spread(second)}) with a single run "
                        f"on {'both sides' if top['reached'] < 2 and second['reached'] < 2 else 'one side'}: the "
                        f"spread is not measured")
            else:
                lead = (f"within the spread of {second['strategy']} with {second['mode']} ({_spread(second)}): "
                        f"not a measured lead")
            out.append(f"{setting}, time to {what}: {top['strategy']} with {top['mode']} first ({_spread(top)}), "
                       f"{lead}{ended}. Order on the mean: {order}.")
        out += _changes(firsts, what)
    return out


def _ordered(group: pd.DataFrame):
    whole = group[(group["reached"] == group["runs"]) & (group["reached"] > 0)].sort_values("mean")
    return whole["strategy"], whole["mode"]


def _changes(firsts: dict, what: str) -> list[str]:
    """Where the first changes (settings mildest first): a measured change between two settings whose firsts are
    clear of the rest (the next such setting, neighbour or not); between neighbours where a lead is not clear, a
    change within the spread."""
    if len(firsts) < 2:
        return []
    items = list(firsts.items())
    if len({(s, m) for s, m, _ in firsts.values()}) == 1:
        (s, m, _), clear = items[0][1], sum(c for *_, c in firsts.values())
        spread = ("beyond the repeats' spread at every one" if clear == len(items) else
                  f"beyond the repeats' spread at {clear} of {len(items)}")
        return [f"Time to {what}: {s} with {m} is first under every failure setting of the sweep ({spread})."]
    out = []
    clear = [(k, v) for k, v in items if v[2]]  # a change between two clear firsts is measured, neighbours or not
    for (a, (sa, ma, _)), (b, (sb, mb, _)) in zip(clear, clear[1:]):
        if (sa, ma) != (sb, mb):
            out.append(f"The ranking changes with the failures (time to {what}), measured: from {a} ({sa} with {ma} "
                       f"first) to {b} ({sb} with {mb} first), each first clear of the rest (beyond the repeats' "
                       f"spread, or the only one to reach it in every run).")
    for (a, (sa, ma, ca)), (b, (sb, mb, cb)) in zip(items, items[1:]):
        if (sa, ma) != (sb, mb) and not (ca and cb):
            which = "neither lead is" if not (ca or cb) else "one lead is not"
            out.append(f"The first to {what} on the mean changes from {a} ({sa} with {ma}) to {b} ({sb} with {mb}), "
                       f"but {which} beyond the run-to-run spread: not a measured change of the ranking.")
    return out


def section(r):
    from reports.section_parts import Absent, Table

    frame = faults_measured_frame(r.runs)
    if frame.empty:
        return Absent("no run with failures (the failures and recovery settings; docs/faults.md)")
    formats = {"failed": "d", "model failed": ".2f", "steps done": "d", "steps lost": "d", "detection s": ".4f",
               "recovery s": ".4f", "s to last step": ".2f", "model s to last step": ".2f",
               "measured / model": ".2f", "steps to target": ".0f", "s to target": ".2f",
               "samples/s (run)": ".1f", "samples/s (steps)": ".1f"}
    formats = {k: v for k, v in formats.items() if k in frame}
    return {"verdicts": verdicts(frame), "table": Table(frame, formats, sortable=True, id="faults-measured"),
            "several": frame["failures"].nunique() > 1, "model": "model s to last step" in frame}
