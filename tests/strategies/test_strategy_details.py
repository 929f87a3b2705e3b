"""What the matrix does not cover: mixing matrices, the one-peer graph's rounds, the server update hook,
the halving-doubling schedule and the analytic critical path of the simple strategies."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

import strategies
from strategies.decentralized import TOPOLOGIES, WEIGHTS, grid
from strategies.halving_doubling import schedule
from strategies.transport.threads import run_threads


@pytest.mark.parametrize("topology,weights", list(itertools.product(TOPOLOGIES, WEIGHTS)))
def test_mixing_matrix_is_doubly_stochastic(topology, weights):
    config = strategies.make("decentralized", topology=topology, weights=weights)
    for workers, rnd in itertools.product(range(1, 13), range(4)):
        w = config.mixing_matrix(workers, rnd)
        case = f"{topology}/{weights} workers={workers} round={rnd}"
        assert w.shape == (workers, workers), case
        assert (w >= 0).all(), case
        np.testing.assert_allclose(w.sum(axis=0), 1, err_msg=case)
        np.testing.assert_allclose(w.sum(axis=1), 1, err_msg=case)
        assert 0 <= config.spectral_gap(workers, rnd) <= 1 + 1e-12, case


def test_spectral_gaps():
    ring = strategies.make("decentralized")
    assert ring.spectral_gap(5) == pytest.approx(1 - (1 + 2 * np.cos(2 * np.pi / 5)) / 3)
    assert strategies.make("decentralized", topology="complete").spectral_gap(6) == pytest.approx(1)
    # round 0 of the one-peer graph is (I + shift) / 2: eigenvalue moduli |cos(pi j / n)|
    one_peer = strategies.make("decentralized", topology="one_peer_exponential")
    assert one_peer.spectral_gap(8) == pytest.approx(1 - np.cos(np.pi / 8))
    # denser graphs mix faster
    gaps = [strategies.make("decentralized", topology=t).spectral_gap(16) for t in ("ring", "torus", "exponential")]
    assert gaps == sorted(gaps)


def test_torus_grid():
    assert grid(12) == (3, 4) and grid(16) == (4, 4) and grid(7) == (1, 7) and grid(1) == (1, 1)
    torus, ring = (strategies.make("decentralized", topology=t) for t in ("torus", "ring"))
    np.testing.assert_array_equal(torus.mixing_matrix(7), ring.mixing_matrix(7))


@pytest.mark.parametrize("topology,weights", list(itertools.product(TOPOLOGIES, WEIGHTS)))
def test_the_exchange_schedule_gives_every_receiver_one_message_per_slot(topology, weights):
    """The k-th sends of all ranks go to distinct ranks (no receiver takes two at once), each rank waits its
    receives in the slot order they are sent in, and the schedule's weights are W's row."""
    config = strategies.make("decentralized", topology=topology, weights=weights)
    for workers, rnd in itertools.product((1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16), range(3)):
        case = f"{topology}/{weights} workers={workers} round={rnd}"
        w = config.mixing_matrix(workers, rnd)
        plans = [config.schedule(workers, i, rnd) for i in range(workers)]
        for slot in range(max(len(targets) for targets, _, _ in plans)):
            receivers = [targets[slot] for targets, _, _ in plans if slot < len(targets)]
            assert len(receivers) == len(set(receivers)), f"{case}: slot {slot} sends {receivers}"
        for i, (targets, sources, own) in enumerate(plans):
            assert sorted(targets) == [j for j in range(workers) if j != i and w[j, i] > 0], case
            assert [plans[j][0].index(i) for j, _ in sources] == sorted(plans[j][0].index(i) for j, _ in sources)
            assert {j: weight for j, weight in sources} == pytest.approx(
                {j: w[i, j] for j in range(workers) if j != i and w[i, j] > 0}), case
            assert own == pytest.approx(w[i, i]), case


@pytest.mark.parametrize("workers", [2, 3, 5, 8])
def test_one_peer_exponential_changes_every_sync(workers):
    """Round t uses hop 2^(t mod ceil(log2 n)); after log2 n rounds a power of two is exactly averaged."""
    config = strategies.make("decentralized", topology="one_peer_exponential")
    x = np.random.default_rng(workers).standard_normal((workers, 33))
    rounds = 5

    def body(comm):
        runtime = config.bind(comm, workers)
        t = torch.tensor(x[comm.rank])
        for _ in range(rounds):
            runtime.sync(t, "mean")
        return t.numpy()

    got = np.stack(run_threads(workers, body, timeout=10))
    want = x
    for rnd in range(rounds):
        want = config.mixing_matrix(workers, rnd) @ want
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    if workers in (2, 8):
        np.testing.assert_allclose(got, np.broadcast_to(x.mean(axis=0), x.shape), atol=1e-12)


def test_parameter_server_update_hook():
    """Servers apply `update` to the reduced shard and workers receive what it returns (parameters)."""
    workers, numel, k = 3, 10, 3
    config = strategies.make("parameter_server", servers=k)
    params = np.arange(numel, dtype=np.float64)
    grads = [np.full(numel, rank + 1.0) for rank in range(workers)]
    seen = []

    def body(comm):
        runtime = config.bind(comm, workers)
        if runtime.is_server:
            def update(reduced, where):
                seen.append((where.start, where.stop))
                return torch.tensor(params[where]) - 0.5 * reduced
            runtime.serve(numel, torch.float64, "mean", update)
            return None
        t = torch.tensor(grads[comm.rank])
        runtime.sync(t, "mean")
        return t.numpy()

    outputs = run_threads(config.world_size(workers), body, timeout=10)
    for out in outputs[:workers]:
        np.testing.assert_allclose(out, params - 0.5 * 2.0)
    assert sorted(seen) == [(0, 4), (4, 7), (7, 10)]


def test_parameter_server_update_of_wrong_size_fails():
    config = strategies.make("parameter_server")

    def body(comm):
        runtime = config.bind(comm, 2)
        if runtime.is_server:
            runtime.serve(6, torch.float32, "sum", lambda reduced, where: reduced[:-1])
        else:
            runtime.sync(torch.ones(6), "sum")

    with pytest.raises(ValueError, match="returned 5 elements for shard partition \\[0, 6\\)"):
        run_threads(3, body, timeout=5)


def test_parameter_server_more_servers_than_elements():
    from strategies.testing import run_collective
    outputs, traffic = run_collective("parameter_server", [np.ones(2), np.ones(2)], op="sum", servers=3)
    for out in outputs:
        np.testing.assert_array_equal(out, [2, 2])
    assert [t["bytes_recv"] for t in traffic] == [16, 16, 16, 16, 0]


@pytest.mark.parametrize("workers", range(1, 14))
def test_halving_doubling_schedule_pairs_up(workers):
    """Every step has a mirror step on its peer in the same round with the ranges swapped."""
    numel = 37
    plans = [schedule(workers, numel, pos) for pos in range(workers)]
    for pos, (steps, _) in enumerate(plans):
        for step in steps:
            mirror = [s for s in plans[step.peer][0] if s.round == step.round and s.peer == pos]
            assert len(mirror) == 1, (workers, pos, step)
            assert (mirror[0].send, mirror[0].recv) == (step.recv, step.send), (workers, pos, step)
    owned = sorted(o for _, o in plans if o is not None)
    p = 1 << (workers.bit_length() - 1)
    assert len(owned) == p and owned[0][0] == 0 and owned[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(owned, owned[1:]))
    rounds = {s.round for steps, _ in plans for s in steps}
    assert len(rounds) == strategies.make("halving_doubling").traffic(workers, numel).rounds


def test_analytic_rounds_and_paths():
    d = 1000 * 4
    t = strategies.make("halving_doubling").traffic(8, 1000)
    assert t.rounds == 6 and t.path_bytes == 2 * (d // 2 + d // 4 + d // 8)  # halves of 500, 250, 125 elements
    assert strategies.make("halving_doubling").traffic(5, 1000).rounds == 2 * 2 + 2
    assert strategies.make("naive_ring").traffic(4, 1000).path_bytes == 3 * d
    assert strategies.make("all_to_all").traffic(4, 1000).rounds == 3
    flat = strategies.make("reduce_broadcast", tree=False).traffic(5, 1000)
    assert flat.rounds == 5 and flat.path_bytes == 2 * 4 * d
    tree = strategies.make("reduce_broadcast").traffic(5, 1000)
    assert tree.rounds == 6 and tree.path_bytes == 6 * d
    ps = strategies.make("parameter_server", servers=2).traffic(4, 1000)
    assert [r.role for r in ps.ranks] == ["worker"] * 4 + ["server"] * 2
    # one 2 KB partition a shard: its pushes (1 latency), then its replies (1, side by side)
    assert ps.servers()[0].bytes_recv == 4 * d // 2 and ps.rounds == 1 + 1
    native = strategies.make("native").traffic(4, 1000)
    assert not native.counted and native.rounds == strategies.make("ring").traffic(4, 1000).rounds


# -- the harness itself: a pool of thread ranks, and check_strategy's report ----------------------------------

def _exchange(comm):
    """Each of 3 ranks sends its rank to the next: what it got and its counters."""
    got = torch.empty(4)
    handles = [comm.irecv(got, (comm.rank - 1) % 3), comm.isend(torch.full((4,), float(comm.rank)),
                                                                  (comm.rank + 1) % 3)]
    for h in handles:
        h.wait()
    return got.tolist(), comm.counters().as_dict()


def _rank1_fails(comm):
    if comm.rank == 1:
        raise ValueError("rank 1 fails (test)")
    comm.recv(torch.empty(4), 1)  # would wait out the timeout, but the failure aborts it at once


@pytest.mark.parametrize("p2p", ["threads", "sockets"])
def test_a_pool_of_ranks_serves_many_runs_each_counted_from_zero_and_starts_afresh_after_a_failure(p2p):
    """(No clock here, so make test-fast keeps it: the pool's counters start from zero at every run.)"""
    from strategies.transport.threads import ThreadRanks

    with ThreadRanks(3, timeout=20, p2p=p2p) as ranks:
        for _ in range(3):
            for rank, (got, counters) in enumerate(ranks.run(_exchange)):
                assert got == [float((rank - 1) % 3)] * 4
                assert counters == {"bytes_sent": 16, "bytes_recv": 16, "msgs_sent": 1, "msgs_recv": 1}
        assert ranks.groups == 1
        with pytest.raises(ValueError, match="rank 1 fails"):
            ranks.run(_rank1_fails)
        assert [got for got, _ in ranks.run(_exchange)] == [[2.0] * 4, [0.0] * 4, [1.0] * 4]
        assert ranks.groups == 2


@pytest.mark.timing
@pytest.mark.parametrize("p2p", ["threads", "sockets"])
def test_a_failing_rank_aborts_the_pool_run_at_once_not_after_the_timeout(p2p):
    from strategies.transport.threads import ThreadRanks

    with ThreadRanks(3, timeout=20, p2p=p2p) as ranks:
        start = time.monotonic()
        with pytest.raises(ValueError, match="rank 1 fails"):
            ranks.run(_rank1_fails)
        assert time.monotonic() - start < 10


def test_check_strategy_names_every_failing_case_in_one_error(monkeypatch):
    """A ring that is wrong at 7 elements, crashes at 3 under max and sends one message too many at 10 under sum
    (right results, wrong bytes): every such case named, the rest run."""
    from strategies.testing import StrategyCheckError, check_strategy

    runtime = strategies.get("ring").runtime
    sync = runtime._sync

    def planted(self, flat, op):
        if flat.numel() == 3 and op == "max" and self.rank == 1:
            raise RuntimeError("planted crash")
        sync(self, flat, op)
        if flat.numel() == 7:
            flat[0] += 1
        if flat.numel() == 10 and op == "sum":
            extra = flat.clone()
            if self.rank == 0:
                self.comm.send(extra, 1)
            elif self.rank == 1:
                self.comm.recv(extra, 0)

    monkeypatch.setattr(runtime, "_sync", planted)
    with pytest.raises(StrategyCheckError) as info:
        check_strategy("ring", world_sizes=(2, 3), numels=(3, 7, 10), ops=("sum", "max"))
    text = str(info.value)
    assert text.startswith("8 of 12 cases failed:\n"), text
    for workers in (2, 3):
        for op in ("sum", "max"):
            assert f"workers={workers} numel=7 op={op} dtype=float32 p2p=threads: rank 0 " in text, text
        assert f"workers={workers} numel=3 op=max dtype=float32 p2p=threads: RuntimeError: planted crash" in text
        assert f"workers={workers} numel=10 op=sum dtype=float32 p2p=threads: rank 0 analytic " in text
    assert "numel=10 op=max" not in text and "numel=3 op=sum" not in text
