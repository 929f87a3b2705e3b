"""Stragglers: a rank slowed down by `slowdown` stretches its compute by that factor, and a synchronous step
waits for it (the barrel effect); the shipped straggler sweeps parse."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments.config.sweep import RunSpec, load

SWEEPS = Path(__file__).resolve().parents[2] / "experiments" / "config" / "sweeps"
SLOWDOWN = 3.0


def _spec(slowdown: float) -> RunSpec:
    # compute dominates the step (batch 32 at 32x32, no link emulation): the delay is what is measured
    return RunSpec(sweep="straggler-test", workload="tiny", image_size=32, batch_size=32, steps=12,
                   warmup_steps=2, workers=2, strategy="ring", timeout=30,
                   straggler={"ranks": [1], "slowdown": slowdown})


def _timed_steps(group, spec) -> tuple[dict, pd.DataFrame]:
    from experiments.pipeline.summary import summarize
    from experiments.pipeline.train import train

    results = group.run(train, spec, network=spec.network())
    row, steps = summarize(spec, results, "", {"started_at": "", "duration_s": 0.0, "transport": "gloo",
                                                "gpu": "", "cores": 2, "host": ""})
    steps = pd.DataFrame(steps)
    steps = steps[steps["timed"]].copy()
    steps["total_s"] = steps["compute_s"] + steps["comm_s"]
    return row, steps.pivot(index="step", columns="rank")


@pytest.mark.ray
def test_a_straggler_stretches_its_compute_and_the_synchronous_step_waits_for_it(group2):
    base_row, base = _timed_steps(group2, _spec(1.0))
    slow_row, slow = _timed_steps(group2, _spec(SLOWDOWN))

    fast_compute = slow["compute_s"][0].median()  # rank 0's own compute: the straggler's would-be compute
    straggler_compute = slow["compute_s"][1].median()
    ratio = straggler_compute / fast_compute
    print(f"compute: fast {fast_compute * 1e3:.1f} ms, straggler {straggler_compute * 1e3:.1f} ms (x{ratio:.2f}); "
          f"step: base {base_row['step_time_s'] * 1e3:.1f} ms, straggler {slow_row['step_time_s'] * 1e3:.1f} ms")
    # the delay stretches the straggler's measured compute by the slowdown (rank 0's compute stands in for
    # what rank 1's would have been; the two ranks share 2 cores, so allow for noise around 3)
    assert 2.0 < ratio < 5.0, f"straggler compute x{ratio:.2f} of the fast rank's, expected about x{SLOWDOWN:g}"
    # synchronous: the fast rank's step (compute + waiting in the allreduce) lasts as long as the straggler's
    fast_step = slow["total_s"][0].median()
    assert fast_step > 0.9 * straggler_compute, (fast_step, straggler_compute)
    # the group's step time grows by the straggler's extra compute, (slowdown - 1) x compute
    extra = slow_row["step_time_s"] - base_row["step_time_s"]
    expected = (SLOWDOWN - 1) * fast_compute
    assert 0.5 * expected < extra < 2.0 * expected, f"step grew {extra * 1e3:.1f} ms, expected ~{expected * 1e3:.1f}"
    assert slow_row["step_time_s"] > 2.0 * fast_compute
    # throughput falls accordingly (samples per second of the whole group)
    assert slow_row["throughput"] < 0.8 * base_row["throughput"]


@pytest.mark.parametrize("name", ["stragglers.toml", "stragglers_links.toml", "ssp_digits.toml"])
def test_the_straggler_sweeps_parse(name):
    sweep = load(SWEEPS / name)
    assert sweep.runs
    if name == "ssp_digits.toml":  # synchronous, SSP 4 and 8, async x update, summation; one straggler
        assert sorted((str(s.strategy_params["staleness"]), s.strategy_params["mode"]) for s in sweep.runs) == sorted(
            (str(st), mode) for st in (0, 4, 8, "async") for mode in ("update", "summation"))
        assert all(s.straggler == {"ranks": [3], "slowdown": 2.0} and s.dataset == "digits" for s in sweep.runs)
    elif name == "stragglers.toml":
        assert {s.straggler["slowdown"] for s in sweep.runs} == {1.0, 2.0, 3.0}
    else:
        labels = {s.link_label for s in sweep.runs}
        assert any("heterogeneous" in label for label in labels), labels
        slow = [s.network() for s in sweep.runs if s.link.get("ranks")]
        assert slow and all(n.link(1).bandwidth < n.link(0).bandwidth == n.link(2).bandwidth for n in slow)
