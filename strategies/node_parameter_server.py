"""Node-aware parameter server (BytePS's "a PS of nodes, not of GPUs"): sum inside the node first, push and pull
across nodes, share the result inside the node.

Nodes are ranks k*j .. k*j+k-1 (comm.node_of; the last node may be short), laid out as hierarchical.Layout: the
array is cut into k chunks, grouped into r contiguous slices in a node of r ranks. On the wire, in this order:
  1. inside each node: a ring reduce-scatter over the node's slices; local position p then owns slice (p + 1)
     mod r, the node's sum of it (every rank of a full node owns one chunk, so all of them push at once and the
     node's NIC carries the node's sum once: S out, where a flat PS of ranks sends k S);
  2. across nodes, every chunk at once (a short node's ranks own several, pushed together): chunk c's owners, one
     per node (Layout.group(c)), push the `servers` shards of it to the servers, each server sums the node sums it
     gets in node order (every rank then holds the same bits), divides once for a mean and replies to every owner;
  3. inside each node: a ring all-gather of the slices.
Servers: `placement = "colocated"` (default) runs shard s of chunk c on the owner in node s mod m (its own push
and pull cost no bytes; per node NIC 2(m-1)/m S each way, a ring's), `"dedicated"` on server rank workers + s (its
own NIC; per node NIC S each way, BytePS's optimum with servers >= nodes). Dedicated server ranks follow the
workers in nodes of k too (the network places rank i in node i // k): k servers share a server node's NIC, so
BytePS's optimum needs as many server nodes as worker nodes (servers = workers); and they need workers to be a
multiple of ranks_per_node, else the first server would share the last worker node's NIC (colocation, not
dedication).

The servers sum (BytePS's summation mode: the workers run the optimizer, role GRADIENTS), partition by partition
(`partition_mb`, BytePS's 4 MiB): a server answers each partition once every owner's push of it is in, so the
replies stream while later pushes arrive (without partitions a lone server's node would take every push, then
send every reply: twice the NIC time). With ranks_per_node = 1 it is parameter_server in summation mode: the same
bytes, messages and bits (tests/strategies/test_nodes.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strategies.base import GRADIENTS, MAX_MESSAGES, RankTraffic, Strategy, StrategyConfig, Traffic, chunk_bounds
from strategies.hierarchical import Layout, intra_path, intra_traffic
from strategies.ops import check_op, finish_reduction, reduce_into, wire_dtype
from strategies.partitions import check_partition_mb, least_partition_mb, partition_count, partitions
from strategies.primitives import Scratch, ring_allgather, ring_reduce_scatter

PLACEMENTS = ("colocated", "dedicated")


@dataclass(frozen=True)
class Plan:
    """Where every partition of every shard of every chunk is served: the across-node step workers and servers walk.

    Chunk c is cut into `servers` shards and every shard into partitions of at most partition_mb MiB
    (parameter_server.partitions): a server answers a partition as soon as every owner's push of it is in, so its
    replies stream while later pushes arrive (full duplex), as BytePS does."""

    workers: int
    k: int
    servers: int
    dedicated: bool
    partition_mb: float

    def host(self, s: int, group: list[int]) -> int:
        return self.workers + s if self.dedicated else group[s % len(group)]

    def steps(self, numel: int, itemsize: int) -> list[tuple[list[int], list[list[tuple[int, int]]]]]:
        """Per non-empty chunk, in increasing c: its group (one owner per node) and per shard its partitions."""
        layout, out = Layout(self.workers, self.k), []
        for c, (lo, hi) in enumerate(chunk_bounds(numel, self.k)):
            if hi > lo:
                parts = partitions(hi - lo, self.servers, itemsize, self.partition_mb)
                out.append((layout.group(c), [[(lo + a, lo + b) for a, b in p] for p in parts]))
        return out

    @staticmethod
    def rounds(parts: list[list[tuple[int, int]]]) -> list[tuple[int, int]]:
        """(shard, partition) in wire order: partition by partition, shards in increasing s within each."""
        return [(s, r) for r in range(max((len(p) for p in parts), default=0)) for s in range(len(parts))
                if r < len(parts[s])]

    def push_order(self, parts: list[list[tuple[int, int]]], group: list[int], member: int) -> list[tuple[int, int]]:
        """What `member` pushes: partition by partition, hosts visited from its own position on (spreads the
        incast); to any one host in wire order, the order that host waits for them."""
        me, hosts = group.index(member), len(group) if not self.dedicated else self.servers
        mine = [(s, r) for s, r in self.rounds(parts) if self.host(s, group) != member]
        return sorted(mine, key=lambda sr: (sr[1], ((sr[0] % hosts) - me) % hosts, sr[0]))


class NodeParameterServer(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.plan = Plan(workers, config.ranks_per_node, config.servers, config.placement == "dedicated",
                         config.partition_mb)
        # not `layout`: the training loop takes a runtime's layout() for PowerSGD's per-parameter shapes
        self.node_layout = Layout(workers, config.ranks_per_node)
        self.node = None if self.is_server else next(n for n in self.node_layout.nodes() if comm.rank in n)
        self.server = comm.rank - workers if self.is_server else None
        self.scratch, self.incoming = Scratch(), Scratch()

    # -- worker ranks ------------------------------------------------------------------------------------

    def _sync(self, flat, op):
        slices = self.node_layout.slices(flat.numel(), len(self.node))
        # 1. inside the node: ring reduce-scatter; position p keeps the node's sum of slice (p + 1) mod r
        owned = ring_reduce_scatter(self.comm, flat, slices, op, self.node, self.scratch)
        # 2. across nodes: every chunk this rank owns is pushed to its servers and pulled back, all at once
        mine = [(group, parts) for group, parts in self.plan.steps(flat.numel(), flat.element_size())
                if self.rank in group]
        if mine:
            self._push_pull(flat, mine, op)
        # 3. inside the node: ring all-gather, every rank ends with the whole array
        ring_allgather(self.comm, flat, slices, self.node, owned)

    def _push_pull(self, flat, mine, op):
        """Push every partition of every chunk this rank owns (a short node's rank owns several), serve the ones
        hosted here, then take the replies; each in increasing chunk, in the order the plan gives (a pair's
        messages match in posting order). Chunk by chunk, a short node's rank pushed its second chunk only once
        its first was answered, which waits for every full node's pushes (1.13-1.50x the model at n = 8-64 in
        nodes of 3); posted at once, its NIC streams all of them."""
        plan = self.plan
        pushes = [self.comm.isend(flat[slice(*parts[s][r])], plan.host(s, group))
                  for group, parts in mine for s, r in plan.push_order(parts, group, self.rank)]
        # colocated: serve the partitions hosted here as the other owners' pushes come in, then take the replies
        replies = []
        for group, parts in mine:
            for s, r in plan.rounds(parts):
                if plan.host(s, group) == self.rank:
                    lo, hi = parts[s][r]
                    replies += self._serve_partition(flat[lo:hi], group, op, local=flat[lo:hi])
        for group, parts in mine:
            for s, r in plan.rounds(parts):
                if plan.host(s, group) != self.rank:
                    self.comm.recv(flat[slice(*parts[s][r])], plan.host(s, group))
        for handle in pushes + replies:
            handle.wait()

    def _serve_partition(self, like, group, op, local=None):
        """Sum one partition's node sums in node order (the owner's own `local` moves no bytes), finish the mean,
        answer every other owner at once; returns the reply sends."""
        size = like.numel()
        peers = [w for w in group if w != self.rank]
        incoming = self.incoming.get(size * max(len(peers), 1), like)
        rows = {w: incoming[i * size:(i + 1) * size] for i, w in enumerate(peers)}
        for handle in [self.comm.irecv(rows[w], w) for w in peers]:
            handle.wait()
        ordered = [local if w == self.rank else rows[w] for w in group]
        reduced = ordered[0].clone()
        for row in ordered[1:]:  # node order: the same bits whichever push came first
            reduce_into(reduced, row, op)
        finish_reduction(reduced, op, self.workers)
        if local is not None:
            local.copy_(reduced)
            reduced = local
        me = group.index(self.rank) if self.rank in group else 0
        fan_out = sorted(peers, key=lambda w: ((group.index(w) - me) % len(group), w))
        return [self.comm.isend(reduced, w) for w in fan_out]

    # -- dedicated server ranks ---------------------------------------------------------------------------

    def serve(self, numel, dtype, op="mean", update=None, device="cpu"):
        """Take this server's shard of every chunk, partition by partition, from the chunk's owners, sum it,
        answer it (summation mode: `update` is not used, the workers step)."""
        check_op(op, dtype, self.config.ops)
        self._check_size(numel, dtype.itemsize)
        like = torch.empty(0, dtype=wire_dtype(dtype), device=device)  # as the workers send it (Strategy.sync)
        if numel == 0:
            return
        # partition r of every chunk before partition r + 1 of any: the chunks' owners push at once (one per rank
        # of a node, sharing its NIC), so partition r of every chunk arrives about together; served chunk by chunk,
        # the replies of chunks 1.. would wait for chunk 0's last push, which comes with everyone's (the pushes
        # all in, then the replies: twice the NIC time). A worker's own partitions stay in its push order.
        mine = [(group, parts[self.server]) for group, parts in self.plan.steps(numel, like.element_size())]
        order = sorted(((r, c) for c, (_, part) in enumerate(mine) for r in range(len(part))))
        replies = []
        for r, c in order:  # each reply a fresh tensor: earlier sends may still be in flight
            group, part = mine[c]
            lo, hi = part[r]
            replies += self._serve_partition(like.new_empty(hi - lo), group, op)
        for handle in replies:
            handle.wait()


@dataclass(frozen=True)
class NodeParameterServerConfig(StrategyConfig):
    name = "node_parameter_server"
    summary = ("BytePS's PS of nodes: reduce-scatter in each node of ranks_per_node ranks, every rank pushes its "
               "node's sum of a slice to the servers (colocated or dedicated) and pulls, all-gather in the node")
    role = GRADIENTS  # summation servers: the workers run the optimizer
    runtime = NodeParameterServer
    variants = ({"ranks_per_node": 2}, {"ranks_per_node": 3, "servers": 2, "partition_mb": 1e-4},
                {"ranks_per_node": 1, "servers": 2, "placement": "dedicated", "partition_mb": 3e-4})
    ranks_per_node: int = 2
    servers: int = 1
    placement: str = "colocated"
    partition_mb: float = 4.0

    def validate(self):
        k = self.ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"node_parameter_server ranks_per_node = {k!r}: expected an integer >= 1")
        if isinstance(self.servers, bool) or not isinstance(self.servers, int) or self.servers < 1:
            raise ValueError(f"node_parameter_server servers = {self.servers!r}: expected an integer >= 1")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"node_parameter_server placement = {self.placement!r}: accepted are "
                             f"{', '.join(map(repr, PLACEMENTS))}")
        check_partition_mb(f"node_parameter_server partition_mb = {self.partition_mb!r}", self.partition_mb)

    def messages(self, workers, numel, itemsize=4):
        """The owner of a node's chunk (1/k of the array) pushes and gets back each of its partitions; the two ring
        phases inside the node send and receive k - 1 messages each way."""
        chunk = -(-numel // self.ranks_per_node)
        return 2 * partition_count(chunk, self.servers, itemsize, self.partition_mb) + 4 * (self.ranks_per_node - 1)

    def fewer_messages(self, workers, numel, itemsize=4):
        chunk = -(-numel // self.ranks_per_node)
        return least_partition_mb(chunk, self.servers, itemsize, MAX_MESSAGES // 2 - 2 * self.ranks_per_node)

    def check_workers(self, workers: int) -> None:
        if self.placement == "dedicated" and self.ranks_per_node > 1 and workers % self.ranks_per_node:
            raise ValueError(f"node_parameter_server placement = 'dedicated' with workers = {workers} and "
                             f"ranks_per_node = {self.ranks_per_node}: dedicated servers take the nodes after the "
                             f"workers', so workers must be a multiple of ranks_per_node (accepted: such workers, "
                             f"or placement = 'colocated')")

    def num_servers(self, workers):
        self.check_workers(workers)
        return self.servers if self.placement == "dedicated" else 0

    def bind(self, comm, workers):
        if comm.ranks_per_node not in (1, self.ranks_per_node):
            raise ValueError(f"node_parameter_server ranks_per_node = {self.ranks_per_node}, but the run places "
                             f"{comm.ranks_per_node} ranks per node: give the strategy the run's ranks_per_node")
        return super().bind(comm, workers)

    def levels(self, workers: int, numel: int, itemsize: int = 4) -> dict[str, list[RankTraffic]]:
        """Per rank (workers, then dedicated servers), per level: bytes and messages inside its node ('intra': the
        two ring phases) and through its node's NIC ('nic': pushes and replies; rank i is in node i // k)."""
        k, world = self.ranks_per_node, self.world_size(workers)
        plan = Plan(workers, k, self.servers, self.placement == "dedicated", self.partition_mb)
        totals = {"intra": [[0, 0, 0, 0] for _ in range(world)], "nic": [[0, 0, 0, 0] for _ in range(world)]}
        for rank, t in enumerate(intra_traffic(Layout(workers, k), numel, itemsize)):
            totals["intra"][rank] = [t.bytes_sent, t.bytes_recv, t.msgs_sent, t.msgs_recv]
        for group, parts in plan.steps(numel, itemsize):
            for s, r in plan.rounds(parts):
                (lo, hi), host = parts[s][r], plan.host(s, group)
                size = (hi - lo) * itemsize
                for member in (w for w in group if w != host and size):
                    level = totals["intra" if member // k == host // k else "nic"]
                    for src, dst in ((member, host), (host, member)):  # the push, then the reply
                        level[src][0] += size
                        level[src][2] += 1
                        level[dst][1] += size
                        level[dst][3] += 1
        roles = ["worker"] * workers + ["server"] * (world - workers)
        return {level: [RankTraffic(role, *t) for role, t in zip(roles, ranks)] for level, ranks in totals.items()}

    def node_pushes(self, workers: int, numel: int, itemsize: int = 4) -> dict[tuple[int, int], int]:
        """Bytes pushed from node to node across the NICs, {(owner's node, host's node): bytes} (rank i is in node
        i // k; each push's reply goes back the same way): the cost model's flows (strategies.cost_nodes)."""
        k = self.ranks_per_node
        plan = Plan(workers, k, self.servers, self.placement == "dedicated", self.partition_mb)
        out: dict[tuple[int, int], int] = {}
        for group, parts in plan.steps(numel, itemsize):
            for s, p in enumerate(parts):
                host, size = plan.host(s, group), sum(hi - lo for lo, hi in p) * itemsize
                for member in (w for w in group if w // k != host // k and size):
                    out[member // k, host // k] = out.get((member // k, host // k), 0) + size
        return out

    def reply_fill(self, workers: int, numel: int, itemsize: int = 4) -> int:
        """Bytes the busiest node's NIC sends after the last pushes are in: the replies of every shard's last
        partition it serves (a server answers a partition only once every owner's push of it is in), summed over
        the chunks its ranks serve, to the owners in other nodes. The cost model's pipeline fill."""
        k = self.ranks_per_node
        plan = Plan(workers, k, self.servers, self.placement == "dedicated", self.partition_mb)
        per_node: dict[int, int] = {}
        for group, parts in plan.steps(numel, itemsize):
            for s, p in enumerate(parts):
                if not p:
                    continue
                host = plan.host(s, group)
                size = (p[-1][1] - p[-1][0]) * itemsize
                away = sum(1 for w in group if w // k != host // k)
                per_node[host // k] = per_node.get(host // k, 0) + away * size
        return max(per_node.values(), default=0)

    def traffic(self, workers, numel, itemsize=4):
        levels = self.levels(workers, numel, itemsize)
        ranks = tuple(RankTraffic(a.role, a.bytes_sent + b.bytes_sent, a.bytes_recv + b.bytes_recv,
                                  a.msgs_sent + b.msgs_sent, a.msgs_recv + b.msgs_recv)
                      for a, b in zip(levels["intra"], levels["nic"]))
        # critical path: the largest node's two ring phases, then the busiest rank's pushes and replies through
        # its NIC, serialized (a server's n-fold fan-in and fan-out; a short node's owner of several chunks)
        rounds, path = intra_path(Layout(workers, self.ranks_per_node), numel, itemsize)
        rounds += max((max(t.msgs_sent, t.msgs_recv) for t in levels["nic"]), default=0)
        path += max((max(t.bytes_sent, t.bytes_recv) for t in levels["nic"]), default=0)
        return Traffic(ranks, rounds=rounds, path_bytes=path)
