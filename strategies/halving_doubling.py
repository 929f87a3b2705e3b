"""Rabenseifner allreduce: recursive-halving reduce-scatter, then recursive-doubling all-gather.

log2(p) rounds each, p = 2^floor(log2 n): few rounds, so it wins on small messages. The n - p extra ranks
fold their array into a partner first and get the result back at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import RankTraffic, Strategy, StrategyConfig, Traffic
from strategies.ops import finish_reduction, reduce_into
from strategies.primitives import Scratch


@dataclass(frozen=True)
class Step:
    """One exchange with one peer: send a range of the array, receive a range, reduce it in or copy it."""

    round: int
    peer: int
    send: tuple[int, int]
    recv: tuple[int, int]
    reduce: bool


def schedule(workers: int, numel: int, pos: int) -> tuple[list[Step], tuple[int, int] | None]:
    """Position `pos`'s steps in wire order and the range it owns fully reduced (None: an extra rank).

    The one source of truth for who sends what: the runtime runs these steps, traffic() counts them.
    """
    p = 1 << (workers.bit_length() - 1)
    levels = p.bit_length() - 1
    whole, nothing = (0, numel), (0, 0)
    unfold_round = 2 * levels + 1
    if pos >= p:  # an extra rank: fold into pos - p at round 0, get the result back in the last round
        return [Step(0, pos - p, whole, nothing, True), Step(unfold_round, pos - p, nothing, whole, False)], None
    folded = pos + p < workers
    steps = [Step(0, pos + p, nothing, whole, True)] if folded else []
    # Round k (1..L) of the reduce-scatter pairs pos with pos ^ (p >> k); both hold the same segment
    # [lo, hi), split at lo + (hi - lo) // 2: the lower partner keeps the first half and sends the second,
    # the upper the reverse. The all-gather replays these exchanges backwards with the ranges swapped.
    lo, hi = whole
    halves = []
    for k in range(1, levels + 1):
        mask = p >> k
        mid = lo + (hi - lo) // 2
        keep, give = ((mid, hi), (lo, mid)) if pos & mask else ((lo, mid), (mid, hi))
        steps.append(Step(k, pos ^ mask, give, keep, True))
        halves.append((pos ^ mask, keep, give))
        lo, hi = keep
    for k, (peer, keep, give) in zip(range(levels + 1, 2 * levels + 1), reversed(halves)):
        steps.append(Step(k, peer, keep, give, False))
    if folded:
        steps.append(Step(unfold_round, pos + p, whole, nothing, False))
    return steps, (lo, hi)


class HalvingDoubling(Strategy):
    def __init__(self, config, comm, workers):
        super().__init__(config, comm, workers)
        self.scratch = Scratch()

    def _sync(self, flat, op):
        steps, owned = schedule(self.workers, flat.numel(), self.rank)
        for step in (s for s in steps if s.reduce):  # fold, then reduce-scatter
            self._exchange(flat, step, op)
        if owned is not None:
            finish_reduction(flat[owned[0]:owned[1]], op, self.workers)  # mean: divide once, by the owner
        for step in (s for s in steps if not s.reduce):  # all-gather, then unfold
            self._exchange(flat, step, op)

    def _exchange(self, flat, step, op):
        (s_lo, s_hi), (r_lo, r_hi) = step.send, step.recv
        # post the receive first: a gloo send completes only once the peer's receive is posted
        incoming = self.scratch.get(r_hi - r_lo, flat) if step.reduce else flat[r_lo:r_hi]
        received = self.comm.irecv(incoming, step.peer)
        sent = self.comm.isend(flat[s_lo:s_hi], step.peer)
        received.wait()
        if step.reduce:
            reduce_into(flat[r_lo:r_hi], incoming, op)
        sent.wait()


@dataclass(frozen=True)
class HalvingDoublingConfig(StrategyConfig):
    name = "halving_doubling"
    summary = "Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather, 2 log2 n rounds"
    runtime = HalvingDoubling

    def traffic(self, workers, numel, itemsize=4):
        ranks, busiest = [], {}
        for pos in range(workers):
            steps, _ = schedule(workers, numel, pos)
            sent = [(hi - lo) * itemsize for lo, hi in (s.send for s in steps)]
            recv = [(hi - lo) * itemsize for lo, hi in (s.recv for s in steps)]
            ranks.append(RankTraffic("worker", sum(sent), sum(recv), sum(1 for b in sent if b),
                                     sum(1 for b in recv if b)))
            for step, s, r in zip(steps, sent, recv):
                busiest[step.round] = max(busiest.get(step.round, 0), s, r)
        # Rounds run one after another (each waits for its partner's data), every pair in parallel: the
        # critical path is one latency and the largest message of each round. Except the fold: a rank that
        # takes an extra rank's array (round 0) also receives meanwhile, on the same NIC, the message of every
        # unfolded rank whose first exchange with a folded rank is with it (sent at once, then that rank waits):
        # its round 0 carries those too (3 ranks: 1.5 d, not d; SimGrid agrees).
        if busiest.get(0):
            busiest[0] = max(busiest[0], max(early_into_fold(workers, numel, itemsize).values(), default=0))
        return Traffic(tuple(ranks), rounds=len(busiest),
                       path_bytes=sum(busiest.values()) + sum(busiest[k] for k in eager_behind_fold(workers)))


def eager_behind_fold(workers: int) -> range:
    """The reduce-scatter rounds whose messages land on a late rank's download at once (the fold's second-order
    chain): an unfolded rank whose first partner is folded waits for that partner (late by the early message it
    took during its fold), while its partners of the next rounds, folded ranks done early, post their messages to
    it at once; they share its download with the late partner's, one message of each round. With e = n - p extra
    ranks, H the highest and t the lowest power of two in e, the rounds L - log2 H + 1 .. L - log2 t (L = log2 p):
    none when e is a power of two. 7 ranks (e = 3): round 2 (a quarter of the array, 4.25 arrays, not 4.0);
    2p - 1 ranks: rounds 2..L, about half an array (SimGrid alpha_beta's message log)."""
    p = 1 << (workers.bit_length() - 1)
    e = workers - p
    if e == 0:
        return range(0)
    levels = p.bit_length() - 1
    high, low = e.bit_length() - 1, (e & -e).bit_length() - 1
    return range(levels - high + 1, levels - low + 1)


def early_into_fold(workers: int, numel: int, itemsize: int = 4) -> dict[int, int]:
    """Per folded rank f (one that takes an extra rank's array in round 0): the fold's bytes plus the reduce-scatter
    messages unfolded ranks send it before its fold is done (their first exchange with a folded rank, posted at
    once)."""
    p = 1 << (workers.bit_length() - 1)
    folded = {pos for pos in range(p) if pos + p < workers}
    into = {f: numel * itemsize for f in folded}
    for pos in range(p):
        if pos in folded:
            continue
        steps, _ = schedule(workers, numel, pos)
        first = next((st for st in steps if st.reduce and st.peer in folded), None)
        if first is not None:
            into[first.peer] += (first.send[1] - first.send[0]) * itemsize
    return into
