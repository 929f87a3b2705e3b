"""Hierarchical (2D) allreduce: reduce-scatter inside each node, allreduce across nodes, all-gather inside each node.

Horovod's NCCL torus / hierarchical allreduce: with nodes of k ranks, each rank sends only ~1/k of the array
through the node's NIC instead of the flat ring's 2(n-1)/n of it from every rank (k ranks sharing one NIC). The
inner strategy (`inner`: ring, halving_doubling, reduce_broadcast, double_binary_tree) runs the across-node step,
one group per chunk.

Nodes are ranks k*j .. k*j+k-1 (comm.node_of); the last node may be short (r < k ranks). The array is cut into
k chunks; in a node of r ranks the chunks are grouped into r contiguous runs ("slices", chunk_bounds(k, r)), and
the node's ring reduce-scatter leaves local position p owning slice (p + 1) mod r. Chunk c's across-node group is,
node by node, the rank that owns the slice holding c: one rank per node, so a short node's ranks each serve
several groups, in increasing c (every rank walks the groups in the same order: no cycle, FIFO per pair holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
from strategies.ops import finish_reduction
from strategies.primitives import Scratch, ring_allgather, ring_reduce_scatter
from strategies.transport.concurrency import THREADS

INNER = ("ring", "halving_doubling", "reduce_broadcast", "double_binary_tree")


class GroupView:
    """A subgroup of a communicator seen as ranks 0..len(ranks)-1: what an inner strategy runs on.

    Point to point only (bytes are counted by the parent); no control plane, so the inner strategy's _sync is
    called directly, after the outer sync() has checked sizes once for everyone."""

    def __init__(self, comm, ranks: list[int]):
        self.comm, self.ranks = comm, ranks
        self.rank, self.world_size = ranks.index(comm.rank), len(ranks)

    def isend(self, tensor, dst):
        return self.comm.isend(tensor, self.ranks[dst])

    def irecv(self, tensor, src):
        return self.comm.irecv(tensor, self.ranks[src])

    def send(self, tensor, dst):
        self.comm.send(tensor, self.ranks[dst])

    def recv(self, tensor, src):
        self.comm.recv(tensor, self.ranks[src])


@dataclass(frozen=True)
class Layout:
    """Who is where: nodes of k ranks, each node's slices, and each chunk's across-node group."""

    workers: int
    k: int

    def nodes(self) -> list[list[int]]:
        return [list(range(lo, min(lo + self.k, self.workers))) for lo in range(0, self.workers, self.k)]

    def slices(self, numel: int, r: int) -> list[tuple[int, int]]:
        """Element ranges of a node of r ranks: chunk runs chunk_bounds(k, r) of the k chunks."""
        chunks = chunk_bounds(numel, self.k)
        return [(chunks[a][0], chunks[b - 1][1]) for a, b in chunk_bounds(self.k, r)]

    def owner(self, node: list[int], c: int) -> int:
        """The rank of `node` that ends the node's reduce-scatter owning chunk c."""
        r = len(node)
        s = next(i for i, (a, b) in enumerate(chunk_bounds(self.k, r)) if a <= c < b)
        return node[(s - 1) % r]  # position p owns slice (p + 1) mod r

    def group(self, c: int) -> list[int]:
        return [self.owner(node, c) for node in self.nodes()]


def intra_traffic(layout: Layout, numel: int, itemsize: int) -> list[RankTraffic]:
    """Per worker rank: what the node's ring reduce-scatter and ring all-gather over its slices send and receive."""
    intra = [RankTraffic("worker", 0, 0, 0, 0)] * layout.workers
    for node in layout.nodes():
        r = len(node)
        sizes = [(hi - lo) * itemsize for lo, hi in layout.slices(numel, r)]
        for pos, rank in enumerate(node):
            owned = (pos + 1) % r
            # reduce-scatter round t sends slice pos - t, receives pos - t - 1; the all-gather round t sends
            # slice owned - t, receives owned - t - 1 (the ring's pattern, on the node's slices)
            sent = [sizes[(pos - t) % r] for t in range(r - 1)] + [sizes[(owned - t) % r] for t in range(r - 1)]
            recv = [sizes[(pos - t - 1) % r] for t in range(r - 1)] + \
                [sizes[(owned - t - 1) % r] for t in range(r - 1)]
            intra[rank] = RankTraffic("worker", sum(sent), sum(recv), nonempty(*sent), nonempty(*recv))
    return intra


def intra_path(layout: Layout, numel: int, itemsize: int) -> tuple[int, int]:
    """(rounds, bytes) of the two ring phases inside the largest node: 2(r-1) rounds of its largest slice."""
    r_max = max(len(node) for node in layout.nodes())
    slice_max = max((hi - lo for lo, hi in layout.slices(numel, r_max)), default=0) * itemsize
    return 2 * (r_max - 1), 2 * (r_max - 1) * slice_max


class Hierarchical(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        # not `layout`: the training loop takes a runtime's layout() for PowerSGD's per-parameter shapes
        self.node_layout = Layout(workers, config.ranks_per_node)
        self.node = next(node for node in self.node_layout.nodes() if comm.rank in node)
        self.inner = config.inner_config()
        self.scratch = Scratch()
        self._inner_runtimes: dict[tuple[int, ...], Strategy] = {}
        # seconds this rank spent in each phase, summed over syncs, on its communicator's clock (the wall clock,
        # or the simulated one on SimGrid): 'intra' = the node's reduce-scatter and all-gather, 'nic' = the
        # across-node allreduces (what `syncbench simulate --bench --ranks-per-node` sets beside the model)
        self.phase_s = {"intra": 0.0, "nic": 0.0}

    def _inner(self, group: list[int]) -> Strategy:
        key = tuple(group)
        if key not in self._inner_runtimes:
            self._inner_runtimes[key] = self.inner.runtime(self.inner, GroupView(self.comm, group), len(group))
        return self._inner_runtimes[key]

    def _sync(self, flat, op):
        layout, node = self.node_layout, self.node
        chunks = chunk_bounds(flat.numel(), layout.k)
        slices = layout.slices(flat.numel(), len(node))
        clock = getattr(self.comm, "concurrency", THREADS).clock  # a test double may have none: the wall clock
        start = clock()
        # 1. inside the node: ring reduce-scatter over the node's slices; position p keeps slice (p + 1) mod r
        owned = ring_reduce_scatter(self.comm, flat, slices, op, node, self.scratch)
        scattered = clock()
        # 2. across nodes: chunk c allreduced (summed for a mean) by its owners, one per node, in increasing c
        inner_op = "sum" if op == "mean" else op
        for c in range(layout.k):
            group = layout.group(c)
            if self.comm.rank not in group:
                continue
            lo, hi = chunks[c]
            if hi > lo and len(group) > 1:
                self._inner(group)._sync(flat[lo:hi], inner_op)
            finish_reduction(flat[lo:hi], op, self.workers)  # mean: divided once, by the chunk's owner
        reduced = clock()
        # 3. inside the node: ring all-gather of the slices, every rank ends with the whole array
        ring_allgather(self.comm, flat, slices, node, owned)
        self.phase_s["intra"] += (scattered - start) + (clock() - reduced)
        self.phase_s["nic"] += reduced - scattered


@dataclass(frozen=True)
class HierarchicalConfig(StrategyConfig):
    name = "hierarchical"
    summary = ("2D allreduce: reduce-scatter in each node of ranks_per_node ranks, allreduce across nodes "
               "(inner), all-gather in the node")
    runtime = Hierarchical
    variants = ({"ranks_per_node": 2, "inner": "ring"}, {"ranks_per_node": 4, "inner": "halving_doubling"})
    ranks_per_node: int = 2
    inner: str = "ring"

    def validate(self):
        k = self.ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"hierarchical ranks_per_node = {k!r}: expected an integer >= 1")
        if self.inner not in INNER:
            raise ValueError(f"hierarchical inner = {self.inner!r}: accepted are {', '.join(map(repr, INNER))}")

    def inner_config(self) -> StrategyConfig:
        from strategies.registry import get  # the registry imports this module

        return get(self.inner)()

    def bind(self, comm, workers):
        if comm.ranks_per_node not in (1, self.ranks_per_node):
            raise ValueError(f"hierarchical ranks_per_node = {self.ranks_per_node}, but the run places "
                             f"{comm.ranks_per_node} ranks per node: give the strategy the run's ranks_per_node")
        return super().bind(comm, workers)

    def levels(self, workers: int, numel: int, itemsize: int = 4) -> dict[str, list[RankTraffic]]:
        """Per rank, per level: what it sends and receives inside its node ('intra': the two ring phases) and
        through the node's NIC ('nic': the across-node allreduces, whose groups hold one rank per node)."""
        layout = Layout(workers, self.ranks_per_node)
        intra = intra_traffic(layout, numel, itemsize)
        nic = [[0, 0, 0, 0] for _ in range(workers)]
        inner, m = self.inner_config(), len(layout.nodes())
        for c, (lo, hi) in enumerate(chunk_bounds(numel, layout.k)):
            if hi == lo or m == 1:
                continue
            for pos, t in enumerate(inner.traffic(m, hi - lo, itemsize).ranks):
                totals = nic[layout.group(c)[pos]]
                for i, v in enumerate((t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv)):
                    totals[i] += v
        return {"intra": intra, "nic": [RankTraffic("worker", *t) for t in nic]}

    def traffic(self, workers, numel, itemsize=4):
        levels = self.levels(workers, numel, itemsize)
        ranks = tuple(RankTraffic("worker", a.bytes_sent + b.bytes_sent, a.bytes_recv + b.bytes_recv,
                                  a.msgs_sent + b.msgs_sent, a.msgs_recv + b.msgs_recv)
                      for a, b in zip(levels["intra"], levels["nic"]))
        # critical path: the largest node's two ring phases, then the across-node allreduces of the rank serving
        # the most chunks (a short node's), one after another
        layout = Layout(workers, self.ranks_per_node)
        rounds, path = intra_path(layout, numel, itemsize)
        inner, m = self.inner_config(), len(layout.nodes())
        if m > 1:
            per_rank: dict[int, tuple[int, int]] = {}
            for c, (lo, hi) in enumerate(chunk_bounds(numel, layout.k)):
                if hi > lo:
                    t = inner.traffic(m, hi - lo, itemsize)
                    for rank in layout.group(c):
                        r0, p0 = per_rank.get(rank, (0, 0))
                        per_rank[rank] = (r0 + t.rounds, p0 + t.path_bytes)
            if per_rank:
                inner_rounds, inner_path = max(per_rank.values())
                rounds, path = rounds + inner_rounds, path + inner_path
        return Traffic(ranks, rounds=rounds, path_bytes=path)

