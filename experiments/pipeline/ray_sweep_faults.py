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

Times are time.time() on each process (one machine, or the emulated cluster's: one clock). Refused here, each with
its reason (problems()): parameter servers with failures (their servers' shards are not yet carried from segment
to segment on actors), device = "cuda" (a slot's state travels through the driver as it is, on the GPU).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import ray

from experiments.pipeline.ray_faults import ActorSegments, attribute, collect, completed_steps, die, form, hang_up
from experiments.pipeline.sweep_faults import FRESH, SlotState, SweepSegments, _Mixed, build, capture, fetch, restore
from experiments.pipeline.train import run_steps
from strategies.faults import Failure

STATE = "sweep_fault_state"  # the actor's state key: its slot's SlotState after its last completed step


def problems(spec) -> list[str]:
    """What a sweep run with failures needs that Ray actors cannot give it yet (beyond the thread ranks' list)."""
    if not (spec.failures or spec.recovery):
        return []
    what = f"run {spec.strategy} x {spec.workers} workers with failures on the ray substrate"
    found = []
    if spec.strategy_config().num_servers(spec.workers):
        found.append(f"{what}: strategy {spec.strategy!r} has server ranks, whose shards and checkpoint are not "
                     f"yet carried from segment to segment on actors; accepted are strategies without servers, or "
                     f"--substrate threads")
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
    members: tuple[int, ...]  # the slot at each rank
    start: int
    end: int
    dying: dict  # slot -> the step it dies in (scheduled)
    due: dict  # slot -> seconds after `began` from which it dies at its next step (mtbf); {} without
    began: float
    joining: tuple[int, ...]  # replacements that fetch the state from `donor`
    donor: int | None
    has_momentum: bool
    load: dict  # slot -> SlotState or FRESH the driver hands it; the others keep their own
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
        spec = replace(plan.spec, workers=len(plan.members), steps=plan.end)
        result = run_steps(comm, spec, config, compute, buckets, hooks=_Hooks(plan, ctx, slot, compute, report))
        report.final = result["final"]
    except Exception as e:  # noqa: BLE001 - a peer's death: reported with what this rank completed
        report.noticed = time.time()
        report.error = f"{type(e).__name__}: {e}"
        hang_up(comm)
    return report


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
        plan, comm = self.plan, self.ctx.comm
        row["wall_s"] = time.time() - plan.began  # on the run's clock, recoveries included
        comm.barrier()  # every rank has the step's result: none keeps it before all do
        self.ctx.state[STATE] = state = capture(self.compute)
        if plan.checkpoint_every and (step + 1) % plan.checkpoint_every == 0:  # written before going on
            ray.get(plan.log.save_latest.remote(self.slot, step + 1, state))
        self.report.rows.append(row)
        self.report.state, self.report.done = state, step + 1
        comm.barrier()  # every rank kept it: a death after this cannot catch a peer still in the one before


class RaySweepSegments(ActorSegments, SweepSegments):
    """SweepSegments whose segments run on the actors of `group` (actor k is worker slot k); `log`: the run's
    ray_faults.RunLog; `schedule`: failures in place of the spec's (as SweepSegments)."""

    def __init__(self, spec, group, log, schedule=None):
        super().__init__(spec, schedule)
        self._on_actors(group, log)

    def note_deaths(self, deaths: list[tuple[int, int, float]]) -> None:
        """An mtbf's deaths join the schedule, where the recovery finds them; the replacement's clock starts."""
        for slot, step, at in deaths:
            if Failure(step, slot) not in self.pending:
                self.pending.append(Failure(step, slot))
                self.due[slot] = at - self.began + self.rngs[slot].exponential(self.mtbf)

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        left = self.time_left(start)
        members = list(self.alive)
        form(self, members)
        dying: dict[int, int] = {}
        for f in sorted(self.pending):
            if start <= f.step < end:
                dying.setdefault(f.rank, f.step)
        load = {s: self.params[s] for s in members} if self.load_all else {s: FRESH for s in joining}
        self.load_all = False
        donor = next((s for s in members if s not in joining), None)
        source = self.params.get(donor)
        plan = _Plan(self.spec, self.config, tuple(members), start, end, dying, dict(self.due), self.began,
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
        rows = [row for r in reports.values() for row in r.rows] + ray.get(self.log.kept.remote())  # the dead's
        self.rows += [row for row in rows if row["step"] < completed]
        for r in reports.values():
            if r.state is not None:
                self.params[r.slot] = r.state
            if r.final is not None:
                self.finals[r.slot] = r.final
        attribute(self, reports, died, lost, completed, detected)


def execute(spec, meta: dict, group) -> tuple[dict, list[dict], list]:
    """Run `spec` with its failures on `group` (a WorkerGroup of spec.workers actors): sweep_faults.execute's row.
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
