"""The report's time-to-target section on small schema-typed results: each factor's mean and spread over seeds,
the product per run, a configuration that misses the target in one run, and the ranking beside throughput's.
Seeds end with different parameter norms: they are still one configuration (param_norm is a measurement)."""

from __future__ import annotations

import math

import pandas as pd

from experiments.results import schema
from reports import load, sections, tta


def _run(run_id, seed, steps_to, step_s, *, compression="none", sync_every=1, reached=True, sent=88_000.0,
         analytic=None):
    return schema.row(
        schema.RUNS, run_id=run_id, sweep="tta", substrate="ray", workload="tiny", dataset="digits", image_size=16,
        batch_size=32, steps=100, warmup_steps=2, device="cpu", seed=seed, lr=0.1, strategy="ring", workers=2,
        servers=0, bytes_counted=True, link_bandwidth=12.5e6, link_latency_s=0.0, link_emulation="python",
        straggler_slowdown=1.0, compute="real", status="ok", throughput=64 / step_s, step_time_s=step_s,
        compute_s=step_s / 2, comm_s=step_s / 2, bytes_sent_per_worker=sent,
        analytic_bytes_sent_per_worker=sent if analytic is None else analytic, numel=22_000, model_bytes=88_000,
        final_loss=1.0, param_norm=1.0 + seed, transport="threads", cores=2, gpu="", host="h",
        started_at="2026-01-01T00:00:00", duration_s=1.0, compression=compression, sync_every=sync_every,
        target_metric="accuracy", target_value=0.9, eval_every=10, target_reached=reached,
        steps_to_target=float(steps_to) if reached else math.nan,
        time_to_target_s=steps_to * step_s if reached else math.nan)


def _ok(tmp_path, rows):
    schema.conform(pd.DataFrame(rows), schema.RUNS).to_parquet(tmp_path / "runs.parquet")
    runs = load.load_runs(tmp_path)
    return runs[runs["ok"]]


def test_time_to_target_is_steps_times_seconds_per_step_with_spreads(tmp_path):
    ok = _ok(tmp_path, [
        # exact ring: 60 and 80 steps at 10 ms -> 0.6 s and 0.8 s: mean 0.7, sd 0.1414
        _run("a", 0, 60, 0.010), _run("b", 1, 80, 0.010),
        # fp16: 70 steps at 6 ms and 70 at 8 ms -> 0.42 s and 0.56 s: mean 0.49; ms per step 7 ± 1.414
        _run("c", 0, 70, 0.006, compression="fp16", sent=44_000.0),
        _run("d", 1, 70, 0.008, compression="fp16", sent=44_000.0),
        # local SGD H=4: fastest per step (2 ms) but one seed never reaches the target
        # (its second run sent 22,000 bytes per step where its analytic traffic says 18,000)
        _run("e", 0, 100, 0.002, sync_every=4, sent=22_000.0),
        _run("f", 1, 0, 0.002, sync_every=4, reached=False, sent=22_000.0, analytic=18_000.0),
    ])
    df = tta.tta_frame(ok)
    by = df.set_index("configuration")
    assert list(df["configuration"]) == ["ring + fp16", "ring", "ring + local SGD H=4"]
    assert by.loc["ring", "time to target s"] == "0.700 ± 0.141"
    assert by.loc["ring", "steps to target"] == "70.0 ± 14.1"
    assert by.loc["ring + fp16", "time to target s"] == "0.490 ± 0.099"
    assert by.loc["ring + fp16", "ms per step"] == "7.00 ± 1.41"
    assert (by.loc["ring + local SGD H=4", "runs"], by.loc["ring + local SGD H=4", "reached"]) == (2, 1)
    assert list(df["rank by time to target"]) == [1, 2, -1]
    # beside exact ring: 0.49 / 0.7 s; fp16's bytes half of ring's, measured and analytic
    assert list(df["x ring time"]) == ["0.70", "1.00", "-"]  # local SGD H=4 missed the target in one run
    assert by.loc["ring + fp16", "bytes/step x ring"] == by.loc["ring + fp16", "analytic x ring"] == "0.5000"
    assert list(df["bytes measured / analytic"]) == ["1.0000", "1.0000", "1.1000"]  # 22,000 / mean(22,000, 18,000)
    assert list(df["rank by throughput"]) == [2, 3, 1]
    (verdict,) = tta.tta_verdicts(df)
    assert "ring + fp16 reaches the target first: 0.490 ± 0.099 s = 70.0 ± 0.0 steps x 7.00 ± 1.41 ms" in verdict
    assert "ring (0.700 ± 0.141 s) is within the spread: not a clear win." in verdict  # 0.49 + 0.099 > 0.7 - 0.141
    assert "Throughput alone would pick ring + local SGD H=4" in verdict
    assert "Not reached in every run: ring + local SGD H=4." in verdict


def test_no_target_is_an_absent_section(tmp_path):
    row = _run("a", 0, 60, 0.010)
    row.update(target_metric="", target_reached=False)
    ok = _ok(tmp_path, [row])
    result = sections.time_to_target(sections.Results(ok, ok, None, None, []))
    assert isinstance(result, sections.Absent) and "no run names a target" in result.reason


def test_the_section_renders_its_verdict_and_table(tmp_path):
    from reports.page import ENV

    ok = _ok(tmp_path, [_run("a", 0, 60, 0.010), _run("b", 1, 80, 0.010),
                        _run("c", 0, 70, 0.006, compression="fp16"), _run("d", 1, 70, 0.008, compression="fp16")])
    body = sections.time_to_target(sections.Results(ok, ok, None, None, []))
    html = ENV.get_template("sections/time-to-target.html.j2").render(**body)
    assert "ring + fp16 reaches the target first: 0.490 ± 0.099 s" in html
    assert "<th>steps to target</th>" in html and "<td>0.700 ± 0.141</td>" in html


def _twin(run_id, seed, step_s, **kw):
    """A profile-mode twin: the same configuration with compute = "profile" and no target (it does not train)."""
    row = _run(run_id, seed, 0, step_s, **kw)
    row.update(compute="profile", target_metric="", target_value=math.nan, target_reached=False,
               steps_to_target=math.nan, time_to_target_s=math.nan, profile_device="example GPU")
    return row


def test_a_profile_twin_gives_the_seconds_per_step_and_the_table_says_so(tmp_path):
    ok = _ok(tmp_path, [
        # ring: real runs reach the target at 60 and 80 steps (at this machine's 10 ms); its twins step in 30 and
        # 50 ms on the emulated link: time to target = 70 steps (sd 14.142) x 0.040 s (sd 0.014142) = 2.8 s, and
        # its sd carries both factors: sqrt(0.04^2 x 14.142^2 + 70^2 x 0.014142^2 + 14.142^2 x 0.014142^2)
        # = sqrt(0.32 + 0.98 + 0.04) = 1.158 s (the steps' spread alone would say 0.566)
        _run("a", 0, 60, 0.010), _run("b", 1, 80, 0.010), _twin("ta", 0, 0.030), _twin("tb", 1, 0.050),
        # a profile run on another link is nobody's twin
        {**_twin("tx", 0, 0.500), "link_bandwidth": 125e6},
        # fp16 has no twin: both factors from its real runs, 70 x 6 ms and 70 x 8 ms
        _run("c", 0, 70, 0.006, compression="fp16", sent=44_000.0),
        _run("d", 1, 70, 0.008, compression="fp16", sent=44_000.0),
    ])
    by = tta.tta_frame(ok).set_index("configuration")
    assert set(by.index) == {"ring", "ring + fp16"}  # twins are no rows of their own
    assert by.loc["ring", "ms per step"] == "40.00 ± 14.14"
    assert by.loc["ring", "time to target s"] == "2.800 ± 1.158"
    assert by.loc["ring", "seconds per step from"] == "profile twin (2 runs, example GPU)"
    assert by.loc["ring + fp16", "time to target s"] == "0.490 ± 0.099"
    assert by.loc["ring + fp16", "seconds per step from"] == "these real runs"
    (verdict,) = tta.tta_verdicts(tta.tta_frame(ok))
    assert "ring + fp16 reaches the target first" in verdict
    assert "(seconds per step from these real runs)" in verdict
