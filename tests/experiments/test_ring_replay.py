"""The ring's step replayed without SimGrid (experiments/simulate/ring_replay.py) against SimGrid's, and its use for
the elastic ring's shrunk steps only once it gives the simulated step."""

from __future__ import annotations

import pytest

from experiments.simulate.faults import FaultSim, step_seconds
from experiments.simulate.platform import Platform
from experiments.simulate.ring_replay import ReplayedRingSteps, replay_fits, ring_step_seconds
from experiments.simulate.substrate import run_child
from strategies.fault_cost import FaultCosts
from strategies.transport.simgrid import simgrid_available

COSTS = FaultCosts(step_s=1.0, detect_s=0.5, reform_s=0.3, rejoin_s=3.0)


@pytest.mark.parametrize("workers, live, numel", [(4, 3, 1000), (5, 5, 1001), (16, 13, 1_000_003), (32, 31, 7)])
@pytest.mark.simgrid
@pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")
def test_the_replay_gives_simgrids_step_to_the_bit(workers, live, numel):
    # sizes that do and do not divide the gradients (chunks of two sizes: ranks out of step with each other), and
    # fewer gradients than ranks (empty chunks: zero-byte messages, latency only)
    sim = FaultSim("ring", workers, 10, "elastic", 20.0, COSTS, numel=numel)
    done = run_child(lambda: step_seconds(sim, live))
    assert not done.error, done.error
    want = ring_step_seconds(live, numel, sim.compute_s * workers / live, sim.platform.latency, sim.platform.bandwidth)
    assert done.result[0] == pytest.approx(want, rel=1e-12, abs=0)


def test_the_replay_by_hand():
    # 2 ranks, 10 elements of 4 bytes: each phase one round of a 20-byte chunk each way, at 1 s latency and 10
    # bytes/s: 1 + 2 = 3 s a phase after 0.5 s of compute
    assert ring_step_seconds(2, 10, 0.5, 1.0, 10.0) == pytest.approx(6.5)
    # 3 ranks, 4 elements: chunks of 8, 4, 4 bytes (0.8, 0.4, 0.4 s at 10 bytes/s, no latency), the 8-byte one
    # travelling the ring and everyone behind it. Reduce-scatter: rank 1 takes chunk 0 at 0.8 and forwards it,
    # at rank 2 at 1.6 (rank 0's own second send queued behind its first until 0.8: at rank 1 at 1.2); rank 0's
    # phase ends at 1.2. All-gather: rank 2's 8-byte chunk (1.6 -> 2.4) reaches rank 0, which forwards it
    # (2.4 -> 3.2) and waits for that send: 3.2 s
    assert ring_step_seconds(3, 4, 0.0, 0.0, 10.0) == pytest.approx(3.2)
    assert ring_step_seconds(1, 10, 0.25, 1.0, 10.0) == 0.25


def test_the_replay_is_refused_where_it_is_not_exact():
    assert replay_fits(FaultSim("ring", 8, 10, "elastic", 20.0, COSTS)) == ""
    assert "the replay is of ring" in replay_fits(FaultSim("halving_doubling", 8, 10, "elastic", 20.0, COSTS))
    tcp = FaultSim("ring", 8, 10, "elastic", 20.0, COSTS, platform=Platform(network_model="tcp"))
    assert "exact on the star, alpha_beta, nic shared" in replay_fits(tcp)
    with pytest.raises(ValueError, match="the ring replay does not fit: platform star, tcp"):
        ReplayedRingSteps(tcp)


def test_the_replay_is_used_only_once_it_gives_the_simulated_step():
    sim = FaultSim("ring", 8, 10, "elastic", 20.0, COSTS, numel=1000)
    right = ring_step_seconds(8, 1000, 0.1, sim.platform.latency, sim.platform.bandwidth)
    table = ReplayedRingSteps(sim, known={8: right})  # the step at 8 as SimGrid gives it (test above)
    assert table(7) == ring_step_seconds(7, 1000, 0.1 * 8 / 7, sim.platform.latency, sim.platform.bandwidth)
    assert table.replayed == {7} and table.agreement == 0
    wrong = ReplayedRingSteps(sim, known={8: right * (1 + 1e-6)})
    with pytest.raises(RuntimeError, match="the ring replay gives .* over 1e-09; not used"):
        wrong(7)
