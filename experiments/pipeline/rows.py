"""One rank's row of the steps table per step: the same columns for workers and servers, measured or simulated
(experiments/results/schema.py STEPS); experiments/pipeline/summary.py turns them into the run's numbers."""

from __future__ import annotations

import math


def step_row(spec, step: int, rank: int, role: str, compute_s: float, comm_s: float, counters, wall_s: float,
             loss: float = math.nan, samples: int = 0, backward_end_s: float = math.nan,
             comm_busy_s: float = math.nan, overlap_fraction: float = math.nan) -> dict:
    """One rank's step: the same columns for workers and servers, measured or simulated."""
    return {"step": step, "rank": rank, "role": role, "timed": step >= spec.warmup_steps,
            "compute_s": float(compute_s), "comm_s": float(comm_s), "bytes_sent": int(counters.bytes_sent),
            "bytes_recv": int(counters.bytes_recv), "loss": float(loss), "samples": int(samples),
            "consensus_distance": math.nan, "wall_s": float(wall_s), "backward_end_s": float(backward_end_s),
            "exposed_comm_s": float(comm_s), "comm_busy_s": float(comm_busy_s),
            "overlap_fraction": float(overlap_fraction),
            # a parameter server without a barrier fills these on its server rows (serve_without_barrier)
            "staleness": [], "bound_wait_s": math.nan, "dropped_pushes": 0, "eval_value": math.nan}


def overlap_fraction(busy_s: float, exposed_s: float) -> float:
    """The share of communication time hidden behind computation: 1 - exposed / busy (NaN: nothing moved or
    the backend hides it)."""
    if not busy_s > 0:
        return math.nan
    return min(1.0, max(0.0, 1.0 - exposed_s / busy_s))
