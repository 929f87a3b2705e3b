"""Stale-synchronous, asynchronous and backup-worker parameter servers on thread ranks with a scripted delay
schedule: the staleness recorded is what the schedule implies, the bound holds, a late push changes nothing."""

import time

import numpy as np
import pytest
import torch

import strategies
from strategies.transport.threads import run_threads

LR = 0.5


def run(workers, steps, delays, numel=6, servers=1, absolute=False, buckets=None, before_step=None, after_step=None,
        **params):
    """Worker w sleeps delays[w][t] before pushing step t (its 'compute'; `absolute`: until delays[w][t] seconds
    after the start, so that the schedule does not drift); its gradient is (w + 1) x ones, synced bucket by
    bucket (`buckets`: their sizes, one bucket of numel by default); update-mode servers step
    params -= LR x gradient; `before_step(rank, step)` and `after_step(rank, step)`, if given, are called
    first and last in each step. Returns (per worker the buffer after every step, per server the
    records)."""
    config = strategies.make("parameter_server", servers=servers, **params)
    buckets = buckets or [numel]

    def body(comm):
        runtimes = [config.bind(comm, workers) for _ in buckets]
        if runtimes[0].is_server:
            state = {}

            def update(bucket, gradient, where):
                key = (bucket, where.start)
                params = state.setdefault(key, torch.zeros(where.stop - where.start, dtype=torch.float64))
                params -= LR * gradient
                return params

            for runtime, size in zip(runtimes, buckets):
                runtime._check_size(size)
            comm.barrier()  # the workers' common start
            return runtimes[0].serve_run(steps, buckets, torch.float64, update, checked=True)
        seen = []
        for runtime, size in zip(runtimes, buckets):  # the size checks of the first syncs, before the clock starts
            runtime._check_size(size)
        comm.barrier()
        start = time.perf_counter()
        for step in range(steps):
            if before_step is not None:
                before_step(comm.rank, step)
            wait = delays[comm.rank][step]
            time.sleep(max(0.0, start + wait - time.perf_counter()) if absolute else wait)
            buffer = torch.full((sum(buckets),), comm.rank + 1.0, dtype=torch.float64)
            lo = 0
            for runtime, size in zip(runtimes, buckets):
                runtime.sync(buffer[lo:lo + size], "mean")
                lo += size
            seen.append(buffer.numpy().copy())
            if after_step is not None:
                after_step(comm.rank, step)
        return seen

    results = run_threads(config.world_size(workers), body, timeout=30)
    return results[:workers], results[workers:]


# 2 elements of float64 per partition: a shard of 6 is 3 partitions, one of 5 three (2, 2, 1 or so)
TINY_PARTITIONS = 2e-5


def implied_async_staleness(schedule):
    """Async: a push is applied at once and answered at once, so worker w pushes step t at schedule[w][t]; its
    staleness is the number of other pushes between its previous push (its read) and this one."""
    times = {(w, t): at for w, row in enumerate(schedule) for t, at in enumerate(row)}
    staleness = {}
    for (w, t), at in times.items():
        read = times[(w, t - 1)] if t else -1.0
        staleness[(t, w)] = sum(1 for (v, _), other in times.items() if v != w and read < other < at)
    return staleness


SCHEDULE = [[0.00, 0.15, 0.30, 0.45], [0.06, 0.36, 0.66, 0.96], [0.21, 0.51, 0.81, 1.11]]


@pytest.mark.timing
def test_async_staleness_is_what_the_schedule_implies():
    # push times (s after the start), 60 ms apart at least: their order is the schedule's on a busy machine too
    _, records = run(3, 4, SCHEDULE, absolute=True, staleness="async")
    got = {(r.step, r.worker): r.staleness for r in records[0]}
    assert got == implied_async_staleness(SCHEDULE)
    assert max(got.values()) >= 2 and all(r.bound_wait_s < 0.03 for r in records[0])  # async never waits


@pytest.mark.timing
def test_async_summation_sums_every_push_since_the_last_reply_in_every_bucket_and_partition():
    """Summation mode, two buckets, several partitions per server: every unit records the staleness the schedule
    implies, and a worker's reply is the sum of the pushes (scaled by 1/n) since its previous one, its own in."""
    schedule = [[2 * at for at in row] for row in SCHEDULE]  # 120 ms apart: 4 partitions per push, on a busy machine
    outputs, records = run(3, 4, schedule, absolute=True, staleness="async", mode="summation", servers=2,
                           buckets=[6, 5], partition_mb=TINY_PARTITIONS)
    implied = implied_async_staleness(schedule)
    for server in records:
        assert len({r.unit for r in server}) >= 3  # (bucket, partition) units: 2 buckets x 1-2 partitions
        assert {(r.step, r.worker, r.unit): r.staleness for r in server} == {
            (t, w, r.unit): implied[(t, w)] for r in server for (t, w) in [(r.step, r.worker)]}
    times = {(w, t): at for w, row in enumerate(schedule) for t, at in enumerate(row)}
    for (w, t), at in times.items():
        read = times[(w, t - 1)] if t else -1.0
        want = sum((v + 1) / 3 for (v, _), other in times.items() if read < other <= at)
        np.testing.assert_allclose(outputs[w][t], np.full(11, want), rtol=1e-12)


@pytest.mark.timing
@pytest.mark.parametrize("params", [{}, {"mode": "summation", "partition_mb": TINY_PARTITIONS}])
def test_ssp_never_lets_a_worker_run_more_than_s_steps_ahead(params):
    steps, s = 8, 2
    delays = [[0.0] * steps, [0.0] * steps, [0.06] * steps]  # worker 2 is the straggler
    outputs, records = run(3, steps, delays, staleness=s, servers=2, **params)
    for server in records:
        units = len({r.unit for r in server})
        assert units == (1 if not params else 2)  # a shard of 3 elements: 2 partitions of at most 2
        assert len(server) == 3 * steps * units and max(r.lead for r in server) == s  # reached, never exceeded
        assert max(r.staleness for r in server) > 0
        waited = [r.bound_wait_s for r in server if r.worker < 2]
        assert max(waited) > 0.03  # the fast workers waited at the bound for the straggler
    # both servers applied the same pushes: every worker's shards agree with each other at the end
    assert all(np.isfinite(o[-1]).all() for o in outputs)


# -- the same sums and bound with no clock: the order of the pushes scripted by events (make test-fast keeps them) --

def test_async_summation_in_a_scripted_push_order_sums_every_push_since_the_last_reply_scaled_by_1_over_n():
    """Workers push in turns, (step 0: worker 0, 1, 2), (step 1: 0, 1, 2), ...: each push is answered before the
    next begins, so a reply is exactly the pushes since the worker's previous one, own included, each / 3; and
    each unit's staleness is the number of other pushes in between."""
    import threading

    workers, steps = 3, 4
    turn, turned = [0], threading.Condition()

    def before_step(rank, step):
        with turned:
            assert turned.wait_for(lambda: turn[0] == step * workers + rank, timeout=20), "the turns stalled"

    def after_step(rank, step):
        with turned:
            turn[0] += 1
            turned.notify_all()

    outputs, records = run(workers, steps, [[0.0] * steps] * workers, staleness="async", mode="summation",
                           servers=2, buckets=[6, 5], partition_mb=TINY_PARTITIONS, before_step=before_step,
                           after_step=after_step)
    order = [[t * workers + w for t in range(steps)] for w in range(workers)]  # each push's place in the turns
    implied = implied_async_staleness(order)
    for server in records:
        assert len({r.unit for r in server}) >= 3
        assert {(r.step, r.worker, r.unit): r.staleness for r in server} == {
            (r.step, r.worker, r.unit): implied[(r.step, r.worker)] for r in server}
    for w in range(workers):
        for t in range(steps):
            read = order[w][t - 1] if t else -1
            want = sum((v + 1) / workers for v in range(workers) for at in order[v] if read < at <= order[w][t])
            np.testing.assert_allclose(outputs[w][t], np.full(11, want), rtol=1e-12)


@pytest.mark.parametrize("params", [{}, {"mode": "summation", "partition_mb": TINY_PARTITIONS}])
def test_ssp_holds_the_fast_workers_at_s_steps_ahead_of_a_straggler_that_has_not_pushed(params):
    """Worker 2 pushes nothing until workers 0 and 1 have finished steps 0..s-1 (s ahead of it: its clock is 0),
    then gives them a second to finish step s, which the bound forbids; no clock is asserted on: a correct bound
    holds them whatever the machine's load, a bound one step loose lets them through at once."""
    import threading

    steps, s = 6, 2
    done, lock = {0: -1, 1: -1}, threading.Condition()
    ahead = []

    def before_step(rank, step):
        if rank == 2 and step == 0:
            with lock:
                assert lock.wait_for(lambda: min(done.values()) >= s - 1, timeout=20), "workers 0, 1 never got ahead"
                lock.wait_for(lambda: max(done.values()) >= s, timeout=1.0)  # only a loose bound lets this happen
                ahead.append(dict(done))

    def after_step(rank, step):
        if rank < 2:
            with lock:
                done[rank] = step
                lock.notify_all()

    outputs, records = run(3, steps, [[0.0] * steps] * 3, staleness=s, servers=2, before_step=before_step,
                           after_step=after_step, **params)
    assert ahead == [{0: s - 1, 1: s - 1}]  # held at the bound: s steps ahead of the straggler, not s + 1
    for server in records:
        assert max(r.lead for r in server) == s
    assert all(np.isfinite(o[-1]).all() for o in outputs)


@pytest.mark.parametrize("params", [{}, {"mode": "summation", "partition_mb": 1.0}])
def test_staleness_zero_is_the_synchronous_server(params):
    config = strategies.make("parameter_server", servers=2, staleness=0, **params)
    assert not config.asynchronous and config == strategies.make("parameter_server", servers=2, **params)


def test_staleness_zero_trains_bit_identically_to_the_synchronous_summation_server():
    """s = 0 in summation mode, two buckets with overlap: the same parameters, bit for bit, as the default."""
    from tests.experiments.test_train import spec_for, train_on_threads

    torch.set_num_threads(1)
    runs = [train_on_threads(spec_for("parameter_server", workers=2, steps=3, bucket_mb=0.03, overlap=True,
                                      params={"servers": 2, "mode": "summation", "partition_mb": 0.01, **extra}))
            for extra in ({}, {"staleness": 0, "backups": 0})]
    for a, b in zip(runs[0][:2], runs[1][:2]):
        assert a["final"]["buckets"] > 1 and torch.equal(a["params"], b["params"])


@pytest.mark.timing
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


def test_a_late_backup_worker_gets_the_newest_parameters_not_its_own_steps():
    """Update mode, 4 workers, 1 backup: workers 0-2 make all 4 steps (params -LR x 2 x (t + 1): -1, -2, -3, -4)
    before worker 3 pushes at all (it waits for their last reply: no clock involved). Each of its late pushes is
    answered with the newest parameters, those of step 3: -4 at every step, never its own step's -1, -2, -3."""
    import threading

    steps, workers = 4, 4
    finished, lock = [], threading.Lock()
    others_done = threading.Event()

    def before_step(rank, step):
        if rank == 3 and step == 0:
            assert others_done.wait(20), "workers 0-2 never finished their steps"

    def after_step(rank, step):
        if rank < 3 and step == steps - 1:
            with lock:
                finished.append(rank)
                if len(finished) == 3:
                    others_done.set()

    outputs, records = run(workers, steps, [[0.0] * steps] * workers, backups=1, servers=2,
                           before_step=before_step, after_step=after_step)
    for rank in range(3):
        assert [float(p[0]) for p in outputs[rank]] == [-LR * 2.0 * (t + 1) for t in range(steps)]
    assert [float(p[0]) for p in outputs[3]] == [-LR * 2.0 * steps] * steps
    for server in records:
        assert sorted(r.step for r in server if r.dropped and r.worker == 3) == list(range(steps))


@pytest.mark.timing
def test_a_backup_workers_late_push_never_changes_a_summation_steps_mean():
    """Summation mode, two buckets, several partitions: every step's mean is that of workers 0-2, whatever worker
    3's late pushes carry; worker 3 gets each step's mean too (it applies the update the others applied)."""
    steps, workers = 3, 4
    delays = [[0.0] * steps, [0.0] * steps, [0.0] * steps, [0.15] * steps]
    outputs, records = run(workers, steps, delays, backups=1, servers=2, mode="summation", buckets=[6, 5],
                           partition_mb=TINY_PARTITIONS)
    for rank in range(workers):
        for params in outputs[rank]:
            np.testing.assert_array_equal(params, np.full(11, 2.0))
    for server in records:
        dropped = [r for r in server if r.dropped]
        units = len({r.unit for r in server})
        assert units >= 3 and {r.worker for r in dropped} == {3} and len(dropped) == steps * units


@pytest.mark.parametrize("params, pattern", [
    ({"staleness": 2, "placement": "colocated"}, r"need placement='dedicated', got placement='colocated'"),
    ({"backups": 1, "placement": "colocated", "mode": "summation"}, r"need placement='dedicated'"),
    ({"staleness": "async", "placement": "colocated"}, r"accepted: placement='dedicated'"),
])
def test_barrier_free_servers_need_dedicated_servers(params, pattern):
    with pytest.raises(ValueError, match=pattern):
        strategies.make("parameter_server", **params)


@pytest.mark.parametrize("params", [{}, {"mode": "summation", "partition_mb": TINY_PARTITIONS}])
def test_traffic_counts_dropped_pushes_too(params):
    from strategies.testing import check_traffic

    config = strategies.make("parameter_server", servers=2, backups=1, **params)
    traffic = config.traffic(4, 6, 8)
    assert [r.bytes_sent for r in traffic.ranks] == [48] * 4 + [4 * 24] * 2
    assert traffic.ranks[0].msgs_sent == (2 if not params else 4)  # a shard of 3: partitions of 2 and 1
    measured = []

    def body(comm):
        runtime = config.bind(comm, 4)
        if runtime.is_server:
            runtime.serve_run(1, 6, torch.float64, lambda b, g, where: torch.zeros(where.stop - where.start,
                                                                                   dtype=torch.float64))
        else:
            runtime.sync(torch.ones(6, dtype=torch.float64), "mean")
        return {"role": "server" if runtime.is_server else "worker", **comm.counters().as_dict()}

    measured = run_threads(6, body, timeout=10)
    check_traffic(config, 4, 6, 8, measured, "backups=1")


@pytest.mark.parametrize("params", [{"staleness": 2}, {"staleness": "async"}, {"backups": 1},
                                    {"staleness": 2, "mode": "summation", "bucket_mb": 0.03, "overlap": True}])
def test_training_without_a_barrier_records_staleness_and_outruns_a_straggler(params):
    """Real training (tiny model) on 4 thread workers, worker 3 three times slower: the barrier-free server runs,
    its rows carry the staleness of every gradient it applied (bounded by SSP), the bound waits and the drops;
    the fast workers finish more steps per second than the straggler allows a synchronous server."""
    from experiments.config.sweep import RunSpec
    from experiments.pipeline.summary import summarize
    from tests.experiments.test_train import train_on_threads

    torch.set_num_threads(1)
    run_keys = {k: params.pop(k) for k in ("bucket_mb", "overlap") if k in params}
    spec = RunSpec(workload="tiny", image_size=16, batch_size=8, steps=6, warmup_steps=1, workers=4,
                   strategy="parameter_server", strategy_params={"servers": 2, **params},
                   straggler={"ranks": [3], "slowdown": 3.0}, **run_keys)
    results = train_on_threads(spec)
    server_rows = [row for r in results[4:] for row in r["steps"]]
    applied = [s for row in server_rows for s in row["staleness"]]
    if "backups" in params:
        assert sum(row["dropped_pushes"] for row in server_rows) > 0 and set(applied) == {0}
    else:  # one entry per (bucket, partition) a server owns: one bucket of 88 KB, or the buckets of 0.03 MiB
        units = len(results[0]["final"]["bucket_numels"])
        assert len(applied) == 2 * 4 * 6 * units and max(applied) > 0
    if params.get("staleness") == 2:
        assert max(row["bound_wait_s"] for row in server_rows) > 0
    row, _ = summarize(spec, results, "", {"started_at": "t", "duration_s": 1.0, "transport": "threads",
                                           "gpu": "", "cores": 2, "host": "h"})
    assert row["status"] == "ok", row["error"]
    assert all(np.isfinite(r["final"]["loss"]) for r in results[:4])


def test_clocks_keep_the_minimum_of_counts_that_only_grow():
    from strategies.parameter_server_async import Clocks

    rng = np.random.default_rng(7)
    clocks, reference = Clocks(5), [0] * 5
    for _ in range(400):  # steps of 1 (a push) and jumps (a reply's version), ties at the minimum included
        w = int(rng.integers(5))
        reference[w] += int(rng.choice([0, 1, 1, 3]))
        clocks[w] = reference[w]
        assert clocks.lowest == min(reference) and clocks[w] == reference[w] and repr(clocks) == repr(reference)
    with pytest.raises(ValueError, match="only grow"):
        clocks[0] = reference[0] - 1
