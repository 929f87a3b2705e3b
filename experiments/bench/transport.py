"""The transport benchmark: gloo point-to-point bandwidth and latency between 2 Ray actors, nccl-tests style.

Measured through the Communicator the strategies use (header + payload per message). Units: MB = 10^6
bytes, GB/s = 10^9 bytes per second.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from experiments.cluster.group import WorkerGroup

MB = 10**6
STREAM_BYTES = 64 * MB  # each timed repeat moves at least this much, so the closing ack is a small part


def transport_bench(sizes=(1 * MB, 16 * MB, 64 * MB), repeats: int = 10, warmup: int = 3,
                    timeout: float = 60.0) -> list[dict]:
    """One row per size (one-direction bandwidth) plus a 4-byte latency row; medians of `repeats` runs."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats {repeats!r} must be >= 1 and warmup {warmup!r} >= 0")
    from experiments.cluster.ray_runtime import ray_session

    with ray_session(), WorkerGroup(2, timeout=timeout) as group:
        rows = group.run(_bench_on_rank, tuple(sizes), repeats, warmup)[0]
        machine = {"cpu": group.cpu, "cores": group.cores, "host": group.host, "transport": group.backend}
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


# -- harness overhead: syncbench's training step vs a plain PyTorch loop ------------------------------


def _plain_loop(ctx, spec) -> float:
    """The loop a user would write: same model, batch, optimizer and thread count; returns samples/s."""
    import torch.nn.functional as F

    from workloads.data import make_dataset
    from workloads.models import build_model

    device = torch.device(ctx.device)
    model = build_model(spec.workload, num_classes=spec.num_classes, image_size=spec.image_size,
                        seed=spec.seed).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    data = make_dataset(spec.dataset, spec.batch_size, spec.image_size, spec.num_classes, seed=spec.seed,
                        device=device)
    times = []
    for step in range(spec.steps):
        start = time.perf_counter()
        x, y = data.next_batch()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= spec.warmup_steps:
            times.append(time.perf_counter() - start)
    return spec.batch_size * len(times) / sum(times)


def _syncbench_loop(ctx, spec) -> float:
    from experiments.pipeline.train import train

    rows = [r for r in train(ctx, spec)["steps"] if r["timed"]]
    return sum(r["samples"] for r in rows) / sum(r["compute_s"] + r["comm_s"] for r in rows)


def harness_bench(workload: str = "resnet18", batch_size: int = 32, image_size: int = 32, steps: int = 30,
                  rounds: int = 7, device: str = "cpu") -> list[dict]:
    """1 worker, no synchronization (ring on one rank), vs the plain loop, alternated in one actor."""
    import ray

    from experiments.cluster.ray_runtime import ray_session
    from experiments.config.sweep import SweepError, parse

    if not 1 <= rounds <= 1000:
        raise ValueError(f"rounds = {rounds!r}: accepted are 1 to 1,000")
    # the settings a sweep would accept, checked the way a sweep's are, before Ray starts
    point = {"workload": workload, "image_size": image_size, "batch_size": batch_size, "steps": steps,
             "warmup_steps": min(5, steps - 1), "strategy": "ring", "workers": 1, "device": device}
    try:
        spec = parse({"name": "harness", "defaults": point}, where="bench harness").runs[0]
    except SweepError as e:
        raise ValueError(str(e).replace(":\n  - ", ": ", 1).replace("\n  - ", "; ")) from None
    if device == "cuda" and not ray.is_initialized() and not torch.cuda.is_available():
        raise ValueError("bench harness --device cuda: this machine has no CUDA GPU (torch sees none): use cpu")
    rows = []
    with ray_session(), WorkerGroup(1, num_gpus=1 if device == "cuda" else 0) as group:
        for i in range(rounds):  # alternate, so drift in the machine's load hits both alike
            plain = group.run(_plain_loop, spec)[0]
            ours = group.run(_syncbench_loop, spec)[0]
            rows.append({"round": i, "plain_samples_per_s": plain, "syncbench_samples_per_s": ours,
                         "ratio": ours / plain, "cpu": group.cpu, "cores": group.cores,
                         "gpu": group.gpu_name or ""})
    return rows


def format_harness(rows: list[dict]) -> str:
    first = rows[0]
    lines = [f"# harness overhead: 1 worker, no synchronization, vs a plain PyTorch loop in the same actor "
             f"(1 thread); {first['gpu'] or first['cpu']}, {first['cores']} cores",
             f"# {'round':>5} {'plain (samples/s)':>18} {'syncbench (samples/s)':>22} {'ratio':>6}"]
    for r in rows:
        lines.append(f"  {r['round']:>5} {r['plain_samples_per_s']:>18.1f} {r['syncbench_samples_per_s']:>22.1f} "
                     f"{r['ratio']:>6.3f}")
    median = statistics.median(r["ratio"] for r in rows)
    lines.append(f"# median ratio {median:.3f} (target >= 0.97)")
    return "\n".join(lines)
