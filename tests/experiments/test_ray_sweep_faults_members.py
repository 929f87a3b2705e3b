"""What a Ray actor runs in a sweep's failure segment (ray_sweep_faults._member), run here on thread ranks without
Ray: a synchronous parameter server's server keeps its shards and momentum in its actor's state from segment to
segment, including when the barrier shrinks to the survivors and the server's rank moves, and the result is the
thread substrate's for the same spec and failure bit for bit (tests/experiments/test_sweep_faults_ray.py runs the
same on real actors, deaths included)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from experiments.config.sweep import RunSpec
from experiments.pipeline import ray_sweep_faults
from experiments.pipeline.sweep_faults import FRESH, SweepSegments
from strategies.transport.threads import run_threads

BASE = dict(workload="tiny", image_size=16, batch_size=8, steps=4, warmup_steps=1, workers=3, lr=0.05,
            momentum=0.9, timeout=60)


def segment(spec, states: dict, members: tuple, workers: int, start: int, end: int, load: dict) -> list:
    """One segment on thread ranks, each member with its actor's state dict (kept by the caller between calls)."""
    plan = ray_sweep_faults._Plan(spec, spec.strategy_config(), members, workers, start, end, {}, {}, time.time(),
                                  (), members[0], False, load, None, 0, None)
    return run_threads(len(members), lambda comm: ray_sweep_faults._member(
        SimpleNamespace(comm=comm, state=states[members[comm.rank]]), plan), timeout=60)


def test_the_server_keeps_its_shards_between_segments_and_serves_the_survivors():
    torch.set_num_threads(1)
    spec = RunSpec(strategy="parameter_server", failures={"schedule": [[2, 1]]}, recovery={"mode": "ps_shrink"},
                   **BASE)
    states = {actor: {} for actor in range(4)}  # workers 0, 1, 2 and the server, actor 3
    first = segment(spec, states, (0, 1, 2, 3), 3, 0, 2, {0: FRESH, 1: FRESH, 2: FRESH, 3: FRESH})
    assert [(r.slot, r.done, r.error) for r in first] == [(0, 2, ""), (1, 2, ""), (2, 2, ""), (3, 2, "")]
    # slot 1 is gone from step 2: the server, now rank 2, serves 0 and 2 on the shards it kept
    second = segment(spec, states, (0, 2, 3), 2, 2, 4, {})
    assert [(r.slot, r.done, r.error) for r in second] == [(0, 4, ""), (2, 4, ""), (3, 4, "")]
    assert [(row["step"], row["rank"], row["role"]) for row in second[2].rows] == [(2, 2, "server"),
                                                                                    (3, 2, "server")]
    threads = SweepSegments(spec).run()  # the same failure on the thread substrate
    for report in second[:2]:
        assert torch.equal(report.state.params, torch.as_tensor(threads.params[report.slot]))
