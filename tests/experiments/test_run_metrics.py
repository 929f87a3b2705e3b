"""The run's numbers from synthetic step records, against values worked out by hand: the one summary
(experiments.pipeline.summary.summarize) that measured (Ray, threads) and simulated (SimGrid) runs all go through.

The run: a parameter server with 2 workers and 1 server, batch 8, 3 steps of which step 0 is warm-up. Worker 1 is
slow in step 1, worker 0 in step 2; the server's own rows are slower than any worker's and must not set the step
time; the warm-up step is 100x slower and must not count.
"""

from __future__ import annotations

import math

import pytest

import strategies
from experiments.config.sweep import RunSpec
from experiments.pipeline.summary import analytic_traffic, summarize

NUMEL = 1000
BATCH = 8
SPEC = RunSpec(workload="tiny", image_size=16, batch_size=BATCH, steps=3, warmup_steps=1,
               strategy="parameter_server", strategy_params={"servers": 1}, workers=2)
META = {"started_at": "2026-01-01T00:00:00", "duration_s": 1.0, "transport": "threads", "gpu": "", "cores": 8,
        "host": "h"}
# (compute_s, comm_s, comm_busy_s) per (step, rank); rank 2 is the server
TIMES = {
    (0, 0): (10.0, 10.0, 10.0), (0, 1): (10.0, 10.0, 10.0), (0, 2): (1.0, 30.0, 30.0),   # warm-up
    (1, 0): (0.10, 0.02, 0.03), (1, 1): (0.30, 0.05, 0.08), (1, 2): (0.01, 0.90, 0.91),  # worker 1 slowest: 0.35
    (2, 0): (0.20, 0.20, 0.25), (2, 1): (0.25, 0.05, 0.06), (2, 2): (0.01, 0.90, 0.91),  # worker 0 slowest: 0.40
}


def _traffic() -> list[tuple[int, int]]:
    """(bytes sent, bytes received) per rank in one step, as the strategy declares them."""
    t = strategies.make("parameter_server", servers=1).traffic(2, NUMEL, 4)
    return [(r.bytes_sent, r.bytes_recv) for r in t.ranks]


def _results(times=TIMES, traffic=None, loss=1.5) -> list[dict]:
    traffic = traffic or _traffic()
    results = []
    for rank in range(3):
        role = "worker" if rank < 2 else "server"
        rows = []
        for step in range(3):
            compute_s, comm_s, busy = times[step, rank]
            rows.append({"step": step, "rank": rank, "role": role, "timed": step >= 1, "compute_s": compute_s,
                         "comm_s": comm_s, "bytes_sent": traffic[rank][0], "bytes_recv": traffic[rank][1],
                         "loss": loss if role == "worker" else math.nan, "samples": BATCH if role == "worker" else 0,
                         "consensus_distance": math.nan, "wall_s": float(step), "backward_end_s": compute_s,
                         "exposed_comm_s": comm_s, "comm_busy_s": busy, "overlap_fraction": math.nan})
        final = {"loss": loss if role == "worker" else math.nan, "param_norm": 2.0 + rank, "numel": NUMEL,
                 "buckets": 1, "bucket_numels": [NUMEL], "trained": role == "worker",
                 "consensus_distance": math.nan}
        results.append({"steps": rows, "final": final})
    return results


def test_step_time_is_the_slowest_workers_per_timed_step_and_throughput_the_groups_samples_over_it():
    """Timed steps 1 and 2: slowest workers 0.30 + 0.05 = 0.35 s and 0.20 + 0.20 = 0.40 s.
    step time = (0.35 + 0.40) / 2 = 0.375 s; throughput = 2 workers x 8 x 2 steps / 0.75 s = 42.67 samples/s;
    compute = (0.30 + 0.20) / 2 = 0.25 s; comm = (0.05 + 0.20) / 2 = 0.125 s; comm share = 0.25 / 0.75 = 1/3."""
    row, steps = summarize(SPEC, _results(), "", META)
    assert row["status"] == "ok", row["error"]
    assert row["step_time_s"] == pytest.approx(0.375, abs=1e-12)
    assert row["throughput"] == pytest.approx(32 / 0.75, abs=1e-9)
    assert row["compute_s"] == pytest.approx(0.25, abs=1e-12)
    assert row["comm_s"] == pytest.approx(0.125, abs=1e-12)
    assert row["comm_fraction"] == pytest.approx(1 / 3, abs=1e-12)
    assert len(steps) == 9 and {s["run_id"] for s in steps} == {row["run_id"]}


def test_exposed_and_busy_communication_and_the_hidden_share():
    """Busy: the slowest workers' time inside bucket syncs, (0.08 + 0.25) / 2 = 0.165 s; exposed = comm = 0.125 s;
    overlap fraction = 1 - (0.05 + 0.20) / (0.08 + 0.25) = 1 - 0.25 / 0.33."""
    row, _ = summarize(SPEC, _results(), "", META)
    assert row["comm_busy_s"] == pytest.approx(0.165, abs=1e-12)
    assert row["exposed_comm_s"] == pytest.approx(0.125, abs=1e-12)
    assert row["overlap_fraction"] == pytest.approx(1 - 0.25 / 0.33, abs=1e-12)
    assert row["backward_end_s"] == pytest.approx(0.25, abs=1e-12)  # the slowest workers' compute (set so above)


def test_bytes_per_worker_and_server_are_the_timed_steps_and_equal_the_analytic_ones():
    traffic = _traffic()
    row, _ = summarize(SPEC, _results(), "", META)
    assert row["bytes_sent_per_worker"] == traffic[0][0] == row["analytic_bytes_sent_per_worker"]
    assert row["bytes_sent_per_server"] == traffic[2][0] == 2 * 4 * NUMEL  # two workers' pushes answered
    assert row["servers"] == 1 and row["numel"] == NUMEL and row["model_bytes"] == 4 * NUMEL
    assert row["final_loss"] == 1.5 and row["param_norm"] == pytest.approx(2.5)  # the two workers' mean


def test_a_rank_that_moved_other_bytes_than_declared_fails_the_run_naming_it():
    traffic = _traffic()
    results = _results()
    results[1]["steps"][2]["bytes_sent"] += 4
    row, _ = summarize(SPEC, results, "", META)
    assert row["status"] == "failed"
    assert row["error"].startswith(f"rank 1 step 2: measured {traffic[1][0] + 4:,} bytes sent"), row["error"]
    assert math.isnan(row["throughput"])


def test_a_non_finite_loss_fails_the_run_naming_step_and_rank():
    results = _results()
    results[1]["steps"][1]["loss"] = math.nan
    row, _ = summarize(SPEC, results, "", META)
    assert row["status"] == "failed" and row["error"] == "loss is nan at step 1 on rank 1"
    assert math.isnan(row["step_time_s"])


def test_a_run_that_did_not_run_keeps_its_error_and_no_numbers():
    row, steps = summarize(SPEC, None, "worker group did not start", META)
    assert (row["status"], row["error"], steps) == ("failed", "worker group did not start", [])
    assert all(math.isnan(row[k]) for k in ("throughput", "step_time_s", "comm_fraction"))


def test_warm_up_rows_change_nothing():
    """Making the warm-up step 10x slower again leaves every number as it was."""
    slower = {k: tuple(10 * t for t in v) if k[0] == 0 else v for k, v in TIMES.items()}
    row, _ = summarize(SPEC, _results(), "", META)
    again, _ = summarize(SPEC, _results(times=slower), "", META)
    for key in ("throughput", "step_time_s", "compute_s", "comm_s", "comm_fraction", "comm_busy_s"):
        assert again[key] == row[key], key


def test_a_bucketed_runs_analytic_traffic_is_its_buckets_summed():
    """Ring on 2 workers, buckets of 7 and 5 elements (float32). Bucket 7: chunks 4, 3 (16, 12 B): each worker
    sends one chunk in the reduce-scatter and the other in the all-gather, 28 B each way; 2 rounds, each paced
    by the 16 B chunk: 32 B. Bucket 5: chunks 3, 2 (12, 8 B): 20 B each way, 2 rounds, 24 B. Per step: 4 rounds,
    56 B on the critical path (not the largest bucket's 32), 48 B sent and received per worker."""
    spec = RunSpec(workload="tiny", image_size=16, batch_size=BATCH, steps=3, warmup_steps=1, strategy="ring",
                   workers=2)
    results = []
    for rank in range(2):
        rows = [{"step": step, "rank": rank, "role": "worker", "timed": step >= 1, "compute_s": 0.1, "comm_s": 0.01,
                 "bytes_sent": 48, "bytes_recv": 48, "loss": 1.0, "samples": BATCH, "consensus_distance": math.nan,
                 "wall_s": float(step), "backward_end_s": 0.1, "exposed_comm_s": 0.01, "comm_busy_s": 0.01,
                 "overlap_fraction": math.nan} for step in range(3)]
        final = {"loss": 1.0, "param_norm": 1.0, "numel": 12, "buckets": 2, "bucket_numels": [7, 5], "trained": True,
                 "consensus_distance": math.nan}
        results.append({"steps": rows, "final": final})
    row, _ = summarize(spec, results, "", META)
    assert row["status"] == "ok", row["error"]
    assert (row["analytic_rounds"], row["analytic_path_bytes"]) == (4.0, 56.0)
    assert row["analytic_bytes_sent_per_worker"] == 48.0
    assert row["bytes_sent_per_worker"] == row["bytes_recv_per_worker"] == 48.0
    traffic = analytic_traffic(strategies.make("ring"), 2, [7, 5])
    assert traffic["ranks"] == [("worker", 48, 48)] * 2 and (traffic["rounds"], traffic["path_bytes"]) == (4, 56)
