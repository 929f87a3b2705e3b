"""Failures on SimGrid: the simulated time to step S against the model, per recovery mode (small: 4 ranks)."""

from __future__ import annotations

import pytest

from experiments.simulate.faults import FaultSim, StepTable, compare, compose_failures, simulate_failures
from experiments.simulate.substrate import run_child
from strategies.fault_cost import FaultCosts
from strategies.faults import FaultSettingError
from strategies.transport.simgrid import simgrid_available

pytestmark = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")

COSTS = FaultCosts(step_s=1.0, detect_s=0.5, restart_s=1.0, checkpoint_s=0.2, reform_s=0.3, rejoin_s=3.0)


@pytest.mark.slow
@pytest.mark.parametrize("strategy, mode, every, steps, seeds", [("ring", "checkpoint_restart", 10, 100, 6),
                                                                 ("ring", "elastic", 0, 100, 6),
                                                                 ("parameter_server", "ps_shrink", 0, 60, 4)])
def test_simulated_time_to_step_matches_the_model(strategy, mode, every, steps, seeds):
    # 4 workers, each failing every 20 simulated s on average (the job every 5 s), steps of about 0.1 s: 1.5-3
    # failures a run. The mean over the seeds is within its own noise (3 standard errors, + 2%) of the model's
    # expectation, and within 10% (every step simulated; the composed runs below check the model with more seeds)
    sim = FaultSim(strategy, 4, steps, mode, 20.0, COSTS, checkpoint_every=every, numel=250_000)
    got = compare(sim, range(seeds))
    assert got.failures >= 1.5 and got.overshoots == 0
    assert abs(got.simulated_s - got.model_s) <= 3 * got.stderr_s + 0.02 * got.model_s, got
    assert got.ratio == pytest.approx(1, abs=0.10), got


def test_settings_the_simulation_cannot_run_are_refused():
    with pytest.raises(FaultSettingError, match="the simulation runs checkpoint_restart, elastic, ps_shrink"):
        FaultSim("decentralized", 4, 10, "reweight", 20.0, COSTS)
    with pytest.raises(FaultSettingError, match="does not fit strategy 'decentralized'"):
        FaultSim("decentralized", 4, 10, "elastic", 20.0, COSTS)
    with pytest.raises(FaultSettingError, match="barrier-free parameter server is not simulated"):
        FaultSim("parameter_server", 4, 10, "ps_shrink", 20.0, COSTS, params={"staleness": "async"})
    with pytest.raises(FaultSettingError, match="checkpoint_every = 0"):
        FaultSim("ring", 4, 10, "checkpoint_restart", 20.0, COSTS)


@pytest.mark.parametrize("strategy, mode, every", [("ring", "checkpoint_restart", 10), ("ring", "elastic", 0),
                                                   ("parameter_server", "ps_shrink", 0)])
def test_composed_steps_give_the_full_simulation(strategy, mode, every):
    # the failure process over steps simulated once per world size is the full simulation, step for step: the
    # same failures, steps run and lost, and simulated seconds (4 workers, each failing every 20 s: 3-4 failures,
    # the survivors at 3 and 2 workers)
    sim = FaultSim(strategy, 4, 60, mode, 20.0, COSTS, checkpoint_every=every, numel=250_000, seed=1)
    full = run_child(lambda: simulate_failures(sim))
    assert not full.error, full.error
    table = StepTable(sim)
    composed = compose_failures(sim, table)
    want = full.result
    assert len(want.failures) >= 3 and (mode == "checkpoint_restart" or len(table.seconds) >= 2)
    assert [slot for _, slot in composed.failures] == [slot for _, slot in want.failures]
    assert [t for t, _ in composed.failures] == pytest.approx([t for t, _ in want.failures], rel=1e-9)
    assert (composed.steps_run, composed.steps_lost, composed.overshoots) == \
        (want.steps_run, want.steps_lost, want.overshoots)
    assert composed.time_s == pytest.approx(want.time_s, rel=1e-9)
    assert composed.step_s == pytest.approx(want.step_s, rel=1e-9)


def test_composed_runs_match_the_model_at_8_ranks():
    # 400 seeds of ring with elastic recovery, the job failing every 5 s (5 failures a run, overlapping: two slots
    # are often missing at once): within 3 standard errors + 2% of the model (here 1.010) and within 5%. (Failing
    # every 2.5 s the group often runs at 5 or 4 of 8, slower than the n - 1 step the model prices every smaller
    # size at: 1.036, said in docs/faults.md)
    sim = FaultSim("ring", 8, 200, "elastic", 40.0, COSTS, numel=250_000)
    got = compare(sim, range(400), composed=True)
    assert got.composed and got.failures >= 5 and got.overshoots == 0
    assert set(got.step_s) >= {8, 7, 6, 5}
    assert abs(got.simulated_s - got.model_s) <= 3 * got.stderr_s + 0.02 * got.model_s, got
    assert got.ratio == pytest.approx(1, abs=0.05), got
    with pytest.raises(ValueError, match="the step table is of"):
        compare(FaultSim("ring", 8, 200, "elastic", 40.0, COSTS, numel=1000), range(2), composed=True,
                steps=StepTable(sim))
