"""The "Failures measured" section on hand-made results: strategy x recovery mode, the fastest to the last step, a
ranking that changes between failure settings, the ended runs with their cause; the model's section prices only
failure-free runs."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from experiments.results import schema
from reports import faults, faults_measured, load
from reports.page import ENV
from reports.sections import SECTIONS, Absent, Results


def _run(run_id, strategy, step_s):
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="faults", substrate="threads", workload="resnet18", image_size=32,
        batch_size=16, steps=10, warmup_steps=2, device="cpu", seed=0, lr=0.1, strategy=strategy, workers=4,
        servers=1 if strategy == "parameter_server" else 0, bytes_counted=True, link_bandwidth=125e6,
        link_latency_s=0.0, link_emulation="python", ranks_per_node=1, straggler_slowdown=1.0, compute="real",
        status="ok", throughput=64 / step_s, step_time_s=step_s, compute_s=0.2, comm_s=step_s - 0.2,
        comm_fraction=0.5, exposed_comm_s=step_s - 0.2, numel=1000, model_bytes=4000, final_loss=1.0, param_norm=1.0,
        transport="threads", cores=2, gpu="", host="h", started_at="2026-01-01T00:00:00", duration_s=1.0)


def _results(tmp_path, rows) -> Results:
    pq.write_table(schema.to_arrow(rows, schema.RUNS), tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return Results(runs=runs, ok=runs[runs["ok"]], steps=None, sweep_text=None, links=load.link_order(runs))


def _fault(run_id, strategy, mode, to_step, setting="rank 2 at step 5", status="ok", error=""):
    return {**_run(run_id, strategy, 0.5), "recovery_mode": mode, "failure_setting": setting, "failure_count": 1,
            "completed_steps": 10 if status == "ok" else 5, "steps_lost": 1 if mode == "checkpoint_restart" else 0,
            "detection_s": 0.01, "recovery_s": 0.02, "time_to_step_s": to_step,
            "run_throughput": 64 * 8 / to_step if math.isfinite(to_step) else math.nan, "status": status,
            "error": error}


def test_strategies_by_mode_the_fastest_and_the_ended_runs(tmp_path):
    rows = [_fault("r-e", "ring", "elastic", 6.0), _fault("r-c", "ring", "checkpoint_restart", 7.5),
            _fault("p-s", "parameter_server", "ps_shrink", 9.0),
            _fault("r-n", "ring", "none", math.nan, status="failed",
                   error="the run ended after 5 completed step(s): rank(s) [2] failed during step 5")]
    body = faults_measured.section(_results(tmp_path, rows))
    frame = body["table"].frame.set_index(["strategy", "mode"])
    assert frame.loc[("ring", "checkpoint_restart"), "steps lost"] == 1
    assert frame.loc[("ring", "none"), "ended by"] == "rank(s) [2] failed during step 5"
    assert frame.loc[("ring", "elastic"), "samples/s (run)"] == pytest.approx(512 / 6.0)
    [verdict] = body["verdicts"]
    assert verdict.startswith("rank 2 at step 5: ring with elastic reached its last step first (6.00 s")
    assert "1 run(s) ended by the failure" in verdict
    html = ENV.get_template("sections/faults-measured.html.j2").render(**body)
    assert "<b>Measured.</b>" in html and 'id="faults-measured"' in html
    assert "faults-measured" in [section.id for section in SECTIONS]


def test_the_ranking_that_changes_between_failure_settings_is_said(tmp_path):
    rows = [_fault("a", "ring", "elastic", 6.0, setting="MTBF 60 s per worker, seed 0"),
            _fault("b", "parameter_server", "ps_shrink", 7.0, setting="MTBF 60 s per worker, seed 0"),
            _fault("c", "ring", "elastic", 9.0, setting="MTBF 5 s per worker, seed 0"),
            _fault("d", "parameter_server", "ps_shrink", 8.0, setting="MTBF 5 s per worker, seed 0")]
    body = faults_measured.section(_results(tmp_path, rows))
    assert body["several"]
    assert body["verdicts"][-1] == ("The ranking changes with the failures: MTBF 5 s per worker, seed 0: "
                                    "parameter_server with ps_shrink; MTBF 60 s per worker, seed 0: ring with elastic.")


def test_absent_without_failures_and_the_model_prices_failure_free_runs_only(tmp_path):
    plain = [_run("ring", "ring", 0.5), _run("hd", "halving_doubling", 0.6)]
    assert isinstance(faults_measured.section(_results(tmp_path, plain)), Absent)
    with_faults = plain + [_fault("slow", "parameter_server", "ps_shrink", 9.0)]
    frame = faults.section(_results(tmp_path, with_faults))["table"].frame
    assert "parameter_server" not in set(frame["strategy"])
