"""A link down for t seconds on thread ranks: the rank lives, its NIC carries nothing for a while.

    run = run_with_outages("ring", workers=4, steps=8, outages=[LinkOutage(step=3, rank=2, seconds=0.2)],
                           x0=np.zeros(5), gradient=grad, lr=0.5)

The harness of strategies/fault_runs.py (the real strategy code on thread ranks, the same small problem), with
each outage applied by the transport: at the start of step s's synchronization rank r's communicator holds every
send and receive of r's until t seconds have passed (strategies/transport/link.py, LinkDown), so whoever waits on
r waits too. No rank dies and nothing is recovered: the result is the run without the outage, later. What the
outage costs each strategy is who waits: a ring, halving-doubling or a synchronous server every rank; a
barrier-free server only the worker whose link is down (its server serves each worker on its own loop).

An outage at least the communicator's timeout long is a failure (strategies/faults.py, outage_outcome): r's peers'
waits time out, the run takes r for dead at step s and its recovery mode applies, as for a rank that died there
(the outage then is over: a restarted or rejoining rank has its link back). Each outage's record says which of
the two happened, measured, not predicted. A barrier-free server's outages must be stalls here (its server's
per-worker loop has no recovery of its own on thread ranks: refused before work).

Each worker's step ends are recorded (seconds from the run's start), so a caller compares the time to step S of
each rank with and without the outage (OutageRun.time_to_step).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch

import strategies
from strategies.fault_records import FaultRun, RankFailed
from strategies.fault_runs import Segments, barrier_free_member, barrier_free_run
from strategies.faults import (
    FAILURE,
    NONE,
    STALL,
    Failure,
    FaultSettingError,
    Recovery,
    check_fits,
    check_outages,
    check_schedule,
    outage_outcome,
)
from strategies.transport.communicator import CommError
from strategies.transport.link import LinkDown
from strategies.transport.threads import run_threads


@dataclass(frozen=True)
class OutageRecord:
    """One outage as it happened: STALL (its peers waited it out) or FAILURE (they gave the rank up: the recovery
    mode applied); began_s from the run's start; held_s the seconds the rank's own messages were held; `error`,
    for a failure, what its peers saw."""

    step: int
    rank: int
    seconds: float
    outcome: str
    began_s: float
    held_s: float
    error: str = ""


@dataclass
class OutageRun:
    """A run with link outages: the fault run (parameters, steps, failures an outage turned into), each outage's
    record, and every worker slot's step ends (slot -> [(step, seconds from the run's start)])."""

    run: FaultRun
    outages: list[OutageRecord] = field(default_factory=list)
    ends: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def time_to_step(self, steps: int) -> dict[int, float]:
        """Each slot's seconds from the start until it completed `steps` steps (its last end of step steps - 1);
        NaN for a slot that never did."""
        return {slot: max((t for s, t in ends if s == steps - 1), default=math.nan)
                for slot, ends in sorted(self.ends.items())}


def run_with_outages(name: str, workers: int, steps: int, outages, x0, gradient, lr: float, failures=(),
                     recovery: Recovery | None = None, timeout: float = 20.0, network=None, **params) -> OutageRun:
    """`steps` steps of `name` on `workers` thread ranks with the link outages (and any rank failures) applied;
    see the module doc. Every setting checked before any work."""
    config = strategies.make(name, **params)
    recovery = recovery or Recovery(NONE)
    servers = config.num_servers(workers)
    listed = check_outages(outages, workers, steps, servers)
    schedule = check_schedule(failures, workers, steps, servers)
    check_fits(recovery.mode, config, workers, schedule, recovery.replicas)
    if recovery.replicas:
        raise FaultSettingError(f"recovery.replicas = {recovery.replicas!r} with link outages: chain-replicated "
                                f"servers run rank failures only (strategies/fault_replicas.py)")
    x0 = torch.as_tensor(np.array(x0, copy=True))
    if getattr(config, "asynchronous", False):
        return _barrier_free(config, workers, steps, listed, schedule, recovery, x0, gradient, lr, timeout,
                             network)
    run = OutageSegments(config, workers, steps, schedule, recovery, x0, gradient, lr, timeout)
    run.network = network
    run.down = {(o.step, o.rank): o.seconds for o in listed}
    return run.go()


class OutageSegments(Segments):
    """fault_runs.Segments with each outage applied at the start of its step's synchronization, and every step's
    end recorded; an outage its peers time out on becomes the rank's failure at that step."""

    down: dict[tuple[int, int], float]

    def go(self) -> OutageRun:
        self.began = self.clock()
        self.out_outages: list[OutageRecord] = []
        self.ends: dict[int, list[tuple[int, float]]] = {slot: [] for slot in range(self.workers)}
        self.taken: list[tuple] = []  # this segment's outages taken: (step, slot, seconds, began, LinkDown)
        run = self.run()
        self._settle(None)
        return OutageRun(run, sorted(self.out_outages), self.ends)

    def _bind(self, comm, m: int):
        position = comm.rank
        slot = self.alive[position] if position < m else self.workers + position - m
        return _Watched(super()._bind(comm, m), comm, slot, self.step, self)

    def take(self, step: int, slot: int, comm) -> None:
        """Rank `slot`'s link goes down now if an outage is due at `step` (each happens once)."""
        seconds = self.down.pop((step, slot), None)
        if seconds is None:
            return
        fabric = getattr(comm, "fabric", None)
        link = LinkDown(seconds, cancelled=lambda: fabric is not None and fabric.aborted is not None)
        comm.link_down = link
        self.taken.append((step, slot, seconds, self.clock(), link))

    def ended(self, step: int, slot: int) -> None:
        if slot < self.workers:
            self.ends[slot].append((step, self.clock() - self.began))

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        self.taken = []
        try:
            super()._segment(start, end, joining, ready)
        except RankFailed:
            self._settle(None)
            raise
        except CommError as e:  # a peer's timeout on a link still down: the rank taken for dead
            if not self.taken or time.monotonic() >= self.taken[-1][4].end:
                self._settle(None)  # the outages so far were stalls; this error is something else's
                raise
            step, slot, _, died_at, _ = self.taken[-1]
            self._settle(e)
            self.pending = sorted([*self.pending, Failure(step, slot)])
            self._died_at, self._detected_at = died_at, self.clock()
            raise RankFailed(slot, step) from e
        self._settle(None)

    def _settle(self, error: BaseException | None) -> None:
        """Record this segment's outages: the last one a FAILURE when `error` ended the segment, the others
        stalls."""
        for i, (step, slot, seconds, began, link) in enumerate(self.taken):
            failed = error is not None and i == len(self.taken) - 1
            self.out_outages.append(OutageRecord(step, slot, seconds, FAILURE if failed else STALL,
                                                 began - self.began, link.held_s, str(error) if failed else ""))
        self.taken = []


class _Watched:
    """A rank's strategy runtime with the outages applied at each step's start and its step ends recorded."""

    def __init__(self, runtime, comm, slot: int, step: int, run: OutageSegments):
        self.runtime, self.comm, self.slot, self.step, self.run = runtime, comm, slot, step, run

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def sync(self, tensor, op):
        self.run.take(self.step, self.slot, self.comm)
        self.runtime.sync(tensor, op)
        self.run.ended(self.step, self.slot)
        self.step += 1

    def serve(self, *args):
        self.run.take(self.step, self.slot, self.comm)
        self.runtime.serve(*args)
        self.step += 1


# -- the barrier-free parameter server: only the worker whose link is down waits -----------------------------

def _barrier_free(config, workers, steps, outages, schedule, recovery, x0, gradient, lr, timeout, network):
    if schedule:
        raise FaultSettingError(f"failures {list(schedule)} with link outages on a barrier-free parameter server: "
                                f"thread ranks run its outages alone (its failures: strategies/fault_runs.py)")
    for o in outages:
        if o.rank >= workers:
            raise FaultSettingError(f"link outage of server rank {o.rank}: a barrier-free server's own link down is "
                                    f"not run on thread ranks; accepted are worker ranks 0..{workers - 1}")
        if outage_outcome(o.seconds, timeout) == FAILURE:
            raise FaultSettingError(f"link outage seconds = {o.seconds:g} with timeout = {timeout:g} s on a "
                                    f"barrier-free parameter server: it would outlast its server's wait, a failure "
                                    f"its per-worker loop does not recover from on thread ranks; accepted are "
                                    f"outages shorter than the timeout")
    down = {(o.step, o.rank): o.seconds for o in outages}
    ends: dict[int, list[tuple[int, float]]] = {slot: [] for slot in range(workers)}
    records: list[OutageRecord] = []
    lives = {slot: steps for slot in range(workers)}
    server_params = x0.clone().reshape(-1)
    began = time.perf_counter()

    def member(comm):
        if comm.rank >= workers:
            return barrier_free_member(comm, config, workers, lives, steps, x0, gradient, lr, server_params)
        return _worker(comm, config, workers, steps, x0, gradient, down, ends[comm.rank], records, began)

    results = run_threads(workers + config.num_servers(workers), member, timeout=timeout, network=network)
    run = barrier_free_run(workers, steps, (), lives, {slot: results[slot] for slot in range(workers)},
                           results[workers], server_params.reshape(x0.shape).numpy())
    run.wall_s = time.perf_counter() - began
    return OutageRun(run, sorted(records), ends)


def _worker(comm, config, workers, steps, x0, gradient, down, ends, records, began):
    """A barrier-free worker's loop (as fault_runs.barrier_free_member's) with its link taken down at its step."""
    from strategies.fault_records import _grad
    from strategies.parameter_server_async import push_pull

    servers = config.num_servers(workers)
    x = x0.clone().reshape(-1)
    taken = []  # (step, seconds, began, LinkDown)
    for step in range(steps):
        if (seconds := down.get((step, comm.rank))) is not None:
            comm.link_down = LinkDown(seconds)
            taken.append((step, seconds, time.perf_counter() - began, comm.link_down))
        g = _grad(gradient, comm.rank, step, x.reshape(x0.shape)).reshape(-1)
        push_pull(comm, g, workers, servers, config.partition_mb)
        x = g
        ends.append((step, time.perf_counter() - began))
    records += [OutageRecord(step, comm.rank, seconds, STALL, at, link.held_s) for step, seconds, at, link in taken]
    return x.reshape(x0.shape).numpy()
