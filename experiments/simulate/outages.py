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


# -- past the timeout: the rank's failure under the run's recovery mode --------------------------------------------

@dataclass(frozen=True)
class OutageFailure:
    """What an outage past the timeout did to a simulated run: the outage's rank taken for dead at the start of
    its step, detected when its peers' waits time out, recovered as the mode says."""

    mode: str
    time_s: float  # simulated seconds to step S (mode none: to the run's end, at the detection)
    completed_steps: int  # steps S (none: the steps before the outage's)
    steps_run: int  # steps run, the lost ones counted again
    steps_lost: int
    failed_at_s: float  # the start of the outage's step: the failure's time
    detect_s: float  # from it to the detection: the step's compute (nobody waits on the link yet) + the timeout
    step_s: dict  # simulated seconds of a step at each world size the run reached
    ended: str = ""  # mode none: the cause


def outage_is_failure(sim: OutageSim, timeout_s: float) -> bool:
    """True when the outage outlasts the peers' wait: they need the rank's link once their compute is done, and
    give it up after `timeout_s` of waiting (the outage less the step's compute reaching the timeout)."""
    if not (timeout_s > 0 and timeout_s < float("inf")):
        raise ValueError(f"timeout_s = {timeout_s!r}: accepted are seconds > 0")
    return sim.outage is not None and sim.outage.seconds - sim.compute_s >= timeout_s


def simulate_outage_failure(sim: OutageSim, mode: str, timeout_s: float, costs, checkpoint_every: int = 0,
                            steps=None) -> OutageFailure:
    """The outage past the timeout as rank r failing at the start of step s (as on thread ranks), on SimGrid:
    each world size's step simulated once (the strategy's real code, experiments/simulate/faults.py's StepTable)
    and the failure and the mode's recovery composed over them (compose_failures, equal to simulating every step
    where both run). Detection: the step's compute + the timeout; `costs` (a FaultCosts; its detect_s and step_s
    are replaced) the restart, checkpoint, re-forming and rejoin seconds. Modes: none (the run ends at the
    detection), checkpoint_restart, elastic, ps_shrink; the others refused before any work (FaultSettingError),
    as are an outage that is a stall (outage_is_failure) and a barrier-free server (not simulated with failures).
    `steps`: a StepTable to reuse (its step simulations), else a fresh one."""
    import math
    from dataclasses import replace

    from experiments.simulate.faults import MODES, FaultSim, StepTable, _FailureProcess
    from strategies.faults import CHECKPOINT_RESTART, NONE, FaultSettingError

    if not outage_is_failure(sim, timeout_s):
        raise FaultSettingError(f"link outage of {sim.outage.seconds if sim.outage else 0:g} s with compute "
                                f"{sim.compute_s:g} s and timeout {timeout_s:g} s: the peers' wait is shorter than "
                                f"the timeout, a stall (simulate_outage), not a failure")
    if mode not in (NONE, *MODES):
        raise FaultSettingError(f"mode = {mode!r}: an outage past the timeout is simulated with {NONE}, "
                                f"{', '.join(MODES)} (reweight runs on thread ranks)")
    outage = sim.outage
    if outage.rank >= sim.workers:
        raise FaultSettingError(f"link outage of server rank {outage.rank} past the timeout: the simulation fails "
                                f"workers here (a server's failure: `syncbench faults --simulate --servers-fail`); "
                                f"accepted are worker ranks 0..{sim.workers - 1}")
    detect = sim.compute_s + timeout_s
    costs = replace(costs, detect_s=detect)
    # the FaultSim checks the mode against the strategy and refuses a barrier-free server, before any simulation
    # (mode none: its steps are checkpoint_restart's without a checkpoint, any strategy's)
    fault = FaultSim(sim.strategy, sim.workers, sim.steps, mode if mode != NONE else CHECKPOINT_RESTART, math.inf,
                     costs, checkpoint_every=checkpoint_every if mode != NONE else sim.steps,
                     compute_s=sim.compute_s, numel=sim.numel, platform=sim.platform, params=sim.params)
    table = steps or StepTable(fault)
    # the start of step s on the composed clock, by the same additions _ComposedSteps makes (so the failure is
    # seen at exactly that step boundary)
    clock, step_n = 0.0, table(sim.workers)
    for step in range(1, outage.step + 1):
        clock = clock + step_n
        if mode == CHECKPOINT_RESTART and step % checkpoint_every == 0 and step < sim.steps:
            clock += costs.checkpoint_s
    if mode == NONE:
        return OutageFailure(mode, clock + detect, outage.step, outage.step, 0, clock, detect,
                             {sim.workers: step_n},
                             ended=f"rank {outage.rank}'s link down {outage.seconds:g} s from step {outage.step}: "
                                   f"its peers timed out after {timeout_s:g} s, no recovery")

    class Scheduled(_FailureProcess):
        """The outage's rank fails once, at the start of its step; nobody else, and not its replacement."""

        def draw(self, slot: int, now: float) -> None:
            first = slot not in self.next_fail
            self.next_fail[slot] = clock if slot == outage.rank and first else math.inf

    class OneFailure(FaultSim):
        def process(self, steps_):
            return Scheduled(self, steps_)

    from experiments.simulate.faults import compose_failures

    one = OneFailure(**{f: getattr(fault, f) for f in fault.__dataclass_fields__})
    result = compose_failures(one, table)
    reached = {m: table(m) for m in sorted(table.seconds)}
    return OutageFailure(mode, result.time_s, sim.steps, result.steps_run, result.steps_lost, clock, detect, reached)
