"""Server failures on SimGrid: chain-replicated servers (ps_shrink) or a checkpoint restart, against hand-worked
expectations and the model."""

from __future__ import annotations

import pytest

from experiments.simulate.fault_servers import ServerFaultSim
from experiments.simulate.faults import (
    StepTable,
    _ComposedSteps,
    compare,
    compose_failures,
    simulate_failures,
    step_seconds,
)
from experiments.simulate.substrate import run_child
from strategies.fault_cost import FaultCosts
from strategies.faults import FaultSettingError
from strategies.transport.simgrid import simgrid_available

pytestmark = [pytest.mark.simgrid,
              pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")]

COSTS = FaultCosts(step_s=1.0, detect_s=0.5, restart_s=1.0, checkpoint_s=0.1, reform_s=0.25, rejoin_s=3.0)
LATENCY, BANDWIDTH = 50e-6, 125e6  # FaultSim's platform: the alpha-beta star's


def _sim(mode, servers=2, replicas=1, **kw):
    kw.setdefault("numel", 1200)
    return ServerFaultSim("parameter_server", 4, kw.pop("steps", 5), mode, kw.pop("mtbf_s", 20.0), COSTS,
                          params={"servers": servers}, replicas=replicas if mode == "ps_shrink" else 0, **kw)


@pytest.mark.parametrize("servers, replicas", [(2, 1), (3, 2)])
def test_the_replicated_step_carries_the_chain(servers, replicas):
    # each server's 1,200 x 4 / k bytes go down a chain of R hops and the tail's 8-byte ack comes back before the
    # workers are answered: each server sends one message and receives one at a time, no link shared, so the step
    # is longer by (R + 1) latencies + R shards + the ack at 1 Gbit/s, to the rounding
    plain = run_child(lambda: step_seconds(_sim("checkpoint_restart", servers, checkpoint_every=2), 4))
    chained = run_child(lambda: step_seconds(_sim("ps_shrink", servers, replicas), 4))
    assert not plain.error and not chained.error, (plain.error, chained.error)
    shard = 1200 * 4 / servers
    want = (replicas + 1) * LATENCY + replicas * shard / BANDWIDTH + 8 / BANDWIDTH
    assert chained.result[0] - plain.result[0] == pytest.approx(want, rel=1e-9)


class _Draws:
    """The failure process's exponential draws, scripted (servers' first, then the workers', then redraws)."""

    def __init__(self, values):
        self.values = list(values)

    def exponential(self, mean):
        return self.values.pop(0)


def _scripted(sim, draws):
    run = sim.process(_ComposedSteps(sim, lambda workers: 1.0))  # every step 1 s
    run.rng = _Draws(draws)
    for slot in run.server_slots:  # drawn at its making with the seeded draws: again, scripted
        run.draw(slot, 0.0)
    run.drive()
    return run.result()


def test_a_server_failure_costs_detection_and_promotion():
    # 2 servers (slots 4, 5), server 4 fails at 2.5 s during step 2 (2 -> 3): step 2 is redone; the failure is
    # noticed at the boundary at 3.0, the promotion ends at 2.5 + 0.5 + 0.25 = 3.25, then steps 2, 3, 4: 6.25 s;
    # no worker missing, nothing lost, the server's standby drawn again at 3.25
    got = _scripted(_sim("ps_shrink"), [2.5, 1e9, 1e9, 1e9, 1e9, 1e9, 1e9])
    assert got.failures == [(2.5, 4)]
    assert got.time_s == pytest.approx(6.25, abs=1e-12)
    assert (got.steps_run, got.steps_lost, got.overshoots) == (6, 0, 0)


def test_a_server_failure_without_replicas_restarts_from_the_checkpoint():
    # checkpoints every 2 steps (0.1 s): steps 0, 1 end at 2.0, the checkpoint at 2.1; server 5 fails at 2.5 in
    # step 2 (2.1 -> 3.1), noticed at 3.1 (after its detection at 3.0: an overshoot); restart until 2.5 + 0.5 + 1
    # = 4.0, back to step 2: steps 2, 3 to 6.0, the checkpoint to 6.1, step 4 to 7.1
    got = _scripted(_sim("checkpoint_restart", checkpoint_every=2), [1e9, 2.5, 1e9, 1e9, 1e9, 1e9, 1e9])
    assert got.failures == [(2.5, 5)]
    assert got.time_s == pytest.approx(7.1, abs=1e-12)
    assert (got.steps_run, got.steps_lost, got.overshoots) == (6, 0, 1)


def test_a_worker_failing_during_a_promotion_joins_the_incident():
    # server 4 at 2.5 (its window to 3.25), worker 1 at 3.1 (its window 3.1 + 0.5 = 3.6): one incident, the
    # group on at 3 workers from 3.6 (steps 2, 3, 4 at 1 s each: 6.6 s; the worker rejoins at 6.1, the run over
    # at 6.6 all the same)
    got = _scripted(_sim("ps_shrink"), [2.5, 1e9, 1e9, 3.1, 1e9, 1e9, 1e9, 1e9])
    assert got.failures == [(2.5, 4), (3.1, 1)]
    assert got.time_s == pytest.approx(6.6, abs=1e-12)


def test_settings_the_server_simulation_cannot_run_are_refused():
    with pytest.raises(FaultSettingError, match="replicas = 0 with ps_shrink"):
        _sim("ps_shrink", replicas=0)
    with pytest.raises(FaultSettingError, match="accepted are 1 to 1"):
        _sim("ps_shrink", replicas=2)
    with pytest.raises(FaultSettingError, match="'ps_shrink' does not fit strategy"):
        ServerFaultSim("parameter_server", 4, 5, "ps_shrink", 20.0, COSTS, replicas=1,
                       params={"servers": 2, "mode": "summation"})
    with pytest.raises(FaultSettingError, match="replicas cover a server's failure under ps_shrink"):
        ServerFaultSim("parameter_server", 4, 5, "checkpoint_restart", 20.0, COSTS, checkpoint_every=2, replicas=1,
                       params={"servers": 2})
    with pytest.raises(FaultSettingError, match="dedicated servers"):
        ServerFaultSim("ring", 4, 5, "checkpoint_restart", 20.0, COSTS, checkpoint_every=2)


@pytest.mark.parametrize("mode, every", [("ps_shrink", 0), ("checkpoint_restart", 5)])
def test_composed_server_failures_give_the_full_simulation(mode, every):
    # 4 workers, 2 servers, each slot failing every 20 s (this seed: server 4 twice, workers 1 and 0): the full
    # simulation (every step, the chain's traffic in it) and the composed one give the same failures and seconds
    sim = _sim(mode, steps=100, mtbf_s=20.0, checkpoint_every=every, numel=250_000, seed=4)
    full = run_child(lambda: simulate_failures(sim))
    assert not full.error, full.error
    composed = compose_failures(sim, StepTable(sim))
    want = full.result
    assert [slot for _, slot in want.failures] == [4, 4, 1, 0]
    assert [slot for _, slot in composed.failures] == [4, 4, 1, 0]
    assert [t for t, _ in composed.failures] == pytest.approx([t for t, _ in want.failures], rel=1e-9)
    assert (composed.steps_run, composed.steps_lost, composed.overshoots) == \
        (want.steps_run, want.steps_lost, want.overshoots)
    assert composed.time_s == pytest.approx(want.time_s, rel=1e-9)


@pytest.mark.slow
def test_composed_server_failures_match_the_model_at_8_workers():
    # 8 workers, 4 servers with a replica each, every slot failing every 60 s (the group every 5 s): within 3
    # standard errors + 2% of the model, and within 10%
    sim = ServerFaultSim("parameter_server", 8, 200, "ps_shrink", 60.0, COSTS, numel=250_000,
                         params={"servers": 4}, replicas=1)
    got = compare(sim, range(300), composed=True)
    assert got.failures >= 3
    assert abs(got.simulated_s - got.model_s) <= 3 * got.stderr_s + 0.02 * got.model_s, got
    assert got.ratio == pytest.approx(1, abs=0.10), got
