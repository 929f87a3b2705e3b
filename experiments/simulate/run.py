"""One simulated training run: every rank an actor on a SimGrid platform, compute replayed from a timeline.

Per step on a worker, in simulated time: forward, then backward; the gradients are synchronized bucket by
bucket (one flat bucket by default) by the registered strategy's own code over the simulated transport; then
the optimizer. With overlap, bucket b is synchronized as soon as the timeline says its last gradient is ready
(and the previous bucket is done) while backward goes on; without, after backward. Payloads are `meta`
tensors of the real size (strategies/transport/simgrid.py): no values move, every byte is counted and simulated.
Each simulation runs in a forked process: SimGrid's engine is one per process.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

import strategies
from experiments.config.sweep import RunSpec
from experiments.simulate.platform import Platform
from strategies.base import GRADIENTS, PARAMETERS, SERVER

REFUSED = {"native": "gloo/NCCL's own allreduce moves its bytes inside the backend",
           "ddp": "PyTorch DDP's allreduce moves its bytes inside the backend"}


@dataclass(frozen=True)
class Compute:
    """One rank's compute timeline for one step (seconds) and the gradient layout it implies.

    ready_s[i]: when parameter i's gradient is ready, seconds after backward starts (registration order);
    numels[i]: its element count. `source` says where the numbers came from (a profile's id, or 'fixed').
    """

    forward_s: float
    backward_s: float
    optimizer_s: float
    numels: tuple[int, ...]
    ready_s: tuple[float, ...]
    source: str
    profile_id: str = ""
    profile_device: str = ""

    @property
    def numel(self) -> int:
        return sum(self.numels)

    @classmethod
    def from_profile(cls, profile) -> Compute:
        return cls(profile.forward_s, profile.backward_s, profile.optimizer_s, tuple(profile.numels),
                   tuple(profile.ready_s), f"profile {profile.id} ({profile.device_name})", profile.id,
                   profile.device)

    @classmethod
    def fixed(cls, forward_s: float, backward_s: float, optimizer_s: float, numels: tuple[int, ...]) -> Compute:
        """No profile: backward produces gradients evenly, last registered parameter first."""
        total, ready, done = sum(numels), [0.0] * len(numels), 0
        for i in reversed(range(len(numels))):
            done += numels[i]
            ready[i] = backward_s * done / max(total, 1)
        return cls(forward_s, backward_s, optimizer_s, tuple(numels), tuple(ready), "fixed")


@dataclass(frozen=True)
class SimSpec:
    """What one simulated run needs beside the RunSpec: the platform, compute, buckets and overlap."""

    platform: Platform
    compute: Compute
    bucket_mb: float | None = None
    overlap: bool = False


def check_simulable(strategy: str) -> None:
    """Refuse strategies whose bytes the simulator cannot see."""
    if strategy in REFUSED:
        raise ValueError(f"strategy {strategy!r} cannot be simulated: {REFUSED[strategy]}, where no simulator "
                         f"sees them; accepted are the strategies written over send/recv: "
                         f"{', '.join(n for n in strategies.names() if n not in REFUSED)}")


def simulate(spec: RunSpec, sim: SimSpec) -> list[dict]:
    """Run the simulation in this process (once per process); every rank's {"steps": [...], "final": {...}}."""
    from strategies.transport.simgrid import run_simgrid
    from workloads.buckets import make_buckets

    check_simulable(spec.strategy)
    config = strategies.make(spec.strategy, **spec.strategy_params)
    world = config.world_size(spec.workers)
    compute = sim.compute
    buckets = make_buckets(compute.numels, sim.bucket_mb)
    # bucket b may start once its last gradient is ready: the latest ready time of its parameters
    bucket_ready = [max(compute.ready_s[i] for i in b.params) if b.params else 0.0 for b in buckets]

    def rank_main(comm):
        # one runtime per bucket: each checks its size with the other ranks once (in the first step), as
        # a bucketed trainer keeps one communication state per bucket
        runtimes = [config.bind(comm, spec.workers) for _ in buckets]
        flat = torch.empty(compute.numel, dtype=torch.float32, device="meta")
        if runtimes[0].is_server:
            return _serve(comm, runtimes, spec, compute, buckets)
        sg = comm.sg
        rows = []
        for step in range(spec.steps):
            comm.reset_counters()
            start = comm.now()
            comm.compute(compute.forward_s)
            backward_start = comm.now()
            sync_s = 0.0
            if config.role == PARAMETERS:  # decentralized: local step first, then average parameters
                comm.compute(compute.backward_s + compute.optimizer_s)
                t = comm.now()
                runtimes[0].sync(flat, "mean")
                sync_s = comm.now() - t
            else:
                if not sim.overlap:
                    comm.compute(compute.backward_s)
                for bucket, ready, runtime in zip(buckets, bucket_ready, runtimes):
                    if comm.now() < backward_start + ready:
                        sg.this_actor.sleep_until(backward_start + ready)
                    t = comm.now()
                    runtime.sync(flat[bucket.lo:bucket.hi], "mean")
                    sync_s += comm.now() - t
                if comm.now() < backward_start + compute.backward_s:  # overlap: the rest of backward
                    sg.this_actor.sleep_until(backward_start + compute.backward_s)
                if config.role == GRADIENTS:
                    comm.compute(compute.optimizer_s)
            counters = comm.counters()
            # compute_s is the timeline's compute; comm_s the exposed communication (the rest of the step):
            # with overlap, what hides under backward is not counted. comm_busy_s: time inside the syncs.
            busy = _busy(compute, config.role)
            exposed = comm.now() - start - busy
            rows.append({"step": step, "rank": comm.rank, "role": "worker", "timed": step >= spec.warmup_steps,
                         "compute_s": busy, "comm_s": exposed, "exposed_comm_s": exposed, "comm_busy_s": sync_s,
                         "overlap_fraction": 1 - exposed / sync_s if sync_s > 0 else math.nan,
                         "backward_end_s": compute.forward_s + compute.backward_s,
                         "bytes_sent": counters.bytes_sent, "bytes_recv": counters.bytes_recv,
                         "loss": math.nan, "samples": spec.batch_size, "consensus_distance": math.nan,
                         "wall_s": comm.now()})
        return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": compute.numel,
                                         "consensus_distance": math.nan}}

    return run_simgrid(world, rank_main, lambda sg: sim.platform.build(sg, world), sim.platform.config,
                       sim.platform.nic)


def _busy(compute: Compute, role: str) -> float:
    """The step's compute alone (a worker of the parameter server runs no optimizer: its server does)."""
    return compute.forward_s + compute.backward_s + (0.0 if role == SERVER else compute.optimizer_s)


def _serve(comm, runtimes, spec: RunSpec, compute: Compute, buckets) -> dict:
    """A parameter server: per bucket, receive the workers' shards, update (the optimizer's share), reply."""
    rows = []
    busy = [0.0]

    def update(reduced, where: slice):
        seconds = compute.optimizer_s * (where.stop - where.start) / max(compute.numel, 1)
        comm.compute(seconds)
        busy[0] += seconds
        return reduced

    for step in range(spec.steps):
        comm.reset_counters()
        start, busy[0] = comm.now(), 0.0
        for bucket, runtime in zip(buckets, runtimes):
            runtime.serve(bucket.numel, torch.float32, "mean", update, device="meta")
        counters = comm.counters()
        rows.append({"step": step, "rank": comm.rank, "role": "server", "timed": step >= spec.warmup_steps,
                     "compute_s": busy[0], "comm_s": comm.now() - start - busy[0],
                     "comm_busy_s": comm.now() - start, "backward_end_s": math.nan,
                     "bytes_sent": counters.bytes_sent, "bytes_recv": counters.bytes_recv, "loss": math.nan,
                     "samples": 0, "consensus_distance": math.nan, "wall_s": comm.now()})
    return {"steps": rows, "final": {"loss": math.nan, "param_norm": math.nan, "numel": compute.numel,
                                     "consensus_distance": math.nan}}


def run_in_child(call: Callable[[], object]) -> tuple[object, str, float]:
    """call() in a forked process (SimGrid's engine runs once per process): (result, error, wall seconds).

    Fork, not spawn: milliseconds instead of seconds of imports, and `call` may be a closure. This process
    must not have run SimGrid's engine itself (it never does: every simulation goes through here).
    """
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    parent_pid = os.getpid()

    def main():
        _die_with_parent(parent_pid)
        try:
            start = time.perf_counter()
            result = call()
            child.send(("ok", result, time.perf_counter() - start))
        except BaseException as e:  # noqa: BLE001 - sent to the parent, which reports it
            child.send(("error", f"{type(e).__name__}: {e}", 0.0))
        finally:
            child.close()

    proc = ctx.Process(target=main, daemon=True)
    proc.start()
    child.close()
    try:
        status, payload, wall = parent.recv()
    except EOFError:
        proc.join()
        status, payload, wall = "error", f"the simulation process died (exit code {proc.exitcode})", 0.0
    except BaseException:  # Ctrl-C, a test's timeout: the simulation must not outlive its reason to run
        proc.kill()
        raise
    finally:
        proc.join()
        parent.close()
    return (payload, "", wall) if status == "ok" else (None, payload, wall)


def simulate_in_child(spec: RunSpec, sim: SimSpec) -> tuple[list[dict] | None, str, float]:
    """simulate() in a fresh process: (results or None, error, simulation wall seconds)."""
    return run_in_child(lambda: simulate(spec, sim))


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this (forked) process when its parent dies, even by SIGKILL, so that a killed
    `syncbench simulate` or test run leaves no simulation running. Elsewhere a no-op. (The kernel watches the
    thread that forked: run_in_child is called from the main thread.) A parent that died before the request
    was made is caught by the check after it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
