"""Session fixtures: one embedded Ray for the whole test session, and a reusable 2-actor worker group."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_session():
    """An embedded Ray with 8 logical CPUs (8 one-CPU actors fit on 2 cores), no dashboard, own temp dir."""
    import ray

    from experiments.cluster.ray_runtime import ensure_ray

    started = ensure_ray(num_cpus=8)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def _shared_groups():
    groups: dict = {}
    yield groups
    for group in groups.values():
        group.shutdown()


@pytest.fixture
def group2(ray_session, _shared_groups):
    """A healthy 2-rank gloo WorkerGroup shared across tests; replaced if an earlier test broke it."""
    from experiments.cluster.group import WorkerGroup

    group = _shared_groups.get(2)
    if group is None or group.broken:
        if group is not None:
            group.shutdown()
        group = _shared_groups[2] = WorkerGroup(2, timeout=20)
    return group
