"""hierarchical's programs replayed on the network (strategies/cost_replay.py): the price of a sync on nodes where it
is small enough (REPLAY_MESSAGES), as the runtime runs it: NodeStage's rounds, the inner ring or halving_doubling
through GroupView's pump, latency on the wire. Beyond it the price is the stage model
(cost_nodes.hierarchical_node_seconds)."""

from __future__ import annotations

import functools

from strategies.base import chunk_bounds
from strategies.cost_replay import replay
from strategies.hierarchical import Layout, Piece


def replay_node_seconds(config, workers: int, numel: int, itemsize: int, nic_bandwidth: float,
                        intra_bandwidth: float, latency: float, intra_latency: float) -> float | None:
    """The sync's seconds on nodes, its programs replayed (replay_program, cost_replay.replay), latency included;
    None where there is no replay (another inner strategy, too many messages)."""
    built = replay_program(config, workers, numel, itemsize, latency, intra_latency)
    if built is None:
        return None
    nodes = -(-workers // config.ranks_per_node)
    return replay(*built, [intra_bandwidth] * (2 * workers) + [nic_bandwidth] * (2 * nodes))


# the replay's size limit: beyond it the price is the stage model (cost_nodes.hierarchical_node_seconds)
REPLAY_MESSAGES = 12_000


@functools.lru_cache(maxsize=256)
def replay_program(config, workers: int, numel: int, itemsize: int, latency: float, intra_latency: float):
    """The ranks' programs as Hierarchical._sync runs them, for cost_replay.replay (inner ring or halving_doubling;
    None for the others): per stage, NodeStage.start's round-0 sends; the across-node allreduces of the chunks the
    rank owns, round 0 of the node's rings completed at the inner strategy's first wait (NodeStage.pump, through
    GroupView); NodeStage.finish's other rounds and its sends. Every message crosses both ranks' ports, and both
    NICs with the NIC's latency when it leaves its node (links 2r, 2r + 1: rank r's port; 2n + 2j, 2n + 2j + 1: node
    j's NIC). None where the programs would hold more than REPLAY_MESSAGES messages."""
    from strategies.cost_replay import Message

    if config.inner not in ("ring", "halving_doubling"):
        return None
    k, n = config.ranks_per_node, workers
    layout = Layout(workers, k)
    count = config.pieces(workers, numel, itemsize)
    if count * config._piece_messages(workers, numel, itemsize)[0] * workers / 2 > REPLAY_MESSAGES:
        return None
    ids: dict[tuple, int] = {}
    messages: list[Message] = []

    def message(key: tuple, src: int, dst: int, nbytes: int) -> int:
        key = key + (src, dst)
        if key not in ids:
            ids[key] = len(messages)
            links, wire = (2 * src, 2 * dst + 1), intra_latency
            if src // k != dst // k:  # the route: port, NIC, switch, NIC, port
                links, wire = links + (2 * n + 2 * (src // k), 2 * n + 2 * (dst // k) + 1), wire + latency
            messages.append(Message(src, dst, nbytes, links, wire))
        return ids[key]

    programs = []
    for node in layout.nodes():
        pieces = Piece.cut(layout, numel, count, len(node))
        for rank in node:
            steps: list = []
            for stage in range(count + 2):
                gather = pieces[stage - 2] if stage >= 2 else None
                scatter = pieces[stage] if stage < count else None
                intra = _StageProgram(node, rank, stage, gather, scatter, itemsize, message, steps).start()
                if 1 <= stage <= count:  # piece stage - 1 across nodes, chunk by chunk
                    piece = pieces[stage - 1]
                    for c in range(k):
                        group = layout.group(c)
                        lo, hi = piece.chunks[c]
                        if rank in group and hi > lo and len(group) > 1:
                            _inner_program(config.inner, group, group.index(rank), hi - lo, itemsize, stage, c,
                                           message, steps, intra.wait)
                intra.finish()
            programs.append(steps)
    return programs, messages


class _StageProgram:
    """NodeStage's sends and waits on one rank, as replay steps: start() posts round 0's sends, wait() is the inner
    strategy's wait through GroupView (round 0 completed first, once), finish() the other rounds and the sends."""

    def __init__(self, node, rank, stage, gather, scatter, itemsize, message, steps):
        self.r, self.pos = len(node), node.index(rank)
        self.rank, self.right, self.left = rank, node[(self.pos + 1) % self.r], node[(self.pos - 1) % self.r]
        self.stage, self.itemsize, self.message, self.steps = stage, itemsize, message, steps
        self.phases = [(kind, piece) for kind, piece in (("gather", gather), ("scatter", scatter)) if piece]
        self.sent: list[int] = []
        self.done_rounds = 0

    def _ring(self, kind: str, piece, rnd: int, incoming: int) -> int:
        # reduce-scatter round t sends slice pos - t and receives pos - t - 1; the all-gather owned - t, owned - t - 1
        at = (self.pos if kind == "scatter" else self.pos + 1) - rnd - incoming
        lo, hi = piece.slices[at % self.r]
        src, dst = (self.left, self.rank) if incoming else (self.rank, self.right)
        return self.message(("node", self.stage, kind, rnd), src, dst, (hi - lo) * self.itemsize)

    def start(self):
        from strategies.cost_replay import Step

        if self.r > 1:
            self.sent = [self._ring(kind, piece, 0, 0) for kind, piece in self.phases]
            self.steps.append(Step((), tuple(self.sent)))
        return self

    def _round(self, rnd: int) -> None:
        from strategies.cost_replay import Step

        for kind, piece in self.phases:
            self.steps.append(Step((self._ring(kind, piece, rnd, 1),), ()))
            if rnd + 1 < self.r - 1:
                self.sent.append(self._ring(kind, piece, rnd + 1, 0))
                self.steps.append(Step((), (self.sent[-1],)))
        self.done_rounds = rnd + 1

    def wait(self, m: int) -> None:
        from strategies.cost_replay import Step

        if self.done_rounds == 0 and self.r > 1:  # NodeStage.pump
            self._round(0)
        self.steps.append(Step((m,), ()))

    def finish(self) -> None:
        from strategies.cost_replay import Step

        for rnd in range(self.done_rounds, self.r - 1):
            self._round(rnd)
        if self.sent:
            self.steps.append(Step(tuple(self.sent), ()))


def _inner_program(inner: str, group: list[int], at: int, size: int, itemsize: int, stage: int, c: int, message,
                   steps: list, wait) -> None:
    """The inner allreduce's sends and waits for group member `at`, as strategies/ring.py (ring_reduce_scatter,
    ring_allgather: every send of a round posted before its receive is waited for, the sends waited at the end of
    each phase) and strategies/halving_doubling.py (each exchange: send, wait for the receive, then the send)."""
    from strategies import halving_doubling
    from strategies.cost_replay import Step

    m, rank = len(group), group[at]
    if inner == "ring":
        bounds = chunk_bounds(size, m)
        right, left = group[(at + 1) % m], group[(at - 1) % m]
        for phase, first in (("reduce-scatter", at), ("all-gather", at + 1)):
            sends = []
            for rnd in range(m - 1):
                lo, hi = bounds[(first - rnd) % m]
                sends.append(message(("across", stage, c, phase, rnd), rank, right, (hi - lo) * itemsize))
                steps.append(Step((), (sends[-1],)))
                lo, hi = bounds[(first - rnd - 1) % m]
                wait(message(("across", stage, c, phase, rnd), left, rank, (hi - lo) * itemsize))
            for handle in sends:
                wait(handle)
        return
    for step in halving_doubling.schedule(m, size, at)[0]:
        peer = group[step.peer]
        send = message(("across", stage, c, step.round), rank, peer, (step.send[1] - step.send[0]) * itemsize)
        steps.append(Step((), (send,)))
        wait(message(("across", stage, c, step.round), peer, rank, (step.recv[1] - step.recv[0]) * itemsize))
        wait(send)
