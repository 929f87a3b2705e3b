"""Double binary tree allreduce (NCCL 2.4): two complementary binary trees, each reducing and broadcasting half.

Tree 0 is NCCL's btree rooted at rank 0 (ranks alternate between inner nodes and leaves); tree 1 is its mirror
(n even: rank r plays n-1-r) or its shift by one (n odd: rank r plays r-1), so a rank that is an inner node in one
tree is mostly a leaf in the other and every rank sends and receives about the whole array once per phase:
O(log n) latency, per-rank traffic ~2S against the ring's 2(n-1)/n S. Half h of the array travels on tree h, cut
into `chunks` pipeline chunks: while chunk c is reduced up a tree, chunk c-1 is broadcast down it.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
from strategies.ops import finish_reduction, reduce_into
from strategies.primitives import Scratch


def btree_parent(n: int, rank: int) -> int | None:
    """NCCL's ncclGetBtree parent: with `bit` the lowest set bit of rank, up = (rank ^ bit) | (bit << 1), or
    rank ^ bit when that is out of range; rank 0 is the root."""
    if rank == 0:
        return None
    bit = rank & -rank
    up = (rank ^ bit) | (bit << 1)
    return up if up < n else rank ^ bit


def tree_parents(n: int, tree: int) -> list[int | None]:
    """Every rank's parent in tree 0 (the btree) or tree 1 (mirror for even n, shift by one for odd n)."""
    if tree == 0:
        return [btree_parent(n, r) for r in range(n)]
    if n % 2:  # shift: rank r plays r - 1 of the btree
        return [None if (p := btree_parent(n, (r - 1) % n)) is None else (p + 1) % n for r in range(n)]
    return [None if (p := btree_parent(n, n - 1 - r)) is None else n - 1 - p for r in range(n)]  # mirror


def tree_children(parents: list[int | None]) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in parents]
    for rank, parent in enumerate(parents):
        if parent is not None:
            children[parent].append(rank)
    return children


def schedule(chunks: int) -> list[tuple[str, int]]:
    """The steps every rank walks, in wire order: reduce chunk c on both trees, then broadcast chunk c - 1 on
    both. Every rank walks the same list, so every pair's messages come in the order both expect."""
    steps = []
    for c in range(chunks + 1):
        if c < chunks:
            steps.append(("reduce", c))
        if c > 0:
            steps.append(("broadcast", c - 1))
    return steps


class DoubleBinaryTree(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.parents = [tree_parents(workers, t) for t in (0, 1)]
        self.children = [tree_children(p) for p in self.parents]
        self.scratch = [Scratch(), Scratch()]

    def _sync(self, flat, op):
        halves = chunk_bounds(flat.numel(), 2)  # half t travels on tree t
        pieces = [[(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, self.config.chunks)] for lo, hi in halves]
        me, sends = self.rank, []
        for phase, c in schedule(self.config.chunks):
            for tree in (0, 1):
                lo, hi = pieces[tree][c]
                if hi == lo:
                    continue
                parent, children = self.parents[tree][me], self.children[tree][me]
                if phase == "reduce":
                    # up the tree: the children's partial sums of chunk c come in, ours goes to the parent
                    incoming = self.scratch[tree].get((hi - lo) * max(len(children), 1), flat)
                    bufs = [incoming[i * (hi - lo):(i + 1) * (hi - lo)] for i in range(len(children))]
                    for handle in [self.comm.irecv(buf, child) for buf, child in zip(bufs, children)]:
                        handle.wait()
                    for buf in bufs:  # in child order: the same sum whatever arrived first
                        reduce_into(flat[lo:hi], buf, op)
                    if parent is None:
                        finish_reduction(flat[lo:hi], op, self.workers)  # the root: mean divided once
                    else:
                        sends.append(self.comm.isend(flat[lo:hi], parent))
                else:
                    # down the tree: the root's result of chunk c comes from the parent, goes on to the children
                    if parent is not None:
                        self.comm.recv(flat[lo:hi], parent)
                    sends += [self.comm.isend(flat[lo:hi], child) for child in children]
        for handle in sends:
            handle.wait()


@dataclass(frozen=True)
class DoubleBinaryTreeConfig(StrategyConfig):
    name = "double_binary_tree"
    summary = "NCCL's double binary tree: two complementary trees, half the array each, pipelined in chunks"
    runtime = DoubleBinaryTree
    variants = ({"chunks": 1}, {"chunks": 4})
    chunks: int = 4

    def validate(self):
        if isinstance(self.chunks, bool) or not isinstance(self.chunks, int) or self.chunks < 1:
            raise ValueError(f"double_binary_tree chunks = {self.chunks!r}: expected an integer >= 1 (pipeline "
                             f"chunks per half of the array)")

    def levels(self, workers: int, numel: int, itemsize: int = 4, ranks_per_node: int = 1) -> dict:
        """Per rank, per level: bytes sent and received inside its node ('intra') and through its node's NIC
        ('nic'), ranks k*j .. k*j+k-1 being node j: every tree edge carries its half up once and down once."""
        k, n = ranks_per_node, workers
        totals = {level: [[0, 0, 0, 0] for _ in range(n)] for level in ("intra", "nic")}
        for tree, (lo, hi) in enumerate(chunk_bounds(numel, 2)):
            sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, self.chunks)]
            for child, parent in enumerate(tree_parents(n, tree)):
                if parent is None:
                    continue
                level = "intra" if child // k == parent // k else "nic"
                for a, b in ((child, parent), (parent, child)):  # up in the reduce, down in the broadcast
                    totals[level][a][0] += sum(sizes)
                    totals[level][a][2] += nonempty(*sizes)
                    totals[level][b][1] += sum(sizes)
                    totals[level][b][3] += nonempty(*sizes)
        return {level: [RankTraffic("worker", *t) for t in ranks] for level, ranks in totals.items()}

    def traffic(self, workers, numel, itemsize=4):
        n = workers
        sent = [[] for _ in range(n)]
        recv = [[] for _ in range(n)]
        depth = 0
        for tree, (lo, hi) in enumerate(chunk_bounds(numel, 2)):
            parents = tree_parents(n, tree)
            children = tree_children(parents)
            sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, self.chunks)]
            for rank in range(n):
                has_parent = parents[rank] is not None
                for size in sizes:  # reduce: one to the parent, one from each child; broadcast: the reverse
                    sent[rank] += [size] * (has_parent + len(children[rank]))
                    recv[rank] += [size] * (len(children[rank]) + has_parent)
            depth = max(depth, max(_depth(parents, r) for r in range(n)))
        ranks = tuple(RankTraffic("worker", sum(s), sum(r), nonempty(*s), nonempty(*r)) for s, r in zip(sent, recv))
        # pipelined: the deepest leaf's chunk goes up and down (2 x depth hops), the other chunks follow one step
        # behind each; the busiest NIC moves its own bytes (it sends and receives at once)
        chunk = max((b - a for lo, hi in chunk_bounds(numel, 2) for a, b in chunk_bounds(hi - lo, self.chunks)),
                    default=0) * itemsize
        busiest = max((max(r.bytes_sent, r.bytes_recv) for r in ranks), default=0)
        rounds = 2 * depth + (self.chunks - 1) if n > 1 else 0
        path = busiest + max(2 * depth - 2, 0) * chunk if n > 1 else 0
        return Traffic(ranks, rounds=rounds, path_bytes=path)


def _depth(parents: list[int | None], rank: int) -> int:
    hops = 0
    while parents[rank] is not None:
        rank, hops = parents[rank], hops + 1
    return hops
