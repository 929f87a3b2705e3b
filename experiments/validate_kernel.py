"""`syncbench validate --substrates kernel`: a small cell (n <= 8, no overlap, one rank per NIC) measured over real
TCP through `tc tbf`.

The cell's ranks are processes, one per namespace, each behind its own veth on one bridge, shaped both ways with tbf
at the cell's (scaled) bandwidth: the network and the rank start-up of the link-outage runs
(experiments/cluster/outages.py: shaped_network, start_rank, collect_ranks; the rank is
experiments/cluster/outage_rank.py with "isolated": true: gloo's rendezvous, syncbench's sockets transport over TCP
for the payload). One run per cell: a first synchronization, untimed (it opens the TCP connections and grows their
windows out of slow start), then `repeats` synchronizations, each begun together after a barrier; a repeat's time is
the slowest worker's, the cell's the median, with min and max.

Latency: tbf shapes bandwidth only (netem, which adds a per-message delay, is missing from this kernel), so a cell
with a latency is refused, never recorded as if it were applied; the cells run at 0 us, the model is priced at 0 us,
and the row's link says the veth's own latency (a few us of kernel forwarding) is what the run had. Compression and
local SGD live in the step loop (experiments/pipeline/train.py), which the rank process does not run: refused.
"""

from __future__ import annotations

import math
import os
import statistics
import time

from strategies.transport.link import parse_bandwidth, parse_latency

NAME = "sbval"  # the cluster name of validate's kernel runs (its namespaces are sbc-sbval-n<rank>)
APPLIED = "kernel: tbf bandwidth, latency not shaped (the veth's own)"


def kernel_refusal(cell, common: str, spec_of) -> str:
    """Why the kernel-shaped network cannot measure this cell here ('' if it can); `common` is the measured
    substrates' shared reason, if any; `spec_of()` the cell's RunSpec as measured (experiments/validate_runs.py)."""
    from experiments.cluster.host import support_problem

    if common:
        return common
    if problem := support_problem():
        return f"no namespace cluster on this machine: {problem}"
    if cell.ranks_per_node > 1:
        return ("nodes: the kernel-shaped network gives each rank its own shaped NIC; a node's ranks would need an "
                "unshaped intra-node link of the cell's 100 Gbit/s, 2 us, which it does not build")
    if parse_latency(cell.latency) > 0:
        return (f"latency {cell.latency}: tbf shapes bandwidth only and this kernel has no netem qdisc (per-message "
                f"delay); run the kernel cells at 0us (--links 1Gbit/0us): the veth's own latency is what they have")
    spec = spec_of()
    if spec.compression not in (None, "none") or int(spec.sync_every) > 1:
        return ("compression and local SGD run in the step loop, which the kernel-shaped rank processes do not run "
                "(they synchronize a flat gradient with the strategy itself)")
    config = spec.strategy_config()
    if config.asynchronous:
        return (f"{spec.strategy} with barrier-free servers: its servers run on their own clock, so one "
                f"synchronization begun together is not the cell's step")
    if not config.counted:
        return (f"{spec.strategy} moves its bytes inside the backend's allreduce: not a strategy of the sockets "
                f"transport")
    return ""


def measure_kernel(cell, spec, numels, repeats: int = 3, timeout: float = 120.0, name: str = NAME) -> dict:
    """The cell over tbf-shaped veths: its measured row's numbers (floor: none; the veth's copies are the kernel's).
    `spec`, `numels`: the cell's RunSpec and parameter sizes as measured (experiments/validate_runs.py: run_spec,
    scaled). A run whose synchronized gradient is not the workers' mean raises."""
    from experiments.cluster.outages import collect_ranks, shaped_network, start_rank, stop_ranks

    config = spec.strategy_config()
    world = config.world_size(cell.workers)
    rank_spec = {"world": world, "strategy": spec.strategy, "params": dict(spec.strategy_params),
                 "workers": cell.workers, "steps": repeats + 1, "numel": sum(numels), "timeout": timeout,
                 "p2p": "sockets-tcp", "down": None, "isolated": True}
    start, cpu = time.perf_counter(), _children_cpu()
    with shaped_network(name, world, parse_bandwidth(spec.link["bandwidth"])) as cluster:
        procs = [start_rank(cluster, rank, rank_spec) for rank in range(world)]
        try:
            results = collect_ranks(procs, timeout + 60)
        finally:
            stop_ranks(procs)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu
    error = max(results[r]["error"] for r in range(cell.workers))
    if error > 1e-4 * cell.workers:
        raise RuntimeError(f"{spec.strategy}: the synchronized gradient is {error:g} away from the workers' mean")
    samples = [max(results[r]["ends"][i] - results[r]["starts"][i] for r in range(cell.workers))
               for i in range(1, repeats + 1)]  # the first sync (connections, slow start) untimed
    first = max(results[r]["ends"][0] - results[r]["starts"][0] for r in range(cell.workers))
    return {"measured_s": statistics.median(samples), "measured_min_s": min(samples), "measured_max_s": max(samples),
            "floor_s": math.nan, "first_s": first, "repeats": len(samples), "wall_s": wall, "cpu_s": cpu,
            "cpu_per_wall": cpu / wall if wall else math.nan}


def _children_cpu() -> float:
    """CPU seconds of this process's reaped children (the rank processes)."""
    times = os.times()
    return times.children_user + times.children_system
