"""Failures on Ray actors: a scripted rank really dies, the survivors detect it, and the run recovers on them.

    run = run_with_failures_ray("ring", workers=4, steps=10, failures=[Failure(step=3, rank=2)],
                                recovery=Recovery("elastic"), x0=np.zeros(5), gradient=grad, lr=0.5)

The problem, the recovery and the result are strategies/fault_runs.py's (`Segments`: which slots go on, from which
step and state, what each failure cost); only a segment runs elsewhere: every rank a Ray actor of one placement
group (experiments/cluster/group.py), joined by torch.distributed, its messages over the sockets transport (or
gloo). A segment is one call on every member actor; the parameters stay in the actors (their state) between
segments; the driver reads them at each segment's end. A checkpoint is written by every rank when it takes it, to
the run's log (an actor apart from the ranks: the checkpoint store, which outlives a rank's death).

- The death: the failing rank kills its own process with SIGKILL at the start of its step, before its part of the
  step leaves (what ray.kill does to an actor, without Python's cleanup: the kernel closes its sockets). The rank
  kills itself rather than the driver killing it because only the rank knows when it reaches its step: a driver's
  kill would land wherever the rank happens to be. Just before, it tells the run's log its time (a Ray
  call it waits for, so the time is a little before the death: the detection is overstated by that round trip).
- The detection: a peer waiting on the dead rank fails at once on its closed connection; every rank that fails
  closes its own connections and leaves its process group, so a rank waiting on it fails at once too, and the
  failure reaches every survivor within milliseconds, whatever the topology (the communicator's timeout is only
  the backstop). The detection time is when the driver holds every survivor's report and Ray's word that the
  actor died.
- The recovery: elastic, ps_shrink and reweight re-form a process group of the survivors in their own processes
  (their parameters kept; WorkerGroup.reform), on the same transport; checkpoint_restart starts a replacement
  actor in the dead one's place (WorkerGroup.replace, timed), re-forms the group and loads the last checkpoint on
  every rank; a replacement joining later (rejoin_steps) starts the same way and fetches the parameters from a
  peer. The recovery time is from the detection to the re-formed group's first step.

Times are time.time() on each process: one machine (the emulated cluster) shares its clock. A barrier-free
parameter server is refused here (its servers serve a whole run in one call; thread ranks run it).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

import numpy as np
import ray
import torch
from ray.exceptions import RayActorError

import strategies
from experiments.cluster.group import STARTUP_TIMEOUT_S, GroupError, WorkerGroup
from strategies.fault_runs import (
    FaultRun,
    RankFailed,
    Segments,
    barrier_free_lives,
    barrier_free_member,
    barrier_free_run,
    bind,
    train_step,
)
from strategies.faults import CHECKPOINT_RESTART, PS_SHRINK, FaultSettingError, RunEnded, check_fits, check_schedule


def run_with_failures_ray(name: str, workers: int, steps: int, failures, recovery, x0, gradient, lr: float,
                          timeout: float = 20.0, p2p: str = "sockets", network=None, host: RayFaultHost | None = None,
                          **params) -> FaultRun:
    """`steps` steps of `name` on `workers` Ray actors (+ servers), the failures injected; needs Ray running
    (experiments.cluster.ray_runtime.ensure_ray). Same arguments and result as strategies.fault_runs'; `host`
    keeps the actors for the next run (else they are started and stopped here)."""
    config = strategies.make(name, **params)
    servers = config.num_servers(workers)
    schedule = check_schedule(failures, workers, steps, servers)
    check_fits(recovery.mode, config, workers, schedule)
    if config.asynchronous and (recovery.mode != PS_SHRINK or p2p != "gloo"):
        raise FaultSettingError(f"a barrier-free parameter server (staleness={config.staleness!r}, backups="
                                f"{config.backups}) with recovery.mode = {recovery.mode!r} and p2p = {p2p!r} on Ray "
                                f"actors: accepted are mode 'ps_shrink' (nothing to re-form) over p2p 'gloo' (its "
                                f"server takes each worker's pushes on a thread of its own; the sockets transport "
                                f"moves a rank's messages from one thread at a time)")
    if not (isinstance(timeout, int | float) and timeout > 0):
        raise ValueError(f"timeout {timeout!r}: accepted are seconds > 0")
    x0 = torch.as_tensor(np.array(x0, copy=True))
    own = host is None
    host = host or RayFaultHost()
    try:
        group, log = host.take(workers + servers, timeout)
        if config.asynchronous:
            return _barrier_free(config, workers, steps, schedule, x0, gradient, lr, timeout, group, log, network)
        return RaySegments(config, workers, steps, schedule, recovery, x0, gradient, lr, timeout, group=group,
                           log=log, p2p=p2p, network=network).run()
    finally:
        if own:
            host.close()


class RayFaultHost:
    """The actors of fault runs of one size, kept from run to run (an actor holding torch takes seconds to start):
    before each run, the actors a failure killed are replaced and the group is re-formed by the run."""

    def __init__(self, num_cpus: float = 1):
        self.num_cpus = num_cpus
        self.group: WorkerGroup | None = None
        self.log = None

    def take(self, world: int, timeout: float) -> tuple[WorkerGroup, object]:
        if self.group is not None and (self.group.broken or self.group.world_size != world
                                       or self.group.timeout != timeout):  # broken: a re-forming that failed
            self.group.shutdown()
            self.group = None
        if self.group is None:
            self.group = WorkerGroup(world, num_cpus=self.num_cpus, timeout=timeout)
        else:  # a run before killed some: replace them (their bundles are free)
            probes = {a.address.remote(): i for i, a in enumerate(self.group.actors)}
            for ref, index in probes.items():
                try:
                    ray.get(ref, timeout=STARTUP_TIMEOUT_S)
                except RayActorError:
                    self.group.replace(index)
        if self.log is None:
            self.log = RunLog.options(num_cpus=0).remote()
        ray.get(self.log.clear.remote())  # nothing left from a run before
        return self.group, self.log

    def close(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None
        if self.log is not None:
            ray.kill(self.log)
            self.log = None

    def __enter__(self) -> RayFaultHost:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@ray.remote
class RunLog:
    """The run's durable side, apart from its ranks: where a failing rank leaves (slot, step, time) just before it
    kills itself, and where every rank writes its checkpoint when it takes it (a checkpoint must outlive its rank)."""

    def __init__(self):
        self.deaths: list[tuple[int, int, float]] = []
        self.checkpoints: dict[int, dict[int, np.ndarray]] = {}
        self.rows: list[dict] = []
        self.latest: dict = {}  # slot -> (steps completed, state): a sweep's latest checkpoint

    def record(self, slot: int, step: int, at: float) -> None:
        self.deaths.append((slot, step, at))

    def take(self) -> list[tuple[int, int, float]]:
        deaths, self.deaths = self.deaths, []
        return deaths

    def save(self, slot: int, completed: int, x: np.ndarray) -> None:
        self.checkpoints.setdefault(completed, {})[slot] = x

    def saved(self, completed: int) -> dict[int, np.ndarray]:
        return self.checkpoints.get(completed, {})

    def save_latest(self, slot: int, completed: int, state) -> None:
        """A sweep's checkpoint (a model's state): only each slot's latest is kept, so a long run holds one."""
        self.latest[slot] = (completed, state)

    def latest_saved(self) -> dict:
        return dict(self.latest)

    def keep(self, rows: list[dict]) -> None:
        """A dying rank's completed steps' rows (a sweep's run), which its process takes with it otherwise."""
        self.rows += rows

    def kept(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows

    def clear(self) -> None:
        self.deaths, self.checkpoints, self.rows, self.latest = [], {}, [], {}


@dataclass(frozen=True)
class _Plan:
    """What every member of a segment runs: steps start..end-1, who dies when, what it loads."""

    config: object
    members: tuple[int, ...]  # the slot at each position: live workers in rank order, then server ranks
    workers: int  # how many members are workers (positions 0..workers-1)
    start: int
    end: int
    dying: dict  # slot -> the step it dies in
    joining: tuple[int, ...]  # replacements that fetch the parameters from `donor`
    donor: int | None
    load: dict  # slot -> parameters the driver hands it (the start, a checkpoint); the others keep their own
    mixing: np.ndarray | None
    gradient: object
    lr: float
    checkpoint_every: int  # 0: no checkpoints
    like: np.ndarray  # the parameters' shape and dtype (servers)
    log: object


@dataclass
class _Report:
    slot: int
    ready: float | None  # when the group was formed (every member bound, the replacements holding x)
    done: int  # the next step: steps before it are complete on this rank
    x: np.ndarray | None  # a worker's parameters after step done - 1
    error: str = ""  # why this rank stopped early (a peer's death)
    noticed: float | None = None


def _member(ctx, plan: _Plan) -> _Report:
    """One member actor's segment; returns what it completed, even when a peer's death stops it."""
    comm = ctx.comm
    position = comm.rank
    slot = plan.members[position]
    server = position >= plan.workers
    state = ctx.state
    if slot in plan.load:
        state["fault_x"] = torch.tensor(plan.load[slot])
    report = _Report(slot, None, plan.start, None)
    try:
        runtime = bind(plan.config, comm, plan.workers, plan.mixing)
        if plan.joining and plan.donor is not None and not server:  # a replacement fetches x from a peer
            if slot == plan.donor:
                for j in plan.joining:
                    comm.send(state["fault_x"], plan.members.index(j))
            elif slot in plan.joining:
                fetched = torch.tensor(plan.like)
                comm.recv(fetched, plan.members.index(plan.donor))
                state["fault_x"] = fetched
        comm.barrier()  # the group is formed
        report.ready = time.time()
        for step in range(plan.start, plan.end):
            if plan.dying.get(slot) == step:
                die(plan.log, slot, step)
            if server:
                runtime.serve(plan.like.size, torch.tensor(plan.like).dtype, "mean")
            else:
                x = train_step(plan.config, runtime, plan.gradient, plan.lr, slot, step, state["fault_x"])
            comm.barrier()  # every rank has the step's result: none keeps it before all do
            if not server:
                state["fault_x"] = x
                if plan.checkpoint_every and (step + 1) % plan.checkpoint_every == 0:  # written before going on
                    ray.get(plan.log.save.remote(slot, step + 1, x.numpy().copy()))
            report.done = step + 1
            comm.barrier()  # every rank kept it: a death after this cannot catch a peer still in the one before
    except Exception as e:  # noqa: BLE001 - a peer's death: reported with what this rank completed
        report.noticed = time.time()
        report.error = f"{type(e).__name__}: {e}"
        hang_up(comm)
    if not server:
        report.x = state["fault_x"].numpy().copy()
    return report


def die(log, slot: int, step: int) -> None:
    """The scripted death: the time to the log, then SIGKILL to this process (no cleanup, no goodbye)."""
    ray.get(log.record.remote(slot, step, time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def hang_up(comm) -> None:
    """Close this rank's connections and leave its process group: every rank waiting on it fails at once, so a
    death reaches the whole group in milliseconds, not after a timeout."""
    try:
        comm.close()
    except Exception:  # noqa: BLE001 - closing what a failure broke
        pass
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


class ActorSegments:
    """What segments on Ray actors keep beside the harness's recovery, whatever a segment runs (this problem's
    steps, or a sweep's training: ray_sweep_faults.RaySweepSegments): the wall clock, the group and the run's log,
    the members of the intact process group, the actors killed and not yet replaced, and whether every worker
    loads the driver's state at the next segment (the start, a checkpoint restart). Before a Segments class."""

    clock = staticmethod(time.time)

    def _on_actors(self, group: WorkerGroup, log) -> None:
        self.group, self.log = group, log
        self.formed: list[int] | None = None  # the members of the intact process group (formed by the first segment)
        self.dead: set[int] = set()  # actors killed, not yet replaced
        self.load_all = True  # every worker loads the driver's state (the start, a checkpoint)

    def _recover(self, step, dead, died_at, detected_at):
        death = super()._recover(step, dead, died_at, detected_at)
        if self.recovery.mode == CHECKPOINT_RESTART:
            self.load_all = True  # every rank resumes from the checkpoint
        return death


class RaySegments(ActorSegments, Segments):
    """Segments on the actors of `group`: actor i is worker slot i (servers after the workers)."""

    def __init__(self, *args, group: WorkerGroup, log, p2p: str, network):
        super().__init__(*args)
        self._on_actors(group, log)
        self.p2p, self.network = p2p, network

    def note_deaths(self, deaths: list[tuple[int, int, float]]) -> None:
        """The deaths the run's log holds after a segment: here every one is scripted."""

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        m = len(self.alive)
        members = list(self.alive) + [self.workers + j for j in range(self.config.num_servers(m))]
        form(self, members)
        dying: dict[int, int] = {}
        for f in sorted(self.pending):
            if start <= f.step < end:
                dying.setdefault(f.rank, f.step)
        load = {s: self.params[s].numpy() for s in self.alive} if self.load_all else {}
        self.load_all = False
        donor = next((s for s in self.alive if s not in joining), None)
        plan = _Plan(self.config, tuple(members), m, start, end, dying, tuple(joining), donor, load,
                     None if self.mixing is None else self.mixing.matrix, self.gradient, self.lr,
                     self.recovery.checkpoint_every, self.x0.numpy(), self.log)
        refs = {actor_ref: index for index, actor_ref in (
            (i, self.group.actors[i].run.remote(_member, (plan,), self.network, self.timeout, self.p2p))
            for i in members)}
        reports, died, lost = collect(refs, self.timeout * (end - start + 2))
        detected = time.time()
        completed = completed_steps(reports, died, start, end, ready)
        for step in range(start, completed):
            saved = None  # the checkpoint every rank wrote to the run's log once step was complete
            if self.checkpoints_at(step + 1):
                saved = {slot: torch.tensor(x) for slot, x in ray.get(self.log.saved.remote(step + 1)).items()}
            self._completed(step, saved)
        for r in reports.values():
            if r.x is not None:
                self.params[r.slot] = torch.tensor(r.x)
        attribute(self, reports, died, lost, completed, detected)


def form(segments, members: list[int]) -> None:
    """The segment's process group of `members` (actor indices): the actors a failure killed replaced (each start-up
    measured), the group re-formed where its membership changed or a failure broke it."""
    for index in sorted(segments.dead & set(members)):
        began = time.time()
        segments.group.replace(index)
        segments.out.starts_s.append(time.time() - began)
        segments.dead.discard(index)
    if segments.formed != members:
        segments.group.reform(members)
        segments.formed = members


def completed_steps(reports: dict, died: list[int], start: int, end: int, ready: list[float]) -> int:
    """The steps every survivor completed (they agree: two barriers per step); when the group was formed into
    `ready`."""
    if not reports and not died:
        raise RunEnded(f"segment of steps {start}..{end - 1}: no member answered within the deadline", start)
    starts = [r.ready for r in reports.values() if r.ready is not None]
    if starts:
        ready.append(min(starts))
    done = {r.done for r in reports.values()}
    if len(done) > 1:  # two barriers per step make this impossible: a bug, named
        raise RuntimeError(f"the survivors disagree on the steps they completed: {sorted(done)} "
                           f"({ {r.slot: r.done for r in reports.values()} })")
    return done.pop() if done else start


def attribute(segments, reports: dict, died: list[int], lost: list[int], completed: int, detected: float) -> None:
    """After a segment: nothing when it ran to its end; RankFailed naming the scripted death (its time and the
    detection's set on `segments`); RunEnded for a failure no schedule named."""
    if not died and not lost and not any(r.error for r in reports.values()):
        return
    segments.formed = None  # the process group is broken: every survivor left it
    segments.dead |= set(died)
    deaths = ray.get(segments.log.take.remote())
    segments.note_deaths(deaths)  # an mtbf's deaths join the schedule (a sweep's run; a scripted one: nothing)
    scripted = {slot for slot, _, _ in deaths}
    if set(died) != scripted or lost or not deaths:
        errors = "; ".join(f"rank {r.slot}: {r.error}" for r in reports.values() if r.error)
        raise RunEnded(f"a failure no schedule named: actors died {sorted(died)} (scripted deaths "
                       f"{sorted(scripted)}), no answer from {sorted(lost)}; {errors or 'no rank error'}",
                       completed)
    step = min(s for _, s, _ in deaths)
    if completed != step:
        raise RuntimeError(f"rank(s) {sorted(scripted)} died in step {step} but the survivors completed "
                           f"{completed} steps")
    segments._died_at = min(t for _, _, t in deaths)
    segments._detected_at = detected
    raise RankFailed(min(scripted), step)


def collect(refs: dict, deadline_s: float) -> tuple[dict, list[int], list[int]]:
    """Every member's result, the actors that died, the members that did not answer by the deadline."""
    results, died = {}, []
    pending = dict(refs)
    end = time.monotonic() + deadline_s
    while pending and time.monotonic() < end:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=min(0.5, max(end - time.monotonic(), 0)))
        for ref in done:
            index = pending.pop(ref)
            try:
                results[index] = ray.get(ref)
            except RayActorError:
                died.append(index)
            except ray.exceptions.RayTaskError as e:  # the function itself raised: not a death
                raise GroupError(f"fault run failed on actor {index}: {e}", [index]) from None
    return results, sorted(died), sorted(pending.values())


# -- the barrier-free parameter server: a worker killed, the others never wait for it ------------------------

def _barrier_free(config, workers, steps, schedule, x0, gradient, lr, timeout, group, log, network) -> FaultRun:
    """One call on every actor: each worker pushes for its life and the failing ones kill themselves in the step
    they fail in; the servers serve each worker its life's pushes (told, as a failure detector would tell them),
    so nobody waits on the dead: nothing is detected, re-formed or lost."""
    lives = barrier_free_lives(workers, steps, schedule)
    began = time.time()
    group.reform(list(range(group.world_size)))
    refs = {actor.run.remote(_barrier_free_rank, (config, workers, lives, steps, x0, gradient, lr, log), network,
                             timeout, "gloo"): index for index, actor in enumerate(group.actors)}
    results, died, lost = collect(refs, timeout * (steps + 2))
    deaths = ray.get(log.take.remote())
    if set(died) != {slot for slot, _, _ in deaths} or lost:
        raise RunEnded(f"a failure no schedule named: actors died {sorted(died)}, no answer from {sorted(lost)}", 0)
    params = x0.clone().reshape(-1)
    for index in range(workers, group.world_size):  # each server's shards
        shard, touched = (torch.tensor(a) for a in results[index][1:])
        params[touched] = shard[touched]
    run = barrier_free_run(workers, steps, schedule, lives, {s: results.get(s) for s in range(workers)},
                           [r for r in results[workers][0]], params.reshape(x0.shape).numpy())
    run.wall_s = time.time() - began
    return run


def _barrier_free_rank(ctx, config, workers, lives, steps, x0, gradient, lr, log):
    if ctx.comm.rank < workers:
        return barrier_free_member(ctx.comm, config, workers, lives, steps, x0, gradient, lr, None,
                                   die=lambda slot, step: die(log, slot, step))
    params, touched = x0.clone().reshape(-1), torch.zeros(x0.numel(), dtype=torch.bool)
    pushed = barrier_free_member(ctx.comm, config, workers, lives, steps, x0, gradient, lr, params, touched)
    return pushed, params.numpy(), touched.numpy()
