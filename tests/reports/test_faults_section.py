"""The "Failures" section on hand-made results: measured steps priced by the failure model, the ranking's change."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest

from experiments.results import schema
from reports import faults, load
from reports.page import ENV
from reports.sections import SECTIONS, Absent, Results
from strategies.fault_cost import daly_interval


def _run(run_id, strategy, step_s, workers=4, fast_step_s=math.nan, **params):
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="faults", substrate="threads", workload="resnet18", image_size=32,
        batch_size=16, steps=4, warmup_steps=1, device="cpu", seed=0, lr=0.1, strategy=strategy,
        **{f"param_{key}": v for key, v in params.items()}, workers=workers,
        servers=1 if strategy == "parameter_server" else 0, bytes_counted=True, link_bandwidth=125e6,
        link_latency_s=0.0, link_emulation="python", ranks_per_node=1, straggler_slowdown=1.0, compute="profile",
        status="ok", throughput=64 / step_s, step_time_s=step_s, fast_step_s=fast_step_s, compute_s=0.2,
        comm_s=step_s - 0.2, comm_fraction=0.5, exposed_comm_s=step_s - 0.2, numel=1000, model_bytes=4000,
        final_loss=1.0, param_norm=1.0, transport="threads", cores=2, gpu="", host="h",
        started_at="2026-01-01T00:00:00", duration_s=1.0)


def _results(tmp_path, rows) -> Results:
    pq.write_table(schema.to_arrow(rows, schema.RUNS), tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return Results(runs=runs, ok=runs[runs["ok"]], steps=None, sweep_text=None, links=load.link_order(runs))


def test_each_mode_priced_by_hand_and_the_ranking_changes(tmp_path):
    rows = [_run("ring", "ring", 0.5), _run("ring3", "ring", 0.4, workers=3),
            _run("ps", "parameter_server", 0.9, fast_step_s=0.6, staleness="async")]
    body = faults.section(_results(tmp_path, rows))
    frame = body["table"].frame.set_index(["strategy", "mode"])
    assert sorted(frame.index) == sorted([("ring", "checkpoint_restart"), ("ring", "elastic"),
                                          ("parameter_server (staleness=async)", "checkpoint_restart"),
                                          ("parameter_server (staleness=async)", "ps_shrink")])
    mtbf = 10 * 3600.0  # the harshest column: each of 4 workers every 10 h, the job every M = 9,000 s
    harsh = faults._column(10.0)
    # ring, elastic: 3 survivors take 0.4 s a step with 3/4 of the samples: 0.5333 s for a step's worth. No
    # progress for w = 10 detect + 5 re-form = 15 s; the slot missing r = 120 + 0.5333 / 2 s (the replacement joins
    # at a step boundary) at pace 0.5 / 0.5333; half a step lost in flight:
    # T = 5,000 / (e^(-lambda r) + (e^(-lambda w) - e^(-lambda r)) 0.9375 - lambda e^(-lambda w) 0.25)
    w, r = 15, 120 + 0.4 * 4 / 3 / 2
    rate = 4 / (mtbf + r)  # a slot awaiting its replacement cannot fail
    progress = math.exp(-rate * r) + (math.exp(-rate * w) - math.exp(-rate * r)) * 0.9375 \
        - rate * math.exp(-rate * w) * 0.25
    assert frame.loc[("ring", "elastic"), harsh] == pytest.approx(5000 / progress / 3600)
    rate = 4 / (mtbf + 120)
    assert bool(frame.loc[("ring", "elastic"), "n-1 measured"])
    # ring, checkpoint_restart: Daly's interval in whole steps, R = 10 + 120, delta = 10
    every = round(daly_interval(10, 9000) / 0.5)
    want = 9000 * math.exp(130 / 9000) * math.expm1((every * 0.5 + 10) / 9000) * 5000 / (every * 0.5)
    assert frame.loc[("ring", "checkpoint_restart"), harsh] == pytest.approx(want / 3600)
    # barrier-free PS at its fastest worker's pace 0.6 s: c = (120 + 0.3) / 4
    ps = ("parameter_server (staleness=async)", "ps_shrink")
    assert frame.loc[ps, "s/step"] == 0.6 and not frame.loc[ps, "n-1 measured"]
    assert frame.loc[ps, harsh] == pytest.approx(6000 / (1 - rate * 120.3 / 4) / 3600)
    [verdict] = body["verdicts"]
    assert verdict.startswith("resnet18, 4 workers, ")
    assert "ring with elastic is fastest to step 10,000 at every MTBF shown" in verdict


def test_a_ranking_that_changes_is_said_with_its_mtbf(tmp_path):
    # a decentralized run can only restart from checkpoints; a barrier-free PS 5% slower loses little per failure
    rows = [_run("d", "decentralized", 0.5), _run("ps", "parameter_server", 0.6, fast_step_s=0.525,
                                                   staleness="async")]
    body = faults.section(_results(tmp_path, rows))
    [verdict] = body["verdicts"]
    assert ("decentralized with checkpoint_restart is fastest to step 10,000 when failures are rare; "
            "parameter_server (staleness=async) with ps_shrink overtakes it below an MTBF of about") in verdict


def test_absent_without_two_strategies_and_rendered_with_them(tmp_path):
    assert isinstance(faults.section(_results(tmp_path, [_run("ring", "ring", 0.5)])), Absent)
    body = faults.section(_results(tmp_path, [_run("ring", "ring", 0.5), _run("hd", "halving_doubling", 0.6)]))
    html = ENV.get_template("sections/faults.html.j2").render(**body)
    assert "MODEL, not a measurement" in html and 'id="faults"' in html and "detection 10.0" in html
    assert "faults" in [section.id for section in SECTIONS]


def test_time_to_target_under_failures_beside_time_to_step(tmp_path):
    # ring reached its target in 2,000 steps (two runs: 1,800 and 2,200), halving-doubling has no target: ring's
    # hours to target are 2,000 x its expected seconds per step to step 10,000, at every MTBF
    ring = [_run(f"ring{i}", "ring", 0.5) | {"target_metric": "accuracy", "target_value": 0.5, "target_reached": True,
                                            "steps_to_target": float(steps)} for i, steps in enumerate((1800, 2200))]
    body = faults.section(_results(tmp_path, ring + [_run("hd", "halving_doubling", 0.6)]))
    frame = body["table"].frame.set_index(["strategy", "mode"])
    for hours in faults.MTBF_HOURS:
        for mode in ("checkpoint_restart", "elastic"):
            assert frame.loc[("ring", mode), faults._target_column(hours)] == pytest.approx(
                2000 * frame.loc[("ring", mode), faults._column(hours)] / 10_000)
    assert frame.loc[("ring", "elastic"), "steps to target"] == 2000
    assert math.isnan(frame.loc[("halving_doubling", "elastic"), "steps to target"])
    html = ENV.get_template("sections/faults.html.j2").render(**body)
    assert "h to target, MTBF 10 h" in html
