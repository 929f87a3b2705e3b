"""Double binary tree allreduce (NCCL 2.4): two complementary binary trees, each reducing and broadcasting half.

Tree 0 is NCCL's btree rooted at 0 (ncclGetBtree: indices alternate between inner nodes and leaves); tree 1 is
its mirror (m even: index i plays m-1-i) or its shift by one (m odd: i plays i-1), so an index that is an inner
node in one tree is mostly a leaf in the other: O(log m) depth, about the whole array in and out of each index
per phase. Half h of the array travels on tree h, cut into `chunks` pipeline chunks.

On nodes of `ranks_per_node` = k ranks (ranks k*j .. k*j+k-1 are node j, the last node may be short) the trees
are built as NCCL builds them (graph/connect.cc, pattern TREE): over the m = ceil(n/k) node indices, with the
node's ranks in a chain hanging off the node's place in the tree. The chain's head (the node's first rank in
tree 0, its last in tree 1) talks to the parent node's head and the child nodes' heads; every other rank's parent
is the rank before it in the chain. So each tree edge between nodes leaves one NIC, and a node's NIC carries its
node's tree edges only (about 2 S each way, the flat version's per-rank figure). With k = 1 the chain is the rank
alone: the trees over ranks, as before.

The pipeline: every message has a slot (a chunk c of tree t goes up from depth d in slot c + D_t - d and down
from depth d in slot c + D_t + d, D_t the tree's depth), and every rank walks its steps in slot order (ties:
tree, then reduce before broadcast). A receive is in the slot after its send, so both ends of a pair see its
messages in one order and while chunk c goes up a tree the chunks before it come down. A rank posts all its
receives first (the children's partial sums in a scratch of its children x the half, per tree), and its sends of
a slot leave only once its sends of the slot before have: eager sends of later slots would otherwise share the
NIC with the chunk a peer is waiting for (on SimGrid that made 4 chunks slower than 1). Each rank waits only for its
own slot before and its data, not for every rank's slot before: a rank's slot may spill into the next or run ahead
of it, so the price replays the schedule (replay_seconds, strategies/cost_replay.py) where it has up to
REPLAY_MESSAGES messages, and beyond sums each slot's busiest port (slot_levels; within 2% of SimGrid at 4 chunks).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from strategies.base import MAX_MESSAGES, RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds, nonempty
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
    """Every index's parent in tree 0 (the btree) or tree 1 (mirror for even n, shift by one for odd n)."""
    if tree == 0:
        return [btree_parent(n, r) for r in range(n)]
    if n % 2:  # shift: index r plays r - 1 of the btree
        return [None if (p := btree_parent(n, (r - 1) % n)) is None else (p + 1) % n for r in range(n)]
    return [None if (p := btree_parent(n, n - 1 - r)) is None else n - 1 - p for r in range(n)]  # mirror


def node_chains(n: int, k: int, tree: int) -> list[list[int]]:
    """Each node's ranks in chain order for `tree`: ascending in tree 0, descending in tree 1 (the head first)."""
    nodes = [list(range(lo, min(lo + k, n))) for lo in range(0, n, k)]
    return nodes if tree == 0 else [node[::-1] for node in nodes]


def node_tree_parents(n: int, k: int, tree: int) -> list[int | None]:
    """Every rank's parent in `tree` over n ranks in nodes of k: a chain head's parent is the head of its node's
    parent node (tree_parents over the node indices), any other rank's the rank before it in its node's chain.
    k = 1: tree_parents(n, tree)."""
    chains = node_chains(n, k, tree)
    up = tree_parents(len(chains), tree)
    parents: list[int | None] = [None] * n
    for node, chain in enumerate(chains):
        parents[chain[0]] = None if up[node] is None else chains[up[node]][0]
        for before, rank in zip(chain, chain[1:]):
            parents[rank] = before
    return parents


def tree_children(parents: list[int | None]) -> list[list[int]]:
    children: list[list[int]] = [[] for _ in parents]
    for rank, parent in enumerate(parents):
        if parent is not None:
            children[parent].append(rank)
    return children


def depths(parents: list[int | None]) -> list[int]:
    """Every rank's hops to the root, O(n): a rank's depth is its parent's plus one (each chain walked once)."""
    out: list[int | None] = [None] * len(parents)
    for rank in range(len(parents)):
        path = []
        while out[rank] is None and parents[rank] is not None:
            path.append(rank)
            rank = parents[rank]
        hops = 0 if out[rank] is None else out[rank]
        out[rank] = hops
        for below in reversed(path):
            hops += 1
            out[below] = hops
    return out


@functools.lru_cache(maxsize=64)
def port_profiles(n: int, tree_k: int, port_k: int) -> tuple[tuple, tuple, int]:
    """The trees' messages by port, with no sizes in them (so every chunk count and buffer reuses them): trees over
    n ranks in nodes of tree_k, ports in nodes of port_k. A port's profile is its (tree, slot offset, messages)
    triples: in tree t it carries that many of chunk c's messages in slot c + offset. Returns the distinct NIC
    port profiles (a node's, sent or received, its ranks summed), the distinct rank port profiles and the deepest
    tree's depth; ports with equal profiles carry equal bytes in every slot, so each profile is priced once (each
    level's profiles as _profile_arrays gives them)."""
    ports: dict[tuple[str, int, int], dict[tuple[int, int], int]] = {}
    top_all = 0
    for tree in (0, 1):
        parents = node_tree_parents(n, tree_k, tree)
        depth = depths(parents)
        top = max(depth, default=0)
        top_all = max(top_all, top)
        for child, parent in enumerate(parents):
            if parent is None:
                continue
            nic = child // port_k != parent // port_k
            # up: sent in slot c + D - depth(child); down: sent in slot c + D + depth(parent)
            for offset, src, dst in ((top - depth[child], child, parent), (top + depth[parent], parent, child)):
                # a message between nodes crosses both ranks' own ports into their nodes too (the nodes
                # platform's route: port, NIC, switch, NIC, port), beside their intra-node messages
                for port in ((("nic", src // port_k, 0), ("nic", dst // port_k, 1)) if nic else ()) + \
                        (("intra", src, 0), ("intra", dst, 1)):
                    profile = ports.setdefault(port, {})
                    profile[tree, offset] = profile.get((tree, offset), 0) + 1
    return tuple(_profile_arrays({tuple(sorted(p.items())) for (lv, _, _), p in ports.items() if lv == level})
                 for level in ("nic", "intra")) + (top_all,)


def _profile_arrays(profiles: set) -> tuple:
    """(how many profiles, per tree the (profile, slot offset, messages) arrays of their triples)."""
    entries = [[(u, off, cnt) for u, profile in enumerate(sorted(profiles)) for (t, off), cnt in profile if t == tree]
               for tree in (0, 1)]
    return len(profiles), tuple(np.array(e, dtype=np.int64).reshape(-1, 3).T for e in entries)


def _slot_bytes(profiles: tuple, sizes: list[list[int]], slots: int) -> np.ndarray:
    """Per slot, the busiest of these port profiles' bytes (chunk c of tree t is sizes[t][c] bytes)."""
    count, trees = profiles
    grid = np.zeros((max(count, 1), slots), dtype=np.int64)
    for (rows, offsets, messages), chunk_sizes in zip(trees, sizes):
        chunk = np.arange(len(chunk_sizes))
        # a profile's entry carries chunk c in slot offset + c; entries of one profile may meet in a slot
        np.add.at(grid, (rows[:, None], offsets[:, None] + chunk), messages[:, None] * np.array(chunk_sizes,
                                                                                                  dtype=np.int64))
    return grid.max(axis=0)


@functools.lru_cache(maxsize=64)
def tree_degrees(n: int, k: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """Per rank its edges (parent and children) in tree 0 and tree 1, over n ranks in nodes of k, and the deeper
    tree's depth: traffic's counts, cached (every chunk count and buffer reuses them)."""
    edges, depth = [], 0
    for tree in (0, 1):
        parents = node_tree_parents(n, k, tree)
        edges.append([(p is not None) + len(c) for p, c in zip(parents, tree_children(parents))])
        depth = max(depth, max(depths(parents), default=0))
    return tuple(zip(*edges)), depth


def schedule(parents: list[list[int | None]], rank: int, chunks: int) -> list[tuple[int, str, int, int]]:
    """The (slot, phase, tree, chunk) steps `rank` walks, in slot order: reduce chunk c of tree t in slot
    c + D_t - d (receive the children's, send to the parent), broadcast it in slot c + D_t + d (receive from the
    parent, send to the children), d the rank's depth in tree t and D_t the tree's depth."""
    steps = []
    for tree, tree_parents_ in enumerate(parents):
        depth = depths(tree_parents_)
        top, d = max(depth), depth[rank]
        for c in range(chunks):
            steps.append((c + top - d, tree, 0, c))
            steps.append((c + top + d, tree, 1, c))
    return [(slot, "reduce" if phase == 0 else "broadcast", tree, c) for slot, tree, phase, c in sorted(steps)]


# the replay's size limit: beyond it the price is the slots' sum (within 2% of SimGrid there, 16 ranks and more)
REPLAY_MESSAGES = 1_000


def replay_program(parents: list[list[int | None]], sizes: list[list[int]], port_k: int):
    """The ranks' programs as DoubleBinaryTree._sync runs them, for cost_replay.replay: per rank its steps in slot
    order (an empty chunk's step skipped, as the runtime skips it), each step's waits (at a new slot its sends of
    the slot before; the children's partial sums up, the parent's result down) and sends; each message's links: one
    rank per NIC (port_k = 1) its sender's upload and its receiver's download; on nodes of port_k both ranks' ports,
    and both NICs when it leaves its node. Returns (programs, messages); links 2r, 2r + 1: rank r's port (up,
    down); 2n + 2j, 2n + 2j + 1: node j's NIC."""
    from strategies.cost_replay import Message, Step

    n = len(parents[0])
    children = [tree_children(p) for p in parents]
    ids: dict[tuple, int] = {}
    messages: list[Message] = []

    def message(tree: int, phase: int, c: int, src: int, dst: int) -> int:
        key = (tree, phase, c, src, dst)
        if key not in ids:
            ids[key] = len(messages)
            links = (2 * src, 2 * dst + 1)
            if port_k > 1 and src // port_k != dst // port_k:  # the route: port, NIC, switch, NIC, port
                links += (2 * n + 2 * (src // port_k), 2 * n + 2 * (dst // port_k) + 1)
            messages.append(Message(src, dst, sizes[tree][c], links))
        return ids[key]

    programs = []
    for rank in range(n):
        steps, current, sent = [], None, []
        for slot, phase, tree, c in schedule(parents, rank, len(sizes[0])):
            if not sizes[tree][c]:
                continue
            parent, kids = parents[tree][rank], children[tree][rank]
            if phase == "reduce":  # the children's partial sums in, ours up
                receives = tuple(message(tree, 0, c, child, rank) for child in kids)
                sends = () if parent is None else (message(tree, 0, c, rank, parent),)
            else:  # the result from the parent, on to the children
                receives = () if parent is None else (message(tree, 1, c, parent, rank),)
                sends = tuple(message(tree, 1, c, rank, child) for child in kids)
            if slot != current:  # a slot's sends leave once the slot before's have arrived
                receives, current, sent = tuple(sent) + receives, slot, []
            sent.extend(sends)
            steps.append(Step(receives, sends))
        programs.append(steps)
    return programs, messages


@functools.lru_cache(maxsize=256)
def _programs(config, workers: int, numel: int, itemsize: int, port_k: int):
    """replay_program for a config, cached: a bandwidth sweep (the map, a bisection) replays the same programs."""
    sizes = [[(b - a) * itemsize for a, b in chunk_bounds(hi - lo, config.chunks)] for lo, hi in chunk_bounds(numel, 2)]
    return replay_program(config.parents(workers), sizes, port_k)


class DoubleBinaryTree(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.parents = [node_tree_parents(workers, config.ranks_per_node, t) for t in (0, 1)]
        self.children = [tree_children(p) for p in self.parents]
        self.steps = schedule(self.parents, self.rank, config.chunks) if self.rank < workers else []
        self.scratch = [Scratch(), Scratch()]

    def _sync(self, flat, op):
        halves = chunk_bounds(flat.numel(), 2)  # half t travels on tree t
        pieces = [[(lo + a, lo + b) for a, b in chunk_bounds(hi - lo, self.config.chunks)] for lo, hi in halves]
        me = self.rank
        # every receive posted at once, in slot order (each pair's order): the children's partial sums of a
        # chunk land in the tree's scratch (child i's at i x the half), the parent's result in place
        scratch = [self.scratch[t].get((hi - lo) * len(self.children[t][me]), flat) for t, (lo, hi) in
                   enumerate(halves)]
        posted = []
        for _, phase, tree, c in self.steps:
            lo, hi = pieces[tree][c]
            parent, children = self.parents[tree][me], self.children[tree][me]
            if hi == lo:
                posted.append([])
            elif phase == "reduce":
                half, at = halves[tree][1] - halves[tree][0], lo - halves[tree][0]
                bufs = [scratch[tree][i * half + at:i * half + at + hi - lo] for i in range(len(children))]
                posted.append([(buf, self.comm.irecv(buf, child)) for buf, child in zip(bufs, children)])
            else:
                posted.append([] if parent is None else [(flat[lo:hi], self.comm.irecv(flat[lo:hi], parent))])
        # a slot's sends leave once the slot before's have: a chunk a peer waits for does not share the NIC
        # with chunks it will need only later
        sends, current = [], None
        for (slot, phase, tree, c), receives in zip(self.steps, posted):
            lo, hi = pieces[tree][c]
            if hi == lo:
                continue
            if slot != current:
                for handle in sends:
                    handle.wait()
                sends, current = [], slot
            parent, children = self.parents[tree][me], self.children[tree][me]
            for _, handle in receives:
                handle.wait()
            if phase == "reduce":
                # up the tree: the children's partial sums of chunk c are in; ours goes to the parent
                for buf, _ in receives:  # in child order: the same sum whatever arrived first
                    reduce_into(flat[lo:hi], buf, op)
                if parent is None:
                    finish_reduction(flat[lo:hi], op, self.workers)  # the root: mean divided once
                else:
                    sends.append(self.comm.isend(flat[lo:hi], parent))
            else:
                # down the tree: the root's result of chunk c came from the parent, goes on to the children
                sends += [self.comm.isend(flat[lo:hi], child) for child in children]
        for handle in sends:
            handle.wait()


# per chunk of each half a rank sends and receives at most 3 + 3 messages (parent and two children, reduce and
# broadcast), in both trees
MESSAGES_PER_CHUNK = 12
MAX_CHUNKS = MAX_MESSAGES // MESSAGES_PER_CHUNK


@dataclass(frozen=True)
class DoubleBinaryTreeConfig(StrategyConfig):
    name = "double_binary_tree"
    summary = ("NCCL's double binary tree: two complementary trees (over nodes, a chain in each, with "
               "ranks_per_node > 1), half the array each, pipelined in chunks")
    runtime = DoubleBinaryTree
    variants = ({"chunks": 1}, {"chunks": 4, "ranks_per_node": 2})
    chunks: int = 4
    ranks_per_node: int = 1

    def validate(self):
        if isinstance(self.chunks, bool) or not isinstance(self.chunks, int) or not 1 <= self.chunks <= MAX_CHUNKS:
            raise ValueError(f"double_binary_tree chunks = {self.chunks!r}: expected an integer from 1 to "
                             f"{MAX_CHUNKS:,} (pipeline chunks per half of the array; each rank sends and receives "
                             f"up to {MESSAGES_PER_CHUNK} messages per chunk, at most {MAX_MESSAGES:,} in all)")
        k = self.ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"double_binary_tree ranks_per_node = {k!r}: expected an integer >= 1 (1: trees over "
                             f"the ranks)")

    def messages(self, workers, numel, itemsize=4):
        return MESSAGES_PER_CHUNK * self.chunks

    def fewer_messages(self, workers, numel, itemsize=4):
        return f"chunks from 1 to {MAX_CHUNKS:,}"

    def bind(self, comm, workers):
        # trees over the ranks (k = 1) run on any placement; trees over nodes of k only where nodes are of k
        if self.ranks_per_node > 1 and comm.ranks_per_node not in (1, self.ranks_per_node):
            raise ValueError(f"double_binary_tree ranks_per_node = {self.ranks_per_node}, but the run places "
                             f"{comm.ranks_per_node} ranks per node: give the strategy the run's ranks_per_node")
        return super().bind(comm, workers)

    def parents(self, workers: int) -> list[list[int | None]]:
        """Every rank's parent in tree 0 and tree 1."""
        return [node_tree_parents(workers, self.ranks_per_node, t) for t in (0, 1)]

    def levels(self, workers: int, numel: int, itemsize: int = 4, ranks_per_node: int | None = None) -> dict:
        """Per rank, per level: bytes sent and received inside its node ('intra') and through its node's NIC
        ('nic'), the nodes being of `ranks_per_node` ranks (default: the strategy's own): every tree edge
        carries its half up once and down once."""
        k, n = ranks_per_node or self.ranks_per_node, workers
        totals = {level: [[0, 0, 0, 0] for _ in range(n)] for level in ("intra", "nic")}
        for parents, (lo, hi) in zip(self.parents(n), chunk_bounds(numel, 2)):
            sizes = [(b - a) * itemsize for a, b in chunk_bounds(hi - lo, self.chunks)]
            nbytes, count = sum(sizes), nonempty(*sizes)
            for child, parent in enumerate(parents):
                if parent is None:
                    continue
                level = "intra" if child // k == parent // k else "nic"
                for a, b in ((child, parent), (parent, child)):  # up in the reduce, down in the broadcast
                    totals[level][a][0] += nbytes
                    totals[level][a][2] += count
                    totals[level][b][1] += nbytes
                    totals[level][b][3] += count
        return {level: [RankTraffic("worker", *t) for t in ranks] for level, ranks in totals.items()}

    def chunk_bytes(self, numel: int, itemsize: int = 4) -> int:
        """The largest pipeline chunk's bytes."""
        return max((b - a for lo, hi in chunk_bounds(numel, 2) for a, b in chunk_bounds(hi - lo, self.chunks)),
                   default=0) * itemsize

    def slot_levels(self, workers: int, numel: int, itemsize: int = 4,
                    ranks_per_node: int | None = None) -> list[tuple[int, int]]:
        """Per slot of the pipeline (the slot a message is sent in, see schedule), the busiest node NIC's bytes
        (sent or received, the node's ranks summed) and the busiest rank port's bytes (its intra-node messages and
        its messages between nodes, which cross its port too), in nodes of
        `ranks_per_node` (default: the strategy's own). A slot's sends leave when the slot before's have, so
        the slots follow one another: the pipeline's fill and drain are the slots with less than the full load."""
        k, n = ranks_per_node or self.ranks_per_node, workers
        nic, intra, top = port_profiles(n, self.ranks_per_node, k)
        if not nic[0] and not intra[0]:
            return []
        # every tree's slots start at 0 (its deepest child's first chunk) and end at its deepest parent's last
        slots = self.chunks + 2 * top - 1
        sizes = [[(b - a) * itemsize for a, b in chunk_bounds(hi - lo, self.chunks)]
                 for lo, hi in chunk_bounds(numel, 2)]
        return [(int(b), int(i)) for b, i in zip(_slot_bytes(nic, sizes, slots), _slot_bytes(intra, sizes, slots))]

    def replay_seconds(self, workers: int, numel: int, itemsize: int = 4, ranks_per_node: int = 1,
                       bandwidth: float = 1.0, intra_bandwidth: float = math.inf) -> float | None:
        """The pipeline's seconds without latency, its schedule replayed (cost_replay.replay) with ranks in nodes of
        `ranks_per_node` (1: a NIC per rank at `bandwidth`; more: the node's NIC at `bandwidth`, each rank's port
        at `intra_bandwidth`); None where it has more than REPLAY_MESSAGES messages (the caller sums the slots).
        The slot sum assumes every rank's slot s starts once every slot s - 1 has ended: at 3 ranks a rank's two
        chunks to one peer spill into the next slot (16 chunk times, not 15); on one node of 3 the chains' middle
        rank sends and receives out of step (18, not 20)."""
        from strategies.cost_replay import replay

        n = workers
        if n < 2 or 4 * (n - 1) * self.chunks > REPLAY_MESSAGES:
            return None
        programs, messages = _programs(self, n, numel, itemsize, ranks_per_node)
        if ranks_per_node == 1:
            capacity = [bandwidth] * (2 * n)
        else:
            nodes = -(-n // ranks_per_node)
            capacity = [intra_bandwidth] * (2 * n) + [bandwidth] * (2 * nodes)
        return replay(programs, messages, capacity)

    def replayed_path_bytes(self, workers: int, numel: int, itemsize: int = 4) -> float | None:
        """The critical path's bytes, one rank per NIC: the schedule replayed at one byte per second (None beyond
        REPLAY_MESSAGES: traffic()'s sum of the slots)."""
        return self.replay_seconds(workers, numel, itemsize, 1, 1.0)

    def traffic(self, workers, numel, itemsize=4):
        n = workers
        degrees, depth = tree_degrees(n, self.ranks_per_node)
        halves = [[(b - a) * itemsize for a, b in chunk_bounds(hi - lo, self.chunks)] for lo, hi in
                  chunk_bounds(numel, 2)]
        nbytes, count = [sum(sizes) for sizes in halves], [nonempty(*sizes) for sizes in halves]
        # reduce: one to the parent, one from each child; broadcast: the reverse (as many sent as received)
        ranks, made = [], {}
        for pair in degrees:
            if pair not in made:
                sent = sum(d * b for d, b in zip(pair, nbytes))
                msgs = sum(d * c for d, c in zip(pair, count))
                made[pair] = RankTraffic("worker", sent, sent, msgs, msgs)
            ranks.append(made[pair])
        ranks = tuple(ranks)
        # pipelined in slots, one after another (a slot's sends leave once the slot before's have): the path is
        # each slot's busiest NIC (a rank's sends or receives in that slot, every rank its own NIC), so the fill
        # and drain cost what they move; SimGrid agrees at 5, 8, 16 ranks where the busiest rank's bytes plus
        # 2 depth - 2 chunks (the path before) was 5-14% short
        rounds = 2 * depth + (self.chunks - 1) if n > 1 else 0
        path = sum(b for b, _ in self.slot_levels(n, numel, itemsize, ranks_per_node=1)) if n > 1 else 0
        return Traffic(ranks, rounds=rounds, path_bytes=path)
