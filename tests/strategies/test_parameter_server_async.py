"""Stale-synchronous, asynchronous and backup-worker parameter servers on thread ranks with a scripted delay
schedule: the staleness recorded is what the schedule implies, the bound holds, a late push changes nothing."""

import time

import numpy as np
import pytest
import torch

import strategies
from strategies.transport.threads import run_threads

LR = 0.5


def run(workers, steps, delays, numel=6, servers=1, absolute=False, **params):
    """Worker w sleeps delays[w][t] before pushing step t (its 'compute'; `absolute`: until delays[w][t] seconds
    after the start, so that the schedule does not drift); its gradient is (w + 1) x ones, the servers step
    params -= LR x gradient. Returns (per worker the parameters after every step, per server the records)."""
    config = strategies.make("parameter_server", servers=servers, **params)

    def body(comm):
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            state = {}

            def update(gradient, where):
                params = state.setdefault(where.start, torch.zeros(where.stop - where.start, dtype=torch.float64))
                params -= LR * gradient
                return params

            runtime._check_size(numel)
            comm.barrier()  # the workers' common start
            return runtime.serve_run(steps, numel, torch.float64, update)
        seen = []
        runtime._check_size(numel)  # the control-plane size check of the first sync(), before the clock starts
        comm.barrier()
        start = time.perf_counter()
        for step in range(steps):
            wait = delays[comm.rank][step]
            time.sleep(max(0.0, start + wait - time.perf_counter()) if absolute else wait)
            buffer = torch.full((numel,), comm.rank + 1.0, dtype=torch.float64)
            runtime.sync(buffer, "mean")
            seen.append(buffer.numpy().copy())
        return seen

    results = run_threads(config.world_size(workers), body, timeout=30)
    return results[:workers], results[workers:]


def implied_async_staleness(schedule):
    """Async: a push is applied at once and answered at once, so worker w pushes step t at schedule[w][t]; its
    staleness is the number of other pushes between its previous push (its read) and this one."""
    times = {(w, t): at for w, row in enumerate(schedule) for t, at in enumerate(row)}
    staleness = {}
    for (w, t), at in times.items():
        read = times[(w, t - 1)] if t else -1.0
        staleness[(t, w)] = sum(1 for (v, _), other in times.items() if v != w and read < other < at)
    return staleness


def test_async_staleness_is_what_the_schedule_implies():
    # push times (s after the start), 60 ms apart at least: their order is the schedule's on a busy machine too
    schedule = [[0.00, 0.15, 0.30, 0.45], [0.06, 0.36, 0.66, 0.96], [0.21, 0.51, 0.81, 1.11]]
    _, records = run(3, 4, schedule, absolute=True, staleness="async")
    got = {(r.step, r.worker): r.staleness for r in records[0]}
    assert got == implied_async_staleness(schedule)
    assert max(got.values()) >= 2 and all(r.bound_wait_s < 0.03 for r in records[0])  # async never waits


def test_ssp_never_lets_a_worker_run_more_than_s_steps_ahead():
    steps, s = 8, 2
    delays = [[0.0] * steps, [0.0] * steps, [0.06] * steps]  # worker 2 is the straggler
    outputs, records = run(3, steps, delays, staleness=s, servers=2)
    for server in records:
        assert len(server) == 3 * steps and max(r.lead for r in server) == s  # reached, never exceeded
        assert max(r.staleness for r in server) > 0
        waited = [r.bound_wait_s for r in server if r.worker < 2]
        assert max(waited) > 0.03  # the fast workers waited at the bound for the straggler
    # both servers applied the same pushes: every worker's shards agree with each other at the end
    assert all(np.isfinite(o[-1]).all() for o in outputs)


def test_staleness_zero_is_the_synchronous_server():
    config = strategies.make("parameter_server", servers=2, staleness=0)
    assert not config.asynchronous and config == strategies.make("parameter_server", servers=2)


def test_a_backup_workers_late_push_never_changes_a_steps_result():
    steps, workers = 4, 4
    delays = [[0.0] * steps, [0.0] * steps, [0.0] * steps, [0.15] * steps]  # worker 3 is always late
    outputs, records = run(workers, steps, delays, backups=1, servers=2)
    # each step is the mean gradient of workers 0-2: (1 + 2 + 3) / 3 = 2; params after step t: -LR x 2 x (t + 1)
    for rank in range(3):
        for t, params in enumerate(outputs[rank]):
            np.testing.assert_array_equal(params, np.full(6, -LR * 2.0 * (t + 1)))
    for server in records:
        dropped = [r for r in server if r.dropped]
        assert {r.worker for r in dropped} == {3} and len(dropped) == steps
    # the late worker continues from the newest parameters (a step the others made)
    made = {-LR * 2.0 * (t + 1) for t in range(steps)}
    assert all(float(p[0]) in made for p in outputs[3])


@pytest.mark.parametrize("params, pattern", [
    ({"staleness": 2, "mode": "summation"}, r"need mode='update' and placement='dedicated'"),
    ({"backups": 1, "placement": "colocated"}, r"need mode='update' and placement='dedicated'"),
])
def test_barrier_free_servers_need_update_mode_and_dedicated_servers(params, pattern):
    with pytest.raises(ValueError, match=pattern):
        strategies.make("parameter_server", **params)


def test_traffic_counts_dropped_pushes_too():
    from strategies.testing import check_traffic

    config = strategies.make("parameter_server", servers=2, backups=1)
    traffic = config.traffic(4, 6, 8)
    assert [r.bytes_sent for r in traffic.ranks] == [48] * 4 + [4 * 24] * 2
    measured = []

    def body(comm):
        runtime = config.bind(comm, 4)
        if runtime.is_server:
            runtime.serve_run(1, 6, torch.float64, lambda g, where: torch.zeros(where.stop - where.start,
                                                                                dtype=torch.float64))
        else:
            runtime.sync(torch.ones(6, dtype=torch.float64), "mean")
        return {"role": "server" if runtime.is_server else "worker", **comm.counters().as_dict()}

    measured = run_threads(6, body, timeout=10)
    check_traffic(config, 4, 6, 8, measured, "backups=1")


@pytest.mark.parametrize("params", [{"staleness": 2}, {"staleness": "async"}, {"backups": 1}])
def test_training_without_a_barrier_records_staleness_and_outruns_a_straggler(params):
    """Real training (tiny model) on 4 thread workers, worker 3 three times slower: the barrier-free server runs,
    its rows carry the staleness of every gradient it applied (bounded by SSP), the bound waits and the drops;
    the fast workers finish more steps per second than the straggler allows a synchronous server."""
    from experiments.config.sweep import RunSpec
    from experiments.pipeline.summary import summarize
    from tests.experiments.test_train import train_on_threads

    torch.set_num_threads(1)
    spec = RunSpec(workload="tiny", image_size=16, batch_size=8, steps=6, warmup_steps=1, workers=4,
                   strategy="parameter_server", strategy_params={"servers": 2, **params},
                   straggler={"ranks": [3], "slowdown": 3.0})
    results = train_on_threads(spec)
    server_rows = [row for r in results[4:] for row in r["steps"]]
    applied = [s for row in server_rows for s in row["staleness"]]
    if "backups" in params:
        assert sum(row["dropped_pushes"] for row in server_rows) > 0 and set(applied) == {0}
    else:
        assert len(applied) == 2 * 4 * 6 and max(applied) > 0
    if params.get("staleness") == 2:
        assert max(row["bound_wait_s"] for row in server_rows) > 0
    row, _ = summarize(spec, results, "", {"started_at": "t", "duration_s": 1.0, "transport": "threads",
                                           "gpu": "", "cores": 2, "host": "h"})
    assert row["status"] == "ok", row["error"]
    assert all(np.isfinite(r["final"]["loss"]) for r in results[:4])
