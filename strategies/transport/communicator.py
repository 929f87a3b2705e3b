"""The point-to-point transport every strategy talks through.

A Communicator moves tensors between ranks (send/recv and their non-blocking forms), counts every payload
byte per peer, never blocks longer than its timeout, and can emulate a network (see link.py). Transports
subclass it and supply three raw operations; counting, emulation and timeouts live here, once.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from strategies.transport.concurrency import THREADS
from strategies.transport.link import LinkClock, LinkDown, Network, sleep_until
from strategies.transport.recorder import Direction, MessageRecorder

DEFAULT_TIMEOUT_S = 60.0


class CommError(RuntimeError):
    """A transport failure that names this rank, the peer and the operation."""


class CommTimeout(CommError):
    """A peer did not answer within the communicator's timeout."""


class RankAborted(CommError):
    """This rank stopped because another rank of its run failed first (a consequence, not the root cause)."""


@dataclass(slots=True)
class PeerCounters:
    bytes_sent: int = 0
    bytes_recv: int = 0
    msgs_sent: int = 0
    msgs_recv: int = 0


@dataclass
class Counters(PeerCounters):
    """A snapshot of one rank's traffic: totals (the inherited fields) and per peer. Payload bytes only."""

    per_peer: dict[int, PeerCounters] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"bytes_sent": self.bytes_sent, "bytes_recv": self.bytes_recv,
                "msgs_sent": self.msgs_sent, "msgs_recv": self.msgs_recv}


class Handle:
    """A pending send or receive; wait() completes it or raises CommError/CommTimeout.

    The one handle type: a transport's raw operations return a plain function wait(timeout) instead."""

    def __init__(self, finish):
        self._finish = finish
        self._done = False

    def wait(self) -> None:
        if not self._done:
            self._done = True
            self._finish()


DONE = Handle(lambda: None)


def completed(timeout: float) -> None:
    """The wait of a raw operation that finished when it was posted (a send queued in memory)."""
    return None


class Communicator(ABC):
    """rank, world_size, send/recv/isend/irecv, per-peer byte counters, a timeout and link emulation."""

    transport = "abstract"
    concurrency = THREADS  # loops side by side and their clock (strategies/transport/concurrency.py)
    recorder: MessageRecorder | None = None  # set per rank: every message recorded (strategies/transport/recorder.py)
    link_down: LinkDown | None = None  # set per rank: its NIC down for a while, its messages held (link.py)

    def __init__(self, rank: int, world_size: int, timeout: float = DEFAULT_TIMEOUT_S,
                 network: Network | None = None):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world_size {world_size}: expected 0 <= rank < world_size")
        if not timeout > 0:
            raise ValueError(f"timeout {timeout!r} must be a positive number of seconds")
        self.rank = rank
        self.world_size = world_size
        self.timeout = float(timeout)
        self.network = network
        # a kernel-shaped network is slow by itself: the communicator only sleeps for a python-emulated one
        self._clock = LinkClock(network, rank) if network and network.emulation == "python" else None
        # nodes of ranks_per_node consecutive ranks (the network's, else one rank per node; set_nodes changes it)
        self.ranks_per_node = network.ranks_per_node if network else 1
        # Only the peers this rank talks to, keyed by rank: a list of world_size counters per rank would be
        # world_size^2 objects in a simulation of many ranks (2 GB at 4,096 ranks, counted on every snapshot).
        self._peers: dict[int, PeerCounters] = {}
        # the whole run's bound (set_deadline): a monotonic time and the timeout it came from; None: unbounded
        self.deadline: float | None = None
        self.run_timeout: float | None = None

    # -- the three raw operations a transport supplies -------------------------------------------

    @abstractmethod
    def _raw_isend(self, tensor: torch.Tensor, dst: int, stamp: tuple[float, float] | None):
        """Start sending `tensor` (and the emulation stamp, if any); return a function wait(timeout) that
        completes the send (`completed` if it is already)."""

    @abstractmethod
    def _raw_irecv(self, tensor: torch.Tensor, src: int, stamped: bool):
        """Start receiving into `tensor`; return a function wait(timeout) that completes the receive, checks the
        message against `tensor` (strategies.transport.wire) and returns the sender's stamp or None."""

    @abstractmethod
    def native_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        """The backend's own allreduce, in place (bytes it moves are not counted: the backend hides them)."""

    @abstractmethod
    def allgather_object(self, obj) -> list:
        """Control plane: every rank's small Python object, uncounted (size checks, rendezvous)."""

    # -- point to point ---------------------------------------------------------------------------

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.isend(tensor, dst).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self.irecv(tensor, src).wait()

    def isend(self, tensor: torch.Tensor, dst: int) -> Handle:
        """Start sending; an empty tensor sends nothing (both sides know the sizes, so both skip it)."""
        self._check_peer(dst, "send to")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return DONE
        tensor = tensor if tensor.is_contiguous() else tensor.contiguous()
        if self.link_down is not None:
            self.link_down.hold()
        record = (self.recorder.start(self.rank, dst, Direction.SEND, nbytes, self.concurrency.clock)
                  if self.recorder is not None else None)
        stamp = self._clock.transmit(nbytes, dst) if self._clock else None
        raw = self._guard(lambda: self._raw_isend(tensor, dst, stamp), "send to", dst)
        peer = self._peer(dst)
        peer.bytes_sent += nbytes
        peer.msgs_sent += 1

        def finish():
            self._guard(lambda: raw(self.timeout), "send to", dst)
            if stamp:
                sleep_until(stamp[1])
            if record is not None:
                record()

        return Handle(finish)

    def irecv(self, tensor: torch.Tensor, src: int) -> Handle:
        """Start receiving into `tensor` (its shape and dtype are what the sender must send)."""
        self._check_peer(src, "recv from")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return DONE
        if not tensor.is_contiguous():
            raise CommError(f"rank {self.rank}: recv from rank {src} needs a contiguous buffer")
        record = (self.recorder.start(self.rank, src, Direction.RECV, nbytes, self.concurrency.clock)
                  if self.recorder is not None else None)
        raw = self._guard(lambda: self._raw_irecv(tensor, src, self._clock is not None), "recv from", src)

        def finish():
            stamp = self._guard(lambda: raw(self.timeout), "recv from", src)
            if self.link_down is not None:
                self.link_down.hold()
            peer = self._peer(src)
            peer.bytes_recv += nbytes
            peer.msgs_recv += 1
            if self._clock:
                sleep_until(self._clock.receive(nbytes, *stamp, src))
            if record is not None:
                record()

        return Handle(finish)

    # -- nodes ------------------------------------------------------------------------------------

    def node_of(self, rank: int) -> int:
        """The node of `rank`: ranks k*j .. k*j+k-1 are node j (k = ranks_per_node; the last node may be short)."""
        return rank // self.ranks_per_node

    def set_nodes(self, ranks_per_node: int) -> None:
        """Group ranks into nodes of `ranks_per_node` (runs without an emulated network); must match the network's."""
        if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
            raise ValueError(f"ranks_per_node = {ranks_per_node!r}: expected an integer >= 1")
        if self.network is not None and self.network.ranks_per_node != ranks_per_node:
            raise ValueError(f"ranks_per_node = {ranks_per_node}, but the emulated network has nodes of "
                             f"{self.network.ranks_per_node} ranks: give one value")
        self.ranks_per_node = ranks_per_node

    def _check_peer(self, peer: int, what: str) -> None:
        if not (0 <= peer < self.world_size) or peer == self.rank:
            raise CommError(f"rank {self.rank}: cannot {what} rank {peer}: expected another rank in "
                            f"0..{self.world_size - 1}")

    def _guard(self, fn, what: str, peer: int | None = None, hint: str = "peer dead, stalled, or ranks disagree "
               "on sizes"):
        """Run a backend operation; turn any error into a CommError naming this rank, the operation and peer."""
        try:
            return fn()
        except CommError:
            raise
        except Exception as e:  # noqa: BLE001 - every backend error becomes a CommError
            # the message is built only on failure: this wraps every send and receive
            where = f"rank {self.rank}: {what}" + (f" rank {peer}" if peer is not None else "")
            if isinstance(e, TimeoutError):
                raise CommTimeout(f"{where} timed out after {self.timeout:g} s ({hint}): {e}") from e
            text = str(e).lower()
            kind = CommTimeout if ("timed out" in text or "timeout" in text) else CommError
            raise kind(f"{where} failed: {type(e).__name__}: {e}") from e

    # -- counters ---------------------------------------------------------------------------------

    def _peer(self, rank: int) -> PeerCounters:
        """The counters of traffic with `rank` (created on first use)."""
        counters = self._peers.get(rank)
        if counters is None:
            counters = self._peers[rank] = PeerCounters()
        return counters

    def counters(self) -> Counters:
        """A snapshot of the traffic since the last reset."""
        snap = Counters(per_peer={})
        for peer, c in sorted(self._peers.items()):
            if c.msgs_sent or c.msgs_recv:
                snap.per_peer[peer] = PeerCounters(c.bytes_sent, c.bytes_recv, c.msgs_sent, c.msgs_recv)
            snap.bytes_sent += c.bytes_sent
            snap.bytes_recv += c.bytes_recv
            snap.msgs_sent += c.msgs_sent
            snap.msgs_recv += c.msgs_recv
        return snap

    def set_deadline(self, run_timeout: float, started: float | None = None) -> None:
        """The whole run must end within `run_timeout` seconds of `started` (a time.monotonic(); now by default);
        the step loops call check_deadline()."""
        started = time.monotonic() if started is None else started
        self.run_timeout, self.deadline = float(run_timeout), started + run_timeout

    def check_deadline(self) -> None:
        """CommTimeout once the run's deadline (set_deadline) has passed; nothing when there is none."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise CommTimeout(f"rank {self.rank}: the run passed its timeout = {self.run_timeout:g} s (the bound on "
                              f"a whole run, every step included): stopped; raise timeout for a longer run")

    def reset_counters(self) -> Counters:
        """Return the snapshot and start counting from zero."""
        snap = self.counters()
        self._peers = {}
        return snap

    # -- control plane ----------------------------------------------------------------------------

    def check_same_numel(self, numel: int, what: str = "tensor") -> None:
        """Fail on every rank, before any payload moves, if ranks pass tensors of different sizes."""
        sizes = self.allgather_object(int(numel))
        if len(set(sizes)) > 1:
            detail = ", ".join(f"rank {r}: {s}" for r, s in enumerate(sizes))
            raise CommError(f"rank {self.rank}: ranks passed {what}s of different sizes ({detail}); "
                            f"every rank must pass the same number of elements")

    def barrier(self) -> None:
        self.allgather_object(None)

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release transport resources (a no-op for transports that own none)."""
