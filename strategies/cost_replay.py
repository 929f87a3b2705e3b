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
    return _Replay(programs, messages, capacity, precision).run()


class _Replay:
    """One replay's state: where each rank's program is, the pairs' queues, the messages in their latency and on
    the wire (bytes left at their stamp, their rate, their finish time in a heap), the links' messages."""

    def __init__(self, programs, messages, capacity, precision):
        self.programs, self.messages, self.capacity, self.precision = programs, messages, capacity, precision
        self.links_of = [tuple(link for link in msg.links if capacity[link] != math.inf) for msg in messages]
        self.arrived = [-1.0] * len(messages)
        self.waiting_on: dict[int, list[int]] = {}  # message -> ranks blocked on it
        self.position = [0] * len(programs)
        self.pairs: dict[tuple[int, int], deque] = {}
        self.busy: set[tuple[int, int]] = set()
        self.left: dict[int, float] = {}   # message on the wire -> its bytes left at stamp[m], moving at rate[m]
        self.stamp: dict[int, float] = {}
        self.rate: dict[int, float] = {}
        self.finishes: list[tuple[float, int, int]] = []  # (when its bytes will all have moved, version, message)
        self.version = [0] * len(messages)
        self.latent: list[tuple[float, int]] = []  # (when its bytes start to move, message): in its latency
        self.on_link: dict[int, set[int]] = {}  # link -> the messages moving on it (a link with none is removed)
        self.changed: list[int] = []  # links whose messages joined or left since the last solve
        self.now = 0.0

    def start(self, m: int):
        msg = self.messages[m]
        self.busy.add((msg.src, msg.dst))
        if msg.latency > 0:
            heapq.heappush(self.latent, (self.now + msg.latency, m))
        else:
            self.flow(m)

    def flow(self, m: int):
        self.left[m], self.stamp[m], self.rate[m] = float(self.messages[m].nbytes), self.now, 0.0
        if not self.links_of[m]:  # on no finite link: it arrives at once
            self.rate[m] = math.inf
            heapq.heappush(self.finishes, (self.now, self.version[m], m))
        for link in self.links_of[m]:
            self.on_link.setdefault(link, set()).add(m)
            self.changed.append(link)

    def post(self, m: int):
        msg = self.messages[m]
        if (msg.src, msg.dst) in self.busy:
            self.pairs.setdefault((msg.src, msg.dst), deque()).append(m)
        else:
            self.start(m)

    def advance(self, rank: int):
        program = self.programs[rank]
        while self.position[rank] < len(program):
            step = program[self.position[rank]]
            for m in step.waits:
                if self.arrived[m] < 0:
                    self.waiting_on.setdefault(m, []).append(rank)
                    return
            for m in step.sends:
                self.post(m)
            self.position[rank] += 1

    def run(self) -> float:
        for rank in range(len(self.programs)):
            self.advance(rank)
        finishes, latent = self.finishes, self.latent
        while True:
            if self.changed:
                _solve(self.changed, self.on_link, self.links_of, self.capacity, self.left, self.stamp, self.rate,
                       self.version, finishes, self.now)
                self.changed.clear()
            while finishes and finishes[0][1] != self.version[finishes[0][2]]:
                heapq.heappop(finishes)  # a finish time its message's new rate has replaced
            if not finishes and not latent:
                break
            if latent and (not finishes or latent[0][0] < finishes[0][0]):  # a latency ends: its bytes join
                self.now = latent[0][0]
                while latent and latent[0][0] <= self.now:
                    self.flow(heapq.heappop(latent)[1])
                continue
            self.now = finishes[0][0]
            self.arrive(self.moved())
        if any(self.position[rank] < len(self.programs[rank]) for rank in range(len(self.programs))):
            raise RuntimeError("replay: a rank waits for a message that is never sent (the programs do not match)")
        return self.now

    def moved(self) -> list[int]:
        """Every message whose bytes have all moved by now (within a rounding of its size), off the heap."""
        finishes, done = self.finishes, []
        while finishes:
            when, seen, m = finishes[0]
            if seen != self.version[m]:
                heapq.heappop(finishes)
                continue
            if when > self.now and self.rate[m] * (when - self.now) > self.precision * self.messages[m].nbytes + 1e-6:
                break
            heapq.heappop(finishes)
            self.version[m] += 1
            done.append(m)
        return done

    def arrive(self, done: list[int]) -> None:
        """These messages have arrived: off their links; the pair's next message leaves; ranks blocked go on."""
        for m in done:
            del self.left[m], self.stamp[m], self.rate[m]
            for link in self.links_of[m]:
                moving = self.on_link[link]
                moving.discard(m)
                if not moving:
                    del self.on_link[link]
                else:
                    self.changed.append(link)
            self.arrived[m] = self.now
        for m in done:
            pair = (self.messages[m].src, self.messages[m].dst)
            self.busy.discard(pair)
            queue = self.pairs.get(pair)
            if queue:
                self.start(queue.popleft())
            for rank in self.waiting_on.pop(m, ()):
                self.advance(rank)


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
