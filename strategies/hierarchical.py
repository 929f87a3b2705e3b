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

Pipelined in pieces (as NCCL pipelines its phases): the array is cut into P contiguous pieces, as many as keep the
inner strategy's messages at `pipeline_mb` MiB or more (HierarchicalConfig.pieces), each synced by the three steps
above on its own, and stage s runs piece s-1's across-node allreduces while the node's ring reduce-scatter of piece
s and all-gather of piece s-2 go on: their messages are posted before the across-node step starts, their first
round is completed (received, reduced, the next round's send posted) the first time the inner strategy waits on the
network, the rest after it. Only piece 0's reduce-scatter and piece P-1's all-gather are not overlapped with the
NIC. Any inner strategy pipelines this way, at a price: each piece runs a whole inner allreduce, so P pieces cost P
x the inner's rounds (latency), not the P - 1 extra steps of a chunk-pipelined inner ring. With one rank per node,
or one node, there is nothing to overlap: one piece, exactly the unpipelined schedule (k = 1 is the inner strategy:
same bytes, same results).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from strategies.base import MAX_MESSAGES, RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
from strategies.ops import finish_reduction, reduce_into
from strategies.primitives import Scratch
from strategies.transport.communicator import Handle
from strategies.transport.concurrency import THREADS

INNER = ("ring", "halving_doubling", "reduce_broadcast", "double_binary_tree")


class GroupView:
    """A subgroup of a communicator seen as ranks 0..len(ranks)-1: what an inner strategy runs on.

    Point to point only (bytes are counted by the parent); no control plane, so the inner strategy's _sync is
    called directly, after the outer sync() has checked sizes once for everyone. `pump` runs before every wait of
    the inner strategy: the pipeline's intra-node work, done while the inner's messages are on the wire."""

    def __init__(self, comm, ranks: list[int]):
        self.comm, self.ranks = comm, ranks
        self.rank, self.world_size = ranks.index(comm.rank), len(ranks)
        self.pump = _nothing

    def isend(self, tensor, dst):
        return self._pumped(self.comm.isend(tensor, self.ranks[dst]))

    def irecv(self, tensor, src):
        return self._pumped(self.comm.irecv(tensor, self.ranks[src]))

    def send(self, tensor, dst):
        self.isend(tensor, dst).wait()

    def recv(self, tensor, src):
        self.irecv(tensor, src).wait()

    def _pumped(self, handle: Handle) -> Handle:
        def finish():
            self.pump()
            handle.wait()

        return Handle(finish)


def _nothing() -> None:
    return None


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
        return node[(_slice_of_chunk(self.k, r)[c] - 1) % r]  # position p owns slice (p + 1) mod r

    def group(self, c: int) -> list[int]:
        """Chunk c's across-node group: its owner in each node, node by node (O(nodes): every full node's owner
        is at the same position)."""
        full, rest = divmod(self.workers, self.k)
        at = (_slice_of_chunk(self.k, self.k)[c] - 1) % self.k
        group = list(range(at, full * self.k, self.k))
        if rest:
            group.append(full * self.k + (_slice_of_chunk(self.k, rest)[c] - 1) % rest)
        return group


@functools.lru_cache(maxsize=64)
def _slice_of_chunk(k: int, r: int) -> tuple[int, ...]:
    """For each of the k chunks, the slice of a node of r ranks that holds it (slices: chunk_bounds(k, r))."""
    return tuple(s for s, (a, b) in enumerate(chunk_bounds(k, r)) for _ in range(a, b))


@dataclass(frozen=True)
class Piece:
    """Elements lo..hi of the array, synced by the three steps on its own: its k chunks and its slices in a node of
    r ranks, relative to lo."""

    lo: int
    hi: int
    chunks: list[tuple[int, int]]
    slices: list[tuple[int, int]]

    @classmethod
    def cut(cls, layout: Layout, numel: int, pieces: int, r: int) -> list[Piece]:
        return [cls(lo, hi, chunk_bounds(hi - lo, layout.k), layout.slices(hi - lo, r))
                for lo, hi in chunk_bounds(numel, pieces)]


class NodeStage:
    """One pipeline stage's intra-node work on this rank: the node's ring all-gather of one piece (`gather`) and
    ring reduce-scatter of another (`scatter`), merged round by round (all-gather, then reduce-scatter, in each
    round), so every rank sends to its right in the order its right posted the receives from its left.

    start() posts every receive and round 0's sends; pump() completes round 0 (every message it waits for was
    posted by a peer's start(), so it never waits on a peer that waits on this rank); finish() the rest."""

    def __init__(self, comm, flat, node: list[int], op: str, scratch: Scratch, gather: Piece | None,
                 scatter: Piece | None):
        self.comm, self.op = comm, op
        n, pos = len(node), node.index(comm.rank)
        self.n, self.pos, self.owned = n, pos, (pos + 1) % n
        self.right, self.left = node[(pos + 1) % n], node[(pos - 1) % n]
        self.gather = None if gather is None else flat[gather.lo:gather.hi]
        self.scatter = None if scatter is None else flat[scatter.lo:scatter.hi]
        self.gather_slices = gather.slices if gather else []
        self.scatter_slices = scatter.slices if scatter else []
        self.phases = [kind for kind, view in (("gather", self.gather), ("scatter", self.scatter)) if view is not None]
        slot = max((hi - lo for lo, hi in self.scatter_slices), default=0)
        self.slots = scratch.get(slot * max(n - 1, 1), flat) if self.scatter is not None else None
        self.slot = slot
        self.pending: dict[tuple[int, str], Handle] = {}
        self.sends: list[Handle] = []
        self.done_rounds = 0

    def _recv_bounds(self, kind: str, rnd: int) -> tuple[int, int]:
        # reduce-scatter round t receives slice pos - t - 1; the all-gather's receives slice owned - t - 1
        if kind == "scatter":
            return self.scatter_slices[(self.pos - rnd - 1) % self.n]
        return self.gather_slices[(self.owned - rnd - 1) % self.n]

    def _send(self, kind: str, rnd: int) -> None:
        # reduce-scatter round t sends slice pos - t (round 0 our own, later the one reduced last round); the
        # all-gather's sends slice owned - t (round 0 the owned one, later the one received last round)
        if kind == "scatter":
            lo, hi = self.scatter_slices[(self.pos - rnd) % self.n]
            self.sends.append(self.comm.isend(self.scatter[lo:hi], self.right))
        else:
            lo, hi = self.gather_slices[(self.owned - rnd) % self.n]
            self.sends.append(self.comm.isend(self.gather[lo:hi], self.right))

    def start(self) -> NodeStage:
        for rnd in range(self.n - 1):
            for kind in self.phases:
                lo, hi = self._recv_bounds(kind, rnd)
                if kind == "scatter":
                    buf = self.slots[rnd * self.slot: rnd * self.slot + hi - lo]
                else:
                    buf = self.gather[lo:hi]
                self.pending[rnd, kind] = self.comm.irecv(buf, self.left)
        if self.n > 1:
            for kind in self.phases:
                self._send(kind, 0)
        return self

    def _round(self, rnd: int) -> None:
        for kind in self.phases:
            self.pending.pop((rnd, kind)).wait()
            if kind == "scatter":
                lo, hi = self._recv_bounds(kind, rnd)
                reduce_into(self.scatter[lo:hi], self.slots[rnd * self.slot: rnd * self.slot + hi - lo], self.op)
            if rnd + 1 < self.n - 1:
                self._send(kind, rnd + 1)
        self.done_rounds = rnd + 1

    def pump(self) -> None:
        if self.done_rounds == 0 and self.n > 1:
            self._round(0)

    def finish(self) -> None:
        for rnd in range(self.done_rounds, self.n - 1):
            self._round(rnd)
        for handle in self.sends:  # a sent slice is not written again in this stage: wait for the sends at the end
            handle.wait()


def intra_traffic(layout: Layout, numel: int, itemsize: int) -> list[RankTraffic]:
    """Per worker rank: what the node's ring reduce-scatter and ring all-gather over its slices send and receive."""
    intra = [RankTraffic("worker", 0, 0, 0, 0)] * layout.workers
    by_size: dict[int, list[int]] = {}  # a node's slice sizes, per node size (the last node may be short)
    for node in layout.nodes():
        r = len(node)
        if r not in by_size:
            by_size[r] = [(hi - lo) * itemsize for lo, hi in layout.slices(numel, r)]
        sizes = by_size[r]
        total, nonzero = sum(sizes), nonempty(*sizes)
        for pos, rank in enumerate(node):
            # reduce-scatter round t (t = 0 .. r-2) sends slice pos - t, receives pos - t - 1: every slice but
            # pos + 1 sent, every slice but pos received; the all-gather round t sends slice owned - t, receives
            # owned - t - 1 (owned = pos + 1): every slice but pos + 2 sent, every slice but pos + 1 received (the
            # ring's pattern on the node's slices, summed whole: O(r) per node, not O(r^2))
            skip_rs_sent, skip_rs_recv, skip_ag_sent = sizes[(pos + 1) % r], sizes[pos], sizes[(pos + 2) % r]
            intra[rank] = RankTraffic("worker", 2 * total - skip_rs_sent - skip_ag_sent,
                                      2 * total - skip_rs_recv - skip_rs_sent,
                                      2 * nonzero - nonempty(skip_rs_sent, skip_ag_sent),
                                      2 * nonzero - nonempty(skip_rs_recv, skip_rs_sent))
    return intra


def intra_path(layout: Layout, numel: int, itemsize: int) -> tuple[int, int]:
    """(rounds, bytes) of the two ring phases inside the largest node: 2(r-1) rounds of its largest slice."""
    r_max = max(len(node) for node in layout.nodes())
    slice_max = max((hi - lo for lo, hi in layout.slices(numel, r_max)), default=0) * itemsize
    return 2 * (r_max - 1), 2 * (r_max - 1) * slice_max


class Hierarchical(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        # its Layout of nodes; Strategy.set_shapes() is the (PowerSGD) per-parameter shapes training declares
        self.node_layout = Layout(workers, config.ranks_per_node)
        self.node = next(node for node in self.node_layout.nodes() if comm.rank in node)
        self.within_node = config.inner_config()  # the config of the strategy named by `inner`
        self.scratch = Scratch()
        self._inner_runtimes: dict[tuple[int, ...], Strategy] = {}
        # seconds this rank spent in each phase, summed over syncs, on its communicator's clock (the wall clock,
        # or the simulated one on SimGrid): see _sync (`syncbench simulate --bench --ranks-per-node` sets 'nic'
        # beside the model)
        self.phase_s = {"intra": 0.0, "nic": 0.0}

    def _inner(self, group: list[int]) -> Strategy:
        key = tuple(group)
        if key not in self._inner_runtimes:
            within = self.within_node
            self._inner_runtimes[key] = within.runtime(within, GroupView(self.comm, group), len(group))
        return self._inner_runtimes[key]

    def _sync(self, flat, op):
        layout, node = self.node_layout, self.node
        count = self.config.pieces(self.workers, flat.numel(), flat.element_size())
        pieces = Piece.cut(layout, flat.numel(), count, len(node))
        clock = getattr(self.comm, "concurrency", THREADS).clock  # a test double may have none: the wall clock
        start, across_s = clock(), 0.0
        # stage s: piece s-1 across nodes, while the node reduce-scatters piece s and all-gathers piece s-2
        for stage in range(count + 2):
            gather = pieces[stage - 2] if stage >= 2 else None
            scatter = pieces[stage] if stage < count else None
            intra = NodeStage(self.comm, flat, node, op, self.scratch, gather, scatter).start()
            if 1 <= stage <= count:
                t0 = clock()
                self._across(flat, pieces[stage - 1], op, intra.pump)
                across_s += clock() - t0
            intra.finish()
        # seconds on the communicator's clock: 'nic' = the across-node allreduces (with the intra-node work they
        # overlap), 'intra' = the rest (the first reduce-scatter, the last all-gather, what was not overlapped)
        self.phase_s["nic"] += across_s
        self.phase_s["intra"] += clock() - start - across_s

    def _across(self, flat, piece: Piece, op: str, pump) -> None:
        """Chunk c of the piece allreduced (summed for a mean) by its owners, one per node, in increasing c."""
        inner_op = "sum" if op == "mean" else op
        for c in range(self.node_layout.k):
            group = self.node_layout.group(c)
            if self.comm.rank not in group:
                continue
            lo, hi = piece.chunks[c]
            part = flat[piece.lo + lo:piece.lo + hi]
            if hi > lo and len(group) > 1:
                inner = self._inner(group)
                inner.comm.pump = pump
                try:
                    inner._sync(part, inner_op)
                finally:
                    inner.comm.pump = _nothing
            finish_reduction(part, op, self.workers)  # mean: divided once, by the chunk's owner


@dataclass(frozen=True)
class HierarchicalConfig(StrategyConfig):
    name = "hierarchical"
    summary = ("2D allreduce: reduce-scatter in each node of ranks_per_node ranks, allreduce across nodes "
               "(inner), all-gather in the node; pipelined in pieces (inner messages >= pipeline_mb MiB)")
    runtime = Hierarchical
    variants = ({"ranks_per_node": 2, "inner": "ring"}, {"ranks_per_node": 4, "inner": "halving_doubling"},
                {"ranks_per_node": 2, "inner": "ring", "pipeline_mb": 1e-4})
    # (nodes of 3 and uneven last nodes: tests/strategies/test_nodes.py; in the peer suites' float16 case 8 ranks
    # averaging 65504 round in a node's partial sum of 3 prescaled values, as unpipelined, which that case forbids)
    ranks_per_node: int = 2
    inner: str = "ring"
    pipeline_mb: float = 0.5

    def validate(self):
        k = self.ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"hierarchical ranks_per_node = {k!r}: expected an integer >= 1")
        if self.inner not in INNER:
            raise ValueError(f"hierarchical inner = {self.inner!r}: accepted are {', '.join(map(repr, INNER))}")
        mb = self.pipeline_mb
        if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not mb > 0:
            raise ValueError(f"hierarchical pipeline_mb = {mb!r}: expected a number of MiB > 0 (the least size "
                             f"pipelining may cut the inner strategy's messages to; inf: no pipeline)")

    def pieces(self, workers: int, numel: int, itemsize: int = 4) -> int:
        """How many pieces the array is pipelined in: as many as keep the inner strategy's messages (its critical
        path's bytes per round, unpipelined) at pipeline_mb MiB or more, at most one per element; one with one
        rank per node or a single node (no NIC phase to overlap). Sized by message, not by array: a piece costs
        a whole inner allreduce's rounds, so many nodes (a ring of m nodes: 2(m-1) rounds of 1/(k m) of the
        array) keep whole arrays where 2 nodes cut theirs."""
        layout = Layout(workers, self.ranks_per_node)
        m = len(layout.nodes())
        if self.ranks_per_node == 1 or m == 1 or numel == 0:
            return 1
        chunk = max(hi - lo for lo, hi in chunk_bounds(numel, layout.k))
        inner = self.inner_config().traffic(m, chunk, itemsize)
        per_round = inner.path_bytes / inner.rounds if inner.rounds else 0.0
        return max(1, min(int(per_round // (self.pipeline_mb * 2**20)), numel))

    def messages(self, workers, numel, itemsize=4):
        """Per piece: the two ring phases in the node (k - 1 messages each way, each) and the inner allreduce."""
        return self.pieces(workers, numel, itemsize) * self._piece_messages(workers, numel, itemsize)[0]

    def fewer_messages(self, workers, numel, itemsize=4):
        per_piece, per_round = self._piece_messages(workers, numel, itemsize)
        low = per_round / ((MAX_MESSAGES // per_piece + 1) * 2**20) * 1.001
        return f"pipeline_mb >= {low:.3g} MiB (inf: no pipeline)"

    def _piece_messages(self, workers: int, numel: int, itemsize: int) -> tuple[int, float]:
        """Messages a worker sends and receives per piece, and the inner strategy's bytes per round (unpipelined)."""
        layout = Layout(workers, self.ranks_per_node)
        m = len(layout.nodes())
        chunk = max((hi - lo for lo, hi in chunk_bounds(numel, layout.k)), default=0)
        inner = self.inner_config().traffic(m, chunk, itemsize) if m > 1 else None
        inner_msgs = max((r.msgs_sent + r.msgs_recv for r in inner.workers()), default=0) if inner else 0
        per_round = inner.path_bytes / inner.rounds if inner and inner.rounds else 0.0
        return max(1, 4 * (layout.k - 1) + inner_msgs), per_round

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
        through the node's NIC ('nic': the across-node allreduces, whose groups hold one rank per node), summed
        over the pipeline's pieces."""
        layout = Layout(workers, self.ranks_per_node)
        intra = [[0, 0, 0, 0] for _ in range(workers)]
        nic = [[0, 0, 0, 0] for _ in range(workers)]
        inner, m = self.inner_config(), len(layout.nodes())
        inner_traffic: dict[int, Traffic] = {}  # per chunk size: chunks come in at most two sizes
        # pieces of the same size send the same: each size once, times its count (O(workers), not O(workers^2))
        for size, count in _piece_sizes(numel, self.pieces(workers, numel, itemsize)).items():
            for rank, t in enumerate(intra_traffic(layout, size, itemsize)):
                _add(intra[rank], t, count)
            if m == 1:
                continue
            for c, (a, b) in enumerate(chunk_bounds(size, layout.k)):
                if b == a:
                    continue
                if b - a not in inner_traffic:
                    inner_traffic[b - a] = inner.traffic(m, b - a, itemsize)
                ranks = inner_traffic[b - a].ranks
                group = layout.group(c)
                if len(ranks) != len(group):
                    raise ValueError(f"hierarchical inner = {self.inner!r}: its traffic on {m} nodes has "
                                     f"{len(ranks)} ranks, expected one per node ({m})")
                for rank, t in zip(group, ranks):
                    _add(nic[rank], t, count)
        return {level: [RankTraffic("worker", *t) for t in totals] for level, totals in (("intra", intra),
                                                                                        ("nic", nic))}

    def traffic(self, workers, numel, itemsize=4):
        levels = self.levels(workers, numel, itemsize)
        ranks = tuple(RankTraffic("worker", a.bytes_sent + b.bytes_sent, a.bytes_recv + b.bytes_recv,
                                  a.msgs_sent + b.msgs_sent, a.msgs_recv + b.msgs_recv)
                      for a, b in zip(levels["intra"], levels["nic"]))
        rounds, path = self.critical_path(workers, numel, itemsize)
        return Traffic(ranks, rounds=rounds, path_bytes=path)

    def critical_path(self, workers: int, numel: int, itemsize: int = 4) -> tuple[int, int]:
        """(rounds, bytes) on the critical path of the pipeline: piece 0's reduce-scatter in the largest node, then
        per stage the slower of the across-node allreduces of the rank serving the most chunks (a short node's)
        and the node's merged all-gather and reduce-scatter of its neighbours, then the last piece's all-gather.
        One piece: the two ring phases and the across-node allreduces one after another, unpipelined. P pieces
        cost P x the inner strategy's rounds (each piece a whole inner allreduce)."""
        layout = Layout(workers, self.ranks_per_node)
        sizes = [hi - lo for lo, hi in chunk_bounds(numel, self.pieces(workers, numel, itemsize))]
        half, across = {}, {}  # per piece size (pieces come in at most two sizes)
        for size in set(sizes):
            half[size] = tuple(v // 2 for v in intra_path(layout, size, itemsize))  # one ring phase
            across[size] = self._across_path(layout, size, itemsize)
        rounds, path = half[sizes[0]]
        for stage in range(1, len(sizes) + 1):
            beside = [half[sizes[p]] for p in (stage, stage - 2) if 0 <= p < len(sizes)]
            intra_rounds = max((r for r, _ in beside), default=0)  # merged round by round: concurrent
            intra_bytes = sum(b for _, b in beside)
            rounds += max(across[sizes[stage - 1]][0], intra_rounds)
            path += max(across[sizes[stage - 1]][1], intra_bytes)
        return rounds + half[sizes[-1]][0], path + half[sizes[-1]][1]

    def _across_path(self, layout: Layout, numel: int, itemsize: int) -> tuple[int, int]:
        """(rounds, bytes) of one piece's across-node allreduces for the rank serving the most chunks."""
        inner, m = self.inner_config(), len(layout.nodes())
        per_rank: dict[int, tuple[int, int]] = {}
        if m > 1:
            traffic = {}  # per chunk size (chunks come in at most two sizes)
            for c, (lo, hi) in enumerate(chunk_bounds(numel, layout.k)):
                if hi > lo:
                    if hi - lo not in traffic:
                        traffic[hi - lo] = inner.traffic(m, hi - lo, itemsize)
                    t = traffic[hi - lo]
                    for rank in layout.group(c):
                        r0, p0 = per_rank.get(rank, (0, 0))
                        per_rank[rank] = (r0 + t.rounds, p0 + t.path_bytes)
        return max(per_rank.values(), default=(0, 0))


def _add(totals: list[int], t: RankTraffic, times: int = 1) -> None:
    for i, v in enumerate((t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv)):
        totals[i] += v * times


def _piece_sizes(numel: int, pieces: int) -> dict[int, int]:
    """How many of chunk_bounds(numel, pieces)'s pieces have each size (at most two sizes), without listing them."""
    base, extra = divmod(numel, pieces)
    return {size: count for size, count in ((base + 1, extra), (base, pieces - extra)) if count}
