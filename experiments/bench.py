"""The transport benchmark: gloo point-to-point bandwidth and latency between 2 Ray actors, nccl-tests style.

Measured through the Communicator the strategies use (header + payload per message). Units: MB = 10^6
bytes, GB/s = 10^9 bytes per second.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from experiments.group import WorkerGroup

MB = 10**6
STREAM_BYTES = 64 * MB  # each timed repeat moves at least this much, so the closing ack is a small part


def transport_bench(sizes=(1 * MB, 16 * MB, 64 * MB), repeats: int = 10, warmup: int = 3,
                    timeout: float = 60.0) -> list[dict]:
    """One row per size (one-direction bandwidth) plus a 4-byte latency row; medians of `repeats` runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats {repeats!r} must be >= 1 and warmup {warmup!r} >= 0")
    import ray

    from experiments.ray_runtime import ensure_ray

    started = ensure_ray() if not ray.is_initialized() else False
    try:
        with WorkerGroup(2, timeout=timeout) as group:
            rows = group.run(_bench_on_rank, tuple(sizes), repeats, warmup)[0]
            machine = {"cpu": group.cpu, "cores": group.cores, "host": group.host, "transport": group.backend}
    finally:
        if started:
            ray.shutdown()
    return [{**row, **machine, "repeats": repeats, "warmup": warmup} for row in rows]


def _bench_on_rank(ctx, sizes, repeats, warmup) -> list[dict] | None:
    """Rank 0 sends, rank 1 receives; rank 0 times and returns the rows."""
    comm = ctx.comm
    tiny = torch.zeros(1, dtype=torch.float32)  # 4 bytes

    def ping() -> float:  # one round trip of a 4-byte message; returns half of it
        start = time.perf_counter()
        if ctx.rank == 0:
            comm.send(tiny, 1)
            comm.recv(tiny, 1)
        else:
            comm.recv(tiny, 0)
            comm.send(tiny, 0)
        return (time.perf_counter() - start) / 2

    pings = [ping() for _ in range(warmup + 5 * repeats)][warmup:]
    latency = statistics.median(pings)
    rows = [{"kind": "latency", "size_bytes": 4, "count": 1, "time_s": latency, "algbw_GBps": 4 / latency / 1e9}]

    for size in sizes:
        count = max(1, math.ceil(STREAM_BYTES / size))
        buffers = [torch.empty(size, dtype=torch.uint8) for _ in range(count)]
        times = []
        for i in range(warmup + repeats):
            comm.barrier()
            start = time.perf_counter()
            if ctx.rank == 0:  # count messages back to back, then wait for the receiver's 4-byte ack
                for h in [comm.isend(b, 1) for b in buffers]:
                    h.wait()
                comm.recv(tiny, 1)
            else:
                for h in [comm.irecv(b, 0) for b in buffers]:
                    h.wait()
                comm.send(tiny, 0)
            # the ack's one-way latency, measured above, is not part of the transfer
            elapsed = max(time.perf_counter() - start - latency, 1e-9)
            if i >= warmup:
                times.append(elapsed / count)
        per_message = statistics.median(times)
        rows.append({"kind": "bandwidth", "size_bytes": size, "count": count, "time_s": per_message,
                     "algbw_GBps": size / per_message / 1e9})
        del buffers
    return rows if ctx.rank == 0 else None


def format_table(rows: list[dict]) -> str:
    """A plain table to paste into an issue: machine header, then size, time and bandwidth per row."""
    if not rows:
        return "# no results"
    first = rows[0]
    lines = [
        f"# syncbench transport bench: {first['transport']} point-to-point between 2 Ray actors, one direction",
        f"# machine: {first['cpu']}, {first['cores']} cores, host {first['host']}",
        f"# median of {first['repeats']} after {first['warmup']} warm-up; bandwidth streams `count` messages "
        f"then a 4-byte ack (its latency subtracted); MB = 10^6 B",
        "#",
        f"# {'what':>9} {'size (B)':>12} {'count':>6} {'time (us)':>12} {'algbw (GB/s)':>13}",
    ]
    for row in sorted(rows, key=lambda r: (r["kind"] != "latency", r["size_bytes"])):
        lines.append(f"  {row['kind']:>9} {row['size_bytes']:>12} {row['count']:>6} "
                     f"{row['time_s'] * 1e6:>12.1f} {row['algbw_GBps']:>13.3f}")
    return "\n".join(lines)
