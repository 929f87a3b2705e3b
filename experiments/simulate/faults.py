"""Failures on a simulated cluster (SimGrid): time to step S under a per-worker failure rate, for one recovery mode.

Two ways, the same answer (checked at 4 ranks: the same failures and seconds to 1e-9):
- simulate_failures, every step simulated: each live worker spends the global batch's compute (`compute_s` x n /
  live workers) and the strategy's real code synchronizes a buffer of `numel` float32 gradients (meta tensors:
  real sizes, no values) over the simulated platform, in a process set up as run_simgrid's (simgrid_process);
- compose_failures: the step at each world size the run reaches simulated once (step_seconds, the same code and
  per-step structure, in a child process), the failure process run over those step times: what makes 1,024
  ranks feasible (one ring step there is 2 million messages).

Failures come at simulated times: every worker slot fails after an exponential time of mean `mtbf_s` (seeded; a
replacement's clock starts when it joins). SimGrid 3.32's Python binding cannot turn a host off, and a host's state
profile would kill a rank inside a collective, which the transport does not survive; so a failure is noticed at
the next step boundary (a zero-time control-plane exchange) and the run is rolled back to what the failure really
cost: the step in flight when it happened does not count, detection ends `detect_s` after it, and the recovery
starts then. (A step boundary later than the detection would overshoot it: the result says how often that
happened.)

Recovery, as the model (strategies/fault_cost.py) prices it:
- checkpoint_restart: a checkpoint of `checkpoint_s` after every `checkpoint_every` completed steps; a failure
  sends every rank back to the last checkpoint finished before it, after detection + `restart_s` (a failure
  during that restarts the restart);
- elastic: the survivors re-form (`reform_s`) and go on at n - 1 from the step in flight; the replacement joins
  `rejoin_s` after the failure, at the next step boundary;
- ps_shrink (a synchronous parameter server): as elastic, nothing to re-form.
Only workers fail here; experiments/simulate/fault_servers.py fails a parameter server's servers too (FaultSim's
hooks: failing_slots, process, watched, serve, expected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

import strategies
from experiments.simulate.platform import Platform
from strategies.fault_cost import FaultCosts
from strategies.faults import CHECKPOINT_RESTART, ELASTIC, PS_SHRINK, FaultSettingError, check_fits

MODES = (CHECKPOINT_RESTART, ELASTIC, PS_SHRINK)


@dataclass(frozen=True)
class FaultSim:
    strategy: str
    workers: int
    steps: int
    mode: str
    mtbf_s: float
    costs: FaultCosts  # step_s is ignored: the simulation measures it
    checkpoint_every: int = 0
    compute_s: float = 0.1
    numel: int = 1_000_000
    seed: int = 0
    platform: Platform = field(default_factory=lambda: Platform(network_model="alpha_beta"))
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.mode not in MODES:
            raise FaultSettingError(f"mode = {self.mode!r}: the simulation runs {', '.join(MODES)}")
        config = strategies.make(self.strategy, **self.params)
        check_fits(self.mode, config, self.workers)
        if config.asynchronous:
            raise FaultSettingError("a barrier-free parameter server is not simulated with failures: its servers "
                                    "serve a whole run at once")
        if self.platform.sharing == "lazy" and (self.strategy != "ring" or self.params):
            raise ValueError(f"platform sharing = 'lazy' with {self.strategy} {self.params or ''}: accepted for ring "
                             f"(no settings) only, whose links never carry two flows at once; the others share "
                             f"links, where SimGrid's lazy update can leave one over its capacity (use 'full')")
        if self.mode == CHECKPOINT_RESTART and self.checkpoint_every < 1:
            raise FaultSettingError(f"checkpoint_every = {self.checkpoint_every!r}: checkpoint_restart needs >= 1")

    # What a kind of simulation changes (experiments/simulate/fault_servers.py: the servers fail too): the slots
    # that fail, the failure process, a server rank's part of a step, and the model's price.
    def failing_slots(self) -> int:
        """Slots that fail at 1 / mtbf_s each: the workers (servers do not fail here)."""
        return self.workers

    def process(self, steps) -> _FailureProcess:
        return _FailureProcess(self, steps)

    def watched(self, alive: list[int]) -> list[int]:
        """The slots whose failure ends a segment: the live workers."""
        return alive

    def serve(self, comm, runtime, tag: str) -> None:
        """A server rank's part of one step (tag: names this segment's mailboxes apart)."""
        runtime.serve(self.numel, torch.float32, "mean")

    def expected(self, costs: FaultCosts):
        from strategies.fault_cost import expected_time

        return expected_time(self.mode, self.steps, self.workers, self.mtbf_s, costs,
                             checkpoint_every=self.checkpoint_every or None)


@dataclass
class FaultSimResult:
    time_s: float  # simulated seconds to reach step S
    step_s: float  # a failure-free step at n workers (the first segment's mean)
    step_s_shrunk: float  # a step at n - 1 (NaN: never ran)
    failures: list[tuple[float, int]]  # (simulated time, slot)
    steps_run: int
    steps_lost: int
    overshoots: int  # failures noticed after their detection time (a step longer than detect_s)


def simulate_failures(sim: FaultSim) -> FaultSimResult:
    """Simulate the whole run on SimGrid, every step, in this process (SimGrid's engine: once per process; see
    compare, which forks a process per seed)."""
    from strategies.transport.simgrid_run import simgrid_process

    config = strategies.make(sim.strategy, **sim.params)
    ranks = sim.workers + config.num_servers(sim.workers)
    with simgrid_process(2 * ranks + 2, sim.platform.config) as (sg, engine):  # ranks, their NIC actors, the driver
        hosts = sim.platform.build(sg, ranks + 1)  # the last: the driver's
        run = sim.process(_SimulatedSteps(sim, config, sg, hosts))
        sg.Actor.create("driver", hosts[-1], run.drive)
        engine.run()
    return run.result()


def compose_failures(sim: FaultSim, step_s) -> FaultSimResult:
    """The same failure process as simulate_failures, over steps of step_s(m) seconds at m live workers (each
    measured once by step_seconds, the strategy's real code on SimGrid) instead of simulating every step: what
    the full run does at every step boundary, with the step's simulated length looked up."""
    run = sim.process(_ComposedSteps(sim, step_s))
    run.drive()
    return run.result()


def step_seconds(sim: FaultSim, workers: int, steps: int = 1) -> list[float]:
    """Rank 0's simulated seconds for each of `steps` failure-free steps at `workers` workers, as the full run
    takes them (the step boundary's exchange, the global batch's compute shared by the workers: compute_s x
    sim.workers / workers, the strategy's sync of `numel` float32 on the platform).
    Runs SimGrid's engine in this process: call it in a child (run_child)."""
    from strategies.transport.simgrid_loader import load_simgrid
    from strategies.transport.simgrid_run import run_simgrid

    config = strategies.make(sim.strategy, **sim.params)
    world = config.world_size(workers)
    sg = load_simgrid()

    def rank_main(comm):
        runtime = config.bind(comm, workers)
        grads = torch.empty(sim.numel, dtype=torch.float32, device="meta")
        seconds = []
        for _ in range(steps):
            comm.allgather_object(None)  # the step boundary's verdict: zero simulated time
            if runtime.is_server:
                sim.serve(comm, runtime, "step")
                continue
            began = sg.Engine.clock
            comm.compute(sim.compute_s * sim.workers / workers)  # the survivors share the global batch
            runtime.sync(grads, "mean")
            seconds.append(sg.Engine.clock - began)
        return seconds

    return run_simgrid(world, rank_main, lambda sg: sim.platform.build(sg, world), sim.platform.config,
                       sim.platform.nic)[0]


class _SimulatedSteps:
    """Steps simulated on SimGrid: a segment runs the live slots' ranks (a fresh cluster each) until a failure, a
    rejoin or step S is due at a step boundary."""

    def __init__(self, sim: FaultSim, config, sg, hosts):
        self.sim, self.config, self.sg, self.hosts = sim, config, sg, hosts
        self.segments = 0

    def now(self) -> float:
        return self.sg.Engine.clock

    def sleep_until(self, t: float) -> None:
        self.sg.this_actor.sleep_until(t)

    def _cluster(self, world: int, tag: str):
        """A fresh cluster per segment: its mailboxes named apart from earlier segments' (a message a dead segment
        left behind must never match a new receive)."""
        from strategies.transport.simgrid import Cluster

        sg, nic = self.sg, self.sim.platform.nic

        class SegmentCluster(Cluster):
            def box(self, src, dst):
                key = (src, dst)
                box = self.boxes.get(key)
                if box is None:
                    box = self.boxes[key] = sg.Mailbox.by_name(f"{tag}:{src}>{dst}")
                    box.set_receiver(self.actors[dst])
                return box

        return SegmentCluster(sg, world, nic)

    def segment(self, alive: list[int], start: int, rejoin_at: float, checkpoints: list, next_fail: dict) -> dict:
        """Steps from `start` on the live slots until the end, a failure or a rejoin is due; what happened."""
        from strategies.transport import factory
        from strategies.transport.simgrid import SimGridCommunicator

        sg, sim, config = self.sg, self.sim, self.config
        m = len(alive)
        world = config.world_size(m)
        self.segments += 1
        cluster = self._cluster(world, f"s{self.segments}")
        done = {"completed": [], "stop": None}
        watched = sim.watched(alive)

        def rank_main(position):
            comm = factory.build("simgrid", SimGridCommunicator(cluster, position))
            runtime = config.bind(comm, m)
            grads = torch.empty(sim.numel, dtype=torch.float32, device="meta")
            step = start
            while True:
                now = sg.Engine.clock
                dead = [s for s in watched if next_fail[s] <= now] if position == 0 else None
                rejoin = position == 0 and rejoin_at <= now
                verdict = comm.allgather_object((dead, rejoin))[0]  # zero simulated time: every rank sees rank 0's
                if verdict[0] or verdict[1] or step >= sim.steps:
                    if position == 0:
                        done["stop"] = (step, verdict[0], now)
                    return
                if runtime.is_server:
                    sim.serve(comm, runtime, f"s{self.segments}")
                else:
                    began = sg.Engine.clock
                    comm.compute(sim.compute_s * sim.workers / m)  # the survivors share the global batch
                    runtime.sync(grads, "mean")
                    if position == 0:
                        done["completed"].append((step, began, sg.Engine.clock))
                step += 1
                if sim.mode == CHECKPOINT_RESTART and step % sim.checkpoint_every == 0 and step < sim.steps:
                    comm.compute(sim.costs.checkpoint_s)  # every rank writes its part
                    if position == 0:
                        checkpoints.append((step, sg.Engine.clock))

        where = [self.hosts[s] for s in alive] + [self.hosts[sim.workers + i] for i in range(world - m)]
        actors = []
        for position in range(world):
            cluster.actors[position] = actor = sg.Actor.create(f"s{self.segments}r{position}", where[position],
                                                               rank_main, position)
            actors.append(actor)
        for actor in actors:
            actor.join()
        return done


class _ComposedSteps:
    """Steps of step_s(m) seconds at m live workers on a plain clock: the segment of _SimulatedSteps, step for
    step, with each step's length looked up instead of simulated."""

    def __init__(self, sim: FaultSim, step_s):
        self.sim, self.step_s = sim, step_s
        self.clock = 0.0

    def now(self) -> float:
        return self.clock

    def sleep_until(self, t: float) -> None:
        self.clock = max(self.clock, t)

    def segment(self, alive: list[int], start: int, rejoin_at: float, checkpoints: list, next_fail: dict) -> dict:
        sim = self.sim
        seconds = self.step_s(len(alive))
        watched = sim.watched(alive)
        first_failure = min(next_fail[s] for s in watched)  # fixed during a segment
        completed, step = [], start
        while True:
            now = self.clock
            if first_failure <= now or rejoin_at <= now or step >= sim.steps:
                dead = [s for s in watched if next_fail[s] <= now]
                return {"completed": completed, "stop": (step, dead, now)}
            self.clock = now + seconds
            completed.append((step, now, self.clock))
            step += 1
            if sim.mode == CHECKPOINT_RESTART and step % sim.checkpoint_every == 0 and step < sim.steps:
                self.clock += sim.costs.checkpoint_s
                checkpoints.append((step, self.clock))


class _FailureProcess:
    """One run's failures and recoveries: the driver runs segments of steps on the live slots, draws each slot's
    next failure, and recovers by the mode: back to the last checkpoint, or on without the failed slots until
    their replacements rejoin. `steps` runs the segments and keeps the clock (simulated or composed)."""

    def __init__(self, sim: FaultSim, steps):
        self.sim, self.steps = sim, steps
        self.rng = np.random.default_rng([sim.seed, sim.workers, 39])
        self.costs = sim.costs
        self.next_fail: dict[int, float] = {}
        self.out = FaultSimResult(math.nan, math.nan, math.nan, [], 0, 0, 0)
        self.step_times: dict[int, list[float]] = {}
        self.server_slots: list[int] = []  # slots that fail beside the workers (experiments/simulate/fault_servers.py)

    def draw(self, slot: int, now: float) -> None:
        self.next_fail[slot] = now + self.rng.exponential(self.sim.mtbf_s)

    def drive(self) -> None:
        sim, out = self.sim, self.out
        alive = list(range(sim.workers))
        for slot in alive:
            self.draw(slot, 0.0)
        step, rejoins = 0, []  # rejoins: (time, slot)
        checkpoints = [(0, 0.0)]  # (steps complete, time the checkpoint finished)
        while step < sim.steps:
            now = self.steps.now()
            joined = [slot for at, slot in rejoins if at <= now]
            rejoins = [(at, slot) for at, slot in rejoins if at > now]
            for slot in joined:
                self.draw(slot, now)  # the replacement's clock starts now
            alive = sorted(alive + joined)
            rejoin_at = min((at for at, _ in rejoins), default=math.inf)
            done = self.steps.segment(alive, step, rejoin_at, checkpoints, self.next_fail)
            out.steps_run += len(done["completed"])
            for _, began, ended in done["completed"]:
                self.step_times.setdefault(len(alive), []).append(ended - began)
            stop_step, dead, noticed = done["stop"]
            if not dead:
                step = stop_step
                continue
            alive, step, incident = self._recover(alive, dead, done["completed"], stop_step, noticed, checkpoints)
            rejoins += [(t + self.costs.rejoin_s, s) for t, s in incident]
        out.time_s = self.steps.now()

    def window(self, slot: int) -> float:
        """Seconds from a slot's failure to the end of its recovery window: detection, then the mode's restart or
        re-forming (ps_shrink: nothing more)."""
        costs = self.costs
        return costs.detect_s + (costs.restart_s if self.sim.mode == CHECKPOINT_RESTART else
                                 costs.reform_s if self.sim.mode == ELASTIC else 0.0)

    def _recover(self, alive, dead, completed, stop_step, noticed, checkpoints):
        """After a failure: detection, then the mode's recovery; a failure before the incident's last window ends
        joins it (each failure with its own window). The live slots, the step to go on from, and the incident's
        (time, slot) failures of workers (elastic: to rejoin). A server slot (`server_slots`) lost outside a
        restart is replaced by its standby at once."""
        sim, out, costs = self.sim, self.out, self.costs
        t_fail = min(self.next_fail[s] for s in dead)
        failed = [s for s in dead if self.next_fail[s] == t_fail]
        # the step in flight at t_fail, and those after it, never completed
        in_flight = next((s for s, _, ended in completed if ended > t_fail), stop_step)
        step = min(stop_step, in_flight)
        out.failures += [(t_fail, s) for s in failed]
        if noticed > t_fail + costs.detect_s:
            out.overshoots += 1
        lost = set(failed)
        incident = [(t_fail, s) for s in failed]
        latest, end = t_fail, max(t_fail + self.window(s) for s in failed)
        while True:
            others = [(self.next_fail[s], s) for s in alive + self.server_slots
                      if s not in lost and latest < self.next_fail[s] < max(end, noticed)]
            if not others:
                break
            latest, slot = min(others)
            lost.add(slot)
            incident.append((latest, slot))
            out.failures.append((latest, slot))
            end = max(end, latest + self.window(slot))
        self.steps.sleep_until(max(end, noticed))
        if sim.mode == CHECKPOINT_RESTART:
            back, _ = max((c for c in checkpoints if c[1] <= t_fail), key=lambda c: c[0])
            out.steps_lost += step - back
            for slot in lost:
                self.draw(slot, self.steps.now())  # replaced at the restart
            del checkpoints[[c[0] for c in checkpoints].index(back) + 1:]
            return alive, back, []
        for slot in lost & set(self.server_slots):
            self.draw(slot, self.steps.now())  # the standby, promoted into the chains, runs from now
        workers = lost - set(self.server_slots)
        alive = [s for s in alive if s not in workers]
        if not alive:
            raise RuntimeError(f"no worker left at {self.steps.now():.6g} simulated s")
        for slot in workers:
            self.next_fail[slot] = math.inf  # not running until it rejoins
        return alive, step, [(t, s) for t, s in incident if s in workers]

    def result(self) -> FaultSimResult:
        full = self.step_times.get(self.sim.workers, [])
        shrunk = self.step_times.get(self.sim.workers - 1, [])
        self.out.step_s = float(np.mean(full)) if full else math.nan
        self.out.step_s_shrunk = float(np.mean(shrunk)) if shrunk else math.nan
        return self.out


@dataclass(frozen=True)
class Comparison:
    """Simulations of several seeds against the model's expectation with the steps they measured."""

    simulated_s: float  # mean simulated seconds to step S
    stderr_s: float  # its standard error over the seeds
    model_s: float  # the model's expected seconds (strategies/fault_cost.py) with the simulated step times
    failures: float  # mean failures per run
    overshoots: int  # failures noticed after their detection time, over all runs
    cpu_s: float  # CPU seconds of all the simulations
    failure_free_s: float = math.nan  # the simulation's S steps and checkpoints without a failure
    model_free_s: float = math.nan  # the model's without a failure (checkpoint_restart: a checkpoint per interval)
    composed: bool = False  # True: each world size's step simulated once, the failure process composed over them
    step_s: dict = field(default_factory=dict)  # composed: simulated seconds of a step at each world size run
    wall_s: float = math.nan  # wall seconds of all the simulations

    @property
    def ratio(self) -> float:
        return self.simulated_s / self.model_s

    @property
    def overhead_ratio(self) -> float:
        """What failures cost in the simulation against the model's price: (simulated - failure-free) / (model -
        failure-free); a sharper check than `ratio` where failures cost little of the whole."""
        return (self.simulated_s - self.failure_free_s) / (self.model_s - self.model_free_s)


def _step_setting(sim: FaultSim) -> tuple:
    """What a step's simulated seconds depend on (not the failures, the mode or the seed; the workers at the start
    set the global batch)."""
    return sim.strategy, sim.params, sim.workers, sim.numel, sim.compute_s, sim.platform, getattr(sim, "replicas", 0)


class StepTable:
    """Seconds of a step at m live workers, each world size simulated once on SimGrid (step_seconds, in a child
    process) when first asked for; what the simulations took."""

    def __init__(self, sim: FaultSim, known: dict[int, float] | None = None):
        self.sim = sim
        self.seconds: dict[int, float] = dict(known or {})
        self.cpu_s = self.wall_s = 0.0

    def __call__(self, workers: int) -> float:
        if workers not in self.seconds:
            from experiments.simulate.child import run_child

            done = run_child(lambda: step_seconds(self.sim, workers))
            if done.error:
                raise RuntimeError(f"simulating a step of {self.sim.strategy} at {workers} workers failed: "
                                   f"{done.error}")
            self.cpu_s += done.cpu_s
            self.wall_s += done.wall_s
            self.seconds[workers] = done.result[0]
        return self.seconds[workers]


def compare(sim: FaultSim, seeds, composed: bool = False, steps: StepTable | None = None) -> Comparison:
    """`sim` once per seed against the model. Full (composed=False): every step simulated, each seed in a forked
    process (SimGrid's engine runs once per process). Composed: each world size's step simulated once (`steps`,
    or a fresh StepTable), the seeds' failure processes composed over them here."""
    from dataclasses import replace

    from experiments.simulate.substrate import run_child

    if composed:
        steps = steps or StepTable(sim)
        if _step_setting(steps.sim) != _step_setting(sim):
            raise ValueError(f"compare: the step table is of {_step_setting(steps.sim)}, not {_step_setting(sim)}")
    times, models, frees, model_frees, failures, overshoots, cpu, wall = [], [], [], [], [], 0, 0.0, 0.0
    for seed in seeds:
        one = replace(sim, seed=seed)
        if composed:
            result = compose_failures(one, steps)
            step_s = steps(sim.workers)
            shrunk = steps(sim.workers - 1) if sim.mode != CHECKPOINT_RESTART else step_s
        else:
            done = run_child(lambda one=one: simulate_failures(one))
            if done.error:
                raise RuntimeError(f"simulation of seed {seed} failed: {done.error}")
            result = done.result
            cpu += done.cpu_s
            wall += done.wall_s
            step_s = result.step_s
            shrunk = result.step_s if math.isnan(result.step_s_shrunk) else result.step_s_shrunk
        times.append(result.time_s)
        failures.append(len(result.failures))
        overshoots += result.overshoots
        costs = FaultCosts(step_s=step_s, step_s_shrunk=shrunk, detect_s=sim.costs.detect_s,
                           restart_s=sim.costs.restart_s, checkpoint_s=sim.costs.checkpoint_s,
                           reform_s=sim.costs.reform_s, rejoin_s=sim.costs.rejoin_s)
        model = sim.expected(costs)
        models.append(model.seconds)
        model_frees.append(model.failure_free_s if sim.mode != CHECKPOINT_RESTART else
                           model.failure_free_s * (1 + sim.costs.checkpoint_s / (sim.checkpoint_every * step_s)))
        checkpoints = (sim.steps - 1) // sim.checkpoint_every if sim.mode == CHECKPOINT_RESTART else 0
        frees.append(sim.steps * step_s + checkpoints * sim.costs.checkpoint_s)
    if composed:
        cpu, wall = steps.cpu_s, steps.wall_s
    stderr = float(np.std(times, ddof=1) / math.sqrt(len(times))) if len(times) > 1 else math.nan
    return Comparison(float(np.mean(times)), stderr, float(np.mean(models)), float(np.mean(failures)), overshoots,
                      cpu, float(np.mean(frees)), float(np.mean(model_frees)), composed,
                      dict(steps.seconds) if composed else {}, wall)
