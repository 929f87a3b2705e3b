"""A parameter server without a barrier (backups, SSP, async) is not held to its slowest rank: its time to target is
the time its servers' parameters met the target, at the fast workers' pace, and the report shows that pace beside
the slowest rank's. A scripted schedule through the one run summary (experiments/pipeline/summary.py), then the
report's table; every expected value is worked out by hand in the comments."""

from __future__ import annotations

import math

import pytest

import strategies
from experiments.config.sweep import RunSpec
from experiments.pipeline.summary import summarize
from reports import tta
from tests.reports.test_time_to_target import _ok, _run, _twin

NUMEL = 1000
BATCH = 8
META = {"started_at": "2026-01-01T00:00:00", "duration_s": 1.0, "transport": "threads", "gpu": "", "cores": 8,
        "host": "h"}
# 3 workers and 1 dedicated server, 7 steps (step 0 warm-up), evaluated after steps 1, 3, 5 (every 2) and 6 (the
# last). Workers 0 and 1 step in 0.10 s compute + 0.02 s communication = 0.12 s; worker 2 straggles: 0.30 + 0.01 =
# 0.31 s. The warm-up step takes 5 s everywhere and must not count.
PACE = {0: (0.10, 0.02), 1: (0.10, 0.02), 2: (0.30, 0.01)}
# held-out accuracy after each evaluated step: the fast workers hold step t's parameters; the straggler, late,
# takes the newest ones, so its evaluations run ahead of its own step count
EVALS = {0: {1: 0.50, 3: 0.80, 5: 0.92, 6: 0.93}, 1: {1: 0.50, 3: 0.80, 5: 0.92, 6: 0.93},
         2: {1: 0.60, 3: 0.91, 5: 0.95, 6: 0.96}}


def _spec(backups: int) -> RunSpec:
    return RunSpec(workload="tiny", image_size=16, batch_size=BATCH, steps=7, warmup_steps=1, dataset="digits",
                   strategy="parameter_server", strategy_params={"servers": 1, "backups": backups}, workers=3,
                   target={"metric": "accuracy", "value": 0.9}, eval_every=2)


def _results(backups: int) -> list[dict]:
    t = strategies.make("parameter_server", servers=1, backups=backups).traffic(3, NUMEL, 4)
    results = []
    for rank, traffic in enumerate(t.ranks):
        worker = traffic.role == "worker"
        rows = []
        for step in range(7):
            compute_s, comm_s = (5.0, 0.0) if step == 0 else PACE[rank] if worker else (0.0, 0.5)
            rows.append({"step": step, "rank": rank, "role": traffic.role, "timed": step >= 1,
                         "compute_s": compute_s, "comm_s": comm_s, "bytes_sent": traffic.bytes_sent,
                         "bytes_recv": traffic.bytes_recv, "loss": 1.0 if worker else math.nan,
                         "samples": BATCH if worker else 0, "consensus_distance": math.nan, "wall_s": float(step),
                         "backward_end_s": compute_s, "exposed_comm_s": comm_s, "comm_busy_s": comm_s,
                         "overlap_fraction": math.nan,
                         "eval_value": EVALS[rank].get(step, math.nan) if worker else math.nan})
        results.append({"steps": rows, "final": {"loss": 1.0 if worker else math.nan, "param_norm": 1.0,
                                                 "numel": NUMEL, "buckets": 1, "bucket_numels": [NUMEL],
                                                 "trained": worker, "consensus_distance": math.nan}})
    return results


def test_backups_reach_the_target_when_the_servers_parameters_do_at_the_fast_workers_pace():
    """Backups (b = 1): the first evaluation that met 0.9 on each worker's own clock: workers 0 and 1 after step 5,
    6 steps x 0.12 s = 0.72 s; worker 2 after step 3, 4 steps x 0.31 s = 1.24 s. The servers' parameters met the
    target at the earliest: 0.72 s, 6 steps. The fast workers' pace is 0.12 s; the step time stays the slowest
    rank's per step: 0.31 s."""
    row, _ = summarize(_spec(1), _results(1), "", META)
    assert row["status"] == "ok", row["error"]
    assert row["step_time_s"] == pytest.approx(0.31)
    assert row["fast_step_s"] == pytest.approx(0.12)
    assert row["target_reached"] and row["steps_to_target"] == 6.0
    assert row["time_to_target_s"] == pytest.approx(0.72)


def test_a_synchronous_server_keeps_the_barrier_rule():
    """The same schedule with a barrier (b = 0): the workers' mean at a step, (0.50 + 0.50 + 0.60) / 3 = 0.533
    after step 1, (0.80 + 0.80 + 0.91) / 3 = 0.837 after step 3, (0.92 + 0.92 + 0.95) / 3 = 0.930 after step 5: 6
    steps x the slowest rank's 0.31 s = 1.86 s; no fast pace (NaN). Backups' 0.72 s is 0.387x that."""
    row, _ = summarize(_spec(0), _results(0), "", META)
    assert row["status"] == "ok", row["error"]
    assert math.isnan(row["fast_step_s"])
    assert row["steps_to_target"] == 6.0 and row["time_to_target_s"] == pytest.approx(1.86)


def _backups(run_id, seed, steps_to, fast_s, slow_s, **kw):
    row = _run(run_id, seed, steps_to, slow_s, **kw)
    row.update(strategy="parameter_server", param_servers=1, param_backups=1, servers=1, fast_step_s=fast_s,
               time_to_target_s=steps_to * fast_s if row["target_reached"] else math.nan)
    return row


def test_the_table_shows_the_fast_pace_beside_the_slowest_ranks_and_compares_with_ring_at_it(tmp_path):
    """Ring reaches the target at 6 steps of 0.20 s: 1.20 s. Backups at 6 steps of the fast workers' 0.12 s
    (slowest rank 0.31 s): 0.72 s = 0.60x ring; at the slowest rank's pace it would be 1.86 s = 1.55x."""
    ok = _ok(tmp_path, [_run("r", 0, 6, 0.20), _backups("b", 0, 6, 0.12, 0.31)])
    by = tta.tta_frame(ok).set_index("configuration")
    [ps] = [c for c in by.index if c != "ring"]
    assert by.loc[ps, "ms per step"] == "120.00 (1 run)"
    assert by.loc[ps, "slowest rank ms per step"] == "310.00 (1 run)"
    assert by.loc[ps, "time to target s"] == "0.720 (1 run)"
    assert by.loc[ps, "x ring time"] == "0.60"
    assert "no barrier: the fastest worker's pace" in by.loc[ps, "seconds per step from"]
    assert by.loc["ring", "ms per step"] == by.loc["ring", "slowest rank ms per step"] == "200.00 (1 run)"


def test_a_barrier_free_twin_gives_its_fast_pace(tmp_path):
    """Profile twins of the backups configuration: fast workers 0.05 and 0.07 s (slowest rank 0.30 s both): time
    to target = 6 steps x 0.06 s = 0.360 s, sd 6 x 0.014142 = 0.085 (the steps agree: one real run, said so)."""
    twins = []
    for seed, fast in ((0, 0.05), (1, 0.07)):
        twin = _twin(f"t{seed}", seed, 0.30)
        twin.update(strategy="parameter_server", param_servers=1, param_backups=1, servers=1, fast_step_s=fast)
        twins.append(twin)
    ok = _ok(tmp_path, [_backups("b", 0, 6, 0.12, 0.31)] + twins)
    row = tta.tta_frame(ok).iloc[0]
    assert row["ms per step"] == "60.00 ± 14.14"
    assert row["slowest rank ms per step"] == "300.00 ± 0.00"
    assert row["time to target s"] == "0.360 ± 0.085 (steps to target: 1 run, no spread)"
