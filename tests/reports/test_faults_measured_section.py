"""The "Failures measured" section on hand-made results: strategy x recovery mode, the first to the last step and to
the target per failure setting with its run-to-run spread, a ranking that changes between failure rates (measured,
or within the spread), the ended runs with their cause, the model's expectation priced with the sweep's own costs;
the model's section prices only failure-free runs."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from experiments.results import schema
from reports import faults, faults_measured, load
from reports.page import ENV
from reports.sections import SECTIONS, Absent, Results
from strategies.fault_cost import FaultCosts, expected_time


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


def _fault(run_id, strategy, mode, to_step, setting="rank 2 at step 5", status="ok", error="", mtbf=math.nan,
           failed=1, detection=0.01, recovery=0.02, every=0, rejoin=-1, to_target=math.nan):
    target = {"target_metric": "accuracy", "target_value": 0.9, "target_reached": math.isfinite(to_target),
              "steps_to_target": 7.0 if math.isfinite(to_target) else math.nan, "time_to_target_s": to_target}
    return {**_run(run_id, strategy, 0.5), "recovery_mode": mode, "failure_setting": setting, "failure_count": failed,
            "completed_steps": 10 if status == "ok" else 5, "steps_lost": 1 if mode == "checkpoint_restart" else 0,
            "detection_s": detection if failed else math.nan, "recovery_s": recovery if failed else math.nan,
            "time_to_step_s": to_step, "run_throughput": 64 * 8 / to_step if math.isfinite(to_step) else math.nan,
            "status": status, "error": error, "failure_mtbf_s": mtbf, "recovery_checkpoint_every": every,
            "recovery_rejoin_steps": rejoin, **(target if math.isfinite(to_target) or mode != "none" else {})}


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
    assert "model s to last step" not in frame  # a schedule, no rate: nothing for the model to price
    [verdict] = body["verdicts"]
    assert verdict.startswith("rank 2 at step 5, time to the last step: ring with elastic first (6.00 s, one run), "
                              "ahead of ring with checkpoint_restart (7.50 s, one run) with a single run on both "
                              "sides: the spread is not measured; 1 run(s) did not reach it (ring with none).")
    assert verdict.endswith("Order on the mean: ring with elastic < ring with checkpoint_restart < parameter_server "
                            "with ps_shrink.")
    html = ENV.get_template("sections/faults-measured.html.j2").render(**body)
    assert "<b>Measured.</b>" in html and 'id="faults-measured"' in html
    assert "faults-measured" in [section.id for section in SECTIONS]


def _rates(slow_ps_at_60=(7.0, 7.2)):
    """Two repeats per cell at MTBF 60 s and 5 s per worker (the string sort would put 5 s first)."""
    mild, harsh = "MTBF 60 s per worker, seed 0", "MTBF 5 s per worker, seed 0"
    return [_fault("a0", "ring", "elastic", 6.0, mild, mtbf=60.0, to_target=4.0),
            _fault("a1", "ring", "elastic", 6.4, mild, mtbf=60.0, to_target=4.2),
            _fault("b0", "parameter_server", "ps_shrink", slow_ps_at_60[0], mild, mtbf=60.0, to_target=5.0),
            _fault("b1", "parameter_server", "ps_shrink", slow_ps_at_60[1], mild, mtbf=60.0, to_target=5.5),
            _fault("c0", "ring", "elastic", 9.0, harsh, mtbf=5.0, to_target=7.0),
            _fault("c1", "ring", "elastic", 9.5, harsh, mtbf=5.0),  # did not reach the target
            _fault("c2", "ring", "elastic", 5.0, harsh, mtbf=5.0, to_target=3.0, status="failed",
                   error="strategy 'ring' is declared exact and identical, but ..."),  # a failed check: no result
            _fault("d0", "parameter_server", "ps_shrink", 8.0, harsh, mtbf=5.0, to_target=6.0),
            _fault("d1", "parameter_server", "ps_shrink", 8.2, harsh, mtbf=5.0, to_target=6.1)]


def test_the_ranking_that_changes_between_failure_rates_beyond_the_spread_is_said(tmp_path):
    body = faults_measured.section(_results(tmp_path, _rates()))
    assert body["several"]
    assert list(body["table"].frame["failures"].unique()) == ["MTBF 60 s per worker, seed 0",
                                                              "MTBF 5 s per worker, seed 0"]  # mildest first
    step_lines = [v for v in body["verdicts"] if "last step" in v]
    assert step_lines[0].startswith("MTBF 60 s per worker, seed 0, time to the last step: ring with elastic first "
                                    "(6.20 s, 6.00-6.40 over 2 runs), ahead of parameter_server with ps_shrink "
                                    "(7.10 s, 7.00-7.20 over 2 runs) beyond the repeats' spread.")
    changes = ("The ranking changes with the failures (time to {}), measured: from MTBF 60 s per worker, seed 0 "
               "(ring with elastic first) to MTBF 5 s per worker, seed 0 (parameter_server with ps_shrink first), each "
               "first clear of the rest (beyond the repeats' spread, or the only one to reach it in every run).")
    assert step_lines[-1] == changes.format("the last step")
    target_lines = [v for v in body["verdicts"] if "the target" in v]
    assert target_lines[0].startswith("MTBF 60 s per worker, seed 0, time to the target: ring with elastic first "
                                      "(4.10 s, 4.00-4.20 over 2 runs), ahead of parameter_server")
    assert target_lines[1].startswith("MTBF 5 s per worker, seed 0, time to the target: parameter_server with "
                                      "ps_shrink first (6.05 s, 6.00-6.10 over 2 runs), the only one to reach it in "
                                      "every run; 2 run(s) did not reach it (ring with elastic).")
    assert target_lines[-1] == changes.format("the target")
    frame = body["table"].frame
    assert frame["s to target"].isna().sum() == 1 and (frame["status"] == "failed").sum() == 1


def test_a_change_within_the_spread_is_not_called_a_ranking_change(tmp_path):
    body = faults_measured.section(_results(tmp_path, _rates(slow_ps_at_60=(6.3, 8.0))))
    mild = body["verdicts"][0]
    assert "within the spread of parameter_server with ps_shrink (7.15 s, 6.30-8.00 over 2 runs): not a measured " \
           "lead" in mild
    assert body["verdicts"][2] == (
        "The first to the last step on the mean changes from MTBF 60 s per worker, seed 0 (ring with elastic) to MTBF "
        "5 s per worker, seed 0 (parameter_server with ps_shrink), but one lead is not beyond the run-to-run spread: "
        "not a measured change of the ranking.")


def test_the_same_first_at_every_rate_says_where_its_lead_is_beyond_the_spread(tmp_path):
    rows = [r for r in _rates() if r["run_id"][0] in "ab"]  # the mild rate, and the same at a third rate
    rows += [{**r, "run_id": r["run_id"] + "x", "failure_setting": "MTBF 30 s per worker, seed 0",
              "failure_mtbf_s": 30.0, "time_to_step_s": r["time_to_step_s"] + (1.0 if r["run_id"] == "a1" else 0)}
             for r in rows]
    lines = [v for v in faults_measured.section(_results(tmp_path, rows))["verdicts"] if "last step" in v]
    assert lines[-1] == ("Time to the last step: ring with elastic is first under every failure setting of the sweep "
                         "(beyond the repeats' spread at 1 of 2).")  # at 30 s its 6.0-7.4 overlaps 7.0-7.2


def test_the_model_prices_each_run_with_the_sweeps_own_costs(tmp_path):
    """A cell's failure-free run gives the seconds per step (10 s to step 10: 1 s), its failed runs the detection
    and recovery (weighted by their failures: (0.2 x 1 + 0.6 x 3) / 4 = 0.5 s and (1.0 + 3 x 2.0) / 4 = 1.75 s)."""
    rate = "MTBF 40 s per worker, seed 0"
    rows = [_fault("c-clean", "ring", "checkpoint_restart", 10.0, rate, mtbf=40.0, failed=0, every=5),
            _fault("c-one", "ring", "checkpoint_restart", 14.0, rate, mtbf=40.0, failed=1, detection=0.2,
                   recovery=1.0, every=5),
            _fault("c-three", "ring", "checkpoint_restart", 19.0, rate, mtbf=40.0, failed=3, detection=0.6,
                   recovery=2.0, every=5),
            _fault("e-clean", "ring", "elastic", 8.0, rate, mtbf=40.0, failed=0, rejoin=2),
            _fault("e-one", "ring", "elastic", 9.0, rate, mtbf=40.0, failed=1, detection=0.1, recovery=0.3,
                   rejoin=2),
            _fault("e-never", "ring", "elastic", 9.0, rate, mtbf=40.0, failed=1, rejoin=-1)]
    frame = faults_measured.section(_results(tmp_path, rows))["table"].frame.set_index("mode", append=True)
    ckpt = frame.xs("checkpoint_restart", level="mode")
    # Daly by hand: job MTBF M = 40 / 4 = 10 s, restart R = 0.5 + 1.75, interval 5 steps = 5 s, no checkpoint cost,
    # failure-free Ts = 10 s: T = M e^(R/M) (e^(tau/M) - 1) Ts / tau
    daly = 10 * math.exp(2.25 / 10) * (math.exp(5 / 10) - 1) * 10 / 5
    assert list(ckpt["model s to last step"]) == pytest.approx([daly] * 3)
    assert list(ckpt["measured / model"]) == pytest.approx([10 / daly, 14 / daly, 19 / daly])
    elastic = frame.xs("elastic", level="mode")
    step_s = 8.0 / 10  # the elastic cell's own failure-free run
    priced = expected_time("elastic", 10, 4, 40.0, FaultCosts(step_s=step_s, step_s_shrunk=step_s, detect_s=0.1,
                                                              reform_s=0.3, rejoin_s=0.1 + 0.3 + 2 * step_s))
    assert elastic["model s to last step"].iloc[0] == pytest.approx(priced.seconds)
    assert elastic["model failed"].iloc[0] == pytest.approx(priced.failures)
    assert math.isnan(elastic["model s to last step"].iloc[-1])  # never replaced: another cell, no price


def test_absent_without_failures_and_the_model_prices_failure_free_runs_only(tmp_path):
    plain = [_run("ring", "ring", 0.5), _run("hd", "halving_doubling", 0.6)]
    assert isinstance(faults_measured.section(_results(tmp_path, plain)), Absent)
    with_faults = plain + [_fault("slow", "parameter_server", "ps_shrink", 9.0)]
    frame = faults.section(_results(tmp_path, with_faults))["table"].frame
    assert "parameter_server" not in set(frame["strategy"])


def test_a_change_between_two_clear_firsts_is_measured_across_an_unclear_rate_between_them(tmp_path):
    """ring first beyond the spread at 60 s, on the mean only at 30 s, the server first beyond it at 5 s."""
    rows = _rates()
    rows += [{**r, "run_id": r["run_id"] + "x", "failure_setting": "MTBF 30 s per worker, seed 0",
              "failure_mtbf_s": 30.0, "time_to_step_s": r["time_to_step_s"] + (1.0 if r["run_id"] == "a1" else 0)}
             for r in rows if r["run_id"][0] in "ab"]
    lines = [v for v in faults_measured.section(_results(tmp_path, rows))["verdicts"] if "last step" in v]
    assert lines[-2:] == [
        "The ranking changes with the failures (time to the last step), measured: from MTBF 60 s per worker, seed 0 "
        "(ring with elastic first) to MTBF 5 s per worker, seed 0 (parameter_server with ps_shrink first), each first "
        "clear of the rest (beyond the repeats' spread, or the only one to reach it in every run).",
        "The first to the last step on the mean changes from MTBF 30 s per worker, seed 0 (ring with elastic) to MTBF "
        "5 s per worker, seed 0 (parameter_server with ps_shrink), but one lead is not beyond the run-to-run spread: "
        "not a measured change of the ranking."]
