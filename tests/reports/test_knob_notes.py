"""The report says so beside the verdict when a run's explicit size knob is more than 10% slower in the model than
the knob's best value for that run (the knob_* columns the sweep records: strategies/knobs.py); a value the model
chose, or one within 10% of the best, says nothing."""

from __future__ import annotations

import math

import pandas as pd

from experiments.results import schema
from reports import load, verdicts

GBIT = 125e6


def _run(run_id: str, strategy: str, throughput: float, **extra) -> dict:
    """A simulated 4-worker run of 32 samples per worker on 1 Gbit/s (one run is the answer: deterministic)."""
    step_s = 4 * 32 / throughput
    values = dict(
        run_id=run_id, sweep="knobs", substrate="simgrid", workload="resnet18", image_size=32, batch_size=32,
        steps=10, warmup_steps=2, device="cpu", seed=0, lr=0.1, strategy=strategy, workers=4, servers=0,
        bytes_counted=True, link_bandwidth=GBIT, link_latency_s=0.0, link_emulation="", straggler_slowdown=1.0,
        compute="fixed", status="ok", throughput=throughput, step_time_s=step_s, compute_s=step_s / 2,
        comm_s=step_s / 2, comm_fraction=0.5, exposed_comm_s=step_s / 2, bytes_sent_per_worker=1e6,
        bytes_recv_per_worker=1e6, analytic_bytes_sent_per_worker=1e6, analytic_rounds=6.0,
        analytic_path_bytes=1.5e6, numel=250_000, model_bytes=1_000_000, final_loss=math.nan, param_norm=math.nan,
        transport="simgrid", cores=0, gpu="", host="simhost", started_at="2026-01-01T00:00:00", duration_s=1.0,
        sim_topology="star", sim_network_model="alpha_beta", sim_nic="shared", compute_source="fixed")
    return schema.row(schema.RUNS, **(values | extra))


def _ps(run_id: str, throughput: float, partition: float, chosen: bool, best: float, slowdown: float) -> dict:
    return _run(run_id, "parameter_server", throughput, servers=4, param_servers=4, param_placement="dedicated",
                param_mode="update", param_partition_mb=partition, param_staleness=0, param_backups=0,
                knob="partition_mb", knob_chosen=chosen, knob_best=best, knob_slowdown=slowdown)


def _ok(tmp_path, rows) -> pd.DataFrame:
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return runs[runs["ok"]]


def test_an_explicit_setting_over_10_percent_slower_than_the_best_is_noted_beside_the_verdict(tmp_path):
    # partition_mb = 16 set in the sweep, 1.25x the model's time at its best, 1 MiB
    ok = _ok(tmp_path, [_run("r", "ring", 100.0), _ps("p", 150.0, 16.0, False, 1.0, 1.25)])
    [note] = verdicts.knob_notes(ok)
    label = ok.loc[ok["strategy"] == "parameter_server", "config_label"].iloc[0]
    assert note == (f"{label}: its partition_mb = 16 (set in the sweep) is 1.25x the model's time at "
                    f"partition_mb = 1, the best for this run (more than 10% slower; leave partition_mb unset to "
                    f"take the model's best).")
    [sentence] = verdicts.verdicts(verdicts.best_strategies(ok, load.link_order(ok)))
    assert sentence.startswith("resnet18 on ") and ": use " in sentence and sentence.endswith(" " + note)


def test_a_chosen_value_or_one_within_10_percent_says_nothing(tmp_path):
    for chosen, slowdown in ((True, 1.0), (False, 1.10), (False, 1.05)):
        ok = _ok(tmp_path, [_run("r", "ring", 100.0), _ps("p", 150.0, 4.0, chosen, 1.0 if not chosen else 4.0,
                                                           slowdown)])
        assert verdicts.knob_notes(ok) == [], (chosen, slowdown)
        [sentence] = verdicts.verdicts(verdicts.best_strategies(ok, load.link_order(ok)))
        assert "partition_mb" not in sentence


def test_runs_without_the_knob_columns_say_nothing():
    frame = pd.DataFrame({"config_label": ["ring"], "strategy": ["ring"]})
    assert verdicts.knob_notes(frame) == []
