"""A synchronous parameter server whose shards are chain-replicated (Li et al., OSDI 2014), on thread ranks: a
server failure is covered by a replica, no step lost and no checkpoint needed.

The parameters are split into one shard per server. Shard j's chain is its primary (server j) followed by the
next `replicas` live servers; every server holds its primary shard and a replica of each shard whose chain it is
on. A step: every worker pushes each shard's gradient to that shard's primary; the primary averages the live
workers' pushes and applies the SGD step (x_j -= lr x mean); the new x_j goes down the chain, each replica
storing it and passing it on, the tail acknowledging to the primary; only then does the primary answer the
workers with x_j (an answer a worker receives is on every replica). A step's values are kept once every rank
has them (the harness's barrier), so a step cut short by a death leaves nothing half-written.

A server dying during step s: its chains lose a link; the next live server on each of its primary shards' chains
becomes their primary, holding them as of step s - 1 (the step in flight is redone, no completed step lost); the
chains re-form over the live servers, a new member of a chain copying the shard from its primary. A worker
dying shrinks the barrier to the survivors (ps_shrink). A shard whose whole chain dies in one step is lost, and
so is the run when no server is left: the run ends, cause named. Server failures are counted with their ranks
numbered after the workers' (workers + server index), as in strategies/fault_runs.py.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from strategies.fault_records import FailureRecord, FaultRun, RankFailed, _grad
from strategies.faults import FaultSettingError, RunEnded, check_schedule
from strategies.transport.communicator import RankAborted
from strategies.transport.threads import run_threads


def check_replicas(replicas: int, servers: int) -> None:
    """FaultSettingError unless `replicas` fits `servers` chain-replicated servers: 1 <= replicas < servers."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas < servers:
        raise FaultSettingError(f"recovery.replicas = {replicas!r} with servers = {servers}: each shard's chain is "
                                f"its primary and `replicas` further servers, so accepted are 1 to {servers - 1} "
                                f"(a parameter server with servers >= 2)")


def chains(live_servers: list[int], shards: int, primaries: dict[int, int], replicas: int) -> dict[int, list[int]]:
    """Each shard's chain: its primary, then the next `replicas` live servers after it (in server order, wrapping
    round), as many as there are."""
    out = {}
    for j in range(shards):
        p = live_servers.index(primaries[j])
        length = min(replicas + 1, len(live_servers))
        out[j] = [live_servers[(p + i) % len(live_servers)] for i in range(length)]
    return out


def run_replicated_ps(workers: int, servers: int, replicas: int, steps: int, failures, x0, gradient, lr: float,
                      rejoin_steps: int | None = None, timeout: float = 20.0) -> FaultRun:
    """`steps` synchronous steps of `workers` workers on `servers` chain-replicated servers (thread ranks), the
    failures injected (worker ranks 0..workers-1, server ranks workers..workers+servers-1); see the module doc.
    rejoin_steps: a failed worker's replacement joins that many steps later and fetches x from a peer."""
    check_replicas(replicas, servers)
    schedule = check_schedule(failures, workers, steps, servers)
    x0 = torch.as_tensor(np.array(x0, copy=True)).reshape(-1)
    if x0.numel() < servers:
        raise FaultSettingError(f"{x0.numel()} parameters on {servers} servers: each server needs a shard (>= 1)")
    return _ReplicatedRun(workers, servers, replicas, steps, schedule, x0, gradient, lr, rejoin_steps, timeout).run()


@dataclass(frozen=True)
class _Segment:
    """Steps start..end-1 run by one group of thread ranks (until a failure or a replacement's joining)."""

    start: int
    end: int
    chain: dict[int, list[int]]  # shard -> its chain (server indices), the primary first
    alive: list[int]  # the live worker slots, in position order
    ranks: list[int]  # position -> rank: the live workers, then the live servers (workers + server index)
    dying: dict[int, int]  # rank -> the step it dies in
    finished: threading.Barrier
    done: dict  # "step": the step reached; "ready": the group formed; "died_at": a rank died (perf_counter)


class _ReplicatedRun:
    """One run's state: the shards, their chains and each server's copies, the workers' parameters, the failures
    still to come; segments of steps, each run by one group of thread ranks, and the re-forming after a failure."""

    def __init__(self, workers, servers, replicas, steps, schedule, x0, gradient, lr, rejoin_steps, timeout):
        self.workers, self.replicas, self.steps = workers, replicas, steps
        self.gradient, self.lr, self.rejoin_steps, self.timeout = gradient, lr, rejoin_steps, timeout
        bounds = np.linspace(0, x0.numel(), servers + 1).round().astype(int)
        self.shard_of = [slice(int(bounds[j]), int(bounds[j + 1])) for j in range(servers)]
        self.live_servers = list(range(servers))
        self.primaries = {j: j for j in range(servers)}
        self.chain = chains(self.live_servers, servers, self.primaries, replicas)
        self.store = {s: {j: x0[self.shard_of[j]].clone() for j in range(servers) if s in self.chain[j]}
                      for s in self.live_servers}
        self.params = {slot: x0.clone() for slot in range(workers)}
        self.alive, self.rejoins, self.pending = list(range(workers)), [], list(schedule)
        self.out = FaultRun({}, 0, 0)
        self.step, self.death = 0, None

    def run(self) -> FaultRun:
        while self.step < self.steps:
            segment = self._segment()
            try:
                run_threads(len(segment.ranks), partial(self._rank, segment), timeout=self.timeout)
            except RankFailed as e:
                if self._failed(e.step, segment):
                    continue
                break
            self.step = segment.done["step"]
            if self.death:
                _record(self.out, self.death, segment.done["ready"])
                self.death = None
        if self.death:
            _record(self.out, self.death, time.perf_counter())
        out = self.out
        out.params = {slot: self.params[slot].reshape(-1).numpy() for slot in self.alive}
        out.params["servers"] = {s: {j: v.numpy() for j, v in self.store[s].items()} for s in self.live_servers}
        out.completed_steps = self.step if out.ended is None else out.ended.completed_steps
        return out

    def _segment(self) -> _Segment:
        """The next group: replacements due now join (fetching the parameters from a live peer); it runs until the
        next joining or the end, the failures scheduled in that span on its ranks injected."""
        joining = [slot for at, slot in self.rejoins if at == self.step]
        self.rejoins = [(at, slot) for at, slot in self.rejoins if at != self.step]
        for slot in joining:  # the replacement fetches the parameters from a live peer
            self.params[slot] = self.params[self.alive[0]].clone()
        self.alive = sorted(self.alive + joining)
        end = min([at for at, _ in self.rejoins] + [self.steps])
        ranks = self.alive + [self.workers + s for s in self.live_servers]
        dying = {}
        for f in self.pending:
            if self.step <= f.step < end and f.rank in ranks:
                dying.setdefault(f.rank, f.step)
        return _Segment(self.step, end, self.chain, self.alive, ranks, dying, threading.Barrier(len(ranks)),
                        {"step": self.step, "ready": None, "died_at": None})

    def _rank(self, segment: _Segment, comm) -> None:
        try:
            self._member(segment, comm)
        except threading.BrokenBarrierError as e:
            raise RankAborted("the step's barrier broke: a peer failed") from e
        except BaseException:
            segment.finished.abort()
            raise

    def _member(self, segment: _Segment, comm) -> None:
        """One rank's steps of the segment: a worker's or a server's, each step's values kept once every rank has
        them."""
        position, m, done, finished = comm.rank, len(segment.alive), segment.done, segment.finished
        rank = segment.ranks[position]
        pos = {r - self.workers: i for i, r in enumerate(segment.ranks) if r >= self.workers}  # server -> position
        comm.allgather_object(None)  # the group is formed
        if position == 0:
            done["ready"] = time.perf_counter()
        for s in range(segment.start, segment.end):
            if segment.dying.get(rank) == s:
                done["died_at"] = time.perf_counter()
                raise RankFailed(rank, s)
            if position < m:
                kept = self._worker_step(comm, segment, pos, s)
            else:
                kept = self._server_step(comm, segment, pos, rank - self.workers)
            finished.wait(self.timeout)  # every rank has the step's values: none is kept before all are
            if position < m:
                self.params[segment.alive[position]] = kept
            else:
                self.store[rank - self.workers].update(kept)
            finished.wait(self.timeout)
            if position == 0:
                done["step"] = s + 1
                self.out.steps_run += 1
            finished.wait(self.timeout)

    def _worker_step(self, comm, segment: _Segment, pos: dict[int, int], s: int) -> torch.Tensor:
        """A worker: push each shard's gradient to its primary, take x_j back."""
        slot = segment.alive[comm.rank]
        g = _grad(self.gradient, slot, s, self.params[slot]).reshape(-1)
        for j, holders in segment.chain.items():
            comm.send(g[self.shard_of[j]].clone(), pos[holders[0]])
        x = torch.empty_like(self.params[slot])
        for j, holders in segment.chain.items():
            part = torch.empty_like(x[self.shard_of[j]])
            comm.recv(part, pos[holders[0]])
            x[self.shard_of[j]] = part
        return x

    def _server_step(self, comm, segment: _Segment, pos: dict[int, int], server: int) -> dict[int, torch.Tensor]:
        """A server: as primary, average the live workers' pushes, the SGD step, down the chain; as a replica,
        store and pass on (the tail acknowledging); as primary again, once on every replica, answer the workers."""
        chain, m, store = segment.chain, len(segment.alive), self.store[server]
        mine = [j for j, holders in chain.items() if holders[0] == server]
        new = {}
        for j in mine:  # average the live workers' pushes, the SGD step, down the chain
            total = torch.zeros_like(store[j])
            for w in range(m):
                part = torch.empty_like(total)
                comm.recv(part, w)
                total += part
            new[j] = store[j] - self.lr * total / m
            if len(chain[j]) > 1:
                comm.send(new[j].clone(), pos[chain[j][1]])
        depth = max(len(h) for h in chain.values())
        for d in range(1, depth):  # replicas, link by link: store, pass on, the tail acknowledges
            for j, holders in chain.items():
                if len(holders) > d and holders[d] == server:
                    got = torch.empty_like(store[j])
                    comm.recv(got, pos[holders[d - 1]])
                    new[j] = got
                    if d + 1 < len(holders):
                        comm.send(got.clone(), pos[holders[d + 1]])
                    else:
                        comm.send(torch.ones(1), pos[holders[0]])
        for j in mine:  # on every replica now: answer the workers
            if len(chain[j]) > 1:
                comm.recv(torch.empty(1), pos[chain[j][-1]])
            for w in range(m):
                comm.send(new[j].clone(), w)
        return new

    def _failed(self, failed_step: int, segment: _Segment) -> bool:
        """After rank(s) died during `failed_step`: the dead workers leave (a replacement due later if
        rejoin_steps), the chains re-form over the live servers; the step in flight is redone. False when the run
        ends (no worker left, or a shard lost every holder)."""
        dead = sorted(f.rank for f in self.pending if f.step == failed_step and f.rank in segment.ranks)
        self.pending = [f for f in self.pending if not (f.step == failed_step and f.rank in dead)]
        if self.death:
            _record(self.out, self.death, segment.done["ready"] or time.perf_counter())
        self.step = failed_step  # the step in flight is redone: nothing completed is lost
        dead_workers = [r for r in dead if r < self.workers]
        dead_servers = [r - self.workers for r in dead if r >= self.workers]
        self.alive = [slot for slot in self.alive if slot not in dead_workers]
        for slot in dead_workers:
            self.params.pop(slot)
        if self.rejoin_steps is not None:
            self.rejoins += [(failed_step + self.rejoin_steps, slot) for slot in dead_workers]
        try:
            if not self.alive:
                raise RunEnded(f"rank(s) {dead} failed during step {failed_step}: no worker left", failed_step)
            self._reform(dead_servers, failed_step)
        except RunEnded as ended:
            self.out.ended = ended
            self.out.failures += [FailureRecord(failed_step, r, 0, math.nan, len(self.alive)) for r in dead]
            self.death = None
            return False
        self.death = (segment.done["died_at"], dead, failed_step, len(self.alive))
        return True

    def _reform(self, dead_servers: list[int], step: int) -> None:
        """The chains after `dead_servers` died: each shard's primary is its first live holder (its copy as of the
        last completed step); new chain members copy the shard from it. RunEnded when a shard lost every holder."""
        if not dead_servers:
            return
        live = [s for s in self.live_servers if s not in dead_servers]
        for j, holders in self.chain.items():
            survivors = [s for s in holders if s in live]
            if not survivors:
                raise RunEnded(f"server rank(s) {[self.workers + s for s in dead_servers]} failed during step "
                               f"{step}: shard {j} lost its primary and all {len(holders) - 1} replica(s) at once",
                               step)
            self.primaries[j] = survivors[0]
        store = self.store
        for s in dead_servers:
            store.pop(s)
        new_chain = chains(live, len(self.chain), self.primaries, self.replicas)
        for s in live:  # a server keeps the shards whose chain it is on
            store[s] = {j: v for j, v in store[s].items() if s in new_chain[j]}
        for j, holders in new_chain.items():
            for s in holders[1:]:
                if j not in store[s]:  # a new link: its copy from the primary (the re-replication)
                    store[s][j] = store[holders[0]][j].clone()
        self.live_servers, self.chain = live, new_chain


def _record(out: FaultRun, death, ready_at: float) -> None:
    died_at, dead, step, survivors = death
    for rank in dead:
        out.failures.append(FailureRecord(step, rank, 0, ready_at - died_at, survivors))
