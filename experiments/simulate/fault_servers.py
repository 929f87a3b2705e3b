"""Server failures on a simulated cluster (SimGrid): a parameter server whose dedicated servers fail too.

Every server, like every worker, fails after an exponential time of mean `mtbf_s` (seeded). Two ways to survive it:
- ps_shrink with `replicas` R >= 1 (chain replication, as Li et al., OSDI 2014; strategies/fault_replicas.py runs
  it on thread ranks): shard j's chain is server j and the next R servers. The simulated step carries the
  replication: as each partition is updated, the primary sends it to the chain's next server, each replica
  passes it on, the tail acknowledges (8 bytes) to the primary, and only then does the primary answer the
  workers (a worker's answer is on every replica). A server failure stops the group for detection + promotion
  (`detect_s` + `reform_s`: the chain's next server becomes primary, a standby takes the failed server's place
  in the chains, copying its shards within that time); the step in flight is redone, nothing else is lost and
  nothing is missing after (the standby's clock starts when the promotion ends). A worker's failure shrinks the
  barrier, as without server failures (experiments/simulate/faults.py).
- checkpoint_restart, no replicas: a server's failure is one more rank's: every rank restarts from the last
  checkpoint (the model: Daly's formula with the job failing at (workers + servers) / mtbf_s).
ps_shrink without replicas is refused: a server's failure would end the run.

The failures are noticed at step boundaries and rolled back to what they cost, as in faults.py; the same two ways
(every step simulated, or each world size's step simulated once and the failures composed over the step times).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import strategies
from experiments.simulate.faults import FaultSim, _FailureProcess
from strategies.fault_cost import FaultCosts, expected_time
from strategies.faults import CHECKPOINT_RESTART, PS_SHRINK, FaultSettingError, check_replicas_fit

ACK_BYTES = 8  # the tail's acknowledgement to the primary
_FORWARDERS: set[tuple[str, int]] = set()  # (segment tag, server) whose replicas' forwarders are running


@dataclass(frozen=True)
class ServerFaultSim(FaultSim):
    """A FaultSim of a parameter server (dedicated, synchronous) whose servers fail as often as its workers."""

    replicas: int = 0

    def __post_init__(self):
        super().__post_init__()
        config = strategies.make(self.strategy, **self.params)
        if config.name != "parameter_server" or config.num_servers(self.workers) < 1:
            raise FaultSettingError(f"strategy {self.strategy!r}: server failures are simulated for a parameter_server "
                                    f"with dedicated servers")
        if self.mode == PS_SHRINK:
            if not self.replicas:
                raise FaultSettingError("replicas = 0 with ps_shrink: a server's failure would end the run; accepted "
                                        "are replicas >= 1 (chain replication) or mode checkpoint_restart")
            check_replicas_fit(config, self.workers, self.replicas)  # (summation servers: check_fits refused)
        elif self.replicas:
            raise FaultSettingError(f"replicas = {self.replicas!r} with mode {self.mode!r}: replicas cover a server's "
                                    f"failure under ps_shrink; checkpoint_restart restarts every rank (replicas = 0)")

    @property
    def servers(self) -> int:
        return strategies.make(self.strategy, **self.params).num_servers(self.workers)

    def failing_slots(self) -> int:
        return self.workers + self.servers

    def process(self, steps) -> _FailureProcess:
        return _ServerFailureProcess(self, steps)

    def watched(self, alive: list[int]) -> list[int]:
        """The live workers and every server (slots workers .. workers + servers - 1)."""
        return alive + [self.workers + i for i in range(self.servers)]

    def serve(self, comm, runtime, tag: str) -> None:
        if self.replicas:
            replicated_serve(self, runtime, tag)
        else:
            super().serve(comm, runtime, tag)

    def expected(self, costs: FaultCosts):
        if self.mode == CHECKPOINT_RESTART:  # every rank restarts: the job fails at (workers + servers) / mtbf
            return expected_time(self.mode, self.steps, self.failing_slots(), self.mtbf_s, costs,
                                 checkpoint_every=self.checkpoint_every or None)
        return expected_time(self.mode, self.steps, self.workers, self.mtbf_s, costs, servers=self.servers,
                             replicas=self.replicas)


def replicated_serve(sim: ServerFaultSim, runtime, tag: str) -> None:
    """A server rank's step with chain replication: serve its shard, each updated partition sent down the chain and
    acknowledged by the tail before the workers are answered. The replicas' forwarders (an actor per chain this
    server is on, on its host, sharing its NIC) start at its first step of a segment and run until the
    simulation ends (daemons)."""
    from strategies.transport.simgrid_loader import load_simgrid

    sg = load_simgrid()
    k, s = runtime.servers, runtime.server
    if (tag, s) not in _FORWARDERS:
        _FORWARDERS.add((tag, s))
        host = sg.this_actor.get_host()
        for shard in range(k):
            chain = [(shard + i) % k for i in range(sim.replicas + 1)]
            if s in chain[1:]:
                sg.Actor.create(f"{tag}:chain{shard}@{s}", host, _forward, sg, tag, shard, len(chain),
                                chain.index(s)).daemonize()
    head = sg.Mailbox.by_name(f"{tag}:chain{s}.1")
    acks = sg.Mailbox.by_name(f"{tag}:ack{s}")

    def update(reduced, where):
        nbytes = reduced.numel() * reduced.element_size()
        head.put(nbytes, nbytes)  # to the chain's first replica
        acks.get()  # the tail has it: every replica has it
        return reduced

    runtime.serve(sim.numel, torch.float32, "mean", update=update)


def _forward(sg, tag: str, shard: int, length: int, position: int) -> None:
    """A replica of `shard` at `position` (1 .. length - 1) of its chain: store each update, pass it on; the tail
    acknowledges to the primary."""
    inbox = sg.Mailbox.by_name(f"{tag}:chain{shard}.{position}")
    tail = position == length - 1
    out = sg.Mailbox.by_name(f"{tag}:ack{shard}" if tail else f"{tag}:chain{shard}.{position + 1}")
    while True:
        nbytes = inbox.get()
        out.put(nbytes, ACK_BYTES if tail else nbytes)


class _ServerFailureProcess(_FailureProcess):
    """_FailureProcess with the servers' slots failing too (slots workers .. workers + servers - 1): a server's
    failure is recovered by promotion (ps_shrink with replicas) or by the restart (checkpoint_restart)."""

    def __init__(self, sim: ServerFaultSim, steps):
        super().__init__(sim, steps)
        self.server_slots = [sim.workers + i for i in range(sim.servers)]
        for slot in self.server_slots:
            self.draw(slot, 0.0)

    def window(self, slot: int) -> float:
        """Seconds from a slot's failure to the end of its recovery window: a server's, detection + promotion."""
        costs = self.costs
        if self.sim.mode == CHECKPOINT_RESTART:
            return costs.detect_s + costs.restart_s
        return costs.detect_s + (costs.reform_s if slot in self.server_slots else 0.0)
