"""`syncbench faults --outage RANK@STEP:SECONDS`: what a link down for t seconds costs each strategy, measured
against the same run without it, on emulated links, the kernel-shaped network or SimGrid, beside the model's price.

- emulated (default): thread ranks, each NIC emulated at --bandwidth (strategies/transport/link.py), the outage
  held by the transport (strategies/fault_outages.py); no compute;
- kernel: a process per rank in its own network namespace behind a tbf-shaped veth, TCP between them, the veth
  taken down and brought up (experiments/cluster/outages.py; root); no compute;
- simgrid: the star platform at --bandwidth, --compute seconds a step, the NIC at 1 byte/s for t simulated seconds
  (experiments/simulate/outages.py).

Each row: the time to step S (the last worker's) without and with the outage, the delay of the rank whose link
went down and of the others (mean and largest), the range of the rank's delay over the runs, and the model's price
(strategies/fault_cost.py, outage_price: which ranks stall and by how much; "failure" past the timeout). On the
kernel-shaped network the price is TCP's (strategies/fault_tcp.py: the data resumes at the first retransmission
after the link is back, an RTO of --rto doubling), beside the price without the backoff, and the RTOs the kernel
itself had on the connections that were retransmitting (`ss`, read 0.1 s into the outage).
"""

from __future__ import annotations

import time

import numpy as np

import strategies
from strategies.fault_cost import outage_price
from strategies.faults import FAILURE, LinkOutage, check_outages, outage_outcome
from strategies.transport.link import Link, Network, parse_bandwidth

SUBSTRATES = ("emulated", "kernel", "simgrid")
DEFAULT_STRATEGIES = ("ring", "halving_doubling", "parameter_server", "parameter_server:staleness=async",
                      "decentralized")


def parse_outage(text: str) -> LinkOutage:
    """'2@5:1.5' -> LinkOutage(step=5, rank=2, seconds=1.5); ValueError naming the text."""
    try:
        rank, rest = text.split("@")
        step, seconds = rest.split(":")
        return LinkOutage(int(step), int(rank), float(seconds))
    except ValueError:
        raise ValueError(f"--outage {text!r}: expected RANK@STEP:SECONDS, like 2@5:1.5 (rank 2's link down 1.5 s "
                         f"from the start of step 5)") from None


def run(args, strategy_of) -> int:
    outage = parse_outage(args.outage)
    if args.on not in SUBSTRATES:
        raise ValueError(f"--on {args.on!r}: accepted are {', '.join(SUBSTRATES)}")
    bandwidth = parse_bandwidth(args.bandwidth)
    if args.on == "kernel":
        from experiments.cluster.host import support_problem

        if (problem := support_problem()) is not None:
            raise ValueError(f"--on kernel: cannot build the kernel-shaped network here: {problem}")
    items = args.strategy or list(DEFAULT_STRATEGIES)
    plan = []
    for item in items:  # every strategy and the outage checked before any work
        name, params = strategy_of(item)
        if args.on != "emulated" and params.get("staleness") == "async":
            params = {"mode": "summation", **params}  # its servers sum; the update is not simulated or timed
        config = strategies.make(name, **params)
        check_outages([outage], args.workers, args.steps, config.num_servers(args.workers))
        plan.append((item, name, params, config))
    if not 1 <= args.repeat <= 20:
        raise ValueError(f"--repeat {args.repeat}: accepted are 1 to 20 runs")
    timeout = args.timeout if args.on != "kernel" else max(args.timeout, 60.0)
    compute = args.compute if args.on == "simgrid" else 0.0
    if args.on == "simgrid" and outage.seconds - compute >= timeout:
        return _simulated_failures(args, outage, plan, bandwidth, timeout)
    if outage_outcome(outage.seconds, timeout) == FAILURE:
        raise ValueError(f"--outage {args.outage}: {outage.seconds:g} s is not shorter than the timeout "
                         f"({timeout:g} s): a failure, not a stall; this table measures stalls (past the timeout: "
                         f"--on simgrid, or `syncbench faults` on thread ranks)")
    tcp = args.on == "kernel"
    if tcp and not (args.rto is not None and 0 < args.rto <= 120):
        raise ValueError(f"--rto {args.rto!r}: accepted are seconds in (0, 120] (Linux: 0.2 plus the RTT)")
    if tcp:
        from strategies.fault_tcp import tcp_resume_s

        resume = tcp_resume_s(outage.seconds, args.rto)
        if resume >= timeout:
            raise ValueError(f"--outage {args.outage} over TCP at an RTO of {args.rto:g} s: the retransmission that "
                             f"gets through comes {resume:g} s into the outage, not before the timeout ({timeout:g} "
                             f"s): a failure, not a stall; this table measures stalls")
    print(f"# {args.workers} workers, {args.steps} steps of {args.numel:,} float32, rank {outage.rank}'s link down "
          f"{outage.seconds:g} s from the start of step {outage.step}; {args.on}, {args.bandwidth} NICs, compute "
          f"{compute:g} s a step" + (f"; priced over TCP at an RTO of {args.rto:g} s" if tcp else ""))
    header = (f"{'strategy':<34} {'none s':>8} {'outage s':>8} {'rank ' + str(outage.rank):>7} {'(min-max)':>13} "
              f"{'others':>7} {'max':>7}  {'model: stalled':<16} {'stall s':>7}"
              + (f" {'no backoff':>10}" if tcp else "") + f" {'wall s':>7}")
    print(header)
    print("-" * len(header), flush=True)
    rtos = []
    for item, name, params, config in plan:
        began = time.perf_counter()
        base, out, spread = _medians(args, name, params, outage, bandwidth, timeout, rtos if tcp else None)
        plain = outage_price(config, args.workers, outage, args.steps, timeout, idle_s=compute)
        price = outage_price(config, args.workers, outage, args.steps, timeout, idle_s=compute,
                             rto_s=args.rto) if tcp else plain
        delay = {r: out[r] - base[r] for r in base}
        others = [d for r, d in delay.items() if r != outage.rank]
        stalled = ("failure" if price.outcome == FAILURE else
                   "all" if len(price.stalled) == args.workers else ",".join(map(str, price.stalled)))
        low, high = spread.get(outage.rank, (float("nan"), float("nan")))
        print(f"{item:<34} {max(base.values()):>8.3f} {max(out.values()):>8.3f} "
              f"{delay.get(outage.rank, float('nan')):>7.3f} {f'({low:.2f}-{high:.2f})':>13} {np.mean(others):>7.3f} "
              f"{max(others):>7.3f}  {stalled:<16} {price.stall_s:>7.3f}"
              + (f" {plain.stall_s:>10.3f}" if tcp else "") + f" {time.perf_counter() - began:>7.1f}", flush=True)
    print(f"# none s / outage s: the last worker's time to step S; rank r / others / max: each worker's seconds later "
          f"at step S than without the outage; each a median of {args.repeat} runs (alternating), (min-max) rank r's "
          f"over the runs against the median without; model: the ranks that stall and by how much "
          f"(strategies/fault_cost.py" + (", over TCP strategies/fault_tcp.py" if tcp else "") + ")")
    if rtos:
        print(f"# the kernel's RTO on the connections retransmitting 0.1 s into the outage: {min(rtos):.3f} to "
              f"{max(rtos):.3f} s (median {float(np.median(rtos)):.3f}; {len(rtos)} connections)")
    return 0


def _medians(args, name, params, outage, bandwidth, timeout, rtos=None) -> tuple[dict, dict, dict]:
    """Each worker's time to step S without and with the outage, the median of --repeat runs of each, taken in
    turn (a load that changes meanwhile touches both), and each worker's smallest and largest delay over the runs
    with the outage (against the median without). `rtos`: gets the kernel's RTOs (kernel runs)."""
    runs = [(_ends(args, name, params, None, bandwidth, timeout), _ends(args, name, params, outage, bandwidth,
                                                                         timeout, rtos)) for _ in range(args.repeat)]
    base, out = ({r: float(np.median([pair[i][r][-1] for pair in runs])) for r in runs[0][i]} for i in (0, 1))
    delays = {r: [pair[1][r][-1] - base[r] for pair in runs] for r in base}
    return base, out, {r: (min(d), max(d)) for r, d in delays.items()}


def _ends(args, name, params, outage, bandwidth, timeout, rtos=None) -> dict[int, list[float]]:
    """Each worker's step ends (seconds from the start) on the chosen substrate."""
    if args.on == "kernel":
        from experiments.cluster.outages import kernel_outage_run

        probe = [] if outage is not None and rtos is not None else None
        ends = kernel_outage_run(name, params, args.workers, args.steps, args.numel, outage, bandwidth, timeout,
                                 probe=probe)
        if probe:
            rtos += [c["rto"] for c in probe[0]["tcp"] if c.get("timer") == "on" and c.get("rto")]
        return ends
    if args.on == "simgrid":
        from experiments.simulate.outages import OutageSim, simulate_outage
        from experiments.simulate.platform import Platform

        platform = Platform(network_model="alpha_beta", bandwidth=bandwidth)
        return simulate_outage(OutageSim(name, args.workers, args.steps, outage, args.compute, args.numel, platform,
                                         params))
    from strategies.fault_outages import run_with_outages

    run = run_with_outages(name, args.workers, args.steps, [outage] if outage else [],
                           np.zeros(args.numel, dtype=np.float32), _gradient, 0.25, timeout=timeout,
                           network=Network(Link(bandwidth)), **params)
    return {slot: [t for _, t in sorted(ends)] for slot, ends in run.ends.items()}


def _gradient(slot: int, step: int, x: np.ndarray) -> np.ndarray:
    return np.full(x.shape, float(slot + step), dtype=x.dtype)


def _simulated_failures(args, outage, plan, bandwidth, timeout) -> int:
    """--on simgrid past the timeout: the outage's rank fails at the start of its step, each recovery mode of
    --modes that the simulation runs and fits the strategy a row (experiments/simulate/outages.py,
    simulate_outage_failure)."""
    from experiments.config.faults import parse_costs
    from experiments.simulate.faults import FaultSim, StepTable
    from experiments.simulate.outages import OutageSim, simulate_outage_failure
    from experiments.simulate.platform import Platform
    from strategies.fault_cost import FaultCosts
    from strategies.faults import CHECKPOINT_RESTART, NONE, FaultSettingError

    costs = FaultCosts(step_s=1.0, **parse_costs(args.costs))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    platform = Platform(network_model="alpha_beta", bandwidth=bandwidth)
    rows = []
    for item, name, params, _ in plan:  # every row checked before any simulation
        sim = OutageSim(name, args.workers, args.steps, outage, args.compute, args.numel, platform, params)
        for mode in modes:
            every = max(1, args.checkpoint_every) if mode == CHECKPOINT_RESTART else 0
            try:
                FaultSim(name, args.workers, args.steps, mode if mode != NONE else CHECKPOINT_RESTART, 1.0, costs,
                         checkpoint_every=every or 1, params=params)
            except FaultSettingError:
                continue  # a mode the simulation does not run, or that does not fit the strategy: not a row
            rows.append((item, sim, mode, every))
    if not rows:
        raise ValueError(f"--outage {args.outage} on simgrid past the timeout: no --strategy and --modes fit (the "
                         f"simulation runs none, checkpoint_restart, elastic, ps_shrink on a synchronous strategy)")
    print(f"# {args.workers} workers, {args.steps} steps of {args.numel:,} float32, {args.compute:g} s of compute a "
          f"step; rank {outage.rank}'s link down {outage.seconds:g} s from step {outage.step}, past the {timeout:g} s "
          f"timeout: the rank's failure (SimGrid, {args.bandwidth} NICs; costs {args.costs} s, detection the step's "
          f"compute + the timeout)")
    header = (f"{'strategy':<20} {'mode':<18} {'completed':>9} {'run':>4} {'lost':>4} {'failed at s':>11} "
              f"{'detect s':>8} {'time s':>8} {'no outage s':>11}")
    print(header)
    print("-" * len(header), flush=True)
    tables = {}
    for item, sim, mode, every in rows:
        table = tables.get(item)
        if table is None:
            table = tables[item] = StepTable(FaultSim(sim.strategy, sim.workers, sim.steps, CHECKPOINT_RESTART, 1.0,
                                                      costs, checkpoint_every=1, compute_s=sim.compute_s,
                                                      numel=sim.numel, platform=sim.platform, params=sim.params))
        got = simulate_outage_failure(sim, mode, timeout, costs, checkpoint_every=every, steps=table)
        free = sim.steps * table(sim.workers) + (((sim.steps - 1) // every) * costs.checkpoint_s if every else 0.0)
        print(f"{item:<20} {mode:<18} {got.completed_steps:>9} {got.steps_run:>4} {got.steps_lost:>4} "
              f"{got.failed_at_s:>11.3f} {got.detect_s:>8.3f} {got.time_s:>8.3f} {free:>11.3f}"
              + (f"  ended: {got.ended}" if got.ended else ""), flush=True)
    print("# time s: simulated seconds to step S (none: to the run's end); no outage s: the same run without it "
          "(each world size's step simulated once, the failure composed over them)")
    return 0
