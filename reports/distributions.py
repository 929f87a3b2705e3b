"""Per-step distributions: every timed step of a run, not only its mean. For each run, from its steps table:

- the step time of step s is its slowest worker's compute + exposed communication (DESIGN: the numbers);
- p50, p99 and max of the timed steps, by the nearest-rank rule (the p-th percentile is the smallest measured step
  time with at least p% of the steps at or under it: always one of the measured times), and p99 / p50, flagged
  above TAIL (1.5);
- the warm-up effect: the untimed warm-up steps' mean over the timed p50;
- spikes: timed steps longer than SPIKE (2) x p50, by step index;
- per-rank spread, nccl-tests' straggler view: each worker rank's own compute (its mean over the timed steps: the
  part a synchronous step does not equalise by waiting), their coefficient of variation, and the slowest rank by
  name with its compute over the median rank's, flagged above STRAGGLER (1.25).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

TAIL = 1.5        # p99 / p50 above this: a run with a heavy tail
SPIKE = 2.0       # a timed step longer than this x p50 is a spike
STRAGGLER = 1.25  # a rank whose compute is this x the median rank's is a straggler


def percentile(times, p: float) -> float:
    """The nearest-rank p-th percentile (0 < p <= 100) of a non-empty list of times."""
    values = np.sort(np.asarray(times, dtype=float))
    if values.size == 0 or np.isnan(values).any():
        raise ValueError(f"percentile of {values.size} times ({int(np.isnan(values).sum())} NaN): accepted is a "
                         f"non-empty list of numbers")
    if not 0 < p <= 100:
        raise ValueError(f"bad percentile {p!r}: accepted are numbers in (0, 100]")
    return float(values[max(math.ceil(p / 100 * values.size), 1) - 1])


def step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (run_id, step): the step time (slowest worker's compute + comm) and whether it was timed."""
    workers = steps[steps["role"] == "worker"]
    per = workers.assign(busy=workers["compute_s"] + workers["comm_s"])
    return per.groupby(["run_id", "step"], sort=True).agg(step_s=("busy", "max"), timed=("timed", "all")) \
        .reset_index()


def run_distribution(steps: pd.DataFrame) -> dict | None:
    """The distribution of one run's steps (its rows of the steps table); None when it has no timed worker step
    with a measured time."""
    times = step_times(steps)
    timed = times[times["timed"] & times["step_s"].notna()]  # a step with no time measured (NaN) has no place
    if timed.empty:
        return None
    p50, p99 = percentile(timed["step_s"], 50), percentile(timed["step_s"], 99)
    warm = times.loc[~times["timed"], "step_s"]
    spikes = [int(s) for s, t in zip(timed["step"], timed["step_s"]) if t > SPIKE * p50]
    ranks = steps[(steps["role"] == "worker") & steps["timed"]].groupby("rank")["compute_s"].mean()
    median = float(ranks.median())
    slowest = int(ranks.idxmax())
    cv = float(ranks.std(ddof=0) / ranks.mean()) if len(ranks) > 1 and ranks.mean() > 0 else 0.0
    ratio = float(ranks.max() / median) if median > 0 else math.nan
    return {"steps": len(timed), "mean s": float(timed["step_s"].mean()), "p50 s": p50, "p99 s": p99,
            "max s": float(timed["step_s"].max()), "p99/p50": p99 / p50 if p50 > 0 else math.nan,
            "warm-up / p50": float(warm.mean()) / p50 if len(warm) and p50 > 0 else math.nan,
            "spikes": ", ".join(map(str, spikes)), "rank compute CV": cv,
            "slowest rank": f"rank {slowest}" if len(ranks) > 1 else "",
            "slowest / median rank": ratio if len(ranks) > 1 else math.nan}


def distributions_frame(ok: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """One row per successful run with steps: its label, workers, link and run_distribution's numbers."""
    if steps is None or steps.empty:
        return pd.DataFrame()
    rows = []
    by_run = dict(tuple(steps.groupby("run_id", sort=False)))
    for run in ok.itertuples():
        mine = by_run.get(run.run_id)
        if mine is None:
            continue
        numbers = run_distribution(mine)
        if numbers is not None:
            rows.append({"run": run.run_id, "strategy": run.label, "workers": run.workers, "link": run.link}
                        | numbers)
    return pd.DataFrame(rows)


def flags(frame: pd.DataFrame) -> list[str]:
    """A sentence per run with a heavy tail, spikes or a straggler rank."""
    out = []
    for r in frame.to_dict("records"):
        where = f"{r['strategy']}, {r['workers']} workers, {r['link']} ({r['run']})"
        if r["p99/p50"] > TAIL:
            out.append(f"{where}: p99 {r['p99 s']:.4g} s is {r['p99/p50']:.2f}x the p50 {r['p50 s']:.4g} s (over "
                       f"{TAIL:g}x: the mean hides a heavy tail)")
        if r["spikes"]:
            out.append(f"{where}: step(s) {r['spikes']} took over {SPIKE:g}x the p50")
        if r["slowest / median rank"] > STRAGGLER:
            out.append(f"{where}: {r['slowest rank']} computes {r['slowest / median rank']:.2f}x the median rank "
                       f"(a straggler; every synchronous step waits for it)")
    return out


def section(r):
    from reports.section_parts import Absent, Table

    frame = distributions_frame(r.ok, r.steps)
    if frame.empty:
        return Absent("no steps recorded for a successful run (steps.parquet), so no per-step distribution")
    return {"flags": flags(frame), "tail": f"{TAIL:g}", "spike": f"{SPIKE:g}", "straggler": f"{STRAGGLER:g}",
            "table": Table(frame, {"workers": "d", "steps": "d", "mean s": ".4f", "p50 s": ".4f", "p99 s": ".4f",
                                   "max s": ".4f", "p99/p50": ".2f", "warm-up / p50": ".2f",
                                   "rank compute CV": ".3f", "slowest / median rank": ".2f"},
                           sortable=True, id="distributions")}
