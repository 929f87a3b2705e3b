"""Per-step distributions (reports/distributions.py) on scripted steps: nearest-rank percentiles exact on a list
worked by hand, the step time as the slowest worker's, and a planted spike and straggler flagged by name."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.results import schema
from reports import distributions as dist


def test_nearest_rank_percentiles_of_a_scripted_list_are_exact():
    times = [0.5 + i / 100 for i in range(100)]  # 0.50, 0.51, ..., 1.49, shuffled below
    shuffled = times[::7] + [t for i, t in enumerate(times) if i % 7]
    assert dist.percentile(shuffled, 50) == times[49]  # the 50th of 100: 0.99
    assert dist.percentile(shuffled, 99) == times[98]  # the 99th: 1.48
    assert dist.percentile(shuffled, 100) == times[-1]
    assert dist.percentile([3.0, 1.0, 2.0], 50) == 2.0  # ceil(1.5) = 2nd of 3
    assert dist.percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0  # ceil(2) = 2nd of 4, not the mean 2.5
    assert dist.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="percentile of 0 times"):
        dist.percentile([], 50)
    with pytest.raises(ValueError, match="bad percentile 0"):
        dist.percentile([1.0], 0)


def _steps(compute, comm, timed_from=2, run_id="r1"):
    """steps rows from compute[step][rank] and comm[step][rank] (workers only), plus a server row that the step
    time must ignore."""
    rows = []
    for step, (cs, ms) in enumerate(zip(compute, comm)):
        for rank, (c, m) in enumerate(zip(cs, ms)):
            rows.append(schema.row(schema.STEPS, run_id=run_id, step=step, rank=rank, role="worker",
                                   timed=step >= timed_from, compute_s=c, comm_s=m, bytes_sent=0, bytes_recv=0,
                                   samples=8, wall_s=0.0))
        rows.append(schema.row(schema.STEPS, run_id=run_id, step=step, rank=len(cs), role="server",
                               timed=step >= timed_from, compute_s=50.0, comm_s=50.0, bytes_sent=0, bytes_recv=0,
                               samples=0, wall_s=0.0))
    return pd.DataFrame(rows)


def test_step_time_is_the_slowest_workers_and_a_planted_spike_and_straggler_are_flagged():
    # 3 workers, 2 warm-up steps of 0.5 s, then 20 timed steps. Rank 2 computes 0.15 s where the others take 0.1
    # (a straggler, 1.5x the median rank); comm makes every rank's step 0.2 s; step 12 spikes to 0.9 s on rank 0.
    compute, comm = [], []
    for step in range(22):
        c = [0.1, 0.1, 0.15]
        m = [0.1, 0.1, 0.05]
        if step < 2:
            m = [0.4, 0.4, 0.35]
        if step == 12:
            m = [0.8, 0.1, 0.05]
        compute.append(c)
        comm.append(m)
    numbers = dist.run_distribution(_steps(compute, comm))
    assert numbers["steps"] == 20
    assert numbers["p50 s"] == pytest.approx(0.2) and numbers["max s"] == pytest.approx(0.9)
    assert numbers["p99 s"] == pytest.approx(0.9)  # nearest rank: the 20th of 20
    assert numbers["mean s"] == pytest.approx((19 * 0.2 + 0.9) / 20)
    assert numbers["p99/p50"] == pytest.approx(4.5)
    assert numbers["warm-up / p50"] == pytest.approx(2.5)
    assert numbers["spikes"] == "12"
    assert numbers["slowest rank"] == "rank 2" and numbers["slowest / median rank"] == pytest.approx(1.5)
    mean = (0.1 + 0.1 + 0.15) / 3
    cv = ((2 * (0.1 - mean) ** 2 + (0.15 - mean) ** 2) / 3) ** 0.5 / mean
    assert numbers["rank compute CV"] == pytest.approx(cv)
    frame = pd.DataFrame([{"run": "r1", "strategy": "ring", "workers": 3, "link": "1Gbit"} | numbers])
    said = dist.flags(frame)
    assert len(said) == 3
    assert said[0].startswith("ring, 3 workers, 1Gbit (r1): p99 0.9 s is 4.50x the p50 0.2 s")
    assert said[1] == "ring, 3 workers, 1Gbit (r1): step(s) 12 took over 2x the p50"
    assert said[2].startswith("ring, 3 workers, 1Gbit (r1): rank 2 computes 1.50x the median rank")


def test_an_even_run_is_not_flagged():
    compute = [[0.1, 0.1]] * 10
    comm = [[0.05, 0.05]] * 10
    numbers = dist.run_distribution(_steps(compute, comm))
    assert numbers["p99/p50"] == 1.0 and numbers["spikes"] == "" and numbers["rank compute CV"] == 0.0
    frame = pd.DataFrame([{"run": "r1", "strategy": "ring", "workers": 2, "link": "1Gbit"} | numbers])
    assert dist.flags(frame) == []


def test_the_report_section_on_the_fixture_and_without_steps(tmp_path):
    from reports import load
    from reports.sections import Absent, Results
    from tests.reports.conftest import make_results

    make_results(tmp_path)
    runs = load.load_runs(tmp_path)
    ok = runs[runs["ok"]]
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    body = dist.section(Results(runs=runs, ok=ok, steps=steps, sweep_text=None, links=load.link_order(runs)))
    frame = body["table"].frame
    assert len(frame) == len(ok) and body["flags"] == []  # the fixture's steps are even
    row = frame.set_index("run").loc["ring-4-1Gbit"]
    assert row["p50 s"] == pytest.approx(ok.set_index("run_id").loc["ring-4-1Gbit", "step_time_s"])
    assert isinstance(dist.section(Results(runs=runs, ok=ok, steps=None, sweep_text=None, links=[])), Absent)


def test_steps_without_a_measured_time_are_left_out_not_an_error():
    """A results file whose steps carry no times (NaN) must not stop the report: the run has no distribution."""
    nan = float("nan")
    assert dist.run_distribution(_steps([[nan, nan]] * 4, [[nan, nan]] * 4)) is None
    mixed = dist.run_distribution(_steps([[0.1, 0.1]] * 3 + [[nan, nan]], [[0.05, 0.05]] * 4))
    assert mixed["steps"] == 1 and mixed["p50 s"] == pytest.approx(0.15)
