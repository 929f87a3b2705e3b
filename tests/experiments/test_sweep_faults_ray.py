"""Failures in a sweep's training on Ray actors: the failing rank's actor really dies at its step, the survivors
detect it and recover by the run's mode, and the result is the thread ranks' (tests/experiments/test_sweep_faults.py
checks those against references worked apart from the sweep's code): the survivors' mean gradient (elastic), the
failure-free run bit for bit (checkpoint_restart). Three workers, the tiny model, four steps; one group of actors
serves the file (the killed ones replaced after each run)."""

from __future__ import annotations

import pytest
import ray
import torch

from experiments.config.sweep import RunSpec
from experiments.pipeline.sweep_faults import SweepSegments
from tests.experiments.test_sweep_faults import reference

BASE = dict(workload="tiny", image_size=16, batch_size=8, steps=4, warmup_steps=1, workers=3, lr=0.05,
            momentum=0.9, timeout=60, p2p="sockets")
META = {"started_at": "2026-01-01T00:00:00+00:00", "transport": "sockets", "gpu": "", "cores": 2, "host": "test"}


def spec_of(strategy="ring", schedule=((2, 1),), **recovery) -> RunSpec:
    return RunSpec(strategy=strategy, failures={"schedule": [list(f) for f in schedule]}, recovery=recovery or None,
                   **BASE)


@pytest.fixture(scope="module")
def group(ray_session):
    from experiments.cluster.group import WorkerGroup

    group = WorkerGroup(3, num_cpus=0.5, timeout=60)
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def group_ps(ray_session):
    """3 workers and the parameter server's 1 server."""
    from experiments.cluster.group import WorkerGroup

    group = WorkerGroup(4, num_cpus=0.5, timeout=60)
    yield group
    group.shutdown()


def on_ray(group, spec, schedule=None):
    """The run on the actors (`schedule`: in place of the spec's): (its result, the segments), its log killed
    after."""
    from experiments.pipeline.ray_faults import RunLog
    from experiments.pipeline.ray_sweep_faults import RaySweepSegments

    log = RunLog.options(num_cpus=0).remote()
    try:
        segments = RaySweepSegments(spec, group, log, schedule)
        return segments.run(), segments
    finally:
        ray.kill(log)
        for index in sorted(segments.dead):
            group.replace(index)
        group.reform(list(range(group.world_size)))


def test_elastic_survivors_on_actors_train_as_on_thread_ranks(group):
    spec = spec_of("ring", [(2, 1)], mode="elastic")  # slot 1's actor dies in step 2; 0 and 2 go on
    run, segments = on_ray(group, spec)
    assert (run.completed_steps, run.steps_run, run.ended) == (4, 4, None)
    [failure] = run.failures
    assert (failure.step, failure.rank, failure.steps_lost, failure.survivors) == (2, 1, 0, 2)
    assert 0 <= failure.detection_s < 5 and 0 <= failure.recovery_s < 30
    threads = SweepSegments(spec).run()
    expected = reference(spec, lambda s: [0, 2] if s >= 2 else [0, 1, 2])
    assert sorted(run.params) == sorted(threads.params) == [0, 2]
    for slot in (0, 2):
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), torch.as_tensor(threads.params[slot]),
                                   rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), expected, rtol=1e-5, atol=1e-6)
    assert sorted({(r["step"], r["rank"]) for r in segments.rows}) == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0), (3, 1)]


def test_checkpoint_restart_on_actors_resumes_bit_identically(group):
    spec = spec_of("ring", [(3, 2)], mode="checkpoint_restart", checkpoint_every=2)  # step 2 lost, redone
    run, _ = on_ray(group, spec)
    assert (run.completed_steps, run.steps_run) == (4, 5)
    assert [(f.step, f.rank, f.steps_lost) for f in run.failures] == [(3, 2, 1)]
    assert len(run.starts_s) == 1  # the dead slot's actor replaced, its start-up measured
    clean, _ = on_ray(group, spec, schedule=[])  # the same run on the actors, nothing failing
    assert clean.steps_run == 4 and not clean.failures
    threads = SweepSegments(spec, schedule=[]).run()  # and on thread ranks (one process: its own thread count)
    for slot in range(3):
        assert torch.equal(torch.as_tensor(run.params[slot]), torch.as_tensor(clean.params[slot]))
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), torch.as_tensor(threads.params[slot]),
                                   rtol=1e-5, atol=1e-6)


def test_the_run_row_on_ray_and_no_actor_left_behind(group):
    from experiments.pipeline.ray_sweep_faults import execute

    before = list(group.actors)
    # slot 0 dies in step 0: the survivors' first segment completed nothing, they go on from their initial state
    row, steps, _ = execute(spec_of("ring", [(0, 0)], mode="elastic"), META, group)
    assert row["status"] == "ok", row["error"]
    assert (row["recovery_mode"], row["failure_count"], row["failure_ranks"], row["steps_lost"],
            row["completed_steps"]) == ("elastic", 1, (0,), 0, 4)
    assert row["detection_s"] >= 0 and row["recovery_s"] >= 0 and row["time_to_step_s"] > 0
    assert sorted(r["step"] for r in steps if r["role"] == "worker") == [0, 0, 1, 1, 2, 2, 3, 3]  # two survivors
    # the killed actor is gone, replaced; every actor of the group answers; no run log is left
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(before[0].address.remote(), timeout=30)
    assert group.actors[0] is not before[0] and group.actors[1:] == before[1:]
    ray.get([a.address.remote() for a in group.actors], timeout=30)
    from ray._private import state

    alive = [a for a in state.actors().values() if a["State"] == "ALIVE" and a["ActorClassName"] == "RunLog"]
    assert alive == []


def test_the_servers_barrier_shrinks_on_actors_and_they_keep_their_shards(group_ps):
    # slot 1's actor dies in step 1; the server (actor 3) serves 0 and 2 from step 1 on, its shards and momentum
    # kept in its actor; slot 1's replacement joins at step 3, fetching the state from slot 0
    spec = spec_of("parameter_server", [(1, 1)], mode="ps_shrink", rejoin_steps=2)
    run, segments = on_ray(group_ps, spec)
    assert (run.completed_steps, run.steps_run, run.ended) == (4, 4, None), str(run.ended)
    [failure] = run.failures
    assert (failure.step, failure.rank, failure.steps_lost, failure.survivors) == (1, 1, 0, 2)
    threads = SweepSegments(spec).run()
    expected = reference(spec, lambda s: [0, 2] if s in (1, 2) else [0, 1, 2], lambda s: {1: 0} if s == 3 else {})
    assert sorted(run.params) == sorted(threads.params) == [0, 1, 2]
    for slot in range(3):
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), torch.as_tensor(threads.params[slot]),
                                   rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), expected, rtol=1e-5, atol=1e-6)
    # every completed step's server row, its rank after the workers of that step's group
    assert [(r["step"], r["rank"], r["role"]) for r in segments.server_rows] == [
        (0, 3, "server"), (1, 2, "server"), (2, 2, "server"), (3, 3, "server")]


def test_a_restart_reloads_the_servers_checkpoint_on_actors_bit_identically(group_ps):
    # slot 2 dies in step 3; the checkpoint after step 1 (workers' and server's) is reloaded, steps 2 redone
    spec = spec_of("parameter_server", [(3, 2)], mode="checkpoint_restart", checkpoint_every=2)
    run, segments = on_ray(group_ps, spec)
    assert (run.completed_steps, run.steps_run) == (4, 5)
    assert [(f.step, f.rank, f.steps_lost) for f in run.failures] == [(3, 2, 1)]
    assert sorted(segments.server_checkpoint) == [0]  # the server's part of the checkpoint after step 3
    assert [r["step"] for r in segments.server_rows] == [0, 1, 2, 3]  # step 2's last attempt only
    clean, _ = on_ray(group_ps, spec, schedule=[])
    threads = SweepSegments(spec).run()  # the same failure on thread ranks
    for slot in range(3):
        assert torch.equal(torch.as_tensor(run.params[slot]), torch.as_tensor(clean.params[slot]))
        torch.testing.assert_close(torch.as_tensor(run.params[slot]), torch.as_tensor(threads.params[slot]),
                                   rtol=1e-5, atol=1e-6)


def test_an_mtbf_run_on_actors_fails_where_its_draws_say_and_its_row_records_it(group):
    from experiments.pipeline.ray_sweep_faults import RaySweepSegments, execute

    spec = RunSpec(strategy="ring", failures={"mtbf_s": 200.0, "seed": 3},
                   recovery={"mode": "elastic", "rejoin_steps": 2}, **BASE)
    # the run's own draws: a slot dies at the first step it starts after its time (seconds from the run's start),
    # and no step starts within 10 ms of it (the group is formed and every model built first); a time past the
    # run's timeout never comes (the timeout bounds the whole run)
    draws = RaySweepSegments(spec, group=None, log=None)
    early = sorted(slot for slot, due in draws.due.items() if due < 0.01)
    assert early == [2] and all(due > spec.timeout for slot, due in draws.due.items() if slot != 2)
    assert draws.rngs[2].exponential(200.0) > spec.timeout  # the replacement's, drawn at the death: never comes
    # so slot 2 dies in step 0, once; it rejoins at step 2 and lives
    row, steps, _ = execute(spec, META, group)
    assert row["status"] == "ok", row["error"]
    assert (row["failure_setting"], row["failure_count"], row["failure_steps"], row["failure_ranks"],
            row["steps_lost"], row["completed_steps"]) == ("MTBF 200 s per worker, seed 3", 1, (0,), (2,), 0, 4)
    assert row["detection_s"] >= 0 and row["recovery_s"] >= 0 and row["time_to_step_s"] > 0
    workers = [r["step"] for r in steps if r["role"] == "worker"]
    assert [workers.count(step) for step in range(4)] == [2, 2, 3, 3]


def test_ray_refuses_what_its_actors_cannot_recover_yet():
    from experiments.pipeline.ray_substrate import RaySubstrate
    from experiments.pipeline.substrate import Run

    substrate = RaySubstrate()
    ps = spec_of("parameter_server", [(2, 1)], mode="ps_shrink")
    assert substrate.problems(Run(ps.run_id, ps)) == []  # synchronous, dedicated servers: their shards on actors
    cuda = RunSpec(strategy="ring", failures={"schedule": [[2, 1]]}, recovery={"mode": "elastic"},
                   **{**BASE, "device": "cuda"})
    assert any("device = 'cuda'" in p for p in substrate.problems(Run(cuda.run_id, cuda)))
    mtbf = RunSpec(strategy="ring", failures={"mtbf_s": 5.0, "seed": 1}, recovery={"mode": "elastic"}, **BASE)
    assert substrate.problems(Run(mtbf.run_id, mtbf)) == []
    ring = spec_of("ring", [(2, 1)], mode="elastic")
    assert substrate.problems(Run(ring.run_id, ring)) == []


def test_an_mtbf_death_on_an_actor_joins_the_schedule_and_draws_the_replacement_s_time():
    import numpy as np

    from experiments.pipeline.ray_sweep_faults import RaySweepSegments
    from strategies.faults import Failure

    spec = RunSpec(strategy="ring", failures={"mtbf_s": 10.0, "seed": 3}, recovery={"mode": "elastic"}, **BASE)
    run = RaySweepSegments(spec, group=None, log=None)
    draws = {slot: np.random.default_rng([3, slot, 39]) for slot in range(3)}
    assert run.due == pytest.approx({slot: rng.exponential(10.0) for slot, rng in draws.items()})
    run.began = 100.0
    run.note_deaths([(1, 3, 104.0)])  # the log's (slot, step, time) of a death the schedule did not name
    assert run.pending == [Failure(3, 1)]
    assert run.due[1] == pytest.approx(4.0 + draws[1].exponential(10.0))
    run.note_deaths([(1, 3, 104.0)])  # a death already in the schedule: nothing drawn again
    assert run.pending == [Failure(3, 1)]
