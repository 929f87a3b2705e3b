"""The columns a sweep's run with failures adds to its row (sweep_faults.execute): the failures as set, what
happened, what each cost, the time to the last step, the outages; and each step's declared traffic as the group's
size changes."""

from __future__ import annotations

import math

import numpy as np

from strategies.faults import FAILURE


def step_traffic(config, sizes: dict[int, int], mixings, numels: list[int]) -> dict[int, dict]:
    """Each step's declared traffic: the strategy's at the step's group size; after a re-weighting, each survivor
    sends its buffers to, and receives them from, its neighbours in the survivors' graph."""
    from experiments.pipeline.summary import analytic_traffic

    by_size = {m: analytic_traffic(config, m, numels) for m in set(sizes.values())}
    out = {}
    for step, m in sizes.items():
        mixing = next((x for x in reversed(mixings) if x.step <= step), None)
        if mixing is None:
            out[step] = by_size[m]
            continue
        degrees = [int(np.count_nonzero(row)) - 1 for row in mixing.matrix]
        payload = 4 * sum(numels)
        out[step] = {**by_size[m], "ranks": [("worker", d * payload, d * payload) for d in degrees]}
    return out


def last_attempts(rows: list[dict]) -> list[dict]:
    """Each (step, rank)'s last attempt (checkpoint_restart redoes the steps since its checkpoint), in step order."""
    last = {(r["step"], r["rank"]): r for r in rows}
    return [last[k] for k in sorted(last)]


def failure_setting(spec) -> str:
    """The run's failures as set, for display."""
    failures = spec.failures or {}
    if "mtbf_s" in failures:
        return f"MTBF {failures['mtbf_s']:g} s per worker, seed {failures.get('seed', 0)}"
    return ", ".join([f"rank {rank} at step {step}" for step, rank in failures.get("schedule", [])]
                     + [f"rank {rank}'s link down {seconds:g} s at step {step}"
                        for step, rank, seconds in failures.get("outages", [])])


def fault_columns(spec, out, rows: list[dict], row: dict, segments=None) -> dict:
    """The failures' columns of the run's row: what happened, what it cost, the time to the last step."""
    failures = out.failures if out is not None else []
    completed = out.completed_steps if out is not None else 0
    last_wall = max((r["wall_s"] for r in rows), default=math.nan)
    warm = spec.warmup_steps  # throughput over the timed steps, as the run's: from the end of its warm-up
    warm_end = max((r["wall_s"] for r in rows if r["step"] == warm - 1), default=0.0) if warm else 0.0
    samples = sum(r["samples"] for r in rows if r["step"] >= warm)
    detection = [f.detection_s for f in failures if math.isfinite(f.detection_s)]
    recovery = [f.recovery_s for f in failures if math.isfinite(f.recovery_s)]
    columns = {
        **outage_columns(segments),
        "recovery_mode": (spec.recovery or {"mode": "none"})["mode"], "failure_setting": failure_setting(spec),
        "failure_mtbf_s": float((spec.failures or {}).get("mtbf_s", math.nan)),
        "recovery_checkpoint_every": (spec.recovery or {}).get("checkpoint_every") or 0,
        "recovery_rejoin_steps": -1 if (r := (spec.recovery or {}).get("rejoin_steps")) is None else r,
        "failure_count": len(failures), "failure_steps": tuple(f.step for f in failures),
        "failure_ranks": tuple(f.rank for f in failures), "completed_steps": completed,
        "steps_run": out.steps_run if out is not None else 0,
        "steps_lost": sum(f.steps_lost for f in failures),
        "detection_s": float(np.mean(detection)) if detection else math.nan,
        "recovery_s": float(np.mean(recovery)) if recovery else math.nan,
        "recovery_max_s": max((f.detection_s + f.recovery_s for f in failures
                               if math.isfinite(f.detection_s + f.recovery_s)), default=math.nan),
        "time_to_step_s": last_wall if completed == spec.steps else math.nan,
        "run_throughput": samples / (last_wall - warm_end) if samples and last_wall > warm_end else math.nan,
    }
    if row.get("target_reached"):  # on the run's clock: the wall time its target was met, recoveries included
        reached = int(row["steps_to_target"]) - 1
        columns["time_to_target_s"] = max(r["wall_s"] for r in rows if r["step"] == reached)
    return columns


def outage_columns(segments) -> dict:
    """The run row's outage columns: how many outages happened, the seconds their links held messages, how many
    became failures (none recorded on segments without outages)."""
    records = getattr(segments, "out_outages", [])
    return {"outage_count": len(records),
            "outage_held_s": float(sum(r.held_s for r in records)) if records else math.nan,
            "outage_failures": sum(1 for r in records if r.outcome == FAILURE)}
