"""A schedule replayed on the network's physics, for a strategy whose price is not a sum of rounds: the ranks' programs
(wait for these messages, received or sent; post these sends) over split-duplex ports shared max-min fairly, one
FIFO connection per pair of ranks. It is what SimGrid's alpha_beta model does with the same program
(strategies/transport/simgrid.py's shared NIC, `_Connection`), in a fluid event loop: the double binary tree's
pipeline at small n, where a rank's slot spills into the next (its sends outlast the slot) or runs ahead of it (its
upload and download need not keep the slots in step), which a sum of each slot's busiest port cannot express.

Units: bytes, bytes/s and seconds. A message may carry its route's latency (hierarchical's replay); the double binary
tree's leaves it out and adds rounds x latency as every strategy's price does.

Cost: an event (a message's latency over, its bytes all moved) re-solves the sharing only in the part of the network
it changed (the messages linked to it through shared links), and the messages of a round whose sizes differ by
chunk_bounds' one element end in one event (PRECISION): hierarchical's 64 ranks in nodes of 4, 6,912 messages, in
about 0.1 s (it took 1-4 s re-solving every message at every event).
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


# a message within this fraction of its bytes of its end ends with the event that ends another: the same round's
# messages, whose sizes differ by one element of chunk_bounds (4 bytes in 532,440), end together instead of one event
# each (hierarchical's 64 ranks in nodes of 4: 196 events, not 8,070); it moves an end by at most that fraction of
# the message's time
PRECISION = 1e-5


def replay(programs: list[list[Step]], messages: list[Message], capacity: list[float],
           precision: float = PRECISION) -> float:
    """Seconds until the last message of these per-rank programs has arrived. A rank walks its steps in order: it
    waits for the step's messages to have arrived, then posts the step's sends (every receive is posted from the
    start). A message leaves when the one posted before it to the same peer has arrived (one connection per pair);
    on the wire it shares each link it crosses max-min fairly with the other messages there (a link of infinite
    capacity is no constraint: a message on none moves at once). A message with at most `precision` of its bytes
    left ends with the event (PRECISION; 0: each at its own instant, up to rounding).

    An event (a message's latency over, its bytes all moved) re-solves the sharing only where it changed: the
    messages linked to the ones that joined or left through shared links (a max-min solution is each such
    component's own); every other message keeps its rate and its finish time in the heap."""
    links_of = [tuple(link for link in msg.links if capacity[link] != math.inf) for msg in messages]
    arrived = [-1.0] * len(messages)
    waiting_on: dict[int, list[int]] = {}  # message -> ranks blocked on it
    position = [0] * len(programs)
    pairs: dict[tuple[int, int], deque] = {}
    busy: set[tuple[int, int]] = set()
    left: dict[int, float] = {}   # message on the wire -> its bytes left at stamp[m], moving at rate[m]
    stamp: dict[int, float] = {}
    rate: dict[int, float] = {}
    finishes: list[tuple[float, int, int]] = []  # (when its bytes will all have moved, version, message)
    version = [0] * len(messages)
    latent: list[tuple[float, int]] = []  # (when its bytes start to move, message): in its latency
    on_link: dict[int, set[int]] = {}  # link -> the messages moving on it (a link with none is removed)
    changed: list[int] = []  # links whose messages joined or left since the last solve
    now = 0.0

    def start(m: int):
        msg = messages[m]
        busy.add((msg.src, msg.dst))
        if msg.latency > 0:
            heapq.heappush(latent, (now + msg.latency, m))
        else:
            flow(m)

    def flow(m: int):
        left[m], stamp[m], rate[m] = float(messages[m].nbytes), now, 0.0
        if not links_of[m]:  # on no finite link: it arrives at once
            rate[m] = math.inf
            heapq.heappush(finishes, (now, version[m], m))
        for link in links_of[m]:
            on_link.setdefault(link, set()).add(m)
            changed.append(link)

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
    while True:
        if changed:
            _solve(changed, on_link, links_of, capacity, left, stamp, rate, version, finishes, now)
            changed.clear()
        while finishes and finishes[0][1] != version[finishes[0][2]]:
            heapq.heappop(finishes)  # a finish time its message's new rate has replaced
        if not finishes and not latent:
            break
        if latent and (not finishes or latent[0][0] < finishes[0][0]):  # a latency ends: its bytes join the sharing
            now = latent[0][0]
            while latent and latent[0][0] <= now:
                flow(heapq.heappop(latent)[1])
            continue
        now = finishes[0][0]
        done = []
        while finishes:  # every message whose bytes have all moved by now (within a rounding of its size)
            when, seen, m = finishes[0]
            if seen != version[m]:
                heapq.heappop(finishes)
                continue
            if when > now and rate[m] * (when - now) > precision * messages[m].nbytes + 1e-6:
                break
            heapq.heappop(finishes)
            version[m] += 1
            done.append(m)
        for m in done:
            del left[m], stamp[m], rate[m]
            for link in links_of[m]:
                moving = on_link[link]
                moving.discard(m)
                if not moving:
                    del on_link[link]
                else:
                    changed.append(link)
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


def _solve(changed: list[int], on_link: dict[int, set[int]], links_of: list[tuple[int, ...]], capacity: list[float],
           left: dict[int, float], stamp: dict[int, float], rate: dict[int, float], version: list[int],
           finishes: list, now: float) -> None:
    """Max-min fair rates (progressive filling) for the messages linked, through links they share, to the changed
    links: the links with the least capacity per unfixed message fix their messages at that share; repeat with
    what is left. A message whose rate changes has its bytes left brought to now and a new finish time."""
    links = {link for link in changed if link in on_link}
    todo = list(links)
    flows: set[int] = set()
    while todo:  # the component(s): links -> their messages -> those messages' links
        for m in on_link[todo.pop()]:
            if m not in flows:
                flows.add(m)
                for other in links_of[m]:
                    if other not in links:
                        links.add(other)
                        todo.append(other)
    share = {link: capacity[link] for link in links}
    count = {link: len(on_link[link]) for link in links}
    fixed: dict[int, float] = {}
    while count:
        low = min(share[link] / c for link, c in count.items())
        limit = low * (1 + 1e-12)
        for link in [link for link, c in count.items() if share[link] <= limit * c]:
            for m in on_link[link]:
                if m in fixed:
                    continue
                fixed[m] = low
                for other in links_of[m]:
                    share[other] -= low
                    count[other] -= 1
                    if not count[other]:
                        del count[other]
    for m, new in fixed.items():
        old = rate[m]
        if new != old:
            left[m] -= old * (now - stamp[m])
            stamp[m], rate[m] = now, new
            version[m] += 1
            heapq.heappush(finishes, (now + max(left[m], 0.0) / new, version[m], m))
