"""`syncbench verify` and `syncbench bench`: the strategies as plain collectives on Ray actors over gloo.

verify: rank-dependent inputs, every rank's result checked against a float64 reference, measured bytes
against the analytic traffic. bench: an nccl-tests-style table (time, algbw, busbw, ratio to native).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from types import SimpleNamespace

import numpy as np
import torch

import strategies
from experiments.bench.verify_rank import check_setting, setting_label, verify_on_rank, world_groups
from experiments.cluster import placement
from experiments.cluster.group import P2P, WorkerGroup
from experiments.cluster.limits import RANK_BASE_BYTES, capacity_for, check_ranks
from experiments.cluster.ray_runtime import ray_session
from strategies.cost import comm_time, critical_path, node_cost
from strategies.ops import OPS, check_op
from strategies.transport.link import Network
from strategies.transport.threads import run_threads

TAIL = 1.5  # p99 / median above this: the table's median hides a heavy tail (said under the table)

# dtypes `verify --dtype` accepts (numpy names)
VERIFY_DTYPES = {name: getattr(np, name) for name in ("float16", "float32", "float64", "int8", "int32", "int64",
                                                      "uint8", "uint16", "uint32", "uint64", "bool")}


P2P_WORDS = {"gloo": "gloo", "sockets": "syncbench's sockets (Unix + single copy within a namespace, else TCP)",
             "sockets-unix": "syncbench's sockets (Unix within a namespace, else TCP)",
             "sockets-tcp": "syncbench's sockets (TCP)"}


MAX_VERIFY_NUMEL = 2**32  # elements of verify's message (docs/settings.md); the memory check follows


def verify(workers: int, numel: int, op: str = "sum", names: list[str] | None = None,
           address: str | None = None, out=print, oversubscribe: bool = False, dtype: str = "float32",
           p2p: str = "gloo") -> bool:
    """Run each strategy (each declared variant) once on `workers` Ray actors; print a table; True when every
    check passed.

    Every argument is checked before Ray starts. Without `names`, strategies that do not support `op` are
    skipped (and said so); named ones that do not are an error.
    """
    if p2p not in P2P:
        raise ValueError(f"--p2p {p2p!r}: expected one of {', '.join(P2P)}")
    chosen = names
    names = names or strategies.names()
    for name in names:
        strategies.get(name)  # unknown names fail here, before any actor starts
    if op not in OPS:
        raise ValueError(f"--op {op!r}: accepted are {', '.join(OPS)}")
    if dtype not in VERIFY_DTYPES:
        raise ValueError(f"--dtype {dtype!r}: accepted are {', '.join(VERIFY_DTYPES)}")
    check_op(op, torch.from_numpy(np.zeros(1, VERIFY_DTYPES[dtype])).dtype)  # e.g. band on float32: refused
    np_dtype = np.dtype(VERIFY_DTYPES[dtype])
    # an inexact strategy (neighbour averaging) is always checked with 'mean', whatever the op
    unsupported = [n for n in names if strategies.get(n).exact and op not in strategies.get(n).ops]
    if unsupported and chosen:
        raise ValueError(f"--op {op!r}: not supported by {', '.join(unsupported)} (they support "
                         f"{', '.join(strategies.get(unsupported[0]).ops)})")
    names = [n for n in names if n not in unsupported]
    settings = [(n, p) for n, p in strategies.registry.settings() if n in names]
    if workers < 1 or not 0 <= numel <= MAX_VERIFY_NUMEL:
        shown = str(numel) if len(str(numel)) <= 40 else str(numel)[:40] + "..."
        raise ValueError(f"--workers {workers} / --numel {shown}: accepted are workers >= 1 and numel from 0 to "
                         f"{MAX_VERIFY_NUMEL:,}")
    groups = world_groups(settings, workers)
    # each rank holds its input and, for the reference, every rank's input in float64
    check_ranks(max(world for world, _ in groups), RANK_BASE_BYTES + numel * (8 * workers + 16),
                capacity_for(address), f"verify --workers {workers} --numel {numel:,}", oversubscribe)
    all_ok = True
    width = max(len(setting_label(n, p)) for n, p in settings)
    out(f"verify: {workers} workers, {numel} {dtype} elements, op {op}, {P2P_WORDS[p2p]} between Ray actors"
        + (f"; skipped (no op {op!r}): {', '.join(unsupported)}" if unsupported else ""))
    out(f"{'strategy':{width}s} {'ok':>4s} {'max abs err':>12s} {'sent/worker (measured)':>24s} {'(analytic)':>12s}")
    with ray_session(address, num_cpus=max(_cores(), max(world for world, _ in groups))):
        for world, group_settings in groups:
            with WorkerGroup(world) as group:
                per_rank = group.run(verify_on_rank, group_settings, workers, numel, op, dtype, p2p=p2p)
            for name, params in group_settings:
                label = setting_label(name, params)
                rows = [r for ranks in per_rank for r in ranks if r["setting"] == label]
                ok, error, why = check_setting(name, params, workers, numel, op, np_dtype, rows)
                all_ok &= ok
                traffic = strategies.make(name, **params).traffic(workers, numel, np_dtype.itemsize)
                measured = max(r["bytes_sent"] for r in rows[:workers])
                shown = f"{traffic.worker_bytes_sent:,}" if traffic.counted else "in backend"
                out(f"{label:{width}s} {'yes' if ok else 'NO':>4s} {error:12.3g} {measured:>24,} {shown:>12s}"
                    + (f"  {why}" if why else ""))
    return all_ok


# -- bench --------------------------------------------------------------------------------------------


def _iters_for(nbytes: int) -> tuple[int, int]:
    """(warm-up, timed) iterations: more for small messages, whose times are noisy."""
    if nbytes <= 1 << 20:
        return 5, 30
    if nbytes <= 16 << 20:
        return 2, 8
    return 1, 5


def _bench_on_rank(ctx, names, workers, sizes, iters, ranks_per_node=1):
    times = {}
    for name in names:
        config = _config(name, ranks_per_node)
        runtime = config.bind(ctx.comm, workers)
        for nbytes in sizes:
            numel = nbytes // 4
            x = torch.ones(numel, dtype=torch.float32)
            warm, timed = _iters_for(nbytes)
            timed = iters or timed
            samples = []
            for it in range(warm + timed):
                ctx.comm.barrier()
                start = time.perf_counter()
                if runtime.is_server:
                    runtime.serve(numel, torch.float32, "sum")
                else:
                    runtime.sync(x, "sum" if config.exact else "mean")
                if it >= warm:
                    samples.append(time.perf_counter() - start)
            times[(name, nbytes)] = samples
    return times


def _config(name: str, ranks_per_node: int):
    """A strategy's default settings; a node-aware one (a ranks_per_node parameter) grouped by the bench's nodes."""
    node_aware = "ranks_per_node" in strategies.get(name).parameters()
    return strategies.make(name, **({"ranks_per_node": ranks_per_node} if node_aware else {}))


# of each 1514-byte Ethernet frame a TCP segment fills, 1448 bytes are payload (IP, TCP with timestamps, Ethernet
# headers: 66): the share of a kernel-shaped link's rate a transfer's payload can get
TCP_PAYLOAD = 1448 / 1514
NODE_STRATEGIES = ("ring", "hierarchical", "double_binary_tree", "node_parameter_server")  # priced per level


def bench(workers: int, sizes: list[int], names: list[str] | None = None, link: dict | None = None,
          iters: int = 0, address: str | None = None, out=print, oversubscribe: bool = False,
          p2p: str = "gloo", ranks_per_node: int = 1) -> list[dict]:
    """Time every strategy at every size on the same actors; print and return the table's rows.

    `p2p`: what carries the strategies' messages (strategies.transport.sockets.P2P); native is gloo's either way.
    `ranks_per_node` k > 1: ranks in nodes of k sharing one NIC (`link`; `link["intra_bandwidth"]`/`intra_latency`
    inside a node). Python emulation: on thread ranks of this process, not on Ray actors: a node's NIC is shared by
    the ranks holding one Network object (strategies/transport/link.py), which actors in separate processes cannot.
    Kernel emulation: Ray actors, k per namespace of the cluster of `syncbench cluster up --node-cpus k`, sharing
    its tbf-shaped veth (inside a node: the namespace's loopback, not shaped). The model is then
    strategies.cost.node_cost's, the slower level's time.
    """
    if p2p not in P2P + ("threads",) or (p2p == "threads" and ranks_per_node == 1):
        raise ValueError(f"--p2p {p2p!r}: expected one of {', '.join(P2P)} (or, with --ranks-per-node > 1, threads: "
                         f"the thread ranks' own queues)")
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or not 1 <= ranks_per_node <= 1024:
        raise ValueError(f"--ranks-per-node {ranks_per_node!r}: expected a whole number from 1 to 1024")
    if ranks_per_node > 1:
        return _bench_nodes(workers, sizes, names, link, iters, out, p2p, ranks_per_node, address, oversubscribe)
    if link and ("intra_bandwidth" in link or "intra_latency" in link):
        raise ValueError("--intra-bandwidth / --intra-latency: the link inside a node needs --ranks-per-node > 1 "
                         "(with one rank per node every message crosses a NIC)")
    names = names or [n for n in strategies.names() if strategies.get(n).exact]
    for name in names:
        strategies.get(name)
    network = Network.from_spec(link)
    if workers < 2:
        raise ValueError(f"--workers {workers}: a benchmark needs at least 2 workers")
    address = placement.connect_address([network], address)  # kernel links: the namespace cluster, or refused
    if not sizes:
        raise ValueError("--sizes: give at least one message size, e.g. 4K,64K,1M")
    if not 0 <= iters <= 100_000:
        raise ValueError(f"--iters {iters}: accepted are 0 (by size) to 100,000")
    _check_duration(names, workers, sizes, iters, network)
    # each rank holds the message, a receive buffer and the strategy's scratch space
    check_ranks(max(world for world, _ in world_groups(names, workers)), RANK_BASE_BYTES + 3 * max(sizes),
                capacity_for(address), f"bench --workers {workers} --sizes up to {max(sizes):,} bytes",
                oversubscribe)
    results: dict = {}
    tails: dict = {}  # (p99, max) of the per-iteration times
    with ray_session(address, num_cpus=max(_cores(), workers + 1)):
        for world, _ in world_groups(names, workers):
            placement.check(world, network)
        for world, group_names in world_groups(names, workers):
            with WorkerGroup(world, node_resources=placement.bundles(world, network)) as group:
                per_rank = group.run(_bench_on_rank, group_names, workers, sizes, iters, network=network, p2p=p2p)
            for key in per_rank[0]:
                # each iteration takes as long as its slowest rank; report the median over iterations
                per_iter = [max(rank[key][i] for rank in per_rank) for i in range(len(per_rank[0][key]))]
                results[key] = statistics.median(per_iter)
                tails[key] = (nearest_rank(per_iter, 99), max(per_iter))
    rows = []
    factor = 2 * (workers - 1) / workers
    for nbytes in sizes:
        native = results.get(("native", nbytes))
        for name in names:
            t = results[(name, nbytes)]
            algbw = nbytes / t / 1e9
            p99, slowest = tails[(name, nbytes)]
            rows.append({"size": nbytes, "strategy": name, "time_ms": t * 1e3, "p99_ms": p99 * 1e3,
                         "max_ms": slowest * 1e3, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * factor, "vs_native": (native / t) if native else math.nan,
                         "model_ms": _predicted(name, workers, nbytes, network) * 1e3})
    out(format_bench(rows, workers, link, p2p))
    return rows


def _bench_nodes(workers, sizes, names, link, iters, out, p2p, k, address=None, oversubscribe=False) -> list[dict]:
    """bench() on nodes of k: thread ranks (python emulation) or Ray actors k per namespace of the kernel-shaped
    cluster, every setting checked before the first message."""
    kernel = bool(link) and link.get("emulation") == "kernel"
    if p2p == "gloo" and not kernel:
        raise ValueError(f"--p2p gloo with --ranks-per-node {k}: gloo needs a process per rank, nodes run on thread "
                         f"ranks with python emulation: accepted are threads (their queues) and the sockets, or "
                         f"--emulation kernel (Ray actors, {k} per namespace of the kernel-shaped cluster)")
    if p2p == "threads" and kernel:
        raise ValueError(f"--p2p threads with --emulation kernel: the kernel-shaped cluster runs each rank in a Ray "
                         f"actor of its node's namespace; accepted there: {', '.join(P2P)}")
    if not link or link.get("emulation", "python") not in ("python", "kernel"):
        raise ValueError(f"--ranks-per-node {k}: give --bandwidth (the node's NIC), emulated in python (thread "
                         f"ranks) or by the kernel (--emulation kernel, the cluster of `syncbench cluster up`)")
    names = names or list(NODE_STRATEGIES)
    for name in names:
        if not strategies.get(name).counted:
            raise ValueError(f"--strategies {name}: its bytes move inside a backend that the node emulation does not "
                             f"see; accepted are counted strategies, e.g. {', '.join(NODE_STRATEGIES)}")
    network = Network.from_spec(link).with_nodes(k)  # refuses an intra-node link the kernel would not shape
    if workers < 2:
        raise ValueError(f"--workers {workers}: a benchmark needs at least 2 workers")
    if not sizes:
        raise ValueError("--sizes: give at least one message size, e.g. 4K,64K,1M")
    if not 0 <= iters <= 100_000:
        raise ValueError(f"--iters {iters}: accepted are 0 (by size) to 100,000")
    groups = [(world, [n for n in names if _config(n, k).world_size(workers) == world])
              for world in sorted({_config(n, k).world_size(workers) for n in names})]
    _check_duration(names, workers, sizes, iters, network)
    if kernel:
        address = placement.connect_address([network], address)  # the namespace cluster, or refused
        check_ranks(max(world for world, _ in groups), RANK_BASE_BYTES + 3 * max(sizes), capacity_for(address),
                    f"bench --workers {workers} --sizes up to {max(sizes):,} bytes", oversubscribe)
    load = os.getloadavg()
    results: dict = {}
    if kernel:
        with ray_session(address, num_cpus=max(_cores(), workers + 1)):
            for world, _ in groups:  # every group placeable (nodes, CPUs per node, links) before the first
                placement.check(world, network)
            for world, group_names in groups:
                with WorkerGroup(world, node_resources=placement.bundles(world, network)) as group:
                    per_rank = group.run(_bench_on_rank, group_names, workers, sizes, iters, k, network=network,
                                         p2p=p2p)
                _collect(per_rank, results)
    else:
        for world, group_names in groups:
            per_rank = run_threads(world, lambda comm, group_names=group_names: _bench_on_rank(
                SimpleNamespace(comm=comm, rank=comm.rank), group_names, workers, sizes, iters, k),
                timeout=600, network=network, p2p=p2p)
            _collect(per_rank, results)
    rows = []
    for nbytes in sizes:
        ring = results.get(("ring", nbytes))
        for name in names:
            t = results[(name, nbytes)]
            level = _node_level(name, workers, nbytes, network)
            rows.append({"size": nbytes, "strategy": name, "time_ms": t * 1e3, "algbw_GBps": nbytes / t / 1e9,
                         "vs_ring": t / ring if ring else math.nan, "model_ms": level[0] * 1e3,
                         "bottleneck": level[1], "nic_MB": level[2] / 1e6, "intra_MB": level[3] / 1e6})
    out(format_node_bench(rows, workers, k, network, p2p, load, os.getloadavg()))
    return rows


def _collect(per_rank: list[dict], results: dict) -> None:
    """Each iteration takes as long as its slowest rank; the median over iterations, per (strategy, size)."""
    for key in per_rank[0]:
        per_iter = [max(rank[key][i] for rank in per_rank) for i in range(len(per_rank[0][key]))]
        results[key] = statistics.median(per_iter)


def _node_level(name: str, workers: int, nbytes: int, network: Network) -> tuple[float, str, float, float]:
    """(model seconds, bottleneck level, the busiest node NIC's bytes, the busiest intra-node port's bytes) of one
    allreduce on the network's nodes; NaN and '' for a strategy without per-level traffic."""
    k = network.ranks_per_node
    try:
        c = node_cost(_config(name, k), workers, nbytes // 4, k, network.default.bandwidth, network.intra.bandwidth,
                      network.default.latency, network.intra.latency)
    except ValueError:  # no levels(): its traffic() states totals, not peers
        return math.nan, "", math.nan, math.nan
    return c.time_s, c.bottleneck, c.nic_bytes, c.intra_bytes


def format_node_bench(rows: list[dict], workers: int, k: int, network: Network, p2p: str, load_before, load_after
                      ) -> str:
    def rate(bw):
        return "unlimited" if math.isinf(bw) else f"{bw * 8 / 1e9:g} Gbit/s"

    nodes = -(-workers // k)
    kernel = network.emulation == "kernel"
    where = (f"Ray actors, {k} per network namespace of the kernel-shaped cluster" if kernel
             else "thread ranks of one process")
    inside = ("the namespace's loopback (not shaped)" if kernel
              else f"{rate(network.intra.bandwidth)} / {network.intra.latency * 1e6:g} us")
    lines = [f"# syncbench bench --ranks-per-node {k}: {workers} workers in {nodes} nodes of {k} (the last one "
             f"{workers - (nodes - 1) * k}), {where} over {P2P_WORDS.get(p2p, p2p)}",
             f"# a node's NIC {rate(network.default.bandwidth)} / {network.default.latency * 1e6:g} us"
             f"{' (tbf on its veth, both ways)' if kernel else ''}, shared by its ranks; inside a node {inside}",
             f"# host {platform.node()}, {_cores()} cores, load average {load_before[0]:.2f} before, "
             f"{load_after[0]:.2f} after; times are medians of the slowest rank per iteration",
             "# model: strategies.cost.node_cost, the slower level (NIC: the busiest node's bytes, the node's ranks "
             "summed; intra: the busiest port); MB = 1e6 bytes",
             *([f"# tbf shapes Ethernet frames: TCP payload gets at most {TCP_PAYLOAD:.3f} of the rate, so "
                f"a transfer takes about {1 / TCP_PAYLOAD:.3f}x its model even on an idle machine"] if kernel else []),
             f"{'size':>10s} {'strategy':>22s} {'time(ms)':>10s} {'model(ms)':>10s} {'meas/model':>10s} "
             f"{'vs ring':>8s} {'NIC MB':>8s} {'intra MB':>8s} {'bound':>6s}"]
    for r in rows:
        lines.append(f"{r['size']:>10d} {r['strategy']:>22s} {r['time_ms']:10.1f} {r['model_ms']:10.1f} "
                     f"{r['time_ms'] / r['model_ms']:10.3f} {r['vs_ring']:8.3f} {r['nic_MB']:8.2f} "
                     f"{r['intra_MB']:8.2f} {r['bottleneck']:>6s}")
    return "\n".join(lines)


MAX_BENCH_S = 3_600  # what the alpha-beta model may predict for a whole `bench` on emulated links


def _check_duration(names: list[str], workers: int, sizes: list[int], iters: int, network: Network | None) -> None:
    """Refuse a benchmark the model says cannot finish within MAX_BENCH_S (64M on a 1 Mbit link: hours), naming
    the estimate and what would fit, instead of running silently for as long."""
    total = 0.0
    for nbytes in sizes:
        warm, timed = _iters_for(nbytes)
        for name in names:
            seconds = _predicted(name, workers, nbytes, network)
            total += (warm + (iters or timed)) * (0.0 if math.isnan(seconds) else seconds)
    if total > MAX_BENCH_S:
        raise ValueError(f"--sizes up to {max(sizes):,} bytes on links of {network.default.bandwidth * 8 / 1e6:g} "
                         f"Mbit/s: the alpha-beta model predicts {total:,.0f} s for the benchmark; accepted are "
                         f"benchmarks predicted to take at most {MAX_BENCH_S:,} s (smaller --sizes, fewer --iters "
                         f"or a faster --bandwidth)")


def _predicted(name: str, workers: int, nbytes: int, network: Network | None) -> float:
    """The alpha-beta model (strategies.cost) on the emulated links: rounds x latency + critical-path bytes /
    bandwidth. NaN without emulation, or for a backend's own bytes that python emulation does not slow."""
    counted = strategies.get(name).counted
    if network is None or (not counted and network.emulation != "kernel"):
        return math.nan
    if network.ranks_per_node > 1:
        return _node_level(name, workers, nbytes, network)[0]
    modelled = name if counted else "ring"  # the kernel shapes the backend's bytes too: modelled as ring
    rounds, path_bytes, _ = critical_path(modelled, workers, nbytes // 4)
    return comm_time(rounds, path_bytes, network.default.bandwidth, network.default.latency)


def nearest_rank(times, p: float) -> float:
    """The nearest-rank p-th percentile: the smallest time with at least p% of them at or under it (the report's
    per-step distributions use the same rule, reports/distributions.py)."""
    values = sorted(times)
    return values[max(math.ceil(p / 100 * len(values)), 1) - 1]


def tail_lines(rows: list[dict]) -> list[str]:
    """A line under the table for each row whose p99 is over TAIL x its median: the median hides its tail."""
    return [f"# heavy tail: {r['size']} bytes, {r['strategy']}: p99 {r['p99_ms']:.3f} ms, max {r['max_ms']:.3f} ms "
            f"= {r['p99_ms'] / r['time_ms']:.2f}x the median (over {TAIL:g}x)"
            for r in rows if "p99_ms" in r and r["time_ms"] > 0 and r["p99_ms"] / r["time_ms"] > TAIL]


def format_bench(rows: list[dict], workers: int, link: dict | None, p2p: str = "gloo") -> str:
    kernel = bool(link) and link.get("emulation") == "kernel"
    net = f"emulated links {link['bandwidth']} / {link.get('latency', '0s')} (native is not emulated)" if link \
        else "no link emulation"
    if kernel:
        net = (f"kernel-shaped links {link['bandwidth']} / {link.get('latency', '0s')} (tbf on the veths of one "
               f"network namespace per rank; native's bytes are shaped too, modelled as ring)")
    carrier = "gloo" if p2p == "gloo" else f"{P2P_WORDS[p2p]} (native: gloo)"
    lines = [f"# syncbench bench: {workers} workers on Ray actors, {carrier} over "
             f"{'TCP between network namespaces' if kernel else 'loopback'}, {net}",
             f"# host {platform.node()}, {platform.processor() or platform.machine()}, "
             f"{_cores()} cores; times are medians of the slowest rank per iteration",
             "# GB = 1e9 bytes; busbw = algbw x 2(n-1)/n (nccl-tests); vs_native > 1 means faster than native",
             f"{'size':>10s} {'strategy':>18s} {'time(ms)':>10s} {'algbw(GB/s)':>12s} {'busbw(GB/s)':>12s} "
             f"{'vs_native':>9s}" + (f" {'model(ms)':>10s} {'meas/model':>10s}" if link else "")]
    for r in rows:
        line = (f"{r['size']:>10d} {r['strategy']:>18s} {r['time_ms']:10.3f} {r['algbw_GBps']:12.3f} "
                f"{r['busbw_GBps']:12.3f} {r['vs_native']:9.2f}")
        if link:
            line += f" {r['model_ms']:10.3f} {r['time_ms'] / r['model_ms']:10.3f}"
        lines.append(line)
    return "\n".join(lines + tail_lines(rows))


def _cores() -> int:
    return os.cpu_count() or 1
