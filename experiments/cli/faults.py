"""`syncbench faults`: a scripted failure for each strategy and recovery mode that fits it, on thread ranks or on
Ray actors (`--substrate ray`: the failing actor is killed, experiments/pipeline/ray_faults.py).

Each row trains the same small problem (a parameter vector, each worker slot's gradient x - target(slot, step))
with one strategy, the failures injected (strategies/fault_runs.py), and checks the result against the survivors'
reference worked out here in numpy: each step's mean over the slots alive in it (elastic, ps_shrink), the run
without failures (checkpoint_restart: it must resume to the same bits' values), the re-weighted mixing matrices
(reweight), the steps before the failure (none). A barrier-free server's result depends on the order its pushes
arrived: no fixed reference, said so. Prints a plain table: steps completed and run, steps lost, seconds of
detection (from the death until every survivor has stopped and the run knows) and of recovery (from there to the
recovered group's first step) per failure, measured on the ranks that ran, and the check.

`--outage RANK@STEP:SECONDS` instead: a link down for a while, no rank dying (experiments/cli/outages.py).
"""

from __future__ import annotations

import contextlib
import os
import time

import numpy as np

import strategies
from strategies.fault_runs import run_with_failures
from strategies.faults import (
    CHECKPOINT_RESTART,
    ELASTIC,
    MODES,
    NONE,
    PS_SHRINK,
    REWEIGHT,
    Failure,
    FaultSettingError,
    Recovery,
    check_fits,
    check_schedule,
    connected,
    metropolis,
    survivors_graph,
)

SUBSTRATES = ("threads", "ray")
RAY_WORKERS = (2, 8)  # the emulated cluster's sizes on this machine (an actor per rank, servers besides)
DEFAULT_STRATEGIES = ("ring", "halving_doubling", "double_binary_tree", "parameter_server",
                      "parameter_server:staleness=async", "decentralized")
NUMEL, LR = 64, 0.25


def add_arguments(p) -> None:
    p.add_argument("--workers", type=int, default=4, help="worker ranks, 1 to 16 (default 4; Ray: 2 to 8)")
    p.add_argument("--substrate", choices=SUBSTRATES, default="threads",
                   help="threads: thread ranks of this process (default); ray: every rank a Ray actor, the failing "
                        "one killed (SIGKILL), the survivors re-formed or a replacement started, seconds measured")
    p.add_argument("--p2p", default="sockets", help="with --substrate ray: what carries the messages (sockets, "
                                                     "gloo; default sockets)")
    p.add_argument("--timeout", type=float, default=20.0,
                   help="with --substrate ray: every wait's bound in seconds, 1 to 600 (default 20; a death is "
                        "detected at once, this is the backstop)")
    p.add_argument("--steps", type=int, default=12, help="steps, 1 to 1,000 (default 12)")
    p.add_argument("--fail", action="append", default=None, metavar="RANK@STEP",
                   help="rank RANK dies during step STEP (0-based); repeatable (default 2@5)")
    p.add_argument("--mtbf", default=None,
                   help="instead of --fail: every worker fails after an exponential time of this mean (\"40s\", "
                        "\"2h\"), its replacement after another, drawn with --seed over steps of --step-time")
    p.add_argument("--step-time", default="1s", help="with --mtbf: the seconds a step stands for (default 1s)")
    p.add_argument("--seed", type=int, default=0, help="with --mtbf: the draw's seed (default 0)")
    p.add_argument("--simulate", type=int, default=0, metavar="SEEDS",
                   help="instead of thread ranks: simulate on SimGrid (with --mtbf) this many seeds per strategy and "
                        "mode (checkpoint_restart, elastic, ps_shrink) and print the mean time to --steps against "
                        "the model's")
    p.add_argument("--costs", default="detect=0.5,restart=1,checkpoint=0.2,reform=0.3,rejoin=3",
                   help="with --simulate: recovery costs in seconds (default detect=0.5,restart=1,checkpoint=0.2,"
                        "reform=0.3,rejoin=3)")
    p.add_argument("--compute", type=float, default=0.1,
                   help="with --simulate or --outage --on simgrid: compute seconds per step (0.1)")
    p.add_argument("--numel", type=int, default=1_000_000,
                   help="with --simulate or --outage: float32 gradients synchronized per step (default 1,000,000: "
                        "4 MB)")
    p.add_argument("--compose", action="store_true",
                   help="with --simulate: simulate one step per world size the runs reach (the strategy's real code "
                        "on SimGrid) and compose every seed's failures and recoveries over those step times, "
                        "instead of simulating every step (what makes 1,024 ranks feasible; equal to the full "
                        "simulation where both run)")
    p.add_argument("--replay-shrunk", action="store_true",
                   help="with --compose, ring on the alpha-beta star: the step at --workers simulated (lazy sharing: "
                        "no link carries two flows), fewer workers' replayed by the ring's exact event recursion, "
                        "used only once it gives the simulated step to 1e-9 (experiments/simulate/ring_replay.py)")
    p.add_argument("--servers-fail", action="store_true",
                   help="with --simulate: a parameter server's dedicated servers fail too, as often as a worker; "
                        "ps_shrink covers a server's failure by a chain replica (--replicas), checkpoint_restart by "
                        "restarting every rank")
    p.add_argument("--replicas", type=int, default=None,
                   help="with --servers-fail: each shard's chain replicas under ps_shrink, 1 to servers - 1 "
                        "(default 1)")
    p.add_argument("--checkpoint-every", type=int, default=4,
                   help="checkpoint_restart: steps between checkpoints (default 4); with --simulate, 0: Daly's "
                        "optimum for the simulated step")
    p.add_argument("--rejoin-steps", type=int, default=None,
                   help="elastic and ps_shrink: a replacement joins this many steps after a failure (default never)")
    p.add_argument("--strategy", action="append", default=None,
                   help="a strategy, name or name:key=value,key=value (repeatable; default: "
                        + ", ".join(DEFAULT_STRATEGIES) + ")")
    p.add_argument("--out", help="also write the results to this directory: fault_runs.parquet (a row per strategy "
                                 "and mode) and failures.parquet (a row per failure), typed "
                                 "(experiments/results/faults.py)")
    p.add_argument("--overwrite", action="store_true", help="with --out: replace failure results already there")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated recovery modes (default: all that "
                                                            "fit each strategy)")
    p.add_argument("--outage", default=None, metavar="RANK@STEP:SECONDS",
                   help="instead of failures: rank RANK's link carries nothing for SECONDS from the start of step STEP "
                        "(no rank dies); prints each strategy's time to --steps with and without it, and the model's "
                        "price (experiments/cli/outages.py)")
    p.add_argument("--on", default="emulated", choices=("emulated", "kernel", "simgrid"),
                   help="with --outage: emulated links on thread ranks (default), the kernel-shaped network of "
                        "namespaces over TCP (root), or SimGrid")
    p.add_argument("--bandwidth", default="1Gbit", help="with --outage: every NIC's bandwidth (default 1Gbit)")
    p.add_argument("--rto", type=float, default=0.2,
                   help="with --outage --on kernel: the TCP retransmission timeout the price backs off from, in "
                        "seconds (default 0.2: Linux's 200 ms floor plus a loopback-like RTT; strategies/fault_tcp.py)")
    p.add_argument("--repeat", type=int, default=3,
                   help="with --outage: runs with and without it, each worker's median time taken (default 3; 1 to 20)")


def gradient(slot: int, step: int, x: np.ndarray) -> np.ndarray:
    """Worker slot's gradient at x in `step`: a quadratic pulled to a target of its own (its data shard)."""
    target = np.random.default_rng([slot, step]).standard_normal(x.shape)
    return x - target.astype(x.dtype)


def reference(name: str, params: dict, recovery: Recovery, schedule, workers: int, steps: int,
              x0: np.ndarray) -> dict[int, np.ndarray] | None:
    """What the live slots must hold at the end, in float64 numpy; None where no fixed answer exists."""
    config = strategies.make(name, **params)
    if recovery.mode == PS_SHRINK and config.asynchronous:
        return None
    if recovery.mode == CHECKPOINT_RESTART:
        schedule = ()
    alive, rejoin, x = list(range(workers)), {}, {s: x0.astype(np.float64) for s in range(workers)}
    w = None if config.exact else config.mixing_matrix(workers)
    for step in range(steps):
        for slot in [s for s, at in rejoin.items() if at == step]:
            alive = sorted(alive + [slot])
            x[slot] = x[alive[0] if alive[0] != slot else alive[1]].copy()  # fetched from a peer
            del rejoin[slot]
        dead = [f.rank for f in schedule if f.step == step and f.rank in alive]
        if dead and recovery.mode == NONE:  # the run ends; the failed ranks' parameters are gone with them
            alive = [s for s in alive if s not in dead]
            break
        if dead:
            alive = [s for s in alive if s not in dead]
            if recovery.rejoin_steps is not None:
                rejoin.update({s: step + recovery.rejoin_steps for s in dead})
            if recovery.mode == REWEIGHT:
                _, peers = survivors_graph(config, workers, [r for r in range(workers) if r not in alive])
                if not connected(peers):
                    break  # the run ends here: its completed steps are the answer
                w = metropolis(peers)
        if config.role != strategies.base.PARAMETERS:  # every live replica holds the same x
            base = x[alive[0]]
            g = np.mean([gradient(s, step, base) for s in alive], axis=0)
            for s in alive:
                x[s] = base - LR * g
        else:
            local = np.stack([x[s] - LR * gradient(s, step, x[s]) for s in alive])
            mixed = w @ local
            for i, s in enumerate(alive):
                x[s] = mixed[i]
    return {s: x[s] for s in alive}


def run(args) -> int:
    if args.outage is not None:
        from experiments.cli import outages

        return outages.run(args, _strategy)
    if args.simulate:
        return simulate(args)
    schedule, plan = _plan(args)  # every value checked before any work
    x0 = np.linspace(-1, 1, NUMEL)
    shown = ", ".join(f"rank {f.rank} at step {f.step}" for f in schedule) or "none"
    if args.mtbf is not None:
        shown = f"MTBF {args.mtbf} per worker, steps of {args.step_time}, seed {args.seed}: {shown}"
    where = ("thread ranks" if args.substrate == "threads" else
             f"Ray actors (p2p {args.p2p}; a barrier-free server's runs: gloo)")
    print(f"# {args.workers} workers, {args.steps} steps, {NUMEL} float64 parameters, {where}; failures: {shown}")
    header = (f"{'strategy':<34} {'mode':<18} {'completed':>9} {'run':>4} {'lost':>4} {'detect s':>8} "
              f"{'recovery s':>10} {'wall s':>7}  check")
    print(header)
    print("-" * len(header), flush=True)
    worst = 0.0
    run_rows, failure_rows, starts = [], [], []
    with _runner(args) as run_one:
        for item, name, params, recovery in plan:
            start = time.perf_counter()
            got = run_one(name, args.workers, args.steps, schedule, recovery, x0, gradient, LR, **params)
            wall = got.wall_s if not np.isnan(got.wall_s) else time.perf_counter() - start
            want = reference(name, params, recovery, schedule, args.workers, args.steps, x0)
            check = _check(got, want)
            if want is not None:
                worst = max(worst, _diff(got, want))
            lost = sum(r.steps_lost for r in got.failures)
            recovery_s, detection_s = (_mean(r.recovery_s for r in got.failures),
                                       _mean(r.detection_s for r in got.failures))
            ended = f"; ended: {got.ended.cause}" if got.ended else ""
            print(f"{item:<34} {recovery.mode:<18} {got.completed_steps:>9} {got.steps_run:>4} {lost:>4} "
                  f"{detection_s:>8.3f} {recovery_s:>10.4f} {wall:>7.3f}  {check}{ended}", flush=True)
            diff = _diff(got, want)
            if got.starts_s:
                starts.append(f"{item} {recovery.mode} " + ", ".join(f"{t:.2f} s" for t in got.starts_s))
            run_rows.append({
                "strategy": name, "strategy_label": item, "substrate": args.substrate, "mode": recovery.mode,
                "checkpoint_every": recovery.checkpoint_every,
                "rejoin_steps": -1 if recovery.rejoin_steps is None else recovery.rejoin_steps,
                "workers": args.workers, "steps": args.steps, "completed_steps": got.completed_steps,
                "steps_run": got.steps_run, "failures": len(got.failures), "steps_lost": lost,
                "detection_s": detection_s, "recovery_s": recovery_s,
                "time_to_step_s": float("nan") if got.ended else wall, "ended": got.ended is not None,
                "cause": got.ended.cause if got.ended else "",
                "reference": "none" if want is None else ("matches" if diff <= 1e-9 else "mismatch"),
                "max_abs_diff": diff})
            failure_rows += [{"strategy_label": item, "mode": recovery.mode, "step": r.step, "rank": r.rank,
                              "steps_lost": r.steps_lost, "detection_s": r.detection_s, "recovery_s": r.recovery_s,
                              "survivors": r.survivors} for r in got.failures]
    print(f"# check: the live slots' parameters against the survivors' reference (largest difference {worst:.3g})")
    if starts:
        print("# replacement actors' start (of the recovery seconds): " + "; ".join(starts))
    if args.out:
        from experiments.results import faults as fault_results

        written = fault_results.write(args.out, run_rows, failure_rows, overwrite=args.overwrite)
        print(f"# results: {', '.join(map(str, written))}")
    return 0


@contextlib.contextmanager
def _runner(args):
    """run(name, workers, steps, failures, recovery, x0, gradient, lr, **params) on the chosen substrate."""
    if args.substrate == "threads":
        yield run_with_failures
        return
    from experiments.cluster.ray_runtime import ensure_ray, stop_ray
    from experiments.pipeline.ray_faults import RayFaultHost, run_with_failures_ray

    # a logical CPU per actor (the largest group: the workers and the parameter server's)
    started = ensure_ray(num_cpus=max(os.cpu_count() or 1, args.workers + 2))
    try:
        with RayFaultHost() as host:
            def run_one(name, *arguments, **params):  # a barrier-free server's threads take gloo (see its refusal)
                p2p = "gloo" if strategies.make(name, **params).asynchronous else args.p2p
                return run_with_failures_ray(name, *arguments, timeout=args.timeout, p2p=p2p, host=host, **params)

            yield run_one
    finally:
        if started:
            stop_ray()


def _mean(values) -> float:
    values = [v for v in values if not np.isnan(v)]
    return float(np.mean(values)) if values else float("nan")


def _plan(args) -> tuple[list, list]:
    """The failure schedule and the (strategy, mode) rows that fit it, every argument checked."""
    if not 1 <= args.workers <= 16:
        raise ValueError(f"--workers {args.workers}: accepted are 1 to 16 (thread ranks of this process)")
    if args.substrate == "ray":
        if not RAY_WORKERS[0] <= args.workers <= RAY_WORKERS[1]:
            raise ValueError(f"--workers {args.workers} with --substrate ray: accepted are {RAY_WORKERS[0]} to "
                             f"{RAY_WORKERS[1]} (an actor per rank on this machine)")
        if not 1 <= args.timeout <= 600:
            raise ValueError(f"--timeout {args.timeout:g}: accepted are 1 to 600 seconds")
        from strategies.transport.names import P2P

        if args.p2p not in P2P:
            raise ValueError(f"--p2p {args.p2p!r}: accepted are {', '.join(P2P)}")
    if not 1 <= args.steps <= 1000:
        raise ValueError(f"--steps {args.steps}: accepted are 1 to 1,000")
    if args.mtbf is not None and args.fail:
        raise ValueError("--mtbf and --fail: give one (a drawn rate or a schedule)")
    if args.mtbf is not None:
        from experiments.config.faults import parse_mtbf
        from strategies.faults import draw_failures
        from strategies.transport.link import parse_latency

        schedule = list(draw_failures(args.workers, parse_mtbf(args.mtbf), parse_latency(args.step_time), args.steps,
                                      args.seed))
    else:
        schedule = [_failure(text) for text in (args.fail or ["2@5"])]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"--modes: {mode!r}: accepted are {', '.join(MODES)}")
    plan = []
    for item in args.strategy or DEFAULT_STRATEGIES:
        name, params = _strategy(item)
        config = strategies.make(name, **params)
        check_schedule(schedule, args.workers, args.steps, config.num_servers(args.workers))  # before any work
        for mode in modes:
            try:
                recovery = Recovery(mode, args.checkpoint_every if mode == CHECKPOINT_RESTART else 0,
                                    args.rejoin_steps if mode in (ELASTIC, PS_SHRINK) else None)
                check_fits(mode, config, args.workers, schedule)
            except FaultSettingError:
                continue  # a mode that does not fit this strategy: not a row
            if config.asynchronous and mode != PS_SHRINK:
                continue  # thread ranks run a barrier-free server's failures with ps_shrink only
            plan.append((item, name, params, recovery))
    if not plan:
        raise ValueError("no --strategy and --modes fit together (elastic: ring, halving_doubling, ...; ps_shrink: "
                         "parameter_server; reweight: decentralized; checkpoint_restart and none: any)")
    return schedule, plan


def _diff(got, want) -> float:
    live = {k: v for k, v in got.params.items() if k != "server"}
    if want is None or live.keys() != want.keys():
        return float("nan") if want is None else float("inf")
    return max((float(np.max(np.abs(live[s] - want[s]))) for s in want), default=0.0)


def _check(got, want) -> str:
    if want is None:
        return "no fixed reference (barrier-free: the pushes' order decides)"
    live = {k: v for k, v in got.params.items() if k != "server"}
    if live.keys() != want.keys():
        return f"MISMATCH: live slots {sorted(live)} != reference {sorted(want)}"
    diff = _diff(got, want)
    return f"matches (max |diff| {diff:.1e})" if diff <= 1e-9 else f"MISMATCH (max |diff| {diff:.3g})"


def _failure(text: str) -> Failure:
    try:
        rank, step = (int(v) for v in text.split("@"))
    except ValueError:
        raise ValueError(f"--fail {text!r}: expected RANK@STEP, e.g. 2@5") from None
    return Failure(step, rank)


def _strategy(item: str) -> tuple[str, dict]:
    name, _, rest = item.partition(":")
    params = {}
    for pair in filter(None, rest.split(",")):
        key, eq, value = pair.partition("=")
        if not eq:
            raise ValueError(f"--strategy {item!r}: expected name:key=value,key=value")
        params[key.strip()] = _value(value.strip())
    if name not in strategies.names():
        raise ValueError(f"--strategy: unknown strategy {name!r}: known are {', '.join(strategies.names())}")
    return name, params


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def simulate(args) -> int:
    """SimGrid: each strategy and mode that fits, `args.simulate` seeds, the mean against the model."""
    from dataclasses import replace

    from experiments.config.faults import parse_costs, parse_mtbf
    from experiments.simulate.faults import MODES as SIMULATED
    from experiments.simulate.faults import compare
    from strategies.fault_cost import FaultCosts, daly_interval

    if args.mtbf is None or args.fail:
        raise ValueError("--simulate draws failures from a rate: give --mtbf (per worker), not --fail")
    if not 1 <= args.simulate <= 1000:
        raise ValueError(f"--simulate {args.simulate}: accepted are 1 to 1,000 seeds")
    if not 2 <= args.workers <= 16_384 or not 1 <= args.steps <= 1_000_000:
        raise ValueError(f"--workers {args.workers}, --steps {args.steps}: accepted are 2 to 16,384 workers and 1 to "
                         f"1,000,000 steps")
    costs = FaultCosts(step_s=1.0, **parse_costs(args.costs))
    mtbf = parse_mtbf(args.mtbf)
    if args.checkpoint_every < 0 or args.numel < 1 or not args.compute > 0:
        raise ValueError(f"--checkpoint-every {args.checkpoint_every}, --numel {args.numel}, --compute "
                         f"{args.compute}: accepted are >= 0 steps (0: Daly's optimum), >= 1 gradients, > 0 seconds")
    if args.replicas is not None and (not args.servers_fail or args.replicas < 1):
        raise ValueError(f"--replicas {args.replicas}: accepted with --servers-fail, 1 to servers - 1")
    replicas = args.replicas or 1
    if args.replay_shrunk and not args.compose:
        raise ValueError("--replay-shrunk: accepted with --compose (it replaces the composed steps' simulations)")
    modes = [m.strip() for m in args.modes.split(",") if m.strip() in SIMULATED]
    plan = _simulated_plan(args, modes, mtbf, costs, replicas)
    if not plan:
        raise ValueError(f"--simulate: no --strategy fits the simulated modes {', '.join(SIMULATED)}")
    how = ("each world size's step simulated once, the failures composed over them" if args.compose else
           "every step simulated")
    print(f"# SimGrid: {args.workers} workers, {args.steps} steps, MTBF {args.mtbf} per worker, {args.simulate} seeds "
          f"({how}); costs {args.costs} s; compute {args.compute:g} s a step; {args.numel:,} float32 gradients")
    if args.servers_fail:
        print(f"# servers fail too: ps_shrink with {replicas} chain replica(s) a shard (promotion: reform), "
              f"checkpoint_restart restarting every rank")
    header = (f"{'strategy':<20} {'mode':<18} {'every':>5} {'failures/run':>12} {'simulated s':>12} {'+-':>6} "
              f"{'model s':>9} {'sim/model':>9} {'overhead':>8} {'CPU s':>7} {'wall s':>7}")
    print(header)
    print("-" * len(header))
    tables = {}
    for item, daly, sim in plan:
        table = None
        if args.compose:  # one table per strategy: its modes share the steps
            key = (item, getattr(sim, "replicas", 0))  # replicas make a longer step
            table = tables[key] if key in tables else tables.setdefault(key, _table(sim, args.replay_shrunk))
            cpu0 = table.cpu_s
        started = time.perf_counter()  # the row's wall: its step simulations (the first row's) and its composition
        if daly:
            step_s = table(sim.workers) if table else _one_step(sim)
            every = max(1, round(daly_interval(sim.costs.checkpoint_s, sim.mtbf_s / sim.failing_slots()) / step_s))
            sim = replace(sim, checkpoint_every=every)
        got = compare(sim, range(args.simulate), composed=args.compose, steps=table)
        cpu, wall = got.cpu_s, got.wall_s
        if table is not None:  # this row's step simulations, and the composition's own time
            cpu, wall = table.cpu_s - cpu0, time.perf_counter() - started
        print(f"{item:<20} {sim.mode:<18} {sim.checkpoint_every or '-':>5} {got.failures:>12.2f} "
              f"{got.simulated_s:>12.2f} {got.stderr_s:>6.2f} {got.model_s:>9.2f} {got.ratio:>9.4f} "
              f"{got.overhead_ratio:>8.3f} {cpu:>7.1f} {wall:>7.1f}")
        if got.overshoots:
            print(f"#   {got.overshoots} failure(s) noticed after their detection time: the step in flight outlasted "
                  f"the detection ({got.overshoots / args.simulate:.2f} a run; the simulation notices failures at "
                  f"step boundaries)")
        if args.compose:
            shown = ", ".join(f"{m}: {s:.6g}" for m, s in sorted(got.step_s.items(), reverse=True))
            print(f"#   simulated seconds a step at each world size: {shown}")
            if isinstance(getattr(table, "replayed", None), set):  # the step at n with sharing = lazy, checked
                print(f"#   replayed: {', '.join(map(str, sorted(table.replayed, reverse=True))) or 'none'} "
                      f"(at {sim.workers}: {table.agreement:.2g} from SimGrid's step, {sim.platform.sharing} sharing)")
    print("# overhead: (simulated - failure-free) / (model - failure-free), what failures cost against the model's "
          "price; CPU s: the SimGrid simulations (composed: of this row's new world sizes)")
    return 0


def _simulated_plan(args, modes, mtbf, costs, replicas) -> list:
    """(strategy label, Daly's interval wanted, the FaultSim) for each --strategy and mode that fits; a mode that
    does not fit is not a row, replicas that do not fit the servers are an error."""
    from experiments.simulate.fault_servers import ServerFaultSim
    from experiments.simulate.faults import FaultSim
    from experiments.simulate.platform import Platform

    plan = []
    for item in args.strategy or ("ring", "parameter_server"):
        name, params = _strategy(item)
        for mode in modes:
            every = max(1, args.checkpoint_every) if mode == CHECKPOINT_RESTART else 0
            kind, extra = FaultSim, {}
            if args.replay_shrunk and (name, params) == ("ring", {}):  # checked against the exact replay at n
                extra["platform"] = Platform(network_model="alpha_beta", sharing="lazy")
            if args.servers_fail:
                kind, extra = ServerFaultSim, {"replicas": replicas if mode != CHECKPOINT_RESTART else 0}
            try:
                plan.append((item, args.checkpoint_every == 0 and mode == CHECKPOINT_RESTART,
                             kind(name, args.workers, args.steps, mode, mtbf, costs, checkpoint_every=every,
                                  compute_s=args.compute, numel=args.numel, params=params, **extra)))
            except FaultSettingError as e:
                if kind is ServerFaultSim and mode == PS_SHRINK and "replicas" in str(e):
                    raise  # the servers' replicas do not fit the parameter server: said, not a missing row
    return plan


def _table(sim, replay: bool):
    from experiments.simulate.faults import StepTable
    from experiments.simulate.ring_replay import ReplayedRingSteps, replay_fits

    if not replay:
        return StepTable(sim)
    why = replay_fits(sim)
    if why:
        raise ValueError(f"--replay-shrunk with {sim.strategy}: {why}")
    return ReplayedRingSteps(sim)


def _one_step(sim) -> float:
    from experiments.simulate.faults import step_seconds
    from experiments.simulate.substrate import run_child

    done = run_child(lambda: step_seconds(sim, sim.workers))
    if done.error:
        raise RuntimeError(f"simulating a step of {sim.strategy} at {sim.workers} workers failed: {done.error}")
    return done.result[0]
