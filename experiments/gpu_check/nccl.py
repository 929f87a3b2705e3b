"""The GPU check's world size 1 through torch.distributed: NCCL on cuda (all one GPU can test), gloo on cpu."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from experiments.gpu_check.core import GRACE_S, Check, synchronize


def world_size_one(check: Check) -> list[dict]:
    """native and ddp on one rank through torch.distributed: NCCL on cuda (what one GPU can test), gloo on cpu.
    In a child process, so the process group does not outlive it."""
    backend = "nccl" if check.device == "cuda" else "gloo"
    out = check.work / "world_size_1.json"
    spec = {"workload": check.sizes.strategies_workload, "image_size": check.sizes.strategies_image,
            "batch_size": check.sizes.strategies_batch, "steps": check.sizes.strategies_steps, "warmup_steps": 1,
            "device": check.device, "timeout": check.sizes.timeout_s}
    code = ("import json, sys; from experiments.gpu_check.nccl import world_size_one_child as c; "
            "c(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    try:
        proc = subprocess.run([sys.executable, "-c", code, backend, json.dumps(spec), str(out)], env=env,
                              capture_output=True, text=True, timeout=max(30.0, check.left() + GRACE_S / 2))
    except subprocess.TimeoutExpired:
        return [{"backend": backend, "strategy": "native, ddp", "status": "failed", "message": "timed out"}]
    if out.exists():
        return json.loads(out.read_text())
    return [{"backend": backend, "strategy": "native, ddp", "status": "failed",
             "message": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}]


def world_size_one_child(backend: str, settings: dict, out: str) -> None:
    """In the child: one rank joins a process group of `backend`; native's sync and ddp's training run through it
    and the pipeline's summary checks them. Writes one row per strategy to `out`."""
    import datetime as dt

    import torch.distributed as dist

    from experiments.config.run import RunSpec
    from experiments.pipeline.summary import summarize
    from experiments.pipeline.train import train
    from strategies.transport.torch_dist import TorchCommunicator

    torch.set_num_threads(1)
    # the device machine has no network: gloo and NCCL bootstrap on the loopback (one rank: nothing leaves it)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    device = settings["device"]
    if backend == "nccl":
        torch.cuda.set_device(0)
    store = dist.HashStore()
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=dt.timedelta(seconds=60))
    control = dist.new_group(backend="gloo") if backend == "nccl" else None
    rows = []
    try:
        comm = TorchCommunicator(0, 1, settings["timeout"], control_group=control)
        import strategies

        for name in ("native", "ddp"):
            row = {"backend": backend, "strategy": name}
            try:
                if name == "native":  # the backend's allreduce on one rank: a tensor of the device comes back as is
                    runtime = strategies.make("native").bind(comm, 1)
                    x = torch.arange(1000, dtype=torch.float32, device=device)
                    y = x.clone()
                    runtime.sync(y, "sum")
                    synchronize(torch.device(device))
                    if not torch.equal(x, y):
                        raise AssertionError(f"native allreduce on one rank changed the tensor: {y[:5]}")
                spec = RunSpec(strategy=name, workers=1, **settings)
                ctx = _Ctx(0, 1, comm, device)
                started = time.perf_counter()
                result = train(ctx, spec)
                meta = {"started_at": "", "duration_s": time.perf_counter() - started, "transport": backend,
                        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "", "cores": os.cpu_count(),
                        "host": platform.node(), "substrate": f"torch.distributed {backend}, world size 1"}
                run, _ = summarize(spec, [result], "", meta)
                row.update(status=run["status"], message=run["error"] or "",
                           images_per_s=float(run["throughput"]))
            except Exception as e:  # noqa: BLE001 - recorded, the next strategy still runs
                row.update(status="failed", message=f"{type(e).__name__}: {e}")
            rows.append(row)
    finally:
        dist.destroy_process_group()
    Path(out).write_text(json.dumps(rows, indent=1))


@dataclass
class _Ctx:
    rank: int
    world_size: int
    comm: object
    device: str
    state: dict | None = None

    def __post_init__(self):
        self.state = {}


