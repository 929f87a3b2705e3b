"""A link down for t simulated seconds on SimGrid: a ring stalls everyone by the outage less the compute it
overlapped (the model's price), a barrier-free server only the worker whose link is down."""

from __future__ import annotations

import pytest

import strategies
from experiments.simulate.outages import OutageSim, simulate_outage
from strategies.fault_cost import outage_price
from strategies.faults import FaultSettingError, LinkOutage

pytestmark = pytest.mark.simgrid
OUTAGE = LinkOutage(step=2, rank=2, seconds=1.0)
SMALL = {"workers": 4, "steps": 4, "numel": 100_000, "compute_s": 0.1}


def later(name: str, **params) -> dict[int, float]:
    base = simulate_outage(OutageSim(name, outage=None, params=params, **SMALL))
    out = simulate_outage(OutageSim(name, outage=OUTAGE, params=params, **SMALL))
    return {rank: out[rank][-1] - base[rank][-1] for rank in base}


def test_a_simulated_ring_stalls_everyone_by_the_models_price():
    price = outage_price(strategies.make("ring"), 4, OUTAGE, 4, timeout_s=60, idle_s=SMALL["compute_s"])
    assert price.stalled == (0, 1, 2, 3) and price.stall_s == pytest.approx(0.9)
    assert later("ring") == pytest.approx(dict.fromkeys(range(4), price.stall_s), abs=2e-3)


def test_a_simulated_barrier_free_server_holds_up_only_that_worker():
    late = later("parameter_server", staleness="async", mode="summation")
    assert late[2] > 0.1, late
    assert all(late[rank] <= 1e-9 for rank in (0, 1, 3)), late  # they never wait for it (and share its bandwidth)


def test_the_simulation_refuses_an_outage_outside_the_run():
    with pytest.raises(FaultSettingError, match="link outage step = 4"):
        OutageSim("ring", outage=LinkOutage(4, 1, 1.0), **SMALL)
    with pytest.raises(ValueError, match="server rank 4 on a barrier-free server"):
        OutageSim("parameter_server", outage=LinkOutage(1, 4, 1.0), params={"staleness": "async",
                                                                             "mode": "summation"}, **SMALL)


@pytest.mark.parametrize("steps", [3, 4])
def test_a_simulated_gossip_stall_spreads_one_hop_a_step_as_the_model_says(steps):
    """8 ranks on a ring topology, rank 2's link down in step 2: at step 3 its two neighbours wait too, at step 4
    their neighbours as well; the rest are on time."""
    kw = {"workers": 8, "steps": steps, "numel": 100_000, "compute_s": 0.1}
    base = simulate_outage(OutageSim("decentralized", outage=None, **kw))
    out = simulate_outage(OutageSim("decentralized", outage=OUTAGE, **kw))
    price = outage_price(strategies.make("decentralized"), 8, OUTAGE, steps, timeout_s=60, idle_s=0.1)
    want = {rank: price.stall_s if rank in price.stalled else 0.0 for rank in range(8)}
    assert {rank: out[rank][-1] - base[rank][-1] for rank in base} == pytest.approx(want, abs=2e-3)
    assert len(price.stalled) == {3: 3, 4: 5}[steps]


# -- past the timeout: the rank's failure under the run's recovery mode ------------------------------------------

PAST = LinkOutage(step=3, rank=2, seconds=5.0)
RING6 = {"workers": 4, "steps": 6, "numel": 20_000, "compute_s": 0.1}


def test_an_outage_past_the_timeout_is_the_ranks_failure_under_each_mode():
    """Rank 2's link down 5 s from step 3 of 6 against a 1 s timeout: taken for dead at the start of step 3,
    detected after the step's compute and the timeout (1.1 s), recovered as the mode says; hand-worked from the
    simulated step at 4 and 3 workers (a, b)."""
    from experiments.simulate.faults import FaultSim, StepTable
    from experiments.simulate.outages import outage_is_failure, simulate_outage_failure
    from strategies.fault_cost import FaultCosts

    sim = OutageSim("ring", outage=PAST, **RING6)
    assert outage_is_failure(sim, 1.0) and not outage_is_failure(sim, 4.95)  # 5 - 0.1 of compute < 4.95
    costs = FaultCosts(step_s=1.0, restart_s=2.0, checkpoint_s=0.25, reform_s=0.3, rejoin_s=1000.0)
    # the step at 4 and 3 workers, each simulated once (the strategy's real code) and shared by the three modes
    table = StepTable(FaultSim("ring", 4, 6, "elastic", 1.0, costs, compute_s=0.1, numel=20_000))
    elastic = simulate_outage_failure(sim, "elastic", 1.0, costs, steps=table)
    a, b = elastic.step_s[4], elastic.step_s[3]
    assert b > a > 0.1  # the survivors share the global batch: a step at 3 is longer
    assert elastic.failed_at_s == pytest.approx(3 * a) and elastic.detect_s == pytest.approx(1.1)
    assert elastic.time_s == pytest.approx(3 * a + 1.1 + 0.3 + 3 * b)  # no step lost; 3 steps at 3 workers
    assert (elastic.steps_run, elastic.steps_lost) == (6, 0)

    restart = simulate_outage_failure(sim, "checkpoint_restart", 1.0, costs, checkpoint_every=2, steps=table)
    # checkpoints after steps 2 and 4; the failure at 3a + 0.25 loses step 2 (back to the checkpoint at 2)
    assert restart.failed_at_s == pytest.approx(3 * a + 0.25)
    assert restart.time_s == pytest.approx(3 * a + 0.25 + 1.1 + 2.0 + 4 * a + 0.25)
    assert (restart.steps_run, restart.steps_lost) == (7, 1)

    none = simulate_outage_failure(sim, "none", 1.0, costs, steps=table)
    assert (none.completed_steps, none.time_s) == (3, pytest.approx(3 * a + 1.1))
    assert "timed out after 1 s" in none.ended


def test_an_outage_past_the_timeout_that_cannot_be_simulated_is_refused_before_work():
    from experiments.simulate.outages import simulate_outage_failure
    from strategies.fault_cost import FaultCosts

    costs = FaultCosts(step_s=1.0)
    with pytest.raises(FaultSettingError, match="a stall"):
        simulate_outage_failure(OutageSim("ring", outage=LinkOutage(3, 2, 0.5), **RING6), "elastic", 1.0, costs)
    with pytest.raises(FaultSettingError, match="mode = 'reweight'"):
        simulate_outage_failure(OutageSim("decentralized", outage=PAST, **RING6), "reweight", 1.0, costs)
    with pytest.raises(FaultSettingError, match="barrier-free"):
        simulate_outage_failure(OutageSim("parameter_server", outage=PAST, params={"staleness": "async"}, **RING6),
                                "ps_shrink", 1.0, costs)
    with pytest.raises(FaultSettingError, match="elastic"):  # the mode must fit the strategy
        simulate_outage_failure(OutageSim("parameter_server", outage=PAST, **RING6), "elastic", 1.0, costs)
