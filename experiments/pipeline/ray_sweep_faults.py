"""A sweep's training with failures on Ray actors: the failing rank's actor dies at its step, the survivors go on.

The recovery is sweep_faults.py's (SweepSegments over the harness's Segments: which slots go on, from which step
and state, what each failure cost, the run row's columns); the actors' handling is ray_faults.py's: the failing
rank tells the run's log its time and kills its own process with SIGKILL at the start of its step (what ray.kill
does to an actor; the rank does it because only it knows when it reaches its step), every survivor that fails
hangs up so the death reaches all of them within milliseconds, the group is re-formed of the survivors in their
own processes (elastic, reweight) or of every slot with the dead one's actor replaced (checkpoint_restart), and a
checkpoint is written by every rank to the run's log, which outlives a rank. Only a segment differs: every member
actor runs the sweep's real step loop (train.run_steps) on its slot's model and data shard; its state (SlotState:
parameters, buffers, momentum, data position) stays in the actor between segments and comes back to the driver
with its step rows at the segment's end.

A synchronous parameter server's dedicated servers are actors n..n+s-1 of the group, in every segment after the
live workers: each runs the thread ranks' loop (servers.serve_steps) on its shards, which stay in its actor with
their momentum from segment to segment, so a worker's death shrinks the barrier to the survivors (ps_shrink) and
the servers go on; each server writes its shards to the run's log with the workers' checkpoint, and a restart
hands them back. Servers do not fail in a sweep (a server rank in the schedule is refused, as on thread ranks).

With an mtbf the driver hands each member its slot's time (seconds from the run's start, drawn per slot from the
seed as on thread ranks); a rank dies at the first step it starts after it; the death joins the schedule and the
replacement's time is drawn from the slot's stream.

Times are time.time() on each process (one machine, or the emulated cluster's: one clock). Refused here (beyond
the thread ranks' list, problems()): device = "cuda" (a slot's state travels through the driver as it is, on the
GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import ray

from experiments.pipeline.ray_faults import ActorSegments, attribute, collect, completed_steps, die, form, hang_up
from experiments.pipeline.servers import serve_steps
from experiments.pipeline.sweep_faults import (
    FRESH,
    SlotState,
    SweepSegments,
    _Mixed,
    build,
    capture,
    fetch,
    fresh_server,
    restore,
    server_restore,
    server_snapshot,
)
from experiments.pipeline.train import run_steps
from strategies.faults import Failure
from workloads.buckets import make_buckets

STATE = "sweep_fault_state"  # a worker actor's state key: its slot's SlotState after its last completed step
SERVER = "sweep_fault_server"  # a server actor's: its ShardUpdate (shards and momentum) after its last served step


def problems(spec) -> list[str]:
    """What a sweep run with failures needs that Ray actors cannot give it yet (beyond the thread ranks' list)."""
    if not (spec.failures or spec.recovery):
        return []
    what = f"run {spec.strategy} x {spec.workers} workers with failures on the ray substrate"
    found = []
    if spec.device != "cpu":
        found.append(f"{what}: device = {spec.device!r}; a slot's state travels through the driver between "
                     f"segments and is not moved back to the GPU; accepted is device = 'cpu', or --substrate threads")
    if spec.failures.get("outages"):
        found.append(f"{what}: a link outage in failures.schedule ({{ link, step, seconds }}); actors' links are "
                     f"not taken down in a sweep yet; accepted is --substrate threads (or `syncbench faults "
                     f"--outage ... --on kernel` for the kernel-shaped network)")
    return found


@dataclass(frozen=True)
class _Plan:
    """What every member of a segment runs: steps start..end-1 of the run's training, who dies when, what it loads."""

    spec: object  # the run's (n workers): slot k's data shard is k of n whatever the group's size
    config: object
    members: tuple[int, ...]  # the actor at each rank: the live worker slots, then the servers (n + j)
    workers: int  # how many members are workers (ranks 0..workers-1)
    start: int
    end: int
    dying: dict  # slot -> the step it dies in (scheduled)
    due: dict  # slot -> seconds after `began` from which it dies at its next step (mtbf); {} without
    began: float
    joining: tuple[int, ...]  # replacements that fetch the state from `donor`
    donor: int | None
    has_momentum: bool
    load: dict  # slot -> SlotState or FRESH the driver hands it (a server: its snapshot or FRESH); the others keep
    mixing: np.ndarray | None
    checkpoint_every: int  # 0: none
    log: object


@dataclass
class _Report:
    slot: int
    ready: float | None  # when the group was formed
    done: int  # the next step: steps before it are complete on this rank
    rows: list = field(default_factory=list)  # its completed steps' rows
    state: SlotState | None = None  # after step done - 1, where it completed one in this segment
    final: dict | None = None  # run_steps' final report, where it ran to the segment's end
    error: str = ""  # why this rank stopped early (a peer's death)
    noticed: float | None = None


def _member(ctx, plan: _Plan) -> _Report:
    """One member actor's segment; returns what it completed, even when a peer's death stops it."""
    comm = ctx.comm
    if comm.rank >= plan.workers:
        return _server(ctx, plan)
    slot = plan.members[comm.rank]
    report = _Report(slot, None, plan.start)
    config = plan.config if plan.mixing is None else _Mixed(plan.config, plan.mixing)
    try:
        compute, buckets = build(comm, slot, plan.spec, config)
        state = plan.load[slot] if slot in plan.load else ctx.state[STATE]
        ctx.state[STATE] = state  # what it holds until it completes a step (a death in this segment's first step)
        if isinstance(state, SlotState):
            restore(compute, state)
        if plan.joining and plan.donor is not None:  # a replacement fetches the state from a peer
            fetch(comm, compute, list(plan.members), slot, plan.joining, plan.donor, plan.has_momentum)
        comm.allgather_object(None)  # the group is formed: every rank built, the replacements hold the state
        report.ready = time.time()
        spec = replace(plan.spec, workers=plan.workers, steps=plan.end)
        result = run_steps(comm, spec, config, compute, buckets, hooks=_Hooks(plan, ctx, slot, compute, report))
        report.final = result["final"]
    except Exception as e:  # noqa: BLE001 - a peer's death: reported with what this rank completed
        report.noticed = time.time()
        report.error = f"{type(e).__name__}: {e}"
        hang_up(comm)
    return report


def _server(ctx, plan: _Plan) -> _Report:
    """A server actor's segment: the thread ranks' serve_steps on its shards, which stay in the actor from segment
    to segment (the run's start and a restart hand it fresh ones or the checkpoint's)."""
    comm = ctx.comm
    slot = plan.members[comm.rank]
    report = _Report(slot, None, plan.start)
    spec = replace(plan.spec, workers=plan.workers, steps=plan.end)
    try:
        if slot in plan.load:  # FRESH or a checkpoint's snapshot (FRESH arrives as a copy: not compared by identity)
            ctx.state[SERVER] = update = fresh_server(spec)
            if isinstance(plan.load[slot], dict):
                server_restore(update, plan.load[slot])
        update = ctx.state[SERVER]
        buckets = make_buckets([p.numel() for p in update.flat.trainable], spec.bucket_mb)
        comm.allgather_object(None)  # the group is formed (the workers' side: _member)
        report.ready = time.time()
        serve_steps(comm, spec, plan.config, buckets, update, first=plan.start,
                    hooks=_ServerHooks(plan, comm, slot, update, report))
    except Exception as e:  # noqa: BLE001 - a worker's death: reported with what this server completed
        report.noticed = time.time()
        report.error = f"{type(e).__name__}: {e}"
        hang_up(comm)
    return report


def _counted(plan: _Plan, comm, slot: int, step: int, row: dict, report: _Report, take):
    """The end of a step on any member: the step counts once every rank has it; then the member keeps `take()`
    (its state) and, at a checkpoint step, writes it to the run's log before going on. Returns the state."""
    row["wall_s"] = time.time() - plan.began  # on the run's clock, recoveries included
    comm.barrier()  # every rank has the step's result: none keeps it before all do
    state = take()
    if plan.checkpoint_every and (step + 1) % plan.checkpoint_every == 0:  # written before going on
        ray.get(plan.log.save_latest.remote(slot, step + 1, state))
    report.rows.append(row)
    report.done = step + 1
    comm.barrier()  # every rank kept it: a death after this cannot catch a peer still in the one before
    return state


class _ServerHooks:
    """A server's end of each step (servers.serve_steps calls it); servers do not fail in a sweep."""

    def __init__(self, plan: _Plan, comm, slot: int, update, report: _Report):
        self.plan, self.comm, self.slot, self.update, self.report = plan, comm, slot, update, report

    def end(self, step: int, row: dict) -> None:
        _counted(self.plan, self.comm, self.slot, step, row, self.report, lambda: server_snapshot(self.update))


class _Hooks:
    """A member's begin and end of each step (train.run_steps calls them)."""

    def __init__(self, plan: _Plan, ctx, slot: int, compute, report: _Report):
        self.plan, self.ctx, self.slot, self.compute, self.report = plan, ctx, slot, compute, report
        self.first = plan.start

    def begin(self, step: int) -> None:
        plan = self.plan
        if plan.dying.get(self.slot) == step or (self.slot in plan.due
                                                 and time.time() - plan.began >= plan.due[self.slot]):
            ray.get(plan.log.keep.remote(self.report.rows))  # its completed steps are recorded whatever fails
            die(plan.log, self.slot, step)

    def end(self, step: int, row: dict) -> None:
        def take():
            self.ctx.state[STATE] = state = capture(self.compute)
            return state

        self.report.state = _counted(self.plan, self.ctx.comm, self.slot, step, row, self.report, take)


class RaySweepSegments(ActorSegments, SweepSegments):
    """SweepSegments whose segments run on the actors of `group` (actor k is worker slot k, actor n + j server j);
    `log`: the run's ray_faults.RunLog; `schedule`: failures in place of the spec's (as SweepSegments)."""

    def __init__(self, spec, group, log, schedule=None):
        super().__init__(spec, schedule)
        self._on_actors(group, log)

    def note_deaths(self, deaths: list[tuple[int, int, float]]) -> None:
        """An mtbf's deaths join the schedule, where the recovery finds them; the replacement's clock starts."""
        for slot, step, at in deaths:
            if Failure(step, slot) not in self.pending:
                self.pending.append(Failure(step, slot))
                self.due[slot] = at - self.began + self.rngs[slot].exponential(self.mtbf)

    def _completed(self, step: int, saved: dict | None = None) -> None:
        """As SweepSegments', the servers' part of a checkpoint taken from what their actors wrote to the log."""
        super()._completed(step, saved)
        if self.checkpoints_at(self.step) and saved:
            self.server_checkpoint = {slot - self.workers: state for slot, state in saved.items()
                                      if slot >= self.workers} or None

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        left = self.time_left(start)
        m = len(self.alive)
        servers = [self.workers + j for j in range(self.config.num_servers(m))]
        members = list(self.alive) + servers
        form(self, members)
        dying: dict[int, int] = {}
        for f in sorted(self.pending):
            if start <= f.step < end:
                dying.setdefault(f.rank, f.step)
        if self.load_all:  # the run's start or a restart: every worker its state, every server fresh or checkpointed
            load = {s: self.params[s] for s in self.alive}
            checkpoint = self.server_checkpoint or {}
            load |= {s: checkpoint.get(s - self.workers, FRESH) for s in servers}
        else:
            load = {s: FRESH for s in joining}
        self.load_all = False
        donor = next((s for s in self.alive if s not in joining), None)
        source = self.params.get(donor)
        plan = _Plan(self.spec, self.config, tuple(members), m, start, end, dying, dict(self.due), self.began,
                     tuple(joining), donor, isinstance(source, SlotState) and source.momentum is not None, load,
                     None if self.mixing is None else self.mixing.matrix, self.recovery.checkpoint_every, self.log)
        spec = self.spec
        refs = {self.group.actors[i].run.remote(_member, (plan,), spec.network(), spec.timeout, spec.p2p): i
                for i in members}
        reports, died, lost = collect(refs, min(left, spec.timeout * (end - start + 2)))
        detected = time.time()
        completed = completed_steps(reports, died, start, end, ready)
        # the latest checkpoint every rank wrote to the run's log (it keeps one): an earlier one of this segment is
        # taken from it too and superseded by it in this loop, before any recovery could read it
        latest = ray.get(self.log.latest_saved.remote())
        saved = {slot: state for slot, (at, state) in latest.items()} if latest else None
        last = max((step + 1 for step in range(start, completed) if self.checkpoints_at(step + 1)), default=None)
        if last is not None and {at for at, _ in latest.values()} != {last}:  # every rank writes before going on
            raise RuntimeError(f"the checkpoint after step {last - 1} is missing from the run's log: it holds "
                               f"{ {slot: at for slot, (at, _) in latest.items()} } (slot: steps completed)")
        for step in range(start, completed):
            self._completed(step, saved if self.checkpoints_at(step + 1) else None)
        rows = [row for r in reports.values() if r.slot < self.workers for row in r.rows]
        rows += ray.get(self.log.kept.remote())  # the dead's
        self.rows += [row for row in rows if row["step"] < completed]
        # the servers' rows of the completed steps, each step's last attempt (a restart redoes steps from start)
        self.server_rows = [row for row in self.server_rows if row["step"] < start] + [
            row for r in reports.values() if r.slot >= self.workers for row in r.rows if row["step"] < completed]
        for r in reports.values():
            if r.state is not None:
                self.params[r.slot] = r.state
            if r.final is not None:
                self.finals[r.slot] = r.final
        attribute(self, reports, died, lost, completed, detected)


def execute(spec, meta: dict, group) -> tuple[dict, list[dict], list]:
    """Run `spec` with its failures on `group` (a WorkerGroup of spec.world_size() actors: workers, then servers):
    sweep_faults.execute's row.
    Afterwards the killed actors are replaced and the whole group re-formed for the next run (or, where that
    fails, the group is marked broken: the next run starts a fresh one); the run's log actor is killed."""
    from experiments.pipeline.ray_faults import RunLog
    from experiments.pipeline.sweep_faults import execute as execute_segments

    log = RunLog.options(num_cpus=0).remote()
    segments = RaySweepSegments(spec, group, log)
    try:
        return execute_segments(spec, meta, segments)
    finally:
        ray.kill(log)
        try:
            for index in sorted(segments.dead):
                group.replace(index)
            group.reform(list(range(group.world_size)))
        except Exception:  # noqa: BLE001 - the next run starts a fresh group
            group.broken = True
