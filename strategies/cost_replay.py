"""A schedule replayed on the network's physics, for a strategy whose price is not a sum of rounds: the ranks' programs
(wait for these messages, received or sent; post these sends) over split-duplex ports shared max-min fairly, one
FIFO connection per pair of ranks. It is what SimGrid's alpha_beta model does with the same program
(strategies/transport/simgrid.py's shared NIC, `_Connection`), in a fluid event loop: the double binary tree's
pipeline at small n, where a rank's slot spills into the next (its sends outlast the slot) or runs ahead of it (its
upload and download need not keep the slots in step), which a sum of each slot's busiest port cannot express.

Units: bytes, bytes/s and seconds. A message may carry its route's latency (hierarchical's replay); the double binary
tree's leaves it out and adds rounds x latency as every strategy's price does.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Message:
    src: int
    dst: int
    nbytes: int
    links: tuple[int, ...]  # the link directions it crosses (a sender's upload, a receiver's download, NICs)
    latency: float = 0.0    # seconds on the wire before its bytes move (SimGrid's CM02: latency, then bandwidth)


@dataclass(frozen=True)
class Step:
    waits: tuple[int, ...]  # message ids this step waits for (their arrival: a receive, or a send completed)
    sends: tuple[int, ...]  # message ids it then posts, in order


def replay(programs: list[list[Step]], messages: list[Message], capacity: list[float]) -> float:
    """Seconds until the last message of these per-rank programs has arrived. A rank walks its steps in order: it
    waits for the step's messages to have arrived, then posts the step's sends (every receive is posted from the
    start). A message leaves when the one posted before it to the same peer has arrived (one connection per pair);
    on the wire it shares each link it crosses max-min fairly with the other messages there (a link of infinite
    capacity is no constraint: a message on none moves at once)."""
    links_of = [tuple(link for link in msg.links if capacity[link] != math.inf) for msg in messages]
    arrived = [-1.0] * len(messages)
    waiting_on: dict[int, list[int]] = {}  # message -> ranks blocked on it
    position = [0] * len(programs)
    pairs: dict[tuple[int, int], deque] = {}
    busy: set[tuple[int, int]] = set()
    flows: dict[int, float] = {}  # message on the wire -> bytes left
    latent: list[tuple[float, int]] = []  # (when its bytes start to move, message): in its latency
    on_link: dict[int, set[int]] = {}  # link -> the messages moving on it (a link with none is removed)
    now = 0.0

    def start(m: int):
        msg = messages[m]
        busy.add((msg.src, msg.dst))
        if msg.latency > 0:
            heapq.heappush(latent, (now + msg.latency, m))
        else:
            flow(m)

    def flow(m: int):
        flows[m] = float(messages[m].nbytes)
        for link in links_of[m]:
            on_link.setdefault(link, set()).add(m)

    def post(m: int):
        msg = messages[m]
        if (msg.src, msg.dst) in busy:
            pairs.setdefault((msg.src, msg.dst), deque()).append(m)
        else:
            start(m)

    def advance(rank: int):
        program = programs[rank]
        while position[rank] < len(program):
            step = program[position[rank]]
            for m in step.waits:
                if arrived[m] < 0:
                    waiting_on.setdefault(m, []).append(rank)
                    return
            for m in step.sends:
                post(m)
            position[rank] += 1

    for rank in range(len(programs)):
        advance(rank)
    while flows or latent:
        rates = _max_min(flows, on_link, links_of, capacity)
        dt = min((left / rates[m] for m, left in flows.items()), default=math.inf)
        if latent and latent[0][0] - now < dt:  # a message's latency ends first: its bytes join the sharing
            dt = latent[0][0] - now
            for m in flows:
                flows[m] -= rates[m] * dt
            now = latent[0][0]
            while latent and latent[0][0] <= now:
                flow(heapq.heappop(latent)[1])
            continue
        now += dt
        done = _move(flows, rates, dt, messages)
        _take_off_the_wire(done, flows, on_link, links_of)
        for m in done:
            arrived[m] = now
        for m in done:  # the pair's next message leaves; ranks blocked on this one go on
            pair = (messages[m].src, messages[m].dst)
            busy.discard(pair)
            queue = pairs.get(pair)
            if queue:
                start(queue.popleft())
            for rank in waiting_on.pop(m, ()):
                advance(rank)
    if any(position[rank] < len(programs[rank]) for rank in range(len(programs))):
        raise RuntimeError("replay: a rank waits for a message that is never sent (the programs do not match)")
    return now


def _move(flows: dict[int, float], rates: dict[int, float], dt: float, messages: list[Message]) -> list[int]:
    """dt seconds of every moving message's bytes at its rate; the messages whose bytes have all moved."""
    done = []
    for m in flows:
        rate = rates[m]
        flows[m] = 0.0 if rate == math.inf else flows[m] - rate * dt
        if flows[m] <= 1e-9 * messages[m].nbytes + 1e-6:
            done.append(m)
    return done


def _take_off_the_wire(done: list[int], flows: dict[int, float], on_link: dict[int, set[int]],
                       links_of: list[tuple[int, ...]]) -> None:
    """Messages whose bytes have all moved leave the sharing (a link left with none is removed)."""
    for m in done:
        del flows[m]
        for link in links_of[m]:
            moving = on_link[link]
            moving.discard(m)
            if not moving:
                del on_link[link]


def _max_min(flows: dict[int, float], on_link: dict[int, set[int]], links_of: list[tuple[int, ...]],
             capacity: list[float]) -> dict[int, float]:
    """Max-min fair rates (progressive filling): the links with the least capacity per unfixed flow fix their flows
    at that share; repeat with what is left."""
    left = {link: capacity[link] for link in on_link}
    count = {link: len(moving) for link, moving in on_link.items()}
    rates = {m: math.inf for m in flows if not links_of[m]}  # on no finite link: no time
    while len(rates) < len(flows):
        low = min(left[link] / c for link, c in count.items() if c)
        limit = low * (1 + 1e-12)
        for link in [link for link, c in count.items() if c and left[link] <= limit * c]:
            for m in on_link[link]:
                if m in rates:
                    continue
                rates[m] = low
                for other in links_of[m]:
                    left[other] -= low
                    count[other] -= 1
    return rates
