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
    bounds = np.linspace(0, x0.numel(), servers + 1).round().astype(int)
    shard_of = [slice(int(bounds[j]), int(bounds[j + 1])) for j in range(servers)]
    live_servers = list(range(servers))
    primaries = {j: j for j in range(servers)}
    chain = chains(live_servers, servers, primaries, replicas)
    store = {s: {j: x0[shard_of[j]].clone() for j in range(servers) if s in chain[j]} for s in live_servers}
    params = {slot: x0.clone() for slot in range(workers)}
    alive, rejoins, pending = list(range(workers)), [], list(schedule)
    out = FaultRun({}, 0, 0)
    step, death = 0, None

    while step < steps:
        joining = [slot for at, slot in rejoins if at == step]
        rejoins = [(at, slot) for at, slot in rejoins if at != step]
        for slot in joining:  # the replacement fetches the parameters from a live peer
            params[slot] = params[alive[0]].clone()
        alive = sorted(alive + joining)
        end = min([at for at, _ in rejoins] + [steps])
        m, k = len(alive), len(live_servers)
        ranks = alive + [workers + s for s in live_servers]  # position -> rank
        dying = {}
        for f in pending:
            if step <= f.step < end and f.rank in ranks:
                dying.setdefault(f.rank, f.step)
        finished = threading.Barrier(m + k)
        done = {"step": step, "ready": None, "died_at": None}

        def body(comm, chain=chain, alive=alive, m=m, ranks=ranks, dying=dying, finished=finished, done=done,
                 start=step, end=end):
            try:
                member(comm, chain, alive, m, ranks, dying, finished, done, start, end)
            except threading.BrokenBarrierError as e:
                raise RankAborted("the step's barrier broke: a peer failed") from e
            except BaseException:
                finished.abort()
                raise

        def member(comm, chain, alive, m, ranks, dying, finished, done, start, end):
            position = comm.rank
            rank = ranks[position]
            where = {r: i for i, r in enumerate(ranks)}

            def pos(server):
                return where[workers + server]

            comm.allgather_object(None)  # the group is formed
            if position == 0:
                done["ready"] = time.perf_counter()
            for s in range(start, end):
                if dying.get(rank) == s:
                    done["died_at"] = time.perf_counter()
                    raise RankFailed(rank, s)
                kept = {}
                if position < m:  # a worker: push each shard's gradient to its primary, take x_j back
                    slot = alive[position]
                    g = _grad(gradient, slot, s, params[slot]).reshape(-1)
                    for j, holders in chain.items():
                        comm.send(g[shard_of[j]].clone(), pos(holders[0]))
                    x = torch.empty_like(params[slot])
                    for j, holders in chain.items():
                        part = torch.empty_like(x[shard_of[j]])
                        comm.recv(part, pos(holders[0]))
                        x[shard_of[j]] = part
                    kept = {"worker": x}
                else:
                    server = rank - workers
                    mine = [j for j, holders in chain.items() if holders[0] == server]
                    new = {}
                    for j in mine:  # average the live workers' pushes, the SGD step, down the chain
                        total = torch.zeros_like(store[server][j])
                        for w in range(m):
                            part = torch.empty_like(total)
                            comm.recv(part, w)
                            total += part
                        new[j] = store[server][j] - lr * total / m
                        if len(chain[j]) > 1:
                            comm.send(new[j].clone(), pos(chain[j][1]))
                    depth = max(len(h) for h in chain.values())
                    for d in range(1, depth):  # replicas, link by link: store, pass on, the tail acknowledges
                        for j, holders in chain.items():
                            if len(holders) > d and holders[d] == server:
                                got = torch.empty_like(store[server][j])
                                comm.recv(got, pos(holders[d - 1]))
                                new[j] = got
                                if d + 1 < len(holders):
                                    comm.send(got.clone(), pos(holders[d + 1]))
                                else:
                                    comm.send(torch.ones(1), pos(holders[0]))
                    for j in mine:  # on every replica now: answer the workers
                        if len(chain[j]) > 1:
                            comm.recv(torch.empty(1), pos(chain[j][-1]))
                        for w in range(m):
                            comm.send(new[j].clone(), w)
                    kept = {"server": new}
                finished.wait(timeout)  # every rank has the step's values: none is kept before all are
                if "worker" in kept:
                    params[alive[position]] = kept["worker"]
                else:
                    store[rank - workers].update(kept["server"])
                finished.wait(timeout)
                if position == 0:
                    done["step"] = s + 1
                    out.steps_run += 1
                finished.wait(timeout)

        try:
            run_threads(m + k, body, timeout=timeout)
        except RankFailed as e:
            failed_step = e.step
            dead = sorted(f.rank for f in pending if f.step == failed_step and f.rank in ranks)
            pending = [f for f in pending if not (f.step == failed_step and f.rank in dead)]
            if death:
                _record(out, death, done["ready"] or time.perf_counter())
            step = failed_step  # the step in flight is redone: nothing completed is lost
            dead_workers = [r for r in dead if r < workers]
            dead_servers = [r - workers for r in dead if r >= workers]
            alive = [slot for slot in alive if slot not in dead_workers]
            for slot in dead_workers:
                params.pop(slot)
            if rejoin_steps is not None:
                rejoins += [(failed_step + rejoin_steps, slot) for slot in dead_workers]
            try:
                if not alive:
                    raise RunEnded(f"rank(s) {dead} failed during step {failed_step}: no worker left", failed_step)
                live_servers, primaries, chain = _reform(dead_servers, live_servers, primaries, chain, store,
                                                         replicas, failed_step, workers)
            except RunEnded as ended:
                out.ended = ended
                out.failures += [FailureRecord(failed_step, r, 0, math.nan, len(alive)) for r in dead]
                death = None
                break
            death = (done["died_at"], dead, failed_step, len(alive))
            continue
        step = done["step"]
        if death:
            _record(out, death, done["ready"])
            death = None
    if death:
        _record(out, death, time.perf_counter())
    out.params = {slot: params[slot].reshape(-1).numpy() for slot in alive}
    out.params["servers"] = {s: {j: v.numpy() for j, v in store[s].items()} for s in live_servers}
    out.completed_steps = step if out.ended is None else out.ended.completed_steps
    return out


def _reform(dead_servers, live_servers, primaries, chain, store, replicas, step, workers):
    """The chains after `dead_servers` died: each shard's primary is its first live holder (its copy as of the
    last completed step); new chain members copy the shard from it. RunEnded when a shard lost every holder."""
    if not dead_servers:
        return live_servers, primaries, chain
    live = [s for s in live_servers if s not in dead_servers]
    for j, holders in chain.items():
        survivors = [s for s in holders if s in live]
        if not survivors:
            raise RunEnded(f"server rank(s) {[workers + s for s in dead_servers]} failed during step {step}: shard "
                           f"{j} lost its primary and all {len(holders) - 1} replica(s) at once", step)
        primaries[j] = survivors[0]
    for s in dead_servers:
        store.pop(s)
    new_chain = chains(live, len(chain), primaries, replicas)
    for s in live:  # a server keeps the shards whose chain it is on
        store[s] = {j: v for j, v in store[s].items() if s in new_chain[j]}
    for j, holders in new_chain.items():
        for s in holders[1:]:
            if j not in store[s]:  # a new link: its copy from the primary (the re-replication)
                store[s][j] = store[holders[0]][j].clone()
    return live, primaries, new_chain


def _record(out: FaultRun, death, ready_at: float) -> None:
    died_at, dead, step, survivors = death
    for rank in dead:
        out.failures.append(FailureRecord(step, rank, 0, ready_at - died_at, survivors))
