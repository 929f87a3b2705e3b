"""Every message a rank posts, when it was posted and when its wait completed: the raw facts of a step's picture.

A Communicator whose `recorder` is set (a MessageRecorder; None, the class default, records nothing and costs one
attribute check per message) records each non-empty isend/irecv it posts: the peer, the payload bytes (the bytes its
counters count), the rank's posting order and two times on the communicator's clock (`comm.concurrency.clock()`:
the wall clock on measured transports, the simulated one on SimGrid). `explain` turns the messages into rounds; the
timeline and the trace exports read them too.

One recorder may serve one rank or all the ranks of a run (thread ranks share memory): events carry their rank, and
a lock keeps it correct when a rank's loops (a parameter server's, one thread per worker) post side by side.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum

DEFAULT_LIMIT = 100_000


class Direction(StrEnum):
    """Which side of a message an event is: this rank sent it, or received it."""

    SEND = "send"
    RECV = "recv"


@dataclass(frozen=True, slots=True)
class MessageEvent:
    """One completed message as one rank saw it. `seq`: its place in this rank's posting order (0, 1, ...);
    `posted`: when isend/irecv was called; `finished`: when its Handle's wait completed (seconds on the clock of
    the communicator that recorded it)."""

    rank: int
    peer: int
    direction: Direction
    nbytes: int
    seq: int
    posted: float
    finished: float


class RecorderFull(RuntimeError):
    """A rank posted more messages than its recorder's limit."""


class MessageRecorder:
    """A bounded, thread-safe list of MessageEvents.

    `limit` bounds the messages posted since the last clear(): the one past it is refused when it is posted (before
    it moves), with an error naming the limit. seq numbers keep counting across clear(), so a rank's numbers stay
    unique for the recorder's life."""

    def __init__(self, limit: int = DEFAULT_LIMIT):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit = {limit!r}: expected an integer >= 1 (messages a recorder keeps)")
        self.limit = limit
        self._lock = threading.Lock()
        self._events: list[MessageEvent] = []
        self._posted = 0  # messages posted since the last clear (bounded by limit)
        self._next_seq: dict[int, int] = {}

    def post(self, rank: int) -> int:
        """A message of `rank` is being posted: its seq; RecorderFull past the limit."""
        with self._lock:
            if self._posted >= self.limit:
                raise RecorderFull(f"rank {rank}: the message recorder holds at most limit = {self.limit} messages "
                                   f"and this run posted more: record fewer steps or a smaller world, or raise limit")
            self._posted += 1
            seq = self._next_seq.get(rank, 0)
            self._next_seq[rank] = seq + 1
            return seq

    def add(self, event: MessageEvent) -> None:
        """Keep a completed message (posted through post())."""
        with self._lock:
            self._events.append(event)

    def start(self, rank: int, peer: int, direction: Direction, nbytes: int, clock):
        """A message is being posted now (by `rank`, to or from `peer`): returns done(), to be called when its wait
        completes, which records it; `clock()` tells both times (the communicator's clock)."""
        seq = self.post(rank)
        posted = clock()

        def done() -> None:
            self.add(MessageEvent(rank, peer, direction, nbytes, seq, posted, clock()))

        return done

    def events(self) -> list[MessageEvent]:
        """The completed messages so far, in the order they completed (a copy)."""
        with self._lock:
            return list(self._events)

    def clear(self) -> None:
        """Drop the events and start the limit's count from zero."""
        with self._lock:
            self._events.clear()
            self._posted = 0
