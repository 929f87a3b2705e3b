"""The synchronous dedicated parameter server pipelined across buckets (issue 22): `isync()` posts a bucket's pushes
and its replies' receives, BucketSync starts every bucket before waiting for any reply.

Thread ranks: every world size 1, 2, 3, 5 with k = 1 .. n + 2 servers, overlap on and off, partitions that divide
nothing: bit-identical to the bucket-by-bucket sync, within float tolerance of the exact mean, bytes equal to
traffic(); the order of events on a worker proves the buckets are in flight together (no timing involved); sockets,
gloo (Ray) and SimGrid carry the same pipeline.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import strategies
from experiments.pipeline.bucket_sync import BucketSync
from strategies.transport.communicator import DONE, Handle
from strategies.transport.simgrid import simgrid_available
from strategies.transport.threads import run_threads
from workloads.buckets import make_buckets

SIZES = (101, 250, 7, 333, 312, 64)  # parameters in registration order: 1067 floats
BUCKET_MB = 300 * 4 / 2**20  # buckets close at 300 floats: 3 buckets of SIZES (376, 333, 358 floats)
PART_MB = 7 * 4 / 2**20  # 7-float partitions: divide neither the shards nor the buckets
PART_MB_LARGER = 23 * 4 / 2**20  # 23 floats: the same, with fewer messages for the larger worlds


def _inputs(workers: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(workers)
    return [torch.randn(sum(SIZES), generator=g) for _ in range(workers)]


def _step(syncer, params: int, overlap: bool) -> None:
    """One step of BucketSync: with overlap, the buckets handed over as a backward would make them ready."""
    syncer.begin_step()
    if overlap:
        for i in reversed(range(params)):  # backward: the last registered parameter first
            syncer.grad_ready(i)
    syncer.finish()


def _bucket_sync(comm, config, workers, buffer, buckets, overlap):
    """One step of a new BucketSync; its busy time."""
    syncer = BucketSync(config, comm, workers, buffer, buckets, overlap=overlap)
    try:
        _step(syncer, len(SIZES), overlap)
        return syncer.busy_s
    finally:
        syncer.close()


def _pipelined_and_reference(workers, servers, overlap, mode="summation", p2p="threads", update=False,
                             part_mb=PART_MB):
    """Per worker: (pipelined result, bucket-by-bucket sync() result, counters after the pipelined step)."""
    config = strategies.make("parameter_server", servers=servers, mode=mode, partition_mb=part_mb)
    buckets = make_buckets(list(SIZES), BUCKET_MB)
    inputs = _inputs(workers)

    def hook(reduced, where):  # update mode's server optimizer: any deterministic function of the partition
        return reduced * 0.5 - where.start

    def body(comm):
        if comm.rank >= workers:  # a dedicated server: buckets in bucket order, twice (pipelined, then reference)
            for _ in range(2):  # fresh runtimes each time, as the workers' (each checks its size once)
                runtimes = [config.bind(comm, workers) for _ in buckets]
                for bucket in buckets:
                    runtimes[bucket.index].serve(bucket.numel, torch.float32, "mean", hook if update else None)
            return None
        pipelined = inputs[comm.rank].clone()
        _bucket_sync(comm, config, workers, pipelined, buckets, overlap)
        counters = comm.counters()
        reference = inputs[comm.rank].clone()
        runtimes = [config.bind(comm, workers) for _ in buckets]
        for bucket in buckets:
            runtimes[bucket.index].sync(reference[bucket.lo:bucket.hi], "mean")
        return pipelined, reference, counters

    return config, buckets, inputs, run_threads(config.world_size(workers), body, timeout=30, p2p=p2p)[:workers]


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_pipelined_buckets_equal_the_bucket_by_bucket_sync_and_the_mean_with_the_declared_bytes(workers, overlap):
    """k = 1 .. n + 2 dedicated servers, overlap on and off: every worker bit-identical to the unpipelined sync and
    to the other workers, within 1e-6 of the exact mean, and its bytes and messages those of traffic() per bucket."""
    for servers in range(1, workers + 3):
        config, buckets, inputs, results = _pipelined_and_reference(workers, servers, overlap, part_mb=PART_MB_LARGER)
        exact = torch.stack(inputs).double().mean(0)
        for rank, (pipelined, reference, counters) in enumerate(results):
            case = f"workers={workers} servers={servers} overlap={overlap} rank={rank}"
            assert torch.equal(pipelined, reference), case
            assert torch.equal(pipelined, results[0][0]), case
            assert float((pipelined.double() - exact).abs().max()) <= 1e-6, case
            declared = [config.traffic(workers, b.numel).ranks[rank] for b in buckets]
            assert counters.bytes_sent == sum(t.bytes_sent for t in declared), case
            assert counters.bytes_recv == sum(t.bytes_recv for t in declared), case
            assert counters.msgs_sent == sum(t.msgs_sent for t in declared), case
            assert counters.msgs_recv == sum(t.msgs_recv for t in declared), case


def test_update_mode_servers_reply_their_optimizers_result_pipelined():
    """Update mode with a server hook: the pipelined buckets get exactly the hook's result, as sync() does."""
    for overlap in (False, True):
        _, _, _, results = _pipelined_and_reference(3, 2, overlap, mode="update", update=True)
        for pipelined, reference, _ in results:
            assert torch.equal(pipelined, reference), overlap


@pytest.mark.parametrize("p2p", ["sockets", "sockets-tcp"])
def test_pipelined_buckets_over_sockets(p2p):
    """The sockets match receives from a peer in posting order and move bytes only inside a wait: the pipeline
    gives sync()'s bits over them, with the communication thread driving the sends while no bucket is ready."""
    for overlap in (False, True):
        _, _, inputs, results = _pipelined_and_reference(3, 4, overlap, p2p=p2p)
        for pipelined, reference, _ in results:
            assert torch.equal(pipelined, reference), (p2p, overlap)


class _Recorder:
    """A worker's communicator seen through its calls: each push posted and each reply waited for, with the
    bucket its buffer lies in, in the order they happened."""

    def __init__(self, comm, buffer, buckets, events):
        self.comm, self.events = comm, events
        itemsize, base = buffer.element_size(), buffer.data_ptr()
        self.bucket_of = lambda t: next(b.index for b in buckets
                                        if b.lo <= (t.data_ptr() - base) // itemsize < b.hi)
        isend, irecv = comm.isend, comm.irecv

        def record_isend(tensor, dst):
            events.append(("push", self.bucket_of(tensor)))
            return isend(tensor, dst)

        def record_irecv(tensor, src):
            handle, bucket = irecv(tensor, src), self.bucket_of(tensor)

            def finish():
                handle.wait()
                events.append(("reply", bucket))

            return Handle(finish)

        comm.isend, comm.irecv = record_isend, record_irecv


@pytest.mark.parametrize("overlap", [False, True])
def test_a_buckets_pushes_leave_before_the_previous_buckets_replies_are_in(overlap):
    """The pipeline itself, from the order of a worker's calls (no timing): every bucket's first push is posted
    before the previous bucket's last reply is received. Bucket after bucket (sync() per bucket, the path before
    the pipeline) receives a bucket's replies before pushing the next one, and fails this."""
    workers, servers = 3, 2
    config = strategies.make("parameter_server", servers=servers, partition_mb=PART_MB)
    buckets = make_buckets(list(SIZES), BUCKET_MB)
    assert len(buckets) >= 3
    inputs = _inputs(workers)

    def body(comm):
        if comm.rank >= workers:
            runtimes = [config.bind(comm, workers) for _ in buckets]
            for _ in range(2):
                for bucket in buckets:
                    runtimes[bucket.index].serve(bucket.numel, torch.float32, "mean")
            return None
        events, buffer = [], inputs[comm.rank].clone()
        _Recorder(comm, buffer, buckets, events)
        # two steps: in the first each bucket's runtime checks its size with every rank, which finishes the buckets
        # in flight first (see the socket-buffer test below); the second is the pipeline of every later step
        syncer = BucketSync(config, comm, workers, buffer, buckets, overlap=overlap)
        try:
            for _ in range(2):
                events.clear()
                _step(syncer, len(SIZES), overlap)
        finally:
            syncer.close()
        return events, syncer.busy_s

    for rank, (events, busy) in enumerate(run_threads(config.world_size(workers), body, timeout=30)[:workers]):
        assert busy > 0
        for b in range(1, len(buckets)):
            first_push = events.index(("push", b))
            last_reply = max(i for i, e in enumerate(events) if e == ("reply", b - 1))
            assert first_push < last_reply, (rank, b, events)
        # in flight together: no reply is waited for before the last bucket's pushes are posted
        last_push = max(i for i, e in enumerate(events) if e[0] == "push")
        first_reply = min(i for i, e in enumerate(events) if e[0] == "reply")
        assert last_push < first_reply, (rank, events)


def test_colocated_and_barrier_free_servers_sync_inside_isync():
    """Only the synchronous dedicated server pipelines; the others (and every other strategy) sync inside isync()
    and hand back a done handle: BucketSync then behaves as it did before."""

    def body(comm):
        out = []
        for name, params in (("parameter_server", {"servers": 1, "placement": "colocated"}), ("ring", {})):
            runtime = strategies.make(name, **params).bind(comm, 2)
            x = torch.full((10,), float(comm.rank))
            out.append((runtime.isync(x, "mean") is DONE, float(x[0])))
        return out

    for result in run_threads(2, body, timeout=30):
        assert result == [(True, 0.5), (True, 0.5)]


def test_a_failed_bucket_reaches_finish_without_hanging():
    """A server that never answers the second bucket: every worker's finish() raises (the step fails), no rank
    hangs past the communicator's timeout."""
    workers = 2
    config = strategies.make("parameter_server", servers=1, partition_mb=PART_MB)
    buckets = make_buckets(list(SIZES), BUCKET_MB)

    def body(comm):
        if comm.rank >= workers:
            runtime = config.bind(comm, workers)
            runtime.serve(buckets[0].numel, torch.float32, "mean")
            raise RuntimeError("server gone after bucket 0")
        _bucket_sync(comm, config, workers, torch.ones(sum(SIZES)), buckets, overlap=True)

    with pytest.raises(RuntimeError, match="server gone after bucket 0"):
        run_threads(config.world_size(workers), body, timeout=5)


SIMGRID = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")


@SIMGRID
@pytest.mark.parametrize("overlap", [False, True])
def test_simulated_buckets_pipeline_to_one_fan_out_per_step(overlap):
    """SimGrid (fifo NICs, alpha-beta), 4 workers and 4 dedicated servers, four 4 MiB buckets of 1 MiB partitions,
    overlap off or on (inline: the simulated backward starts each bucket as it is ready, here all at once): the
    step's sync takes the whole buffer's traffic() time (M / B plus one partition's fan-out: 20 MiB
    on the busiest link), not four buckets' round trips one after another (each 1 MiB x n of fan-out more: 32)."""
    from experiments.config.sweep import RunSpec
    from experiments.simulate.platform import Platform
    from experiments.simulate.substrate import (
        SimGridSubstrate,
        SimSpec,
        Timeline,
        simulate_in_child,
        summarize_simulated,
    )
    from strategies.cost import comm_time

    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "20us", "network_model": "alpha_beta",
                               "nic": "fifo"})
    numels = (2**20,) * 4  # four 4 MiB parameters: one bucket each
    # 2 steps, the first untimed: a runtime's first sync checks its size with every rank, the servers' included,
    # which holds bucket b + 1's start until the servers are through bucket b
    spec = RunSpec(sweep="test", strategy="parameter_server", workers=4, steps=2, warmup_steps=1, bucket_mb=4.0,
                   overlap=overlap,
                   link={"bandwidth": "1Gbit", "latency": "20us"},
                   strategy_params={"servers": 4, "mode": "summation", "partition_mb": 1.0})
    substrate = SimGridSubstrate([(spec, SimSpec(platform, Timeline(0.0, 0.0, 0.0, numels, (0.0,) * 4, "none")))])
    (run,) = substrate.runs()
    results, error, wall = simulate_in_child(run.spec, run.settings)
    row, _ = summarize_simulated(run.spec, run.settings, results, error, wall, "now", run.run_id)
    assert row["status"] == "ok", row["error"]
    config = strategies.make("parameter_server", servers=4, partition_mb=1.0)
    whole = config.traffic(4, sum(numels))  # the bucket's shard of a server is one partition: 1 MiB
    one = config.traffic(4, numels[0])
    pipelined = comm_time(whole.rounds, whole.path_bytes, platform.bandwidth, 20e-6)
    sequential = 4 * comm_time(one.rounds, one.path_bytes, platform.bandwidth, 20e-6)
    assert row["bytes_sent_per_worker"] == 4 * one.ranks[0].bytes_sent
    assert row["comm_s"] == pytest.approx(pipelined, rel=0.10), (row["comm_s"], pipelined, sequential)
    assert row["comm_s"] < 0.8 * sequential


def _gloo_pipeline(ctx, overlap):
    config = strategies.make("parameter_server", servers=1, partition_mb=PART_MB)
    buckets = make_buckets(list(SIZES), BUCKET_MB)
    if ctx.rank == 1:
        for _ in range(2):
            runtimes = [config.bind(ctx.comm, 1) for _ in buckets]
            for bucket in buckets:
                runtimes[bucket.index].serve(bucket.numel, torch.float32, "mean")
        return None
    x = _inputs(1)[0]
    pipelined, reference = x.clone(), x.clone()
    _bucket_sync(ctx.comm, config, 1, pipelined, buckets, overlap)
    runtimes = [config.bind(ctx.comm, 1) for _ in buckets]
    for bucket in buckets:
        runtimes[bucket.index].sync(reference[bucket.lo:bucket.hi], "mean")
    return torch.equal(pipelined, reference) and torch.equal(pipelined, x)


@pytest.mark.ray
def test_pipelined_buckets_over_gloo(group2):
    """gloo matches a peer's messages in posting order too: one worker, one dedicated server, 3 buckets of
    partitions in flight together give sync()'s bits (and, alone, the worker's own values)."""
    for overlap in (False, True):
        assert group2.run(_gloo_pipeline, overlap)[0] is True, overlap


def test_busy_time_is_the_union_of_the_buckets_intervals():
    from experiments.results.timeline import union_length as _union

    assert _union([]) == 0.0
    assert _union([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == pytest.approx(3.0)
    assert _union([(3.0, 4.0), (0.0, 5.0)]) == pytest.approx(5.0)
    assert np.isclose(_union([(1.0, 1.0)]), 0.0)


def test_the_overlap_timeline_prices_pipelined_buckets_with_one_fan_out():
    """strategies.cost: four 4 MiB buckets of the 4 + 4 server (1 MiB partitions) back to back take the whole
    buffer's traffic() time (16 MiB streamed + one 4 x 1 MiB fan-out), not four buckets' (32 MiB); strategies that
    sync one bucket after another have no fill and are priced as before."""
    from strategies.cost import comm_time, critical_path, overlap_timeline, pipeline_fill

    n, numel, bw, params = 4, 2**20, 125e6, {"servers": 4, "partition_mb": 1.0}
    rounds, path, _ = critical_path("parameter_server", n, numel, params)
    fill = pipeline_fill("parameter_server", n, numel, params)
    assert fill == (1, n * 2**20)  # the n replies leave side by side: one latency
    bucket = (0.0, comm_time(rounds, path, bw, 50e-6), comm_time(*fill, bw, 50e-6))
    whole_rounds, whole_path, _ = critical_path("parameter_server", n, 4 * numel, params)
    pipelined = overlap_timeline(0.0, 0.0, 0.0, [bucket] * 4, overlap=False)
    assert pipelined.comm_end_s == pytest.approx(comm_time(whole_rounds, whole_path, bw, 50e-6))
    assert pipelined.busy_s == pytest.approx(pipelined.comm_end_s)
    sequential = overlap_timeline(0.0, 0.0, 0.0, [bucket[:2]] * 4, overlap=False)
    assert sequential.comm_end_s == pytest.approx(4 * bucket[1]) == pytest.approx(sequential.busy_s)
    # with overlap: a bucket ready late starts late, and its fill still ends the step
    late = overlap_timeline(0.0, 1.0, 0.0, [bucket, (1.0, bucket[1], bucket[2])], overlap=True)
    assert late.comm_end_s == pytest.approx(1.0 + bucket[1])
    assert late.busy_s == pytest.approx(2 * bucket[1])
    for name, other in (("parameter_server", params | {"placement": "colocated"}),
                        ("parameter_server", params | {"staleness": 2}), ("ring", {})):
        assert pipeline_fill(name, n, numel, other) == (0, 0), (name, other)
    assert pipeline_fill("parameter_server", 1, numel, params) == (0, 0)


@pytest.mark.parametrize("overlap", [False, True])
def test_buckets_larger_than_a_socket_buffer_do_not_deadlock_on_the_first_size_check(overlap):
    """Each bucket's runtime checks its size with every rank at its first sync (the control plane). Over the sockets
    a server's reply moves only while the worker waits for it, so a worker that went on to the next bucket's check
    with a large reply still in flight left the server blocked in its send and both waited out the timeout (make
    demo: 1 worker, 1 server, DDP's 1 MiB + 24 MiB buckets). Buckets of 4 MB each here, far above the buffers."""
    config = strategies.make("parameter_server", servers=1)
    sizes = [1_000_000, 1_000_000, 1_000_000]
    buckets = make_buckets(sizes, 3.0)
    assert len(buckets) == 3

    def body(comm):
        if comm.rank >= 1:
            runtimes = [config.bind(comm, 1) for _ in buckets]
            for bucket in buckets:
                runtimes[bucket.index].serve(bucket.numel, torch.float32, "mean")
            return None
        buffer = torch.arange(sum(sizes), dtype=torch.float32)
        syncer = BucketSync(config, comm, 1, buffer, buckets, overlap=overlap)
        try:
            _step(syncer, len(sizes), overlap)
        finally:
            syncer.close()
        return buffer

    [result, _] = run_threads(2, body, timeout=20, p2p="sockets")
    assert torch.equal(result, torch.arange(sum(sizes), dtype=torch.float32))
