"""A sweep's training with links going down and servers failing, on thread ranks.

    failures = { schedule = [{ link = 2, step = 5, seconds = 1.5 }] }        # rank 2's NIC down 1.5 s from step 5
    failures = { schedule = [{ rank = 5, step = 3 }] }                       # server rank 5 (after 4 workers) fails
    recovery = { mode = "checkpoint_restart", checkpoint_every = 2 }

The segments are the sweep's (sweep_faults.SweepSegments: the real step loop on thread ranks, the harness's
recovery) with two additions:

- **A link down** (strategies/fault_outages.py's mechanism, OutageSegments, not written twice): at the start of
  step s rank r's communicator holds every send and receive of r's until t seconds have passed, so whoever waits
  on r waits too; nothing is lost, the run is the one without the outage, later. A worker's link goes down when
  it starts step s (before its compute: the outage's first seconds overlap it), a server's when the group's first
  worker starts step s. An outage its peers' waits time out on (t at least the communicator's timeout) is r's
  failure at step s under the run's recovery mode, as in the harness.
- **A server failing** (a synchronous parameter server with dedicated servers): the server dies in step s once
  it holds every worker's push of its first bucket, before its first answer leaves (so every worker is in step s
  and step s - 1 is complete everywhere); the fabric aborts the workers' waits. checkpoint_restart reloads every
  worker and every server (their shards and optimizer state) from the last checkpoint and redoes the steps since;
  none ends the run, the cause named; ps_shrink is refused before work (a server's own failure needs a replica,
  which a sweep does not run yet).

What is recorded, beside sweep_faults.py's columns: each outage (how many, the seconds the down links held
messages, how many became failures) on the run's row; the stall itself is in the step rows (the step time and
each rank's comm_s of the outage's steps).
"""

from __future__ import annotations

from experiments.pipeline.sweep_faults import SweepSegments, needs_outage_segments
from strategies.fault_outages import OutageSegments
from strategies.fault_records import RankFailed
from strategies.faults import LinkOutage, check_outages


def segments_for(spec) -> SweepSegments:
    """The segments that run `spec`'s failures on thread ranks: these where it has an outage or a server rank's
    failure, else sweep_faults.SweepSegments."""
    return SweepOutages(spec) if needs_outage_segments(spec) else SweepSegments(spec)


class SweepOutages(OutageSegments, SweepSegments):
    """SweepSegments with the run's link outages applied and its servers failing where scheduled."""

    def __init__(self, spec, schedule=None):
        SweepSegments.__init__(self, spec, schedule)
        servers = self.config.num_servers(spec.workers)
        listed = check_outages([LinkOutage(step, rank, seconds)
                                for step, rank, seconds in (spec.failures or {}).get("outages", [])],
                               spec.workers, spec.steps, servers)
        self.down = {(o.step, o.rank): o.seconds for o in listed}
        # the whole run's bound (timeout) grows by what each outage can hold the run: its seconds, or the
        # timeout's wait before its peers give the rank up
        self.bound_extra_s = sum(min(o.seconds, spec.timeout) for o in listed)
        self.out_outages = []  # OutageRecord per outage taken, in the order settled
        self.taken = []  # this segment's outages taken (OutageSegments.take)
        self.ends = {slot: [] for slot in range(spec.workers)}
        self.comms: dict[int, object] = {}  # rank (worker slot, or workers + server index) -> its communicator

    def run(self):
        out = super().run()
        self._settle(None)
        return out

    def _worker(self, comm, spec, config, alive, start, joining, donor, ready, finished) -> dict:
        self.comms[alive[comm.rank]] = comm
        return super()._worker(comm, spec, config, alive, start, joining, donor, ready, finished)

    def _server(self, comm, spec, config, index: int, start: int) -> dict:
        rank = self.workers + index
        self.comms[rank] = comm
        if (step := self.dying.get(rank)) is not None:
            _dies_at_first_answer(comm, rank, start, step, self)
        return super()._server(comm, spec, config, index, start)

    def dies(self, slot: int, step: int) -> bool:
        """A worker starting `step`: it dies (SweepSegments), or its link goes down if an outage is due; the
        group's first worker also takes the servers' links down."""
        if super().dies(slot, step):
            return True
        self.take(step, slot, self.comms[slot])
        if slot == self.alive[0]:
            for rank in range(self.workers, self.workers + self.config.num_servers(len(self.alive))):
                if (step, rank) in self.down:
                    self.take(step, rank, self.comms[rank])
        return False

    def ended(self, step: int, slot: int) -> None:  # the step ends are the step rows' wall_s here
        pass


def _dies_at_first_answer(comm, rank: int, start: int, step: int, run: SweepOutages) -> None:
    """The server's communicator raises RankFailed(rank, step) at its first send of `step`: it has every worker's
    push of its first bucket then, and no answer has left. Steps are counted at the server loop's step starts (its
    check_deadline, once a step)."""
    now = {"step": start - 1}
    check, isend = comm.check_deadline, comm.isend

    def check_deadline():
        now["step"] += 1
        check()

    def isend_or_die(tensor, dst):
        if now["step"] == step:
            run._died_at = run.clock()
            raise RankFailed(rank, step)
        return isend(tensor, dst)

    comm.check_deadline, comm.isend = check_deadline, isend_or_die
