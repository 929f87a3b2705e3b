"""Decentralized averaging: one round of x_i <- sum_j W_ij x_j with neighbours on a topology.

Not an exact allreduce: repeated rounds converge to the average at a rate set by the spectral gap
1 - |lambda_2(W)|. Used on parameters (local step, then average), as in D-PSGD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from strategies.base import PARAMETERS, RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.primitives import Scratch

TOPOLOGIES = ("ring", "torus", "exponential", "complete", "one_peer_exponential")
WEIGHTS = ("uniform", "metropolis")


def grid(workers: int) -> tuple[int, int]:
    """rows x cols closest to square (a prime number of workers gives 1 x n: a ring)."""
    rows = max(r for r in range(1, math.isqrt(workers) + 1) if workers % r == 0)
    return rows, workers // rows


def in_neighbours(topology: str, workers: int, round: int = 0) -> list[list[int]]:
    """For each rank, the other ranks it receives from (sorted); symmetric except one_peer_exponential."""
    n = workers
    if topology == "one_peer_exponential":
        period = (n - 1).bit_length()  # ceil(log2 n)
        if period == 0:
            return [[]]
        hop = 1 << (round % period)  # round t: receive from i - 2^(t mod ceil(log2 n)), send to i + 2^(...)
        return [[(i - hop) % n] for i in range(n)]
    peers = []
    for i in range(n):
        if topology == "ring":
            near = {(i - 1) % n, (i + 1) % n}
        elif topology == "torus":
            rows, cols = grid(n)
            r, c = divmod(i, cols)
            near = {((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c,
                    r * cols + (c - 1) % cols, r * cols + (c + 1) % cols}
        elif topology == "exponential":
            hops = [1 << k for k in range((n - 1).bit_length()) if 1 << k < n]
            near = {(i + h) % n for h in hops} | {(i - h) % n for h in hops}
        elif topology == "complete":
            near = set(range(n))
        else:
            raise ValueError(f"unknown topology {topology!r}: accepted are {', '.join(TOPOLOGIES)}")
        peers.append(sorted(near - {i}))
    return peers


class Decentralized(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.round = 0
        self.scratch = Scratch()
        self._plans: dict[int, tuple] = {}

    def _plan(self, round):
        """(peers to send to, [(peer, weight)] to receive from, own weight) for this round, in schedule order."""
        key = round % max((self.workers - 1).bit_length(), 1)
        if self.config.topology != "one_peer_exponential":
            key = 0
        if key not in self._plans:
            self._plans[key] = self.config.schedule(self.workers, self.rank, key)
        return self._plans[key]

    def _sync(self, flat, op):
        targets, sources, own = self._plan(self.round)
        self.round += 1
        numel = flat.numel()
        incoming = self.scratch.get(len(sources) * numel, flat).view(len(sources), numel)
        recvs = [self.comm.irecv(incoming[k], peer) for k, (peer, _) in enumerate(sources)]
        sends = [self.comm.isend(flat, peer) for peer in targets]
        for handle in recvs + sends:
            handle.wait()
        flat.mul_(own)
        for k, (_, weight) in enumerate(sources):
            flat.add_(incoming[k], alpha=weight)


@dataclass(frozen=True)
class DecentralizedConfig(StrategyConfig):
    name = "decentralized"
    summary = "one round of neighbour averaging x_i <- sum_j W_ij x_j on a topology (not an exact allreduce)"
    role = PARAMETERS
    ops = ("mean",)
    exact = False
    identical = False
    variants = tuple({"topology": t, "weights": w} for t in TOPOLOGIES for w in WEIGHTS)
    runtime = Decentralized
    topology: str = "ring"
    weights: str = "uniform"

    def validate(self):
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"decentralized: unknown topology {self.topology!r}: accepted are "
                             f"{', '.join(TOPOLOGIES)}")
        if self.weights not in WEIGHTS:
            raise ValueError(f"decentralized: unknown weights {self.weights!r}: accepted are "
                             f"{', '.join(WEIGHTS)}")

    def weights_of(self, peers: list[list[int]], i: int) -> tuple[list[tuple[int, float]], float]:
        """Row i of W without building W: [(in-neighbour j, W_ij)] and W_ii; uniform over the closed
        neighbourhood, or Metropolis (1 / (1 + max(deg i, deg j)))."""
        degree = len(peers[i])
        row = [(j, 1 / (degree + 1) if self.weights == "uniform" else 1 / (1 + max(degree, len(peers[j]))))
               for j in peers[i]]
        return row, 1 - sum(w for _, w in row)

    def mixing_matrix(self, workers: int, round: int = 0) -> np.ndarray:
        """The doubly stochastic W of this round (its rows from weights_of)."""
        peers = in_neighbours(self.topology, workers, round)
        w = np.zeros((workers, workers))
        for i in range(workers):
            row, own = self.weights_of(peers, i)
            for j, weight in row:
                w[i, j] = weight
            w[i, i] = own
        return w

    def schedule(self, workers: int, rank: int, round: int = 0):
        """This rank's (targets, [(source, weight)], own weight) in the order the exchange runs.

        Every rank sends its k-th message along the same direction (ring: right, then left; torus: right, left,
        down, up; circulant graphs: by offset (j - i) mod n), so in each slot every rank receives exactly one
        message and a receiver's link is never asked for two at once; receives are waited in the order they
        arrive (by the slot their sender sends them in). Sending to the neighbours in rank order instead left
        some ranks receiving two messages in the second slot: 1.44x the analytic time at 4 workers, 1 Gbit.
        Costs O(n x degree), never n x n, so 1,024 simulated ranks do not each build W.
        """
        peers = in_neighbours(self.topology, workers, round)
        outs: list[list[int]] = [[] for _ in range(workers)]
        for i, near in enumerate(peers):
            for j in near:
                outs[j].append(i)  # j's message reaches i

        def ordered(i: int) -> list[int]:
            return sorted(outs[i], key=lambda j: self._slot(workers, i, j))

        row, own = self.weights_of(peers, rank)
        weight = dict(row)
        slot_to_me = {j: ordered(j).index(rank) for j in peers[rank]}
        sources = sorted(weight, key=lambda j: (slot_to_me[j], j))
        return ordered(rank), [(j, weight[j]) for j in sources], own

    def _slot(self, workers: int, i: int, j: int) -> tuple[int, int]:
        """The sort key of rank i's send to j: a direction shared by all ranks."""
        if self.topology == "torus":
            rows, cols = grid(workers)
            r, c = divmod(i, cols)
            directions = [r * cols + (c + 1) % cols, r * cols + (c - 1) % cols,
                          ((r + 1) % rows) * cols + c, ((r - 1) % rows) * cols + c]
            return (directions.index(j), 0)
        return (0, (j - i) % workers)

    def spectral_gap(self, workers: int, round: int = 0) -> float:
        """1 - |lambda_2(W)|, the second largest eigenvalue modulus: larger mixes faster."""
        moduli = np.sort(np.abs(np.linalg.eigvals(self.mixing_matrix(workers, round))))[::-1]
        return 1.0 if workers == 1 else min(1.0, max(0.0, float(1 - moduli[1])))  # clip rounding

    def traffic(self, workers, numel, itemsize=4):
        peers, nbytes = in_neighbours(self.topology, workers), numel * itemsize
        m = 1 if nbytes else 0
        out_degree = [0] * workers
        for near in peers:
            for j in near:
                out_degree[j] += 1
        ranks = tuple(RankTraffic("worker", out_degree[i] * nbytes, len(peers[i]) * nbytes, out_degree[i] * m,
                                  len(peers[i]) * m) for i in range(workers))
        # One exchange: a rank's sends to its neighbours serialize on its transmit side (a latency each)
        # while its receive side takes theirs at the same time; every round moves the same amounts.
        fan = max(max(out_degree), max(len(p) for p in peers))
        return Traffic(ranks, rounds=max(out_degree), path_bytes=fan * nbytes)
