"""The ring's step on the alpha-beta star, replayed exactly without SimGrid: what makes the elastic ring's steps at
n - 1, n - 2 ... cheap once the step at n has been simulated.

Why it is exact there. On a star of split-duplex NICs every ring message goes up its sender's NIC and down its
right neighbour's; rank p sends only to p + 1 and receives only from p - 1, and a pair's messages leave one at a
time on its connection (strategies/transport/simgrid.py, _Connection). So no link ever carries two flows at once,
and on SimGrid's alpha_beta model (no TCP corrections) a message of b bytes takes latency + b / bandwidth from the
moment it is put on the wire. The ranks' Python takes no simulated time. What is left is the order of events in
strategies/primitives.py's ring_reduce_scatter and ring_allgather, rank by rank, round by round:
    posted(p, r)   = T0 (round 0)  |  took(p, r - 1)                    (it sends once it has round r - 1's chunk)
    on_wire(p, r)  = max(posted(p, r), arrived(p, r - 1))               (behind the pair's previous message)
    arrived(p, r)  = on_wire(p, r) + latency + bytes(p, r) / bandwidth  (at rank p + 1)
    took(p, r)     = max(posted(p, r), arrived(p - 1, r))               (its wait for the left's chunk)
each phase ending when the rank has its last chunk and its sends have arrived; chunk (p - r) mod n in the
reduce-scatter's round r and (p + 1 - r) mod n in the all-gather's, of chunk_bounds' sizes.

It is used only where it was checked: ReplayedRingSteps simulates the step at n on SimGrid and refuses to go on
(even for the step at n itself) unless the replay gives the same seconds (1e-9 relative);
tests/experiments/test_ring_replay.py checks it against SimGrid at sizes that do and do not divide the gradients.
The same argument makes SimGrid's lazy sharing exact for this step (Platform sharing = "lazy": there is nothing to
share), and the check at n confirms it on every run that uses it.
"""

from __future__ import annotations

import numpy as np

from experiments.simulate.faults import FaultSim, StepTable
from strategies.base import chunk_bounds

AGREEMENT = 1e-9  # relative: the replay against the simulated step at n


def replay_fits(sim: FaultSim) -> str:
    """'' when the replay is exact for `sim`'s steps; else why not."""
    p = sim.platform
    if sim.strategy != "ring" or sim.params:
        return f"strategy {sim.strategy!r} {sim.params or ''}: the replay is of ring (no settings)"
    if (p.topology, p.network_model, p.nic) != ("star", "alpha_beta", "shared"):
        return (f"platform {p.topology}, {p.network_model}, nic {p.nic}: the replay is exact on the star, alpha_beta, "
                f"nic shared (no link shared by two flows, no TCP corrections)")
    return ""


def ring_step_seconds(workers: int, numel: int, compute_s: float, latency: float, bandwidth: float,
                      itemsize: int = 4) -> float:
    """Rank 0's seconds for one ring step of `workers` ranks: `compute_s`, then the allreduce of `numel` elements
    (see the module doc)."""
    n = workers
    if n == 1:
        return compute_s
    sizes = np.array([hi - lo for lo, hi in chunk_bounds(numel, n)], dtype=np.float64) * itemsize
    ranks = np.arange(n)
    start = np.full(n, float(compute_s))
    last_arrived = np.full(n, -np.inf)  # each pair's previous message's arrival (its connection)
    for first in (0, 1):  # the reduce-scatter sends chunk p - r, the all-gather p + 1 - r
        posted = start
        for r in range(n - 1):
            on_wire = np.maximum(posted, last_arrived)
            last_arrived = on_wire + latency + sizes[(ranks + first - r) % n] / bandwidth
            took = np.maximum(posted, np.roll(last_arrived, 1))  # rank p takes what p - 1 sent
            posted = took
        start = np.maximum(took, last_arrived)  # the phase's end: its last chunk in, its sends arrived
    return float(start[0])


class ReplayedRingSteps(StepTable):
    """StepTable for ring on the alpha-beta star: the step at sim.workers simulated on SimGrid (the strategy's
    code), the steps at fewer workers replayed (ring_step_seconds), only once the replay gives the simulated step
    at sim.workers to AGREEMENT; `replayed`: the world sizes replayed, not simulated."""

    def __init__(self, sim: FaultSim, known: dict[int, float] | None = None):
        why = replay_fits(sim)
        if why:
            raise ValueError(f"the ring replay does not fit: {why}")
        super().__init__(sim, known)
        self.replayed: set[int] = set()
        self.agreement = float("nan")  # |replay - simulated| / simulated at sim.workers

    def replay(self, workers: int) -> float:
        sim = self.sim
        return ring_step_seconds(workers, sim.numel, sim.compute_s * sim.workers / workers, sim.platform.latency,
                                 sim.platform.bandwidth)

    def __call__(self, workers: int) -> float:
        n = self.sim.workers
        if workers != n and workers in self.seconds:  # replayed (or given) before
            return self.seconds[workers]
        simulated = super().__call__(n)
        if self.agreement != self.agreement:  # the first call: the replay at n against the simulated step
            self.agreement = abs(self.replay(n) - simulated) / simulated
        if not self.agreement <= AGREEMENT:
            raise RuntimeError(f"the ring replay gives {self.replay(n)!r} s a step at {n} workers, SimGrid "
                               f"{simulated!r} s: {self.agreement:.3g} apart, over {AGREEMENT:g}; not used")
        if workers == n:
            return simulated
        self.seconds[workers] = self.replay(workers)
        self.replayed.add(workers)
        return self.seconds[workers]
