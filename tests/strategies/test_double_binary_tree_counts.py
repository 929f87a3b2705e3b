"""The double binary tree's counts (traffic, levels, slot_levels) against the counting they replaced: the old code is
kept here, message by message, as the reference, on awkward world sizes, node sizes that do and do not divide
them, chunk counts and buffers smaller than the chunks (empty messages)."""

from __future__ import annotations

import time

import pytest

import strategies
from strategies.base import RankTraffic, chunk_bounds, nonempty
from strategies.double_binary_tree import depths, node_tree_parents, tree_children


def reference_depths(parents):
    out = []
    for rank in range(len(parents)):
        hops = 0
        while parents[rank] is not None:
            rank, hops = parents[rank], hops + 1
        out.append(hops)
    return out


def reference_slot_levels(config, n, numel, itemsize, k):
    """Every message put in its slot, every port's bytes summed per slot (the implementation before it priced one
    port profile per distinct port)."""
    slots = {}
    for parents, (lo, hi) in zip(config.parents(n), chunk_bounds(numel, 2)):
        depth = reference_depths(parents)
        top = max(depth, default=0)
        sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, config.chunks)]
        for child, parent in enumerate(parents):
            if parent is None:
                continue
            nic = child // k != parent // k
            for c, size in enumerate(sizes):
                for slot, src, dst in ((c + top - depth[child], child, parent),
                                       (c + top + depth[parent], parent, child)):
                    ports = slots.setdefault(slot, {})
                    for port in ((("nic", src // k, 0), ("nic", dst // k, 1)) if nic else ()) + \
                            (("intra", src, 0), ("intra", dst, 1)):
                        ports[port] = ports.get(port, 0) + size
    return [(max((b for (level, _, _), b in ports.items() if level == "nic"), default=0),
             max((b for (level, _, _), b in ports.items() if level == "intra"), default=0))
            for _, ports in sorted(slots.items())]


def reference_traffic(config, n, numel, itemsize):
    sent = [[] for _ in range(n)]
    recv = [[] for _ in range(n)]
    depth = 0
    for parents, (lo, hi) in zip(config.parents(n), chunk_bounds(numel, 2)):
        children = tree_children(parents)
        sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, config.chunks)]
        for rank in range(n):
            has_parent = parents[rank] is not None
            for size in sizes:
                sent[rank] += [size] * (has_parent + len(children[rank]))
                recv[rank] += [size] * (len(children[rank]) + has_parent)
        depth = max(depth, max(reference_depths(parents), default=0))
    ranks = tuple(RankTraffic("worker", sum(s), sum(r), nonempty(*s), nonempty(*r)) for s, r in zip(sent, recv))
    rounds = 2 * depth + (config.chunks - 1) if n > 1 else 0
    path = sum(b for b, _ in reference_slot_levels(config, n, numel, itemsize, 1)) if n > 1 else 0
    return ranks, rounds, path


def reference_levels(config, n, numel, itemsize, k):
    totals = {level: [[0, 0, 0, 0] for _ in range(n)] for level in ("intra", "nic")}
    for parents, (lo, hi) in zip(config.parents(n), chunk_bounds(numel, 2)):
        sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, config.chunks)]
        for child, parent in enumerate(parents):
            if parent is None:
                continue
            level = "intra" if child // k == parent // k else "nic"
            for a, b in ((child, parent), (parent, child)):
                for size in sizes:
                    totals[level][a][0] += size
                    totals[level][a][2] += size > 0
                    totals[level][b][1] += size
                    totals[level][b][3] += size > 0
    return {level: [RankTraffic("worker", *t) for t in ranks] for level, ranks in totals.items()}


# (workers, the trees' ranks per node, chunks, numel): odd and even n (shift and mirror), powers of two and one
# past them, nodes that divide n and a short last node, one node holding everything, buffers with empty chunks
CASES = [(n, k, chunks, numel)
         for n, k in ((2, 1), (3, 1), (5, 1), (7, 1), (8, 1), (12, 1), (13, 1), (17, 1), (33, 1), (100, 1),
                      (6, 2), (7, 2), (10, 3), (11, 4), (13, 5), (16, 4), (40, 7), (9, 9), (5, 8), (70, 8))
         for chunks in (1, 3, 4)
         for numel in (1, 7, 1001)]


@pytest.mark.parametrize("workers,k,chunks,numel", CASES)
def test_counts_equal_the_message_by_message_reference(workers, k, chunks, numel):
    config = strategies.make("double_binary_tree", chunks=chunks, ranks_per_node=k)
    traffic = config.traffic(workers, numel, 4)
    ranks, rounds, path = reference_traffic(config, workers, numel, 4)
    assert (traffic.ranks, traffic.rounds, traffic.path_bytes) == (ranks, rounds, path)
    for port_k in {1, k, 3}:  # the levels and slots priced on the trees' nodes, on other nodes and on one rank each
        assert config.slot_levels(workers, numel, 4, port_k) == \
            reference_slot_levels(config, workers, numel, 4, port_k), port_k
        assert config.levels(workers, numel, 4, port_k) == reference_levels(config, workers, numel, 4, port_k)
    for tree in (0, 1):
        parents = node_tree_parents(workers, k, tree)
        assert depths(parents) == reference_depths(parents)


def test_a_chunk_size_larger_than_its_half_leaves_empty_slots_counted():
    # 3 elements, 4 chunks per half: most messages are empty; the slot list keeps every slot (zero bytes)
    config = strategies.make("double_binary_tree", chunks=4)
    slots = config.slot_levels(5, 3, 4, 1)
    assert slots == reference_slot_levels(config, 5, 3, 4, 1)
    assert len(slots) == 4 + 2 * max(max(depths(p)) for p in config.parents(5)) - 1
    assert any(b == 0 for b, _ in slots)


def test_sixteen_thousand_workers_price_in_well_under_a_second():
    # the map prices every chunk count at every worker count: 16,384 ranks (counting was ~n^2 x chunks before)
    config = strategies.make("double_binary_tree", chunks=32)
    start = time.perf_counter()
    traffic = config.traffic(16384, 25_557_032, 4)
    assert time.perf_counter() - start < 10  # a loaded 2-core machine; about 1 s idle
    assert traffic.rounds == 2 * 14 + 31 and traffic.path_bytes > 0
