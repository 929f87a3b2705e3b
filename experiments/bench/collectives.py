"""`syncbench verify` and `syncbench bench`: the strategies as plain collectives on Ray actors over gloo.

verify: rank-dependent inputs, every rank's result checked against a float64 reference, measured bytes
against the analytic traffic. bench: an nccl-tests-style table (time, algbw, busbw, ratio to native).
"""

from __future__ import annotations

import math
import platform
import statistics
import time

import numpy as np
import torch

import strategies
from experiments.cluster.group import WorkerGroup
from experiments.cluster.ray_runtime import ensure_ray
from strategies.link import Network
from strategies.ops import reference


def rank_input(rank: int, numel: int, op: str) -> torch.Tensor:
    """Deterministic, rank-dependent float32 data; near 1 for prod so n factors stay finite."""
    i = torch.arange(numel, dtype=torch.float64)
    x = torch.sin(i * 0.37 + rank * 1.3)
    x = 1 + 0.05 * x if op == "prod" else x + rank
    return x.to(torch.float32)


def _groups(names: list[str], workers: int):
    """Strategies grouped by the world size they need (parameter servers need extra ranks)."""
    by_world: dict[int, list[str]] = {}
    for name in names:
        by_world.setdefault(strategies.make(name).world_size(workers), []).append(name)
    return sorted(by_world.items())


# -- verify -------------------------------------------------------------------------------------------


def _verify_on_rank(ctx, names, workers, numel, op):
    rows = []
    for name in names:
        config = strategies.make(name)
        runtime = config.bind(ctx.comm, workers)
        ctx.comm.reset_counters()
        if runtime.is_server:
            runtime.serve(numel, torch.float32, op if config.exact else "mean")
            rows.append({"strategy": name, "rank": ctx.rank, "error": 0.0, "bytes_sent": None})
            continue
        x = rank_input(ctx.rank, numel, op)
        runtime.sync(x, op if config.exact else "mean")
        inputs = [rank_input(r, numel, op).double().numpy() for r in range(workers)]
        if config.exact:
            expected = reference(inputs, op)
        else:  # neighbour averaging: row `rank` of W @ X
            expected = config.mixing_matrix(workers)[ctx.rank] @ np.stack(inputs)
        error = float(np.max(np.abs(x.double().numpy() - expected))) if numel else 0.0
        scale = float(np.max(np.abs(expected))) if numel else 1.0
        rows.append({"strategy": name, "rank": ctx.rank, "error": error, "scale": scale,
                     "bytes_sent": ctx.comm.counters().bytes_sent})
    return rows


def verify(workers: int, numel: int, op: str = "sum", names: list[str] | None = None,
           address: str | None = None, out=print) -> bool:
    """Run each strategy once on `workers` Ray actors; print a table; True when every check passed."""
    names = names or strategies.names()
    for name in names:
        strategies.get(name)  # unknown names fail here, before any actor starts
    if workers < 1 or numel < 0:
        raise ValueError(f"--workers {workers} / --numel {numel}: need workers >= 1 and numel >= 0")
    started = ensure_ray(address, num_cpus=max(_cores(), workers + 1))
    all_ok = True
    out(f"verify: {workers} workers, {numel} float32 elements, op {op}, gloo between Ray actors")
    out(f"{'strategy':18s} {'ok':>4s} {'max abs err':>12s} {'sent/worker (measured)':>24s} {'(analytic)':>12s}")
    try:
        for world, group_names in _groups(names, workers):
            with WorkerGroup(world) as group:
                per_rank = group.run(_verify_on_rank, group_names, workers, numel, op)
            for name in group_names:
                config = strategies.make(name)
                rows = [r for ranks in per_rank for r in ranks if r["strategy"] == name][:workers]
                error = max(r["error"] for r in rows)
                scale = max(r.get("scale", 1.0) for r in rows)
                tolerance = 1e-5 * max(scale, 1.0) * max(workers, 1)
                traffic = config.traffic(workers, numel, 4)
                measured = [r["bytes_sent"] for r in rows]
                analytic = [t.bytes_sent for t in traffic.workers()]
                bytes_ok = (measured == analytic) if traffic.counted else all(m == 0 for m in measured)
                ok = error <= tolerance and bytes_ok
                all_ok &= ok
                shown = f"{max(analytic):,}" if traffic.counted else "in backend"
                out(f"{name:18s} {'yes' if ok else 'NO':>4s} {error:12.3g} {max(measured):>24,} {shown:>12s}")
    finally:
        if started:
            import ray

            ray.shutdown()
    return all_ok


# -- bench --------------------------------------------------------------------------------------------


def _iters_for(nbytes: int) -> tuple[int, int]:
    """(warm-up, timed) iterations: more for small messages, whose times are noisy."""
    if nbytes <= 1 << 20:
        return 5, 30
    if nbytes <= 16 << 20:
        return 2, 8
    return 1, 5


def _bench_on_rank(ctx, names, workers, sizes, iters):
    times = {}
    for name in names:
        config = strategies.make(name)
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


def bench(workers: int, sizes: list[int], names: list[str] | None = None, link: dict | None = None,
          iters: int = 0, address: str | None = None, out=print) -> list[dict]:
    """Time every strategy at every size on the same actors; print and return the table's rows."""
    names = names or [n for n in strategies.names() if strategies.get(n).exact]
    for name in names:
        strategies.get(name)
    network = Network.from_spec(link)
    if workers < 2:
        raise ValueError(f"--workers {workers}: a benchmark needs at least 2 workers")
    started = ensure_ray(address, num_cpus=max(_cores(), workers + 1))
    results: dict = {}
    try:
        for world, group_names in _groups(names, workers):
            with WorkerGroup(world) as group:
                per_rank = group.run(_bench_on_rank, group_names, workers, sizes, iters, network=network)
            for key in per_rank[0]:
                # each iteration takes as long as its slowest rank; report the median over iterations
                per_iter = [max(rank[key][i] for rank in per_rank) for i in range(len(per_rank[0][key]))]
                results[key] = statistics.median(per_iter)
    finally:
        if started:
            import ray

            ray.shutdown()
    rows = []
    factor = 2 * (workers - 1) / workers
    for nbytes in sizes:
        native = results.get(("native", nbytes))
        for name in names:
            t = results[(name, nbytes)]
            algbw = nbytes / t / 1e9
            rows.append({"size": nbytes, "strategy": name, "time_ms": t * 1e3, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * factor, "vs_native": (native / t) if native else math.nan,
                         "model_ms": _predicted(name, workers, nbytes, network) * 1e3})
    out(format_bench(rows, workers, link))
    return rows


def _predicted(name: str, workers: int, nbytes: int, network: Network | None) -> float:
    """The alpha-beta time on the emulated links: rounds x latency + critical-path bytes / bandwidth."""
    config = strategies.make(name)
    if network is None or not config.traffic(workers, 0).counted:
        return math.nan  # no emulation, or a backend the emulation does not slow (native)
    traffic = config.traffic(workers, nbytes // 4, 4)
    link = network.default
    return traffic.rounds * link.latency + traffic.path_bytes / link.bandwidth


def format_bench(rows: list[dict], workers: int, link: dict | None) -> str:
    net = f"emulated links {link['bandwidth']} / {link.get('latency', '0s')} (native is not emulated)" if link \
        else "no link emulation"
    lines = [f"# syncbench bench: {workers} workers on Ray actors, gloo over loopback, {net}",
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
    return "\n".join(lines)


def _cores() -> int:
    import os

    return os.cpu_count() or 1
