"""What the machine (or the Ray cluster) can hold: checked against a sweep's runs before any actor starts.

Two limits depend on where the ranks run, so they cannot be fixed ranges in the sweep file:
- ranks per core: past MAX_RANKS_PER_CORE the ranks mostly wait for a core, and a run measures that;
  `--oversubscribe` allows it (the report flags oversubscribed runs either way);
- memory: every rank holds a Python process with torch (RANK_BASE_BYTES, measured) and at least four
  copies of the model (parameters, gradients, their flat buffers); if even that lower bound does not fit,
  the machine would swap or kill ranks, so it is refused outright.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

MAX_RANKS_PER_CORE = 4
# private memory of an idle rank with torch imported (the shared libraries excluded): 100 MB is below what
# `ps` shows for a GroupWorker on the development machine, so the estimate stays a lower bound
RANK_BASE_BYTES = 100e6
MODEL_COPIES = 4


class LimitError(ValueError):
    """A sweep that does not fit the machine or cluster; says what it needs and what there is."""


@dataclass(frozen=True)
class Capacity:
    """CPUs and memory the ranks can use, and what to call the place that has them."""

    cores: float
    memory_bytes: float
    where: str


def local_capacity() -> Capacity:
    """This machine: its cores and the memory available now."""
    import psutil  # vendored by Ray

    return Capacity(float(os.cpu_count() or 1), float(psutil.virtual_memory().available), "this machine")


def cluster_capacity() -> Capacity:
    """The connected Ray cluster: its CPUs and the memory Ray lets tasks and actors use."""
    import ray

    resources = ray.cluster_resources()
    return Capacity(float(resources.get("CPU", 0)), float(resources.get("memory", 0)), "the Ray cluster")


@functools.lru_cache(maxsize=64)
def _model_bytes(workload: str, num_classes: int, image_size: int) -> int:
    from workloads.models import param_count

    return 4 * param_count(workload, num_classes, image_size)


def rank_bytes(spec) -> float:
    """A lower bound on one rank's memory for this run (fp32 model; activations not counted)."""
    return RANK_BASE_BYTES + MODEL_COPIES * _model_bytes(spec.workload, spec.num_classes, spec.image_size)


def check_capacity(runs, capacity: Capacity, oversubscribe: bool = False) -> None:
    """Raise LimitError for the first run (largest first) that does not fit `capacity`, with the numbers."""
    for spec in sorted(runs, key=lambda s: -s.world_size()):
        world = spec.world_size()
        servers = world - spec.workers
        what = (f"{spec.strategy} with workers = {spec.workers}" + (f" and {servers} server(s)" if servers else "")
                + f" ({world} ranks, {spec.workload})")
        check_ranks(world, lambda spec=spec: rank_bytes(spec), capacity, what, oversubscribe)


def check_ranks(world: int, bytes_per_rank, capacity: Capacity, what: str, oversubscribe: bool = False) -> None:
    """`world` ranks of at least `bytes_per_rank` each (bytes, or a function giving them: it may need to build
    the model on the meta device) against the cores and memory of `capacity`."""
    allowed = int(capacity.cores * MAX_RANKS_PER_CORE)
    if world > allowed and not oversubscribe:
        raise LimitError(f"{what}: {capacity.where} has {capacity.cores:g} cores, and at most "
                         f"{MAX_RANKS_PER_CORE} ranks per core = {allowed} ranks are allowed; pass "
                         f"--oversubscribe to run it anyway (its times would then measure core contention)")
    if callable(bytes_per_rank):
        bytes_per_rank = bytes_per_rank()
    need = world * bytes_per_rank
    if need > capacity.memory_bytes:
        raise LimitError(f"{what}: needs at least {need / 1e9:.1f} GB of memory ({world} x "
                         f"{bytes_per_rank / 1e6:,.0f} MB), {capacity.where} has "
                         f"{capacity.memory_bytes / 1e9:.1f} GB available")


def capacity_for(address: str | None) -> Capacity:
    """The cluster's capacity when Ray is up or an address is given, else this machine's (Ray not started)."""
    import ray

    if ray.is_initialized():
        return cluster_capacity()
    if address or os.environ.get("RAY_ADDRESS"):
        from experiments.cluster.ray_runtime import ensure_ray

        ensure_ray(address)
        return cluster_capacity()
    return local_capacity()
