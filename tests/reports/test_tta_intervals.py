"""Time to target carries the uncertainty of both its factors (steps to target x seconds per step): never
"± 0.000 s" when seconds per step vary. Every expected value is worked out in its comment."""

from __future__ import annotations

import math

import pytest

from reports import tta
from tests.reports.test_time_to_target import _ok, _run, _twin


def test_the_spread_of_a_product_of_independent_factors():
    """N = 10 ± 2 steps, S = 3 ± 0.5 s: sqrt(3^2 x 2^2 + 10^2 x 0.5^2 + 2^2 x 0.5^2) = sqrt(36 + 25 + 1)
    = sqrt(62) = 7.874; a factor without a spread counts as exact; neither: no spread (NaN)."""
    assert tta.product_sd(10, 2, 3, 0.5) == pytest.approx(math.sqrt(62))
    assert tta.product_sd(10, math.nan, 3, 0.5) == pytest.approx(5.0)  # 10 x 0.5
    assert tta.product_sd(10, 2, 3, math.nan) == pytest.approx(6.0)  # 3 x 2
    assert math.isnan(tta.product_sd(10, math.nan, 3, math.nan))


def test_steps_that_agree_over_seeds_do_not_hide_seconds_per_step_that_vary(tmp_path):
    """Three seeds all reach the target at step 50 (evaluated every 10 steps: sd 0); their profile twins step in
    88, 100 and 112 ms (mean 100, sd 12: ±12%). Time to target = 50 x 0.100 = 5.000 s, sd = 50 x 0.012 = 0.600 s,
    not 0.000."""
    ok = _ok(tmp_path, [_run(f"r{s}", s, 50, 0.010) for s in range(3)]
             + [_twin(f"t{s}", s, step_s) for s, step_s in enumerate((0.088, 0.100, 0.112))])
    row = tta.tta_frame(ok).iloc[0]
    assert row["steps to target"] == "50.0 ± 0.0"
    assert row["ms per step"] == "100.00 ± 12.00"
    assert row["time to target s"] == "5.000 ± 0.600"


def test_a_factor_measured_once_is_said_and_both_once_is_one_run(tmp_path):
    """One real run reaches the target at 50 steps; its twins step in 88/100/112 ms: 5.000 ± 0.600 s, from the
    seconds per step alone, and the cell says the steps had one run. The same runs without twins: 50 x 10 ms =
    0.500 s, one run of each factor, no spread at all."""
    ok = _ok(tmp_path, [_run("r", 0, 50, 0.010)]
             + [_twin(f"t{s}", s, step_s) for s, step_s in enumerate((0.088, 0.100, 0.112))])
    assert tta.tta_frame(ok).iloc[0]["time to target s"] == "5.000 ± 0.600 (steps to target: 1 run, no spread)"
    ok = _ok(tmp_path, [_run("r", 0, 50, 0.010)])
    assert tta.tta_frame(ok).iloc[0]["time to target s"] == "0.500 (1 run)"


def test_a_close_second_is_within_the_spread_of_both_factors(tmp_path):
    """ring: 3 seeds at 50 steps, twins 88/100/112 ms: 5.000 ± 0.600 s. fp16: 3 seeds at 60 steps, its own real
    runs at 90 ms each: 5.400 ± 0.000 s. With the steps' spread alone ring would be 5.000 ± 0.000 and fp16's 5.4
    a clear loss; with both factors 5.0 + 0.6 >= 5.4: not a clear win."""
    ok = _ok(tmp_path, [_run(f"r{s}", s, 50, 0.010) for s in range(3)]
             + [_twin(f"t{s}", s, step_s) for s, step_s in enumerate((0.088, 0.100, 0.112))]
             + [_run(f"f{s}", s, 60, 0.090, compression="fp16") for s in range(3)])
    df = tta.tta_frame(ok)
    assert list(df["configuration"]) == ["ring", "ring + fp16"]
    assert df.iloc[1]["time to target s"] == "5.400 ± 0.000"
    (verdict,) = tta.tta_verdicts(df)
    assert "ring + fp16 (5.400 ± 0.000 s) is within the spread: not a clear win." in verdict, verdict
