"""The parameter server's synchronous modes: summation/update x dedicated/colocated x partitions, on threads and
sockets; its analytic traffic and timing; training equal to ring; bad settings refused by value."""

import time

import numpy as np
import pytest
import torch

import strategies
from strategies.parameter_server import partitions, push_order
from strategies.testing import check_case, make_inputs
from strategies.transport.link import Link, Network
from strategies.transport.threads import run_threads

MODES = ("summation", "update")
PLACEMENTS = ("dedicated", "colocated")
PART_MB = 7 * 4 / 2**20  # 7 float32 elements: divides neither the shards nor the buffer


def server_counts(workers, placement):
    return range(1, workers + 3) if placement == "dedicated" else range(1, workers + 1)


@pytest.mark.parametrize("workers", range(1, 9))
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_synchronous_mode_is_exact_identical_and_counted(workers, placement):
    """Exact results (sum, mean, max), every worker bitwise identical and every rank's bytes and messages equal to
    traffic(), for k = 1 .. n + 2 dedicated and 1 .. n colocated servers, partitions that divide nothing."""
    for mode in MODES:
        for servers in server_counts(workers, placement):
            params = {"servers": servers, "placement": placement, "mode": mode, "partition_mb": PART_MB}
            for numel, op in ((0, "sum"), (5, "max"), (1003, "mean")):
                dtype = np.float32
                case = f"workers={workers} {params} numel={numel} op={op}"
                check_case("parameter_server", make_inputs(workers, numel, op, dtype), op, case, **params)


@pytest.mark.parametrize("p2p", ["sockets-unix", "sockets-tcp"])
@pytest.mark.parametrize("placement", PLACEMENTS)
def test_modes_over_sockets(p2p, placement):
    for workers in (1, 3, 4):
        for servers in (1, workers) if placement == "colocated" else (1, workers + 1):
            params = {"servers": servers, "placement": placement, "mode": "summation", "partition_mb": PART_MB}
            check_case("parameter_server", make_inputs(workers, 1003, "sum"), "sum", f"{p2p} {params}", p2p=p2p,
                       **params)


def test_integer_and_half_inputs_are_exact():
    for dtype, op in ((np.int32, "sum"), (np.uint64, "max"), (np.float16, "mean"), (np.int32, "band")):
        for placement in PLACEMENTS:
            params = {"servers": 2, "placement": placement, "partition_mb": PART_MB}
            check_case("parameter_server", make_inputs(4, 301, op, dtype), op, f"{dtype} {op} {params}", **params)


def test_partitions_are_balanced_cover_the_buffer_and_respect_the_limit():
    parts = partitions(1000, 3, 4, 50 * 4 / 2**20)  # 50 elements at most
    flat = [p for shard in parts for p in shard]
    assert flat[0][0] == 0 and flat[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(flat, flat[1:]))
    assert max(hi - lo for lo, hi in flat) <= 50 and min(hi - lo for lo, hi in flat) >= 47
    assert [len(p) for p in parts] == [7, 7, 7]
    assert partitions(2, 3, 4, 4.0) == [[(0, 1)], [(1, 2)], []]


def test_push_order_sends_each_slot_to_different_servers():
    parts = partitions(4000, 4, 4, 100 * 4 / 2**20)
    orders = [push_order(w, parts) for w in range(4)]
    for slot in range(len(orders[0])):
        assert len({order[slot][0] for order in orders}) == 4  # k = n: a permutation in every slot
        assert len({order[slot][1] for order in orders}) == 1  # all in the same round


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_update_hook_gets_every_partition_and_workers_get_its_result(placement):
    """In update mode each server applies `update` partition by partition; every worker gets what it returns.
    Colocated servers take the hook from their worker's runtime (the pipeline sets runtime.update)."""
    workers, numel, k = 3, 100, 2
    config = strategies.make("parameter_server", servers=k, placement=placement, partition_mb=9 * 4 / 2**20)
    params = np.arange(numel, dtype=np.float64)
    grads = [np.full(numel, rank + 1.0) for rank in range(workers)]
    seen = []

    def update(reduced, where):
        seen.append((where.start, where.stop))
        return torch.tensor(params[where]) - 0.5 * reduced

    def body(comm):
        runtime = config.bind(comm, workers)
        runtime.update = update
        if runtime.is_server:
            runtime.serve(numel, torch.float64, "mean", update)
            return None
        t = torch.tensor(grads[comm.rank])
        runtime.sync(t, "mean")
        return t.numpy()

    outputs = run_threads(config.world_size(workers), body, timeout=10)
    for out in outputs[:workers]:
        np.testing.assert_array_equal(out, params - 0.5 * 2.0)
    want = sorted(p for shard in partitions(numel, k, 8, 9 * 4 / 2**20) for p in shard)
    assert sorted(seen) == want and len(want) == 26  # 2 shards of 50, 13 partitions of <= 4 float64 each


def test_summation_servers_ignore_the_update_hook():
    config = strategies.make("parameter_server", servers=2, mode="summation")

    def body(comm):
        runtime = config.bind(comm, 2)
        if runtime.is_server:
            runtime.serve(6, torch.float32, "sum", lambda reduced, where: reduced * 0)
            return None
        t = torch.full((6,), comm.rank + 1.0)
        runtime.sync(t, "sum")
        return t.numpy()

    for out in run_threads(4, body, timeout=10)[:2]:
        np.testing.assert_array_equal(out, np.full(6, 3.0))


def test_roles_follow_mode_and_placement():
    summation = strategies.make("parameter_server", mode="summation", placement="colocated", servers=4)
    assert summation.role == "gradients" and summation.world_size(4) == 4
    update = strategies.make("parameter_server", servers=3)
    assert update.role == "server" and update.world_size(4) == 7
    assert strategies.get("parameter_server").role == "server"


@pytest.mark.parametrize("params, pattern", [
    ({"servers": 0}, r"servers=0 is not accepted: use an integer >= 1"),
    ({"partition_mb": 0}, r"partition_mb=0 is not accepted: use a number of MiB > 0"),
    ({"partition_mb": -1.5}, r"partition_mb=-1.5 is not accepted"),
    ({"staleness": -1},
     r"staleness=-1 is not accepted: use 0 \(synchronous\), an integer s from 1 to 1,000,000 .* or 'async'"),
    ({"staleness": "sometimes"}, r"staleness='sometimes' is not accepted"),
    ({"placement": "nearby"}, r"placement='nearby' is not accepted: use one of 'dedicated', 'colocated'"),
    ({"mode": "average"}, r"mode='average' is not accepted: use one of 'summation', 'update'"),
    ({"backups": -1}, r"backups=-1 is not accepted"),
    ({"backups": 1, "staleness": 2}, r"backups=1 needs staleness=0"),
])
def test_bad_settings_are_refused_by_value(params, pattern):
    with pytest.raises(ValueError, match=pattern):
        strategies.make("parameter_server", **params)


def test_settings_that_depend_on_the_workers_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"backups=4 is not accepted with workers=4: use 0 <= backups < 4"):
        strategies.make("parameter_server", backups=4).world_size(4)
    with pytest.raises(ValueError, match=r"servers=5 with placement='colocated' needs at least 5 workers"):
        strategies.make("parameter_server", servers=5, placement="colocated").world_size(4)


def test_analytic_traffic_per_placement():
    d = 4 * 1200
    dedicated = strategies.make("parameter_server", servers=4).traffic(4, 1200)
    assert [r.bytes_sent for r in dedicated.ranks] == [d] * 4 + [d] * 4  # a server carries n/k x d/k = d
    assert dedicated.path_bytes == d + 4 * d // 4  # the busiest link, then one partition's fan-out
    one = strategies.make("parameter_server", servers=1).traffic(4, 1200)
    assert one.servers()[0].bytes_recv == 4 * d and one.path_bytes == 4 * d + 4 * d
    colocated = strategies.make("parameter_server", servers=4, placement="colocated").traffic(4, 1200)
    ring = strategies.make("ring").traffic(4, 1200)
    assert [r.bytes_sent for r in colocated.ranks] == [r.bytes_sent for r in ring.ranks] == [2 * 3 * d // 4] * 4
    assert colocated.path_bytes == ring.path_bytes
    colocated_one = strategies.make("parameter_server", servers=1, placement="colocated").traffic(4, 1200)
    assert [r.bytes_sent for r in colocated_one.ranks] == [3 * d, d, d, d]


@pytest.mark.timing
def test_partitioned_push_pull_reaches_the_modelled_time_on_emulated_links():
    """On 1 Gbit python-emulated links, 4 workers and 4 dedicated servers take about M/B plus one partition's
    fan-out (what traffic() says), under a ring's 2 (n - 1) / n x M / B measured in the same run; with 1 server
    about n x M / B. Push all, then pull (this strategy before partitions) took 2 M / B, more than the ring."""
    n, numel = 4, 4_000_000  # 16 MB
    network = Network(Link.parse("1Gbit"))

    def measure(name, **params):
        config = strategies.make(name, **params)

        def body(comm):
            runtime = config.bind(comm, n)
            x, best = torch.ones(numel), float("inf")
            for _ in range(3):  # the best of 3: the machine is shared
                comm.barrier()
                start = time.perf_counter()
                if runtime.is_server:
                    runtime.serve(numel, torch.float32, "sum")
                else:
                    runtime.sync(x, "sum")
                best = min(best, time.perf_counter() - start)
            return best

        return max(run_threads(config.world_size(n), body, timeout=60, network=network)[:n])

    bandwidth = network.default.bandwidth
    ps = measure("parameter_server", servers=4, partition_mb=1)
    modelled = strategies.make("parameter_server", servers=4, partition_mb=1).traffic(n, numel).path_bytes
    ring = measure("ring")
    assert modelled / bandwidth * 0.95 <= ps < 0.95 * ring, (ps, modelled / bandwidth, ring)
    single = measure("parameter_server", servers=1, partition_mb=1)
    assert single >= 0.95 * n * numel * 4 / bandwidth, single


@pytest.mark.parametrize("bucket_mb, overlap", [(None, False), (0.01, True)])
def test_training_in_every_synchronous_mode_ends_where_ring_does(bucket_mb, overlap):
    """5 steps of the tiny model on 3 workers: every mode and placement ends within 1e-5 of ring, workers equal,
    flat or in buckets overlapped with backward."""
    from tests.experiments.test_train import spec_for, train_on_threads

    torch.set_num_threads(1)
    extra = {"overlap": overlap} | ({"bucket_mb": bucket_mb} if bucket_mb else {})
    reference = train_on_threads(spec_for("ring", workers=3, **extra))[0]["params"]
    for mode in MODES:
        for placement in PLACEMENTS:
            params = {"servers": 2, "placement": placement, "mode": mode, "partition_mb": 0.003}
            results = train_on_threads(spec_for("parameter_server", workers=3, params=params, **extra))
            for r in results[1:3]:
                assert torch.equal(r["params"], results[0]["params"]), params
            diff = float((results[0]["params"] - reference).abs().max())
            assert diff <= 1e-5, (params, diff)


def test_a_receive_waited_out_of_arrival_order_is_not_queued_behind_a_later_message():
    """A server waits for its workers' partitions in its own order; a partition already on the wire while it
    waits for a later one is received then, not after it (a single "free at" time queued it behind: the
    training path paid every late worker's delay once per partition after it)."""
    from strategies.transport.link import Link, Port

    port, size = Port(Link.parse("1Gbit")), 125_000  # 1 ms on the wire
    now = time.time() + 10.0  # stamps in the future: nothing is pruned as past
    late = port.book_receive(size, now + 0.050, now + 0.051)  # waited first, arrives 50 ms later
    early = port.book_receive(size, now, now + 0.001)  # waited second, already on the wire
    assert late == pytest.approx(now + 0.051) and early == pytest.approx(now + 0.001)
    third = port.book_receive(size, now + 0.0505, now + 0.0515)  # overlaps the late one: it waits for it
    assert third == pytest.approx(now + 0.052)
