"""How a worker group reads its ranks' outcomes, without Ray: a task Ray itself killed (its memory monitor's
OutOfMemoryError) fails the run naming the rank, as a dead actor does, instead of escaping and ending the sweep."""

from __future__ import annotations

import pytest
from ray.exceptions import OutOfMemoryError

from experiments.cluster import group as group_mod


def test_a_task_killed_by_rays_memory_monitor_fails_the_run_naming_the_rank(monkeypatch):
    refs = ["r0", "r1"]
    outcomes = {"r0": "done", "r1": OutOfMemoryError("Task was killed due to the node running low on memory.")}

    def get(ref):
        if isinstance(outcomes[ref], Exception):
            raise outcomes[ref]
        return outcomes[ref]

    monkeypatch.setattr(group_mod, "_wait_any", lambda pending, timeout: list(pending))
    monkeypatch.setattr(group_mod.ray, "get", get)
    group = group_mod.WorkerGroup.__new__(group_mod.WorkerGroup)
    group.broken = False
    with pytest.raises(group_mod.GroupError) as failed:
        group._get(refs, 5.0, "run")
    assert "failed on rank 1" in str(failed.value) and "OutOfMemoryError" in str(failed.value)
    assert group.broken  # the next run starts a new group
