"""A link down for t simulated seconds on SimGrid: every worker's time to step S with and without it.

The strategy's real code runs on the simulated platform (meta tensors of `numel` float32 gradients, `compute_s` of
compute a step, as experiments/simulate/faults.py's steps), and at the start of step s rank r starts an actor that
takes r's NIC down: SimGrid 3.32's Python binding has Link.turn_off, but a link turned off fails the
communications on it, which the transport does not survive (a dead peer is an error), so the outage sets both
directions of r's split-duplex NIC (the star platform's nic<r>_UP and nic<r>_DOWN) to 1 byte/s for t simulated
seconds and back: whatever crosses it meanwhile moves a few bytes, then resumes at full speed (a message's
latency is its own, not held). No rank dies, nothing times out (no communicator timeout in the simulation): a
stall only; an outage past a real communicator's timeout is a failure (strategies/fault_cost.py, outage_price).

A barrier-free server (staleness = "async") serves its workers from one actor for the whole run (serve_run), as on
the SimGrid substrate, summing (mode "summation": its update is the workers', nothing to simulate on the server).
Runs SimGrid's engine: call `outage_steps` through `simulate_outage`, which forks a child for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import strategies
from experiments.simulate.platform import Platform
from strategies.faults import LinkOutage, check_outages

DOWN_BPS = 1.0  # bytes per second of a link that is down


@dataclass(frozen=True)
class OutageSim:
    strategy: str
    workers: int
    steps: int
    outage: LinkOutage | None
    compute_s: float = 0.1
    numel: int = 1_000_000
    platform: Platform = field(default_factory=lambda: Platform(network_model="alpha_beta"))
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        config = strategies.make(self.strategy, **self.params)
        if self.outage is not None:
            check_outages([self.outage], self.workers, self.steps, config.num_servers(self.workers))
            if config.asynchronous and self.outage.rank >= self.workers:
                raise ValueError(f"link outage of server rank {self.outage.rank} on a barrier-free server: it "
                                 f"serves the whole run at once, so it has no step {self.outage.step} to start the "
                                 f"outage at; accepted are worker ranks 0..{self.workers - 1}")
        if self.platform.topology != "star":
            raise ValueError(f"platform topology {self.platform.topology!r}: a link outage takes a rank's own NIC "
                             f"down, which the star platform has (nic<rank>); accepted is topology 'star'")


def simulate_outage(sim: OutageSim) -> dict[int, list[float]]:
    """Each worker's simulated seconds at the end of each step, in a forked child (SimGrid's engine runs once a
    process); RuntimeError naming the simulation's error."""
    from experiments.simulate.child import run_child

    done = run_child(lambda: outage_steps(sim))
    if done.error:
        raise RuntimeError(f"the outage simulation of {sim.strategy} at {sim.workers} workers failed: {done.error}")
    return done.result


def outage_steps(sim: OutageSim) -> dict[int, list[float]]:
    """The simulation itself, in this process: worker -> its step ends (simulated seconds)."""
    from strategies.transport.simgrid_loader import load_simgrid
    from strategies.transport.simgrid_run import run_simgrid

    config = strategies.make(sim.strategy, **sim.params)
    world = config.world_size(sim.workers)
    sg = load_simgrid()

    def take_down(rank: int, seconds: float) -> None:
        links = [sg.Link.by_name(f"nic{rank}_{side}") for side in ("UP", "DOWN")]
        bandwidth = [link.bandwidth for link in links]
        for link in links:
            link.set_bandwidth(DOWN_BPS)
        sg.this_actor.sleep_for(seconds)
        for link, bw in zip(links, bandwidth):
            link.set_bandwidth(bw)

    def rank_main(comm):
        runtime = config.bind(comm, sim.workers)
        if runtime.is_server and config.asynchronous:  # the whole run from here
            runtime.serve_run(sim.steps, sim.numel, torch.float32)
            return None
        grads = torch.empty(sim.numel, dtype=torch.float32, device="meta")
        ends = []
        for step in range(sim.steps):
            _outage_at(sim, comm.rank, step, take_down, sg)
            if runtime.is_server:
                runtime.serve(sim.numel, torch.float32, "mean")
                continue
            comm.compute(sim.compute_s)
            runtime.sync(grads, "mean")
            ends.append(sg.Engine.clock)
        return ends

    results = run_simgrid(world, rank_main, lambda sg: sim.platform.build(sg, world), sim.platform.config,
                          sim.platform.nic)
    return {rank: results[rank] for rank in range(sim.workers)}


def _outage_at(sim: OutageSim, rank: int, step: int, take_down, sg) -> None:
    """Start the outage's actor if rank `rank`'s link goes down at `step`."""
    o = sim.outage
    if o is not None and o.rank == rank and o.step == step:
        sg.Actor.create(f"outage{rank}", sg.Host.current(), take_down, rank, o.seconds)
