"""Connect to Ray, or start a quiet embedded one: the only place that decides where Ray runs."""

from __future__ import annotations

import logging
import os
import tempfile

import ray


def ensure_ray(address: str | None = None, num_cpus: int | None = None, temp_dir: str | None = None) -> bool:
    """Connect to `address` (or RAY_ADDRESS) if given, else start a local Ray; True if we started it.

    Only a Ray this call started should be shut down by the caller (ray.shutdown()); a cluster we only
    connected to, or a Ray already initialized in this process, is left alone.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        ray.init(address=address, logging_level=logging.WARNING)
        return False
    ray.init(num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
             include_dashboard=False,
             _temp_dir=temp_dir or tempfile.mkdtemp(prefix="syncbench-ray-"),
             logging_level=logging.WARNING,
             configure_logging=True)
    return True
