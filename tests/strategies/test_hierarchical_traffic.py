"""hierarchical's traffic(), levels() and critical path, summed per piece size and per node size (O(workers)),
pinned against the round-by-round, rank-by-rank sums they replaced (O(workers^2): over 20 s at 16,384 ranks) on
awkward sizes: a short last node, fewer workers than a node holds, fewer elements than chunks, many pieces."""

from __future__ import annotations

import itertools
import time

import pytest

import strategies
from strategies.base import RankTraffic, chunk_bounds, nonempty
from strategies.hierarchical import INNER, Layout, intra_traffic

# -- the reference: the sums as first written, rank by rank and round by round -------------------------------


def ref_owner(layout: Layout, node: list[int], c: int) -> int:
    r = len(node)
    s = next(i for i, (a, b) in enumerate(chunk_bounds(layout.k, r)) if a <= c < b)
    return node[(s - 1) % r]


def ref_group(layout: Layout, c: int) -> list[int]:
    return [ref_owner(layout, node, c) for node in layout.nodes()]


def ref_intra(layout: Layout, numel: int, itemsize: int) -> list[RankTraffic]:
    intra = [RankTraffic("worker", 0, 0, 0, 0)] * layout.workers
    for node in layout.nodes():
        r = len(node)
        sizes = [(hi - lo) * itemsize for lo, hi in layout.slices(numel, r)]
        for pos, rank in enumerate(node):
            owned = (pos + 1) % r
            sent = [sizes[(pos - t) % r] for t in range(r - 1)] + [sizes[(owned - t) % r] for t in range(r - 1)]
            recv = [sizes[(pos - t - 1) % r] for t in range(r - 1)] + \
                [sizes[(owned - t - 1) % r] for t in range(r - 1)]
            intra[rank] = RankTraffic("worker", sum(sent), sum(recv), nonempty(*sent), nonempty(*recv))
    return intra


def _add(totals, t):
    for i, v in enumerate((t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv)):
        totals[i] += v


def ref_levels(config, workers: int, numel: int, itemsize: int) -> dict[str, list[RankTraffic]]:
    layout = Layout(workers, config.ranks_per_node)
    intra = [[0, 0, 0, 0] for _ in range(workers)]
    nic = [[0, 0, 0, 0] for _ in range(workers)]
    inner, m = config.inner_config(), len(layout.nodes())
    for lo, hi in chunk_bounds(numel, config.pieces(workers, numel, itemsize)):
        for rank, t in enumerate(ref_intra(layout, hi - lo, itemsize)):
            _add(intra[rank], t)
        for c, (a, b) in enumerate(chunk_bounds(hi - lo, layout.k)):
            if b == a or m == 1:
                continue
            for pos, t in enumerate(inner.traffic(m, b - a, itemsize).ranks):
                _add(nic[ref_group(layout, c)[pos]], t)
    return {level: [RankTraffic("worker", *t) for t in totals] for level, totals in (("intra", intra),
                                                                                    ("nic", nic))}


def ref_intra_path(layout: Layout, numel: int, itemsize: int) -> tuple[int, int]:
    r_max = max(len(node) for node in layout.nodes())
    slice_max = max((hi - lo for lo, hi in layout.slices(numel, r_max)), default=0) * itemsize
    return 2 * (r_max - 1), 2 * (r_max - 1) * slice_max


def ref_across_path(config, layout: Layout, numel: int, itemsize: int) -> tuple[int, int]:
    inner, m = config.inner_config(), len(layout.nodes())
    per_rank: dict[int, tuple[int, int]] = {}
    if m > 1:
        for c, (lo, hi) in enumerate(chunk_bounds(numel, layout.k)):
            if hi > lo:
                t = inner.traffic(m, hi - lo, itemsize)
                for rank in ref_group(layout, c):
                    r0, p0 = per_rank.get(rank, (0, 0))
                    per_rank[rank] = (r0 + t.rounds, p0 + t.path_bytes)
    return max(per_rank.values(), default=(0, 0))


def ref_critical_path(config, workers: int, numel: int, itemsize: int) -> tuple[int, int]:
    layout = Layout(workers, config.ranks_per_node)
    bounds = chunk_bounds(numel, config.pieces(workers, numel, itemsize))
    half = [tuple(v // 2 for v in ref_intra_path(layout, hi - lo, itemsize)) for lo, hi in bounds]
    across = [ref_across_path(config, layout, hi - lo, itemsize) for lo, hi in bounds]
    rounds, path = half[0]
    for stage in range(1, len(bounds) + 1):
        beside = [half[p] for p in (stage, stage - 2) if 0 <= p < len(bounds)]
        rounds += max(across[stage - 1][0], max((r for r, _ in beside), default=0))
        path += max(across[stage - 1][1], sum(b for _, b in beside))
    return rounds + half[-1][0], path + half[-1][1]


# -- the pins ----------------------------------------------------------------------------------------------

WORKERS = (1, 2, 3, 5, 7, 10, 13)
KS = (1, 2, 3, 4, 5)


@pytest.mark.parametrize("workers,k", list(itertools.product(WORKERS, KS)))
def test_groups_and_owners_are_the_reference(workers, k):
    layout = Layout(workers, k)
    for c in range(k):
        assert layout.group(c) == ref_group(layout, c), (workers, k, c)
        for node in layout.nodes():
            assert layout.owner(node, c) == ref_owner(layout, node, c)


@pytest.mark.parametrize("workers,k", list(itertools.product(WORKERS, KS)))
@pytest.mark.parametrize("numel", [0, 1, 3, 7, 1001])
def test_intra_traffic_is_the_reference(workers, k, numel):
    layout = Layout(workers, k)
    for itemsize in (2, 4):
        assert intra_traffic(layout, numel, itemsize) == ref_intra(layout, numel, itemsize)


@pytest.mark.parametrize("inner", INNER)
@pytest.mark.parametrize("pipeline_mb", [0.5, 2e-5])  # 2e-5 MiB: many pieces of two sizes
def test_levels_traffic_and_critical_path_are_the_reference(inner, pipeline_mb):
    for workers, k in [(1, 2), (2, 2), (3, 2), (7, 3), (10, 4), (13, 5), (11, 3), (4, 7), (9, 1)]:
        config = strategies.make("hierarchical", ranks_per_node=k, inner=inner, pipeline_mb=pipeline_mb)
        for numel in (1, 3, 1001) + ((12_347,) if pipeline_mb >= 0.5 else ()):  # (many pieces: fewer elements)
            where = (inner, pipeline_mb, workers, k, numel)
            assert config.levels(workers, numel, 4) == ref_levels(config, workers, numel, 4), where
            rounds, path = ref_critical_path(config, workers, numel, 4)
            assert config.critical_path(workers, numel, 4) == (rounds, path), where
            traffic = config.traffic(workers, numel, 4)
            assert (traffic.rounds, traffic.path_bytes) == (rounds, path), where
            levels = ref_levels(config, workers, numel, 4)
            assert [(t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv) for t in traffic.ranks] == [
                (a.bytes_sent + b.bytes_sent, a.bytes_recv + b.bytes_recv, a.msgs_sent + b.msgs_sent,
                 a.msgs_recv + b.msgs_recv) for a, b in zip(levels["intra"], levels["nic"])], where


def test_many_pieces_are_counted_not_listed():
    """Hundreds of pieces of two sizes: each size's sums once, times its count."""
    config = strategies.make("hierarchical", ranks_per_node=3, inner="ring", pipeline_mb=1e-6)
    workers, numel = 8, 20_003
    assert config.pieces(workers, numel, 4) > 300
    assert config.levels(workers, numel, 4) == ref_levels(config, workers, numel, 4)


@pytest.mark.slow  # 16,384 ranks and a CPU-time bound: out of make test-fast
def test_traffic_at_16384_ranks_is_linear_time():
    """The old sums took over 20 s at 16,384 ranks (rank by rank, every group rebuilt per rank); now well under
    one (a generous bound for a loaded machine: the check is against quadratic growth, not a benchmark)."""
    config = strategies.make("hierarchical", ranks_per_node=2, inner="ring")
    start = time.process_time()
    traffic = config.traffic(16_384, 25_557_032, 4)
    assert time.process_time() - start < 6.0
    assert len(traffic.ranks) == 16_384


@pytest.mark.timing  # its last line bounds the replay's CPU time
def test_64_ranks_on_nodes_are_priced_by_their_replay():
    """64 ranks in nodes of 4 at 100 Gbit/s (6,912 messages, once beyond the replay's size): the price is the
    replay (SimGrid alpha_beta: 0.02470 s), not the stage model (0.02230 s: 1.12x short), and the replay takes a
    fraction of a second (it took 1-4 s re-solving every message at every event)."""
    from strategies import cost
    from strategies.hierarchical_replay import replay_node_seconds, replay_program

    config = strategies.make("hierarchical", ranks_per_node=4)
    gbit100 = 100e9 / 8
    assert len(replay_program(config, 64, 25_557_032, 4, 0.0, 2e-6)[1]) == 6_912
    start = time.process_time()
    replayed = replay_node_seconds(config, 64, 25_557_032, 4, gbit100, gbit100, 0.0, 2e-6)
    spent = time.process_time() - start
    node = cost.node_cost(config, 64, 25_557_032, 4, gbit100, gbit100, 0.0, 2e-6)
    staged, _ = cost.hierarchical_node_seconds(config, 64, 25_557_032, 4, gbit100, gbit100, 0.0, 2e-6)
    assert node.time_s == replayed
    assert replayed == pytest.approx(0.02470, rel=0.002)
    assert replayed / staged == pytest.approx(1.107, abs=0.005)
    assert spent < 1.0, spent
