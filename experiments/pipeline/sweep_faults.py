"""A sweep's training with failures, on thread ranks: the run's model trains, a rank dies, the run recovers.

The recovery is the failure harness's (`Segments` in strategies/fault_runs.py: which worker slots go on, from which
step and state, what each failure cost; the same class the Ray actors' harness uses); only a segment differs: here
every member of a segment runs the sweep's real step loop (experiments/pipeline/train.py `run_steps`: the model,
its data shard, the strategy through the communicator) on thread ranks of the segment's size, and a slot's state
between segments is what a checkpoint of the real training holds (`SlotState`: the flat parameters, the buffers,
BatchNorm's running statistics among them, the optimizer's momentum, the data shard's position).

- The death: the failing rank raises at the start of its step, before its part of the step leaves (a scheduled
  failure: its step; an mtbf: the first step it starts after its exponential time, drawn per slot, seeded); the
  fabric aborts its peers' waits, so the survivors stop within the transport's poll.
- A step counts once every member has it (a barrier of the members after each step, outside its timed part);
  then each member keeps its state, and the first checkpoints the group where the mode does.
- The recovery, by the mode: checkpoint_restart loads the last checkpoint on every slot (the dead one replaced) and
  redoes the steps since it; elastic and ps_shrink go on with the survivors at n - 1 from the step in flight, a
  replacement joining after rejoin_steps and fetching the state from a peer; reweight mixes with the survivors'
  Metropolis weights; none ends the run, the cause named. A parameter server's servers keep their shards and
  optimizer state from segment to segment (their checkpoint is taken with the workers').
- A worker keeps its data shard of the run's n workers (slot k of n) whatever the group's size: the survivors'
  steps average fewer shards, the global batch shrinks to theirs.

What is recorded: every completed step's rows (the last attempt of a redone step; `rank` is the member's position
in that step's group, `wall_s` seconds since the run's first step, recoveries included), and on the run's row the
failures, steps lost, detection and recovery seconds, the time to the last step and the throughput over the run.
A failure the mode cannot recover from ends the run: its completed steps are kept and the row names the cause.
"""

from __future__ import annotations

import copy
import gc
import math
import threading
import time
import traceback
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import torch

import strategies.fault_runs as fault_runs
from experiments.pipeline.fault_rows import fault_columns, last_attempts, step_traffic
from experiments.pipeline.measured import MeasuredCompute, ShardUpdate
from experiments.pipeline.servers import serve_steps
from experiments.pipeline.summary import summarize
from experiments.pipeline.train import _INIT_LOCK, run_steps
from strategies.fault_records import RankFailed
from strategies.faults import Failure, Recovery, RunEnded, check_fits, check_schedule
from strategies.transport.communicator import RankAborted
from strategies.transport.threads import run_threads
from workloads.buckets import make_buckets
from workloads.flat import FlatModel
from workloads.models import build_model

DATA_POSITION = ("epoch", "order", "position")  # where a data shard is in its epoch (DigitsData; synthetic: none)


def problems(spec) -> list[str]:
    """What a run with failures needs that the thread substrate cannot give it: one line each ([] when none)."""
    if not (spec.failures or spec.recovery):
        return []
    config = spec.strategy_config()
    what = f"run {spec.strategy} x {spec.workers} workers with failures"
    found = []
    if spec.compute != "real":
        found.append(f"{what}: compute = {spec.compute!r}; a recovery restores a trained model's state, accepted is "
                     f"compute = 'real'")
    if config is not config.unwrapped() or config.wraps_model:
        found.append(f"{what}: strategy {spec.strategy!r} keeps state outside the model (compression's residuals, "
                     f"local SGD's anchor, DDP's reducer) that a recovery does not restore; accepted are strategies "
                     f"without wrappers")
    if config.asynchronous or (config.num_servers(spec.workers) == 0 and config.role == "server"):
        found.append(f"{what}: a barrier-free or colocated parameter server serves the whole run at once; accepted "
                     f"are synchronous parameter servers with dedicated servers")
    network = spec.network()
    if (network is not None and network.overrides) or spec.ranks_per_node > 1:
        found.append(f"{what}: per-rank links and nodes of several ranks follow a rank's position, which changes "
                     f"when the group re-forms; accepted are one link for all and ranks_per_node = 1")
    return found


@dataclass
class SlotState:
    """One worker slot's training state between segments: what its checkpoint holds."""

    params: torch.Tensor
    buffers: list[torch.Tensor]
    momentum: torch.Tensor | None
    data: dict

    def clone(self) -> SlotState:
        return SlotState(self.params.clone(), [b.clone() for b in self.buffers],
                         None if self.momentum is None else self.momentum.clone(), copy.deepcopy(self.data))

    def numpy(self) -> np.ndarray:
        return self.params.numpy()


def capture(compute: MeasuredCompute, into=None) -> SlotState:
    """The slot's state now. `into`: its state kept after the previous step, overwritten in place (no new copy of
    the model per step; nothing else may hold it), else a new one."""
    optimizer = compute._optimizer
    momentum = None
    if optimizer is not None:
        (param,) = optimizer.param_groups[0]["params"]  # the flat buffers as one parameter
        momentum = optimizer.state.get(param, {}).get("momentum_buffer")
    data = {k: copy.deepcopy(getattr(compute.data, k)) for k in DATA_POSITION if hasattr(compute.data, k)}
    buffers = [b.detach() for b in compute.model.buffers()]
    if isinstance(into, SlotState) and (into.momentum is None) == (momentum is None):
        with torch.no_grad():
            into.params.copy_(compute.flat.params)
            for kept, buffer in zip(into.buffers, buffers, strict=True):
                kept.copy_(buffer)
            if momentum is not None:
                into.momentum.copy_(momentum)
        into.data = data
        return into
    return SlotState(compute.flat.params.detach().clone(), [b.clone() for b in buffers],
                     None if momentum is None else momentum.clone(), data)


def restore(compute: MeasuredCompute, state: SlotState) -> None:
    with torch.no_grad():
        compute.flat.params.copy_(state.params)
        for buffer, saved in zip(compute.model.buffers(), state.buffers, strict=True):
            buffer.copy_(saved)
    if state.momentum is not None:
        optimizer = compute.optimizer()
        optimizer.state[optimizer.param_groups[0]["params"][0]]["momentum_buffer"] = state.momentum.clone()
    for k, v in state.data.items():
        setattr(compute.data, k, copy.deepcopy(v))


def server_snapshot(update: ShardUpdate) -> dict:
    """A server's shards and their momentum: its part of a checkpoint."""
    out = {}
    for key, (param, optimizer) in update.shards.items():
        momentum = optimizer.state.get(param, {}).get("momentum_buffer")
        out[key] = (param.detach().clone(), None if momentum is None else momentum.clone())
    return out


def server_restore(update: ShardUpdate, snapshot: dict) -> None:
    from experiments.pipeline.measured import _optimizer

    update.shards = {}
    for key, (values, momentum) in snapshot.items():
        param = torch.nn.Parameter(values.clone())
        optimizer = _optimizer(update.spec, [param])
        if momentum is not None:
            optimizer.state[param]["momentum_buffer"] = momentum.clone()
        update.shards[key] = (param, optimizer)


def fresh_server(spec) -> ShardUpdate:
    """A server's state before its first step: its shards are taken from the seeded initial parameters at their
    first update."""
    with _INIT_LOCK:  # build_model restores the global stream after it: not while a worker seeds its own
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                            seed=spec.seed).to(torch.device(spec.device))
    return ShardUpdate(spec, FlatModel(model))


def build(comm, slot: int, spec, config):
    """Worker slot `slot`'s model, compute and buckets as train() builds them (the same seeds, so a slot's fresh
    model is its failure-free one); `spec` is the run's, its data shard slot of the run's n workers."""
    ctx = SimpleNamespace(rank=slot, world_size=comm.world_size, comm=comm, device=spec.device, state={})
    with _INIT_LOCK:
        torch.manual_seed(spec.seed + slot)
        model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                            seed=spec.seed).to(torch.device(spec.device))
    flat = FlatModel(model)
    buckets = make_buckets([p.numel() for p in flat.trainable], spec.bucket_mb)
    compute = MeasuredCompute(ctx, spec, config, model, flat, None, torch.device(spec.device))  # shard slot of n
    return compute, buckets


def fetch(comm, compute, members: list[int], slot: int, joining, donor: int, has_momentum: bool) -> None:
    """The donor sends its parameters, buffers and momentum to each replacement (the replacement keeps its own
    data shard, from its start); `members`: the slot at each rank of the group."""
    mine = capture(compute)
    momentum = [mine.momentum if mine.momentum is not None else torch.empty_like(mine.params)] \
        if has_momentum else []
    tensors = [mine.params, *mine.buffers, *momentum]
    if slot == donor:
        for j in joining:
            for t in tensors:
                comm.send(t, members.index(j))
    elif slot in joining:
        for t in tensors:
            comm.recv(t, members.index(donor))
        n = len(mine.buffers)
        restore(compute, SlotState(tensors[0], tensors[1:1 + n], tensors[-1] if has_momentum else None, {}))


class _Fresh:
    """A slot's state before its first step: the seeded model as built, nothing to load."""

    def clone(self) -> _Fresh:
        return self

    def numpy(self):
        return None


FRESH = _Fresh()


class _Mixed:
    """The strategy with the survivors' mixing matrix (reweight): bound as strategies/fault_runs.py binds it."""

    def __init__(self, config, matrix: np.ndarray):
        self._config, self._matrix = config, matrix

    def __getattr__(self, name):
        return getattr(self._config, name)

    def bind(self, comm, workers: int):
        return fault_runs.bind(self._config, comm, workers, self._matrix)


class SweepSegments(fault_runs.Segments):
    """The harness's recovery (Segments) with each segment running the sweep's real training on thread ranks."""

    def __init__(self, spec, schedule=None):
        config = spec.strategy_config()
        given = spec.recovery or {"mode": "none"}
        recovery = Recovery(given["mode"], given.get("checkpoint_every") or 0, given.get("rejoin_steps"))
        failures = spec.failures or {}
        if schedule is None:
            schedule = [Failure(step, rank) for step, rank in failures.get("schedule", [])]
        schedule = check_schedule(schedule, spec.workers, spec.steps, config.num_servers(spec.workers))
        check_fits(recovery.mode, config, spec.workers, schedule)
        super().__init__(config, spec.workers, spec.steps, schedule, recovery, FRESH, None, spec.lr, spec.timeout)
        self.spec = spec
        self.mtbf = failures.get("mtbf_s")
        self.rngs = {slot: np.random.default_rng([failures.get("seed", 0), slot, 39]) for slot in range(spec.workers)}
        self.due = {slot: rng.exponential(self.mtbf) for slot, rng in self.rngs.items()} if self.mtbf else {}
        self.lock = threading.Lock()
        self.rows: list[dict] = []  # every completed step's worker rows, in the order completed
        self.server_rows: list[dict] = []  # the servers' rows of the segments that finished
        self.finals: dict[int, dict] = {}  # slot -> its report at the end of the last segment it finished
        self.servers: dict[int, ShardUpdate] = {}  # server index -> its shards and optimizer, from segment to segment
        self.server_checkpoint: dict | None = None  # None: the servers' initial state
        self.began = self.clock()
        self.dying: dict[int, int] = {}

    def run(self):
        # what a process imports once, at its first run, is no run's time to a step: torch.optim's first optimizer
        # imports torch._dynamo, digits imports sklearn (together 5-20 s on a loaded machine)
        import torch._dynamo  # noqa: F401
        if self.spec.dataset == "digits":
            import sklearn.model_selection  # noqa: F401
        self.began = self.clock()
        return super().run()

    # -- the recovery's additions: the servers' state goes with the checkpoint -----------------------------------

    def _completed(self, step: int, saved: dict | None = None) -> None:
        super()._completed(step, saved)
        if self.checkpoints_at(self.step):
            self.server_checkpoint = {i: server_snapshot(u) for i, u in self.servers.items()} or None

    def _recover(self, step, dead, died_at, detected_at):
        death = super()._recover(step, dead, died_at, detected_at)
        if self.recovery.mode == "checkpoint_restart":
            if self.server_checkpoint is None:
                self.servers = {}
            else:
                for i, update in self.servers.items():
                    server_restore(update, self.server_checkpoint[i])
        return death

    bound_extra_s = 0.0  # seconds the whole run's bound allows beyond `timeout` (links down: sweep_outages.py)

    def time_left(self, start: int) -> float:
        """Seconds left of the run's timeout, which bounds the whole run, recoveries too; RunEnded when none."""
        left = self.spec.timeout + self.bound_extra_s - (self.clock() - self.began)
        if left <= 0:
            extra = f" + {self.bound_extra_s:g} s for its links down" if self.bound_extra_s else ""
            raise RunEnded(f"the run passed its timeout = {self.spec.timeout:g} s{extra} (the bound on a whole run, "
                           f"every step and recovery included) at step {start}", start)
        return left

    # -- a segment: steps start..end-1 of the real training on thread ranks ---------------------------------------

    def _segment(self, start: int, end: int, joining: list[int], ready: list[float]) -> None:
        left = self.time_left(start)
        alive = list(self.alive)
        m = len(alive)
        self.dying = {}
        for f in sorted(self.pending):
            if start <= f.step < end:
                self.dying.setdefault(f.rank, f.step)
        self._died_at = 0.0
        donor = next((slot for slot in alive if slot not in joining), None)
        finished = threading.Barrier(m)  # a step counts once every worker has it
        spec = replace(self.spec, workers=m, steps=end)
        config = self.config if self.mixing is None else _Mixed(self.config, self.mixing.matrix)

        def body(comm):
            try:
                if comm.rank >= m:
                    return self._server(comm, spec, config, comm.rank - m, start)
                return self._worker(comm, spec, config, alive, start, joining, donor, ready, finished)
            except threading.BrokenBarrierError as e:  # a consequence of the rank that failed, never the cause
                release_frames(e)
                raise RankAborted("the step's barrier broke: a peer failed") from e
            except BaseException as e:
                finished.abort()
                release_frames(e)
                raise

        try:
            results = run_threads(m + config.num_servers(m), body, timeout=self.spec.timeout,
                                  network=self.spec.network(), run_timeout=left)
        except RankFailed:
            self._detected_at = self.clock()  # every thread rank has stopped: the run knows
            raise
        for result in results[m:]:
            for row in result["steps"]:
                row["wall_s"] = math.nan  # a server's clock restarts each segment: its rows keep bytes and times
                self.server_rows.append(row)

    def _worker(self, comm, spec, config, alive, start, joining, donor, ready, finished) -> dict:
        position = comm.rank
        slot = alive[position]
        compute, buckets = build(comm, slot, self.spec, config)
        state = self.params.get(slot, FRESH)
        if isinstance(state, SlotState):
            restore(compute, state)
        if joining and donor is not None:  # a replacement fetches the state from a peer
            source = self.params.get(donor)
            fetch(comm, compute, alive, slot, joining, donor,
                  isinstance(source, SlotState) and source.momentum is not None)
        comm.allgather_object(None)  # the group is formed: every rank built, the replacements hold the state
        if position == 0:
            ready.append(time.perf_counter())
        hooks = _Hooks(self, slot, position, start, finished, compute)
        result = run_steps(comm, spec, config, compute, buckets, hooks=hooks)
        self.finals[slot] = result["final"]
        return result

    def _server(self, comm, spec, config, index: int, start: int) -> dict:
        update = self.servers.get(index)
        if update is None:
            update = self.servers[index] = fresh_server(spec)
        buckets = make_buckets([p.numel() for p in update.flat.trainable], spec.bucket_mb)
        comm.allgather_object(None)  # the group is formed (the workers' side: _worker)
        return serve_steps(comm, spec, config, buckets, update, first=start)

    def dies(self, slot: int, step: int) -> bool:
        """Whether `slot` dies at the start of `step`: its scheduled step, or its exponential time has come."""
        if self.dying.get(slot) == step:
            return True
        if not self.mtbf or self.clock() - self.began < self.due[slot]:
            return False
        with self.lock:  # the failure joins the schedule, where the recovery finds it; the replacement's clock starts
            self.due[slot] = self.clock() - self.began + self.rngs[slot].exponential(self.mtbf)
            self.pending.append(Failure(step, slot))
        return True


def release_frames(error: BaseException, tracebacks: bool = False) -> None:
    """Drop the locals of the frames `error` (and the errors it was raised from) passed through: a failed member's
    model, optimizer and step tensors, which its traceback would otherwise hold until the interpreter's cycle
    collector runs (the thread ranks keep each failure, and its traceback refers back to them), so a failed
    segment's models outlive it by several runs. The traceback still names every file and line. `tracebacks`:
    drop the tracebacks too (an error kept for its message by what its frames refer to: the run's end, kept by
    the segments whose methods raised it, a cycle even through the frames that were still running)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        traceback.clear_frames(error.__traceback__)  # frames still running (the caller's) are left as they are
        if tracebacks:
            error.__traceback__ = None
        error = error.__cause__ or error.__context__


class _Hooks:
    """A member's begin and end of each step (train.run_steps calls them)."""

    def __init__(self, run: SweepSegments, slot, position, first, finished, compute):
        self.run, self.slot, self.position, self.first = run, slot, position, first
        self.finished, self.compute = finished, compute

    def begin(self, step: int) -> None:
        if self.run.dies(self.slot, step):
            self.run._died_at = time.perf_counter()
            raise RankFailed(self.slot, step)

    def end(self, step: int, row: dict) -> None:
        run, timeout = self.run, self.run.spec.timeout
        row["wall_s"] = run.clock() - run.began  # on the run's clock, recoveries included
        self.finished.wait(timeout)  # every member has the step's result: none is kept before all are
        run.params[self.slot] = capture(self.compute, run.params.get(self.slot))  # the slot's one kept state
        with run.lock:
            run.rows.append(row)
        self.finished.wait(timeout)
        if self.position == 0:
            run._completed(step)  # counted and checkpointed once every member kept its state
        self.finished.wait(timeout)


def needs_outage_segments(spec) -> bool:
    """Whether the run has an outage or a server rank's failure (then sweep_outages.SweepOutages runs it)."""
    failures = spec.failures or {}
    return bool(failures.get("outages")) or any(rank >= spec.workers for _, rank in failures.get("schedule", []))


# -- the run's rows -----------------------------------------------------------------------------------------------


def execute(spec, meta: dict, segments: SweepSegments | None = None) -> tuple[dict, list[dict], list]:
    """Run `spec` with its failures on thread ranks, or on the segments given (Ray actors:
    experiments/pipeline/ray_sweep_faults.py): (run row, step rows, events: none recorded)."""
    if segments is None:
        if needs_outage_segments(spec):
            raise ValueError(f"run {spec.strategy} x {spec.workers} workers: links down or a server failing run on "
                             f"experiments/pipeline/sweep_outages.py's segments (segments_for(spec))")
        segments = SweepSegments(spec)
    error = ""
    try:
        out = segments.run()
    except Exception as e:  # noqa: BLE001 - the run fails (its completed steps kept), the sweep goes on
        out, error = None, f"{type(e).__name__}: {e}"
    rows = last_attempts(segments.rows)
    meta = {**meta, "duration_s": segments.clock() - segments.began}
    if out is not None and out.ended is not None:  # kept for its message; its traceback's frames hold the segments
        release_frames(out.ended, tracebacks=True)
    gc.collect()  # each failure's record on the thread ranks is a reference cycle (its traceback refers back to the
    # ranks' run, whose function holds these segments): freed here, after the run's clock, not runs later
    if not rows:
        row, _ = summarize(spec, None, error or _ended(out), meta)
        return {**row, **fault_columns(spec, out, rows, row, segments)}, [], []
    sizes: dict[int, int] = {}  # step -> the workers that ran it
    for r in rows:
        sizes[r["step"]] = sizes.get(r["step"], 0) + 1
    mixings = out.mixings if out is not None else []
    finals = [_final(segments, slot, rows) for slot in sorted(segments.alive)] or [_final(segments, None, rows)]
    results = [{"steps": rows + segments.server_rows, "final": finals[0]}] + [{"steps": [], "final": f}
                                                                             for f in finals[1:]]
    row, steps = summarize(spec, results, error, meta,
                           step_traffic=lambda numels: step_traffic(segments.config, sizes, mixings, numels))
    row.update(fault_columns(spec, out, rows, row, segments))
    if mixings and row["status"] == "ok":
        row["spectral_gap"] = mixings[-1].spectral_gap  # the survivors' mixing at the end
    if row["status"] == "ok" and (error or _ended(out)):
        row.update(status="failed", error=error or _ended(out))
    return row, steps, []


def _ended(out) -> str:
    return str(out.ended) if out is not None and out.ended is not None else ""


def _final(segments: SweepSegments, slot, rows: list[dict]) -> dict:
    """A live slot's report: its last segment's, or, where that segment was cut by the failure that ended the run,
    what its kept state says."""
    if slot in segments.finals and segments.step == segments.steps:
        return segments.finals[slot]
    from experiments.pipeline.measured import params_digest

    state = segments.params.get(slot)
    params = state.params if isinstance(state, SlotState) else None
    any_final = next(iter(segments.finals.values()), {})
    return {"loss": rows[-1]["loss"], "numel": int(params.numel()) if params is not None else any_final.get("numel", 0),
            "buckets": any_final.get("buckets", 1), "bucket_numels": any_final.get("bucket_numels"),
            "trained": True, "consensus_distance": math.nan,
            "param_norm": float(params.norm()) if params is not None else math.nan,
            "params_digest": params_digest(params) if params is not None else ""}
