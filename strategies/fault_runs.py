"""Training with failures on thread ranks: a scripted failure, each recovery mode, no Ray needed.

    run = run_with_failures("ring", workers=4, steps=10, failures=[Failure(step=3, rank=2)],
                            recovery=Recovery("elastic", rejoin_steps=2), x0=np.zeros(5), gradient=grad, lr=0.5)

The model is any parameter vector x and a gradient(slot, step, x) per worker slot (its data shard), so a test can
work the survivors' result out by hand. Every step each live worker computes its gradient and the strategy
synchronizes it (allreduce, parameter server) or the parameters after a local step (decentralized); then x moves
by lr. A failing rank raises in the step it dies in, before its part of the step leaves: the fabric aborts its
peers' waits (the transport's detection of a dead peer), and the run recovers as its mode says
(strategies/faults.py), on fresh thread ranks of the new size: survivors re-form (elastic, ps_shrink), re-weight
(reweight) or every rank restarts from the last checkpoint (checkpoint_restart). A barrier-free parameter server
never waits for a worker: the failed worker just stops pushing, the others run on, nothing is re-formed.

The run returns what happened: the parameters of every live slot, completed steps, every failure's steps lost,
measured detection seconds (from the death until every rank has stopped) and recovery seconds (from there to the
re-formed group's first step), the mixing matrix after each re-weighting; a failure its mode cannot recover from
ends the run (`ended`), its completed steps kept. The same recovery runs on Ray actors, the failing one killed:
experiments/pipeline/ray_faults.py.
"""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import torch

import strategies
from strategies.decentralized import Decentralized
from strategies.fault_records import FailureRecord, FaultRun, Mixing, RankFailed, _grad  # noqa: F401 - fault_runs.* names
from strategies.faults import (
    CHECKPOINT_RESTART,
    ELASTIC,
    NONE,
    PS_SHRINK,
    REWEIGHT,
    FaultSettingError,
    Recovery,
    RunEnded,
    check_fits,
    check_schedule,
    connected,
    metropolis,
    spectral_gap,
    survivors_graph,
)
from strategies.parameter_server_async import ShardServer, push_pull
from strategies.transport.communicator import RankAborted
from strategies.transport.threads import run_threads


def run_with_failures(name: str, workers: int, steps: int, failures, recovery: Recovery, x0, gradient,
                      lr: float, timeout: float = 20.0, **params) -> FaultRun:
    """Run `steps` steps of `name` on `workers` thread ranks with the failures injected; see the module doc."""
    config = strategies.make(name, **params)
    servers = config.num_servers(workers)
    schedule = check_schedule(failures, workers, steps, servers)
    check_fits(recovery.mode, config, workers, schedule, recovery.replicas)
    x0 = torch.as_tensor(np.array(x0, copy=True))
    if recovery.replicas:  # chain-replicated servers: strategies/fault_replicas.py
        from strategies.fault_replicas import run_replicated_ps

        return run_replicated_ps(workers, servers, recovery.replicas, steps, schedule, x0.numpy(), gradient, lr,
                                 recovery.rejoin_steps, timeout)
    if getattr(config, "asynchronous", False):
        if recovery.mode != PS_SHRINK:
            raise FaultSettingError(f"recovery.mode = {recovery.mode!r} with a barrier-free parameter server "
                                    f"(staleness={config.staleness!r}, backups={config.backups}): thread ranks run "
                                    f"its failures with ps_shrink only (its servers serve a whole run at once)")
        return _barrier_free(config, workers, steps, schedule, x0, gradient, lr, timeout)
    return Segments(config, workers, steps, schedule, recovery, x0, gradient, lr, timeout).run()


class Segments:
    """The run as segments of fixed membership, each on fresh thread ranks; a failure ends a segment.

    The recovery (which slots go on, from which step and state, what each failure cost) is this class's; where a
    segment runs is `_segment`'s: thread ranks here, Ray actors in experiments/pipeline/ray_faults.py. A segment
    raises RankFailed after setting `_died_at` (the death) and `_detected_at` (when the run knew), both on `clock`.
    """

    clock = staticmethod(time.perf_counter)
    network = None  # an emulated network for the thread ranks (strategies/fault_outages.py sets one), or none

    def __init__(self, config, workers, steps, schedule, recovery, x0, gradient, lr, timeout):
        self.config, self.workers, self.steps, self.recovery = config, workers, steps, recovery
        self.pending = list(schedule)  # failures still to happen (each happens once)
        self.gradient, self.lr, self.timeout = gradient, lr, timeout
        self.alive = list(range(workers))  # worker slots running, in rank order
        self.x0 = x0
        self.params = {slot: x0.clone() for slot in self.alive}
        self.step = 0  # the next step to run
        self.steps_run = 0
        self.rejoins: list[tuple[int, int]] = []  # (step, slot): a replacement joins at that step
        self.checkpoint = (0, {slot: x0.clone() for slot in self.alive})
        self.mixing: Mixing | None = None  # decentralized after a re-weighting
        self.out = FaultRun({}, 0, 0)
        self._died_at = self._detected_at = 0.0

    def run(self) -> FaultRun:
        began = self.clock()
        death = None  # (death, detection, failed slots, step, steps lost, survivors): awaiting the next first step
        while self.step < self.steps:
            joining = [slot for at, slot in self.rejoins if at == self.step]
            self.rejoins = [(at, slot) for at, slot in self.rejoins if at != self.step]
            self.alive = sorted(self.alive + joining)
            ready: list[float] = []
            try:
                self._segment(self.step, self._segment_end(), joining, ready)
                if death:
                    self._record(death, ready[0])
                    death = None
                continue
            except RunEnded as ended:  # a failure the segment could not attribute to the schedule: cause named
                self.out.ended = ended
                break
            except RankFailed as e:
                if death:  # a failure before the recovered group's first step completed: counted from the first
                    self._record(death, ready[0] if ready else self._detected_at)
                    death = None
                failed_step = e.step
                dead = sorted(f.rank for f in self.pending if f.step == failed_step and f.rank in self._ranks())
                self.pending = [f for f in self.pending if not (f.step == failed_step and f.rank in dead)]
                try:
                    death = self._recover(failed_step, dead, self._died_at, self._detected_at)
                    # a replacement whose segment was cut before it kept a state (the sweep keeps one per completed
                    # step) joins again, fetching from a peer, at the step redone: else it would start afresh
                    again = [s for s in joining if s in self.alive and s not in self.params]
                    self.alive = [s for s in self.alive if s not in again]
                    self.rejoins += [(self.step, s) for s in again]
                except RunEnded as ended:  # recorded with its cause; no recovery, so no recovery seconds
                    self.out.ended = ended
                    self.out.failures += [FailureRecord(failed_step, rank, 0, math.nan, len(self.alive),
                                                        self._detected_at - self._died_at) for rank in dead]
                    break
        if death:
            self._record(death, self.clock())
        self.out.params = {slot: self.params[slot].numpy() for slot in self.alive}
        self.out.completed_steps = self.step
        self.out.steps_run = self.steps_run
        self.out.wall_s = self.clock() - began
        return self.out

    def _ranks(self) -> set[int]:
        """Ranks that can fail now: the live worker slots and the server ranks (numbered after all workers)."""
        return set(self.alive) | set(range(self.workers, self.workers + self.config.num_servers(self.workers)))

    def _segment_end(self) -> int:
        return min([at for at, _ in self.rejoins] + [self.steps])

    def _recover(self, step: int, dead: list[int], died_at: float, detected_at: float):
        """The mode's answer to `dead` failing during `step`: (death, detection, dead, step, steps lost,
        survivors)."""
        mode = self.recovery.mode
        if mode == NONE:  # the failed ranks' parameters are gone with them
            self.alive = [s for s in self.alive if s not in dead]
            raise RunEnded(f"rank(s) {dead} failed during step {step} and the run has no recovery "
                           f"(recovery.mode = 'none')", step)
        if mode == CHECKPOINT_RESTART:  # every rank restarts, the failed replaced, from the last checkpoint
            at, saved = self.checkpoint
            self.params = {slot: p.clone() for slot, p in saved.items()}
            self.alive = sorted(saved)
            self.step = at
            return died_at, detected_at, dead, step, step - at, len(self.alive)
        if any(r >= self.workers for r in dead):
            raise RunEnded(f"server rank(s) {[r for r in dead if r >= self.workers]} failed during step {step}: "
                           f"recovery mode {mode!r} has no replica of a server", step)
        self.alive = [s for s in self.alive if s not in dead]
        if not self.alive:
            raise RunEnded(f"rank(s) {dead} failed during step {step}: no worker left", step)
        for slot in dead:
            self.params.pop(slot, None)  # a replacement that dies in its first step has kept no state yet
        if mode in (ELASTIC, PS_SHRINK) and self.recovery.rejoin_steps is not None:
            self.rejoins += [(step + self.recovery.rejoin_steps, slot) for slot in dead]
        if mode == REWEIGHT:
            gone = [r for r in range(self.workers) if r not in self.alive]
            alive, peers = survivors_graph(self.config, self.workers, gone)
            if not connected(peers):
                graph = {rank: [alive[j] for j in near] for rank, near in zip(alive, peers)}
                raise RunEnded(f"rank(s) {dead} failed during step {step}: the survivors' graph {graph} (rank: "
                               f"its neighbours) is disconnected, so averaging can never reach every survivor "
                               f"(spectral gap 0)", step)
            w = metropolis(peers)
            self.mixing = Mixing(step, tuple(alive), w, spectral_gap(w))
            self.out.mixings.append(self.mixing)
        self.step = step  # the survivors redo the step in flight: no completed step is lost
        return died_at, detected_at, dead, step, 0, len(self.alive)

    def _record(self, death, ready_at: float) -> None:
        died_at, detected_at, dead, step, lost, survivors = death
        for rank in dead:
            self.out.failures.append(FailureRecord(step, rank, lost, ready_at - detected_at, survivors,
                                                   detected_at - died_at))

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        """Steps start..end-1 on len(alive) worker thread ranks (+ servers); RankFailed when one dies."""
        config, alive = self.config, list(self.alive)
        m = len(alive)
        servers = config.num_servers(m)
        dying: dict[int, int] = {}  # rank -> the step it dies in: its first pending failure in the segment
        for f in sorted(self.pending):
            if start <= f.step < end:
                dying.setdefault(f.rank, f.step)
        self._died_at = 0.0
        donor = next((slot for slot in alive if slot not in joining), None)

        # a step counts once every rank has its result (a neighbour-averaging rank can finish a step its peer's death
        # left others unable to finish): barriers of the harness's own, as the fabric's control plane is aborted
        # by a death and a peer still leaving the previous step's exchange would be caught in it
        finished = threading.Barrier(m + servers)

        def body(comm):
            try:
                member(comm)
            except threading.BrokenBarrierError as e:  # a consequence of the rank that failed, never the cause
                raise RankAborted("the step's barrier broke: a peer failed") from e
            except BaseException:
                finished.abort()
                raise

        def member(comm):
            position = comm.rank
            slot = alive[position] if position < m else self.workers + position - m  # servers: ranks after workers
            runtime = self._bind(comm, m)
            if joining and donor is not None:  # a replacement fetches the parameters from a peer
                fetch = self.params[donor] if slot == donor else torch.empty_like(self.params[donor])
                if slot == donor:
                    for j in joining:
                        comm.send(fetch, alive.index(j))
                elif slot in joining:
                    comm.recv(fetch, alive.index(donor))
                    self.params[slot] = fetch
            comm.allgather_object(None)  # the group is formed: every rank bound, the replacements hold x
            if position == 0:
                ready.append(time.perf_counter())
            for step in range(start, end):
                if dying.get(slot) == step:
                    self._died_at = time.perf_counter()
                    raise RankFailed(slot, step)
                if position >= m:
                    runtime.serve(self.x0.numel(), self.x0.dtype, "mean")  # (a joining slot has no x yet)
                    for _ in range(3):  # the workers' three waits of the step
                        finished.wait(self.timeout)
                    continue
                x = train_step(config, runtime, self.gradient, self.lr, slot, step, self.params[slot])
                finished.wait(self.timeout)  # every rank has the step's result: none is kept before all are
                self.params[slot] = x
                finished.wait(self.timeout)
                if position == 0:
                    self._completed(step)  # counted and checkpointed once every rank kept its result
                finished.wait(self.timeout)

        try:
            run_threads(m + servers, body, timeout=self.timeout, network=self.network)
        except RankFailed:
            self._detected_at = self.clock()  # every thread rank has stopped: the run knows
            raise

    def _completed(self, step: int, saved: dict | None = None) -> None:
        """Step `step` is complete on every rank; `saved`: the parameters then, where they are not in self.params
        (ranks elsewhere report them), for a checkpoint."""
        self.step = step + 1
        self.steps_run += 1
        if self.checkpoints_at(self.step):
            saved = self.params if saved is None else saved
            self.checkpoint = (self.step, {slot: saved[slot].clone() for slot in self.alive})

    def checkpoints_at(self, completed: int) -> bool:
        """Whether the run checkpoints once `completed` steps are complete."""
        return self.recovery.mode == CHECKPOINT_RESTART and completed % self.recovery.checkpoint_every == 0

    def _bind(self, comm, m: int):
        return bind(self.config, comm, m, None if self.mixing is None else self.mixing.matrix)


def bind(config, comm, m: int, mixing: np.ndarray | None):
    """The strategy's runtime on a rank of a group of m workers (+ servers): after a re-weighting, the
    survivors' mixing matrix."""
    if mixing is not None and comm.rank < m:
        return _Reweighted(config, comm, m, mixing)
    return config.bind(comm, m)


def train_step(config, runtime, gradient, lr: float, slot: int, step: int, x: torch.Tensor) -> torch.Tensor:
    """One worker's step: its gradient synchronized, then x moves by lr (allreduce, parameter server); or a local
    step, then the parameters averaged with its neighbours (decentralized). Returns the new x."""
    if config.role == strategies.base.PARAMETERS:
        x = x - lr * _grad(gradient, slot, step, x)
        runtime.sync(x, "mean")
        return x
    g = _grad(gradient, slot, step, x)
    runtime.sync(g, "mean")
    return x - lr * g


class _Reweighted(Decentralized):
    """Decentralized averaging with a given doubly stochastic W over the survivors (positions 0..m-1)."""

    def __init__(self, config, comm, workers, w: np.ndarray):
        super().__init__(config, comm, workers)
        row = w[comm.rank]
        near = [j for j in range(workers) if j != comm.rank and row[j] > 0]
        self.plan = (near, [(j, float(row[j])) for j in near], float(row[comm.rank]))

    def _plan(self, round):
        return self.plan


# -- the barrier-free parameter server: a failed worker stops pushing, nothing else changes ------------------

class _Lives(ShardServer):
    """A server's shard served to each worker for as many steps as that worker lives (the failure detector
    tells the server; on a cluster, the heartbeat)."""

    def __init__(self, *args, lives: dict[int, int], **kwargs):
        super().__init__(*args, **kwargs)
        self.lives = lives

    def _serve_worker(self, worker: int, steps: int) -> None:
        super()._serve_worker(worker, self.lives[worker])


def _barrier_free(config, workers, steps, schedule, x0, gradient, lr, timeout) -> FaultRun:
    lives = barrier_free_lives(workers, steps, schedule)
    server_params = x0.clone().reshape(-1)  # the servers' shards of one vector, each updating its own
    results = run_threads(workers + config.num_servers(workers), lambda comm: barrier_free_member(
        comm, config, workers, lives, steps, x0, gradient, lr, server_params), timeout=timeout)
    return barrier_free_run(workers, steps, schedule, lives, {slot: results[slot] for slot in range(workers)},
                            results[workers], server_params.reshape(x0.shape).numpy())


def barrier_free_lives(workers: int, steps: int, schedule) -> dict[int, int]:
    """Steps each worker slot pushes: until its first failure."""
    lives = {slot: steps for slot in range(workers)}
    for f in schedule:
        lives[f.rank] = min(lives[f.rank], f.step)
    return lives


def barrier_free_member(comm, config, workers, lives, steps, x0, gradient, lr, server_params, touched=None,
                        die=None):
    """One rank of a barrier-free run. A server serves each worker the pushes of its life into `server_params`
    (its shards of it; `touched` marks them) and returns its push records; a worker pushes for its life and
    returns the last reply (the server's parameters), or, with `die`, calls die(rank, step) in the step it fails
    in."""
    servers = config.num_servers(workers)
    if comm.rank >= workers:
        def update(bucket, scaled, where):  # the server's SGD on its unit: x -= lr * g / n (scaled by 1/n already)
            server_params[where] -= lr * scaled
            if touched is not None:
                touched[where] = True
            return server_params[where]

        server = _Lives(comm, workers, servers, [server_params.numel()], x0.dtype, update, config.staleness,
                        config.backups, "cpu", "update", config.partition_mb, lives=lives)
        return server.run(steps)
    x = x0.clone().reshape(-1)
    for step in range(lives[comm.rank]):
        g = _grad(gradient, comm.rank, step, x.reshape(x0.shape)).reshape(-1)
        push_pull(comm, g, workers, servers, config.partition_mb)  # the reply: the server's parameters
        x = g
    if die is not None and lives[comm.rank] < steps:
        die(comm.rank, lives[comm.rank])
    return x.reshape(x0.shape).numpy()


def barrier_free_run(workers, steps, schedule, lives, finals, pushed, server_params,
                     detection_s: float = math.nan) -> FaultRun:
    """The barrier-free run's outcome: the live workers' last replies, the server's parameters, the pushes each
    worker made (counted on server 0's first unit: every unit sees each push), a record per failure (nothing
    re-formed, no step lost)."""
    pushes = {slot: sum(1 for r in pushed if r.worker == slot and r.unit == 0) for slot in range(workers)}
    records = [FailureRecord(f.step, f.rank, 0, 0.0, sum(1 for life in lives.values() if life > f.step),
                             detection_s) for f in schedule]
    alive = {slot: finals[slot] for slot in range(workers) if lives[slot] == steps}
    return FaultRun({**alive, "server": server_params}, steps, steps, records, pushes=pushes)
