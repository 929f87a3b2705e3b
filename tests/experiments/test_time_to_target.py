"""Time to target: a sweep's target is checked when it is read, evaluated on held-out data outside the timed
step, and the summary records the first step that meets it and steps x seconds per step (or that it never did)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from experiments.config.sweep import RunSpec, SweepError, parse
from experiments.pipeline.rows import step_row
from experiments.pipeline.summary import summarize
from experiments.pipeline.train import train
from strategies.transport.threads import run_threads

META = {"started_at": "2026-01-01T00:00:00", "duration_s": 1.0, "transport": "threads", "gpu": "", "cores": 8,
        "host": "h"}


def _scripted(spec: RunSpec, curve: dict[int, float], step_s: float = 0.5) -> list[dict]:
    """One worker's results: every step takes step_s (0.2 compute + 0.3 comm), evaluations from `curve`."""
    counters = SimpleNamespace(bytes_sent=0, bytes_recv=0)
    rows = []
    for step in range(spec.steps):
        row = step_row(spec, step, 0, "worker", 0.2, step_s - 0.2, counters, step_s * (step + 1), loss=1.0,
                       samples=spec.batch_size)
        row["eval_value"] = curve.get(step, math.nan)
        rows.append(row)
    final = {"loss": 1.0, "param_norm": 1.0, "numel": 10, "bucket_numels": [10], "trained": True,
             "consensus_distance": math.nan}
    return [{"steps": rows, "final": final}]


@pytest.mark.parametrize("metric, curve, reached", [
    ("accuracy", {2: 0.5, 5: 0.8, 8: 0.93, 11: 0.97}, 9),   # 0.93 >= 0.9 after the 9th step
    ("loss", {2: 1.5, 5: 0.4, 8: 0.2, 11: 0.1}, 6),          # 0.4 <= 0.5 after the 6th step
])
def test_first_evaluation_meeting_the_target_gives_steps_and_time(metric, curve, reached):
    value = 0.9 if metric == "accuracy" else 0.5
    spec = RunSpec(workload="tiny", dataset="digits", steps=12, warmup_steps=2, workers=1,
                   target={"metric": metric, "value": value}, eval_every=3)
    row, _ = summarize(spec, _scripted(spec, curve), "", META)
    assert row["status"] == "ok", row["error"]
    assert (row["target_metric"], row["target_value"], row["eval_every"]) == (metric, value, 3)
    assert row["target_reached"] and row["steps_to_target"] == reached
    assert row["step_time_s"] == pytest.approx(0.5)
    assert row["time_to_target_s"] == pytest.approx(reached * 0.5)


def test_a_run_that_never_reaches_its_target_says_so():
    spec = RunSpec(workload="tiny", dataset="digits", steps=6, warmup_steps=1, workers=1,
                   target={"metric": "accuracy", "value": 0.99}, eval_every=3)
    row, _ = summarize(spec, _scripted(spec, {2: 0.5, 5: 0.98}), "", META)
    assert row["status"] == "ok" and row["target_reached"] is False
    assert math.isnan(row["steps_to_target"]) and math.isnan(row["time_to_target_s"])
    no_target, _ = summarize(RunSpec(workload="tiny", steps=6, warmup_steps=1), _scripted(spec, {}), "", META)
    assert no_target["target_metric"] == "" and not no_target["target_reached"]


def test_training_evaluates_every_k_steps_and_after_the_last():
    spec = RunSpec(workload="tiny", dataset="digits", image_size=8, batch_size=8, steps=7, warmup_steps=1, lr=0.1,
                   workers=2, p2p="threads", timeout=60.0, target={"metric": "accuracy", "value": 0.05},
                   eval_every=3)

    def rank(comm):
        ctx = SimpleNamespace(rank=comm.rank, world_size=comm.world_size, comm=comm, device="cpu", state={})
        return train(ctx, spec)

    torch.set_num_threads(1)
    results = run_threads(2, rank, timeout=60)
    for result in results:
        evaluated = [r["step"] for r in result["steps"] if not math.isnan(r["eval_value"])]
        assert evaluated == [2, 5, 6]
        assert all(0 <= r["eval_value"] <= 1 for r in result["steps"] if r["step"] in evaluated)
    row, _ = summarize(spec, results, "", META)
    assert row["status"] == "ok" and row["target_reached"] and row["steps_to_target"] in (3, 6, 7)


@pytest.mark.parametrize("defaults, match", [
    ({"target": {"metric": "f1", "value": 0.9}}, r"target = .*metrics: accuracy, loss"),
    ({"target": {"metric": "accuracy", "value": 1.5}}, r"target.value = 1.5: accepted for accuracy are numbers > 0"),
    ({"target": {"metric": "loss", "value": 0.3}, "dataset": "synthetic"}, r"dataset = 'synthetic'.*held-out"),
    ({"target": {"metric": "loss", "value": 0.3}, "compute": "profile"}, r"compute = 'profile'.*does not train"),
    ({"target": {"metric": "loss", "value": 0.3}, "eval_every": 0}, r"eval_every = 0: accepted are"),
])
def test_bad_targets_are_refused_when_the_sweep_is_read(defaults, match):
    with pytest.raises(SweepError, match=match):
        parse({"defaults": {"workload": "tiny", "dataset": "digits", "steps": 5, **defaults}})


def test_a_target_is_part_of_the_run_and_its_absence_keeps_old_ids():
    sweep = parse({"defaults": {"workload": "tiny", "dataset": "digits", "steps": 5,
                                "target": {"metric": "accuracy", "value": 0.9}}})
    assert sweep.runs[0].target == {"metric": "accuracy", "value": 0.9}
    assert RunSpec(eval_every=10, target=None).run_id == RunSpec().run_id


def test_a_replayed_run_reports_no_held_out_accuracy_and_a_trained_one_does():
    """A profile-mode step applies one fixed gradient: its model's accuracy is no result (NaN), so tables and the
    report do not print it beside the runs that trained."""
    from pathlib import Path

    profile = Path(__file__).resolve().parents[2] / "workloads" / "profiles" / "tiny-b32-s16-synthetic.json"
    torch.set_num_threads(1)
    accuracy = {}
    for compute in ("real", "profile"):
        spec = RunSpec(workload="tiny", dataset="digits", image_size=16, batch_size=32, steps=2, warmup_steps=0,
                       workers=1, p2p="threads", timeout=60.0, compute=compute,
                       profile=str(profile) if compute == "profile" else None)
        results = run_threads(1, lambda comm, spec=spec: train(
            SimpleNamespace(rank=0, world_size=1, comm=comm, device="cpu", state={}), spec), timeout=60)
        accuracy[compute] = summarize(spec, results, "", META)[0]["accuracy"]
    assert 0 <= accuracy["real"] <= 1 and math.isnan(accuracy["profile"]), accuracy
