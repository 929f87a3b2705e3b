"""The price of a sync on nodes of several ranks (one NIC per node, an intra-node link between its ranks): the busiest
node NIC's and rank port's bytes from a strategy's per-level traffic, and the pipelines that are priced stage by
stage (hierarchical's pieces, the double binary tree's slots, node_parameter_server's phases). strategies.cost's
sync_seconds calls node_cost when the fabric has ranks_per_node > 1 (and re-exports these names).

Units: bytes and seconds everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


def sync_period(config) -> int:
    """H of a local-SGD strategy (strategies/local_sgd.py: it synchronizes on one step in H), 1 for any other."""
    local = getattr(config, "local", None)
    return int(getattr(local, "sync_every", 1))


# ---- nodes of several ranks: one NIC per node, an intra-node link -----------------------------------------

@dataclass(frozen=True)
class NodeCost:
    """One allreduce on nodes of k ranks: the busiest node NIC's and intra-node port's bytes, each level's time
    (bytes / that level's bandwidth, the level's share of the rounds x its latency) and which one bounds it."""

    nic_bytes: float    # max over nodes of the bytes its NIC transmits or receives (the node's ranks summed)
    intra_bytes: float  # max over ranks of the bytes it sends or receives inside its node (local SGD: / H)
    nic_s: float
    intra_s: float
    rounds: float
    # the sync's time where its levels do not simply overlap (hierarchical's pipeline, node_parameter_server's
    # phases one after another); None: the slower level's, the levels working side by side in every round
    total_s: float | None = None

    @property
    def bottleneck(self) -> str:
        return "nic" if self.nic_s >= self.intra_s else "intra"

    @property
    def time_s(self) -> float:
        return max(self.nic_s, self.intra_s) if self.total_s is None else self.total_s


def node_levels(config, workers: int, numel: int, itemsize: int, ranks_per_node: int) -> dict:
    """Per rank, intra-node and NIC traffic (RankTraffic lists under 'intra' and 'nic') of a strategy placed in
    nodes of ranks_per_node: its own levels() (hierarchical, double_binary_tree), or a ring's (rank i sends all it
    sends to i + 1). Other strategies are refused by name: their traffic() states totals, not peers."""
    from strategies.base import RankTraffic

    k = ranks_per_node
    if getattr(config, "name", "") in ("hierarchical", "node_parameter_server"):
        if config.ranks_per_node != k:
            raise ValueError(f"{config.name} ranks_per_node = {config.ranks_per_node} priced on nodes of {k}: give "
                             f"one value")
        return config.levels(workers, numel, itemsize)
    if getattr(config, "name", "") == "double_binary_tree":
        return config.levels(workers, numel, itemsize, k)
    if getattr(config, "name", "") in ("ring", "naive_ring"):
        ranks = config.traffic(workers, numel, itemsize).ranks
        zero = RankTraffic("worker", 0, 0, 0, 0)
        out = {"intra": [zero] * workers, "nic": [zero] * workers}
        for i, t in enumerate(ranks):
            left, right = (i - 1) % workers, (i + 1) % workers
            sent = RankTraffic("worker", t.bytes_sent, 0, t.msgs_sent, 0)
            recv = RankTraffic("worker", 0, t.bytes_recv, 0, t.msgs_recv)
            for part, peer in ((sent, right), (recv, left)):
                level = "intra" if peer // k == i // k else "nic"
                have = out[level][i]
                out[level][i] = RankTraffic("worker", have.bytes_sent + part.bytes_sent,
                                            have.bytes_recv + part.bytes_recv, have.msgs_sent + part.msgs_sent,
                                            have.msgs_recv + part.msgs_recv)
        return out
    raise ValueError(f"strategy {getattr(config, 'name', config)!r} has no per-level traffic: accepted are "
                     f"hierarchical, double_binary_tree, node_parameter_server, ring, naive_ring")


def node_cost(config, workers: int, numel: int, ranks_per_node: int, nic_bandwidth: float, intra_bandwidth: float,
              latency: float = 0.0, intra_latency: float = 0.0, itemsize: int = 4) -> NodeCost:
    """Price one allreduce on nodes of ranks_per_node: a node's ranks share its NIC (their NIC bytes add up), a
    rank's intra-node bytes go at intra_bandwidth. The time is the slower level's bytes / bandwidth plus the
    strategy's rounds x the latency of the level its rounds cross (the NIC's when any byte leaves a node).
    double_binary_tree: each level's time is its pipeline slots' (slot_levels), one after another."""
    try:
        nic, intra, rounds = _node_bytes(config, workers, numel, itemsize, ranks_per_node)
    except TypeError:  # an unhashable config (a plug-in's): uncached
        nic, intra, rounds = _node_bytes.__wrapped__(config, workers, numel, itemsize, ranks_per_node)
    # a message between nodes crosses its ranks' intra-node ports and both NICs (the nodes platform's route)
    alpha = latency + intra_latency if nic else intra_latency
    nic_s, intra_s = nic / nic_bandwidth, intra / intra_bandwidth
    name = getattr(config, "name", "")
    if name == "hierarchical" and numel:
        # its pipeline, stage by stage (hierarchical_node_seconds), is the time: both levels' seconds in it;
        # where it is small enough, its programs replayed (the NIC's messages crossing the ranks' ports too, a short
        # node's groups one after another while the next groups' first messages come in) are the time
        total, nic_only = hierarchical_node_seconds(config, workers, numel, ranks_per_node, nic_bandwidth,
                                                    intra_bandwidth, latency, intra_latency, itemsize)
        from strategies.hierarchical_replay import replay_node_seconds

        replayed = _cached(replay_node_seconds, config, workers, numel, itemsize, nic_bandwidth, intra_bandwidth,
                           latency, intra_latency)
        total = total if replayed is None else replayed
        return NodeCost(nic, intra, nic_only, total - nic_only, rounds, total)
    if name == "node_parameter_server" and numel:
        # the node's reduce-scatter, the pushes and replies, the node's all-gather (node_ps_seconds)
        from strategies.hierarchical import Layout, intra_path

        ring_rounds, ring_bytes = intra_path(Layout(workers, ranks_per_node), numel, itemsize)
        fill = _cached(config.reply_fill, workers, numel, itemsize)
        nic_s = (nic + fill) / nic_bandwidth + (rounds - ring_rounds) * alpha
        intra_s = ring_bytes / intra_bandwidth + ring_rounds * intra_latency
        total = node_ps_seconds(config, workers, numel, ranks_per_node, nic_bandwidth, intra_bandwidth,
                                intra_latency, itemsize, fill) + (rounds - ring_rounds) * alpha
        return NodeCost(nic, intra, nic_s, intra_s, rounds, total)
    if name == "double_binary_tree":
        # a pipeline of slots, one after another (a slot's sends leave when the slot before's have): each slot
        # takes its busiest port's time, so the fill and drain (slots with less than the full load, as many as
        # the trees' depth) cost what they move, and the NIC level waits out the slots only a chain works in
        slots = _cached(config.slot_levels, workers, numel, itemsize, ranks_per_node)
        nic_s = sum(max(b / nic_bandwidth, i / intra_bandwidth) for b, i in slots)
        intra_s = sum(i for _, i in slots) / intra_bandwidth
        # where it is small enough, the schedule replayed (a rank's slot may spill into the next or run ahead of
        # it; the sum assumes every slot waits for the one before everywhere) is the time
        replayed = _cached(config.replay_seconds, workers, numel, itemsize, ranks_per_node, nic_bandwidth,
                           intra_bandwidth)
        if replayed is not None:
            return NodeCost(nic, intra, nic_s + rounds * alpha, intra_s + rounds * intra_latency, rounds,
                            replayed + rounds * alpha)
    period = sync_period(config)
    if period > 1:  # local SGD: a sync's levels on one step in H
        nic, intra, rounds = nic / period, intra / period, rounds / period
        nic_s, intra_s = nic_s / period, intra_s / period
    return NodeCost(nic, intra, nic_s + rounds * alpha, intra_s + rounds * intra_latency, rounds)


def node_ps_seconds(config, workers: int, numel: int, k: int, nic_bandwidth: float, intra_bandwidth: float,
                    intra_latency: float, itemsize: int, fill: int) -> float:
    """node_parameter_server's sync on nodes of k, its latencies between nodes aside: each node's ring
    reduce-scatter (r - 1 rounds of its largest slice; a server node has none), then its owners' pushes, each
    flow from its node's reduce-scatter's end; a node still reducing while an earlier node's pushes come in shares
    its ranks' downloads with them, so its ring ends later (reduced_under_pushes), and the replies leave from the
    later of the two nodes' ends, and not before the host node's last owners to push have a partition round in
    (their start + fill: a server answers a partition once every owner's push of it is in); every NIC direction a
    fluid queue of its flows (ended by the latest t + the bytes of the flows starting at t or later), the last
    replies' partitions (fill) after the last push is in; then the all-gather of the largest node (its ranks serve
    the most; a short node of larger slices gathers while they answer). With equal nodes: reduce-scatter + (NIC
    bytes + fill) / bandwidth + all-gather, the phases one after
    another."""
    from strategies.hierarchical import Layout

    layout = Layout(workers, k)
    nodes = layout.nodes()

    def ring(r: int) -> float:  # one ring phase of a node of r ranks: r - 1 rounds of its largest slice
        if r <= 1:
            return 0.0
        largest = max((hi - lo for lo, hi in layout.slices(numel, r)), default=0) * itemsize
        return (r - 1) * (intra_latency + largest / intra_bandwidth)

    flows = _cached(config.node_pushes, workers, numel, itemsize)
    rings = {j: ring(len(node)) for j, node in enumerate(nodes)}  # server nodes: 0 (no reduce-scatter)
    reduced = reduced_under_pushes(rings, flows, {j: len(node) for j, node in enumerate(nodes)}, nic_bandwidth,
                                   intra_bandwidth)
    queues: dict[tuple[int, str], list[tuple[float, int]]] = {}
    pushes: dict[int, list[tuple[float, int]]] = {}
    # a host answers a partition once every owner's push of it is in: its replies wait for the last owners to
    # start pushing and for the first partition round to come in (the fill's mirror: as many bytes)
    head: dict[int, float] = {}
    for (src, dst) in flows:
        head[dst] = max(head.get(dst, 0.0), reduced.get(src, 0.0) + fill / nic_bandwidth)
    for (src, dst), nbytes in flows.items():
        start, back = reduced.get(src, 0.0), max(reduced.get(src, 0.0), reduced.get(dst, 0.0), head[dst])
        for node, way, t in ((src, "out", start), (dst, "in", start), (dst, "out", back), (src, "in", back)):
            queues.setdefault((node, way), []).append((t, nbytes))
        pushes.setdefault(dst, []).append((start, nbytes))

    def drained(flows: list[tuple[float, int]]) -> float:
        end, later = 0.0, 0
        for t, nbytes in sorted(flows, reverse=True):
            later += nbytes
            end = max(end, t + later / nic_bandwidth)
        return end

    pushed = max((drained(f) for f in pushes.values()), default=0.0)
    across = max([drained(f) for f in queues.values()] + [pushed + fill / nic_bandwidth])
    return max(across, max(reduced.values(), default=0.0)) + ring(max(len(node) for node in nodes))


def reduced_under_pushes(rings: dict[int, float], flows: dict[tuple[int, int], int], ranks: dict[int, int],
                         nic_bandwidth: float, intra_bandwidth: float) -> dict[int, float]:
    """When each node's ring reduce-scatter ends ({node: seconds}; rings: alone, its ranks' ports its own) with the
    pushes of nodes that finished earlier coming in: those flows leave at their node's end, at the NIC's rate (the
    node's NIC in, a fluid queue), spread over the node's ranks (a rank hosts its chunk's shards), so while they
    flow each rank's download carries nic / r of them and the ring goes at the rest of the port (max-min: the
    pushes are held to that by the NIC; at most half the port, a fair share beside one ring flow). Nodes in the
    order their rings end alone: a node's end depends only on earlier ones'. SimGrid's message log, 4 ranks in
    nodes of 3 at 100 Gbit/s: the lone rank pushes from t = 0, the ring's two rounds take 4.09 ms, not 2.73."""
    ends: dict[int, float] = {}
    for dst in sorted(rings, key=lambda j: (rings[j], j)):
        busy: list[list[float]] = []  # the intervals the early pushes flow into dst's NIC
        for t, nbytes in sorted((ends[src], nbytes) for (src, d), nbytes in flows.items()
                                if d == dst and src != dst and rings[src] < rings[dst]):
            if busy and t <= busy[-1][1]:
                busy[-1][1] += nbytes / nic_bandwidth
            else:
                busy.append([t, t + nbytes / nic_bandwidth])
        share = min(nic_bandwidth / max(ranks.get(dst, 1), 1), intra_bandwidth / 2) / intra_bandwidth
        clock, left = 0.0, rings[dst]  # the ring's seconds still to go at the whole port
        for lo, hi in busy:
            if lo >= clock + left:
                break
            left -= max(0.0, lo - clock)
            clock = max(clock, lo)
            slowed = (hi - clock) * (1 - share)  # ring seconds done while the pushes flow
            if slowed >= left:
                clock, left = clock + left / (1 - share), 0.0
                break
            clock, left = hi, left - slowed
        ends[dst] = clock + left
    return ends


@functools.lru_cache(maxsize=1024)
def _node_bytes(config, workers: int, numel: int, itemsize: int, ranks_per_node: int) -> tuple[int, int, int]:
    """(busiest node NIC's bytes, busiest rank's intra-node bytes, rounds): node_cost's bytes, cached."""
    levels = node_levels(config, workers, numel, itemsize, ranks_per_node)
    nodes = range(0, len(levels["nic"]), ranks_per_node)  # dedicated server ranks fill nodes after the workers'
    nic = max((max(sum(t.bytes_sent for t in levels["nic"][lo:lo + ranks_per_node]),
                   sum(t.bytes_recv for t in levels["nic"][lo:lo + ranks_per_node])) for lo in nodes), default=0)
    intra = max((max(t.bytes_sent, t.bytes_recv) for t in levels["intra"]), default=0)
    return nic, intra, config.traffic(workers, numel, itemsize).rounds


@functools.lru_cache(maxsize=1024)
def _cached_call(method, *args):
    return method(*args)


def _cached(method, *args):
    """method(*args), cached on the (hashable) config it is bound to and the arguments."""
    try:
        return _cached_call(method, *args)
    except TypeError:
        return method(*args)


def node_seconds(config, workers, numel, ranks_per_node, nic_bandwidth, intra_bandwidth, latency=0.0,
                 intra_latency=0.0, itemsize=4) -> float:
    """node_cost's time: the one price of a sync on nodes."""
    return node_cost(config, workers, numel, ranks_per_node, nic_bandwidth, intra_bandwidth, latency, intra_latency,
                     itemsize).time_s


def hierarchical_node_seconds(config, workers: int, numel: int, ranks_per_node: int, nic_bandwidth: float,
                              intra_bandwidth: float, latency: float, intra_latency: float,
                              itemsize: int = 4) -> tuple[float, float]:
    """(seconds, NIC seconds) of hierarchical's pipeline on nodes, as strategies/hierarchical.py runs it: piece 0's
    ring reduce-scatter in the node, then per stage piece s-1's across-node allreduces beside the first two rounds
    of the node's merged all-gather of piece s-2 and reduce-scatter of piece s (NodeStage.start posts round 0's
    sends, NodeStage.pump completes round 0 and posts round 1's while the inner strategy waits), then that
    stage's other rounds, then the last piece's all-gather.
    The across-node step of a piece: the busiest node NIC's bytes of that piece / the NIC bandwidth (the node's
    ranks share it) + the inner rounds of the rank serving the most chunks (a short node's rank serves several,
    one after another) x the route's latency. A node's ring takes its slowest node's rounds (a short node of r
    ranks has r - 1 rounds of larger slices). max(levels) assumed a pipeline that never fills or drains."""
    nic_alpha = latency + intra_latency  # a message between nodes crosses two ports and two NICs
    head, stages, tail = _hierarchical_plan(config, workers, numel, ranks_per_node, itemsize)

    def ring_rounds(candidates) -> list[float]:  # the slowest node's rounds of one (merged) ring phase
        worst: list[float] = []
        for count, slice_bytes in candidates:
            rounds = [intra_latency + slice_bytes / intra_bandwidth] * count
            if sum(rounds) > sum(worst):
                worst = rounds
        return worst

    seconds, nic_total = sum(ring_rounds(head)), 0.0
    for across_bytes, across_rounds, candidates in stages:
        nic = across_bytes / nic_bandwidth + across_rounds * nic_alpha if across_bytes else 0.0
        rounds = ring_rounds(candidates)
        seconds += max(nic, sum(rounds[:2])) + sum(rounds[2:])
        nic_total += nic
    return seconds + sum(ring_rounds(tail)), nic_total


@functools.lru_cache(maxsize=1024)
def _hierarchical_plan(config, workers: int, numel: int, k: int, itemsize: int):
    """The bytes of hierarchical_node_seconds (no bandwidth in them, so a bisection over bandwidths reuses them):
    piece 0's and the last piece's ring phase, per stage the across-node step (the busiest node NIC's bytes, the
    busiest rank's inner rounds) and the merged ring phase, each ring as (rounds, slice bytes) per node size."""
    from strategies.hierarchical import Layout

    layout = Layout(workers, k)
    m = len(layout.nodes())
    inner = config.inner_config()
    sizes = sorted({len(node) for node in layout.nodes()} - {1})

    def ring(piece_sizes: list[int]) -> tuple:
        return tuple((r - 1, sum(max((hi - lo for lo, hi in layout.slices(size, r)), default=0)
                                 for size in piece_sizes) * itemsize) for r in sizes)

    def across(size: int) -> tuple[int, int]:
        if m == 1 or size == 0:
            return 0, 0
        sent, recv, rounds = [0] * m, [0] * m, {}
        for c, (lo, hi) in enumerate(chunk_bounds_(size, k)):
            if hi == lo:
                continue
            t = inner.traffic(m, hi - lo, itemsize)
            for pos, rank in enumerate(layout.group(c)):
                sent[rank // k] += t.ranks[pos].bytes_sent
                recv[rank // k] += t.ranks[pos].bytes_recv
                rounds[rank] = rounds.get(rank, 0) + t.rounds
        return max(max(sent), max(recv)), max(rounds.values(), default=0)

    pieces = [hi - lo for lo, hi in chunk_bounds_(numel, config.pieces(workers, numel, itemsize))]
    stages = tuple((*across(pieces[stage - 1]), ring([pieces[p] for p in (stage, stage - 2) if 0 <= p < len(pieces)]))
                   for stage in range(1, len(pieces) + 1))
    return ring([pieces[0]]), stages, ring([pieces[-1]])


def chunk_bounds_(numel: int, parts: int) -> list[tuple[int, int]]:
    from strategies.base import chunk_bounds

    return chunk_bounds(numel, parts)
