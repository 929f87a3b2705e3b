"""Collective building blocks, written once over a Communicator, on any subgroup of ranks.

Every primitive takes `ranks` (the communicator ranks taking part, in group order) and works on a flat,
contiguous tensor in place. `pos` below is this rank's position in `ranks`. Strategies are composed from
these: ring = ring_reduce_scatter + ring_allgather; reduce_broadcast = a tree or flat reduce + broadcast.
"""

from __future__ import annotations

import torch

from strategies.ops import finish_reduction, reduce_into
from strategies.transport.communicator import Communicator


class Scratch:
    """A receive buffer reused across calls, grown when a bigger message comes."""

    def __init__(self):
        self._buf: torch.Tensor | None = None

    def get(self, numel: int, like: torch.Tensor) -> torch.Tensor:
        buf = self._buf
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            buf = self._buf = torch.empty(max(numel, 1), dtype=like.dtype, device=like.device)
        return buf[:numel]


# -- ring ---------------------------------------------------------------------------------------------


def ring_reduce_scatter(comm: Communicator, flat: torch.Tensor, bounds: list[tuple[int, int]], op: str,
                        ranks: list[int], scratch: Scratch) -> int:
    """n-1 rounds; returns the chunk this rank ends up owning, fully reduced: (pos + 1) mod n.

    Every receive is posted before the first send, each into its own scratch slot: a peer's send then never
    waits for this rank to get round to posting (gloo sends complete only against a posted receive), and
    round r+1's transfer overlaps round r's reduction.
    """
    n, pos = len(ranks), ranks.index(comm.rank)
    right, left = ranks[(pos + 1) % n], ranks[(pos - 1) % n]
    # round r: send chunk (pos - r) to the right, receive chunk (pos - r - 1) from the left and reduce it
    recv_chunks = [bounds[(pos - rnd - 1) % n] for rnd in range(n - 1)]
    slot = max((hi - lo for lo, hi in bounds), default=0)
    slots = scratch.get(slot * (n - 1), flat)
    incoming = [slots[rnd * slot: rnd * slot + hi - lo] for rnd, (lo, hi) in enumerate(recv_chunks)]
    pending = [comm.irecv(buf, left) for buf in incoming]
    sends = []
    for rnd in range(n - 1):
        s_lo, s_hi = bounds[(pos - rnd) % n]  # round 0: our own chunk; later: the one reduced last round
        sends.append(comm.isend(flat[s_lo:s_hi], right))
        pending[rnd].wait()
        r_lo, r_hi = recv_chunks[rnd]
        reduce_into(flat[r_lo:r_hi], incoming[rnd], op)
    for handle in sends:  # a sent chunk is not written again in these rounds: wait for the sends once, at the end
        handle.wait()
    return (pos + 1) % n


def ring_allgather(comm: Communicator, flat: torch.Tensor, bounds: list[tuple[int, int]],
                   ranks: list[int], owned: int | None = None) -> None:
    """n-1 rounds; starts with this rank owning chunk `owned` (default (pos + 1) mod n), ends with all.

    Each round's chunk lands in its own place in `flat`, so all receives are posted up front.
    """
    n, pos = len(ranks), ranks.index(comm.rank)
    right, left = ranks[(pos + 1) % n], ranks[(pos - 1) % n]
    first = (pos + 1) % n if owned is None else owned
    # round r: forward the chunk received last round (round 0: the owned one), receive the left's
    pending = [comm.irecv(flat[lo:hi], left) for lo, hi in (bounds[(first - rnd - 1) % n] for rnd in range(n - 1))]
    sends = []
    for rnd in range(n - 1):
        s_lo, s_hi = bounds[(first - rnd) % n]
        sends.append(comm.isend(flat[s_lo:s_hi], right))
        pending[rnd].wait()
    for handle in sends:
        handle.wait()


# -- every rank holding every array -------------------------------------------------------------------


def reduce_in_rank_order(flat: torch.Tensor, arrays: torch.Tensor, op: str) -> None:
    """flat <- arrays[0] (op) arrays[1] (op) .. (op) arrays[n-1], finished (a mean divided once).

    Every rank folds the same rows in the same order, so every rank ends with the same bits; folding in the
    order arrays arrived would give each rank its own rounding.
    """
    flat.copy_(arrays[0])
    for row in arrays[1:]:
        reduce_into(flat, row, op)
    finish_reduction(flat, op, len(arrays))


# -- binomial trees -----------------------------------------------------------------------------------


def tree_reduce(comm: Communicator, flat: torch.Tensor, op: str, ranks: list[int], root: int,
                scratch: Scratch) -> None:
    """Binomial-tree reduce to ranks[root]: ceil(log2 n) rounds; at mask m, vrank with bit m sends up."""
    n, pos = len(ranks), ranks.index(comm.rank)
    vrank = (pos - root) % n
    mask = 1
    while mask < n:
        if vrank & mask:
            comm.send(flat, ranks[(vrank - mask + root) % n])
            return
        if vrank + mask < n:
            incoming = scratch.get(flat.numel(), flat)
            comm.recv(incoming, ranks[(vrank + mask + root) % n])
            reduce_into(flat, incoming, op)
        mask <<= 1


def tree_broadcast(comm: Communicator, flat: torch.Tensor, ranks: list[int], root: int) -> None:
    """Binomial-tree broadcast from ranks[root]: the reverse of tree_reduce."""
    n, pos = len(ranks), ranks.index(comm.rank)
    vrank = (pos - root) % n
    mask = 1
    while mask < n:  # find the round in which this rank receives: its lowest set bit
        if vrank & mask:
            comm.recv(flat, ranks[(vrank - mask + root) % n])
            break
        mask <<= 1
    mask >>= 1
    # then send down to vrank + m for every lower bit m, one child at a time, largest subtree first (MPICH's
    # binomial broadcast): each child starts forwarding after one message time, so the broadcast takes
    # ceil(log2 n) message times. Sent all at once, the children's messages shared this rank's NIC and all
    # arrived together after as many message times as it has children: L + (L-1) + .. + 1 in all (1.4x
    # traffic()'s time at 12 ranks, 2.25x at 64, on SimGrid).
    while mask > 0:
        if vrank + mask < n:
            comm.send(flat, ranks[(vrank + mask + root) % n])
        mask >>= 1


# -- flat (driver) patterns ---------------------------------------------------------------------------


def flat_reduce(comm: Communicator, flat: torch.Tensor, op: str, ranks: list[int], root: int,
                scratch: Scratch) -> None:
    """Every rank sends its whole array straight to the root, which reduces them in rank order."""
    if comm.rank != ranks[root]:
        comm.send(flat, ranks[root])
        return
    for peer in ranks:
        if peer != comm.rank:
            incoming = scratch.get(flat.numel(), flat)
            comm.recv(incoming, peer)
            reduce_into(flat, incoming, op)


def flat_broadcast(comm: Communicator, flat: torch.Tensor, ranks: list[int], root: int) -> None:
    """The root sends its whole array straight to every other rank."""
    if comm.rank != ranks[root]:
        comm.recv(flat, ranks[root])
        return
    pending = [comm.isend(flat, peer) for peer in ranks if peer != comm.rank]
    for h in pending:
        h.wait()


# -- traffic of the primitives (analytic; the strategies' traffic() is built from these) -------------


def tree_traffic(n: int, nbytes: int) -> list[tuple[int, int, int, int]]:
    """Per position (root 0): (bytes_sent, bytes_recv, msgs_sent, msgs_recv) of one binomial tree reduce."""
    out = []
    for v in range(n):
        children = 0
        mask = 1
        while mask < n and not v & mask:
            if v + mask < n:
                children += 1
            mask <<= 1
        has_parent = v != 0
        m = 1 if nbytes else 0
        out.append((nbytes * has_parent, nbytes * children, m * has_parent, m * children))
    return out
