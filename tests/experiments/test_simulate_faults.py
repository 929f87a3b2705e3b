"""Failures on SimGrid: the simulated time to step S against the model, per recovery mode (small: 4 ranks)."""

from __future__ import annotations

import pytest

from experiments.simulate.faults import FaultSim, compare
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
    # expectation, and within 10% (here 0.92, 0.93, 0.97; at 8 ranks x 200 steps x 12 seeds 1.005 and 0.997)
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
