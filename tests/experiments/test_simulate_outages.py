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
