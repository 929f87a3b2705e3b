"""The in-process transport: one thread per rank, one queue per (src, dst) pair.

Fast, deterministic and Ray-free: the strategy tests and the plug-in harness run on it. A shared Fabric
holds the queues; when one rank fails the fabric is aborted so its peers fail at once instead of waiting
out their timeout. Its queues are also the control plane any other transport (the sockets, a plug-in's)
is built over between thread ranks (strategies.transport.factory).

run_threads runs fn once on fresh ranks; ThreadRanks keeps one group of ranks (threads, communicators, the
sockets' connections) for many runs, as the test matrix's hundreds of cases per world size need.
"""

from __future__ import annotations

import functools
import queue
import threading
import time

import torch

from strategies.transport import factory
from strategies.transport.communicator import DEFAULT_TIMEOUT_S, CommError, Communicator, RankAborted, completed
from strategies.transport.link import Network
from strategies.transport.ops import finish_reduction, reduce_into
from strategies.transport.ranks import Board, RankRun
from strategies.transport.wire import check_received

_POLL_S = 0.05


class Fabric:
    """The shared wiring of one group of thread ranks."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.queues = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size) if s != d}
        self.aborted: str | None = None
        self.board = Board(world_size, threading.Barrier(world_size))

    def abort(self, why: str) -> None:
        self.aborted = self.aborted or why
        self.board.barrier.abort()

    def exchange(self, rank: int, obj, timeout: float) -> list:
        """Every rank's object, in rank order."""
        try:
            return self.board.exchange(rank, obj, timeout)
        except threading.BrokenBarrierError as e:
            if self.aborted:
                raise RankAborted(f"rank {rank}: control-plane exchange aborted: {self.aborted}") from e
            raise CommError(f"rank {rank}: control-plane exchange broken: a peer did not arrive within "
                            f"{timeout:g} s") from e


def _take(fabric: Fabric, rank: int, src: int, tensor: torch.Tensor, timeout: float):
    """A receive's wait: the next message from src off its queue, checked and copied in; returns its stamp."""
    q = fabric.queues[(src, rank)]
    deadline = time.monotonic() + timeout
    while True:
        if fabric.aborted:
            raise RankAborted(f"aborted: {fabric.aborted}")
        try:
            payload, stamp = q.get(timeout=min(_POLL_S, max(deadline - time.monotonic(), 0)))
            break
        except queue.Empty:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"no message from rank {src}") from None
    check_received(rank, src, tensor, payload.numel() * payload.element_size(), payload.dtype)
    tensor.copy_(payload.reshape(tensor.shape))
    return stamp


class ThreadCommunicator(Communicator):
    transport = "threads"

    def __init__(self, fabric: Fabric, rank: int, timeout: float = DEFAULT_TIMEOUT_S,
                 network: Network | None = None):
        super().__init__(rank, fabric.world_size, timeout, network)
        self.fabric = fabric

    def _raw_isend(self, tensor, dst, stamp):
        self.fabric.queues[(self.rank, dst)].put((tensor.clone(), stamp))
        return completed

    def _raw_irecv(self, tensor, src, stamped):
        return functools.partial(_take, self.fabric, self.rank, src, tensor)

    def allgather_object(self, obj) -> list:
        return self.fabric.exchange(self.rank, obj, self.timeout)

    def native_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        """A shared-memory reference allreduce: every rank reduces all ranks' arrays in rank order."""
        arrays = self.allgather_object(tensor.clone())
        result = arrays[0].clone()
        for other in arrays[1:]:
            reduce_into(result, other, op)
        finish_reduction(result, op, self.world_size)
        tensor.copy_(result)


def build(name: str, control: Communicator, *, timeout: float, network: Network | None, address: str):
    """The factory's "threads": the fabric's queues carry the point to point too (with `network` emulated)."""
    factory.require(name, control, ThreadCommunicator, "thread ranks (run_threads)")
    return ThreadCommunicator(control.fabric, control.rank, timeout, network)


def run_threads(world_size: int, fn, timeout: float = DEFAULT_TIMEOUT_S, network: Network | None = None,
                p2p: str = "threads", ranks_per_node: int | None = None, run_timeout: float | None = None):
    """Run fn(comm) on world_size thread ranks; return each rank's result, or raise the root cause of a failure.

    `p2p`: any transport of strategies.transport.factory that works over thread ranks: "threads" (the queues),
    "sockets[-unix|-tcp]" (strategies.transport.sockets on loopback), a registered plug-in; the fabric's queues
    are its control plane. `ranks_per_node`: nodes of that many ranks (comm.node_of); the network's by default.
    `run_timeout`: the bound on the whole run: each rank's communicator carries it (comm.check_deadline, which
    the step loops call between steps) and at that time the fabric is aborted, so that every wait stops.
    """
    factory.check(p2p)
    fabric = Fabric(world_size)
    started = time.monotonic()

    def start(rank: int) -> Communicator:
        control = ThreadCommunicator(fabric, rank, timeout)
        comm = factory.build(p2p, control, timeout=timeout, network=network)
        if ranks_per_node is not None:
            comm.set_nodes(ranks_per_node)
        if run_timeout is not None:
            comm.set_deadline(run_timeout, started)
        return comm

    run = RankRun(world_size, fn, start, on_error=lambda rank, e: fabric.abort(f"rank {rank} failed: {e}"))
    threads = [threading.Thread(target=run.rank, args=(r,), name=f"rank{r}", daemon=True) for r in range(world_size)]
    watchdog = None
    if run_timeout is not None:  # a rank deep in a step of many messages stops at its next wait
        watchdog = threading.Timer(run_timeout, fabric.abort, args=(
            f"the run passed its timeout = {run_timeout:g} s (the bound on a whole run, every step included)",))
        watchdog.daemon = True
        watchdog.start()
    end = None if run_timeout is None else started + run_timeout + 30
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout + 30 if end is None else max(end - time.monotonic(), 0))
    finally:
        if watchdog is not None:
            watchdog.cancel()
    return run.outcome(lambda stuck: f"thread ranks {stuck} still running 30 s after their timeout")


class ThreadRanks:
    """`world_size` thread ranks whose communicators are built once and serve many runs.

        with ThreadRanks(4, p2p="sockets", timeout=20) as ranks:
            for fn in cases:
                results = ranks.run(fn)   # as run_threads(4, fn, ...): each rank's result, or the root cause

    Every run starts with every rank's counters at zero. A failed run leaves peers mid-message, so the group is
    taken down with it and the next run builds a fresh one. No emulated network: its link clocks would carry one
    run's time into the next (use run_threads).
    """

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT_S, p2p: str = "threads",
                 ranks_per_node: int | None = None):
        factory.check(p2p)
        self.world_size, self.timeout, self.p2p, self.ranks_per_node = world_size, timeout, p2p, ranks_per_node
        self.groups = 0  # how many groups were built (one unless a run failed)
        self._comms: list | None = None

    def __enter__(self) -> ThreadRanks:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, fn) -> list:
        """fn(comm) on every rank; each rank's result in rank order, or the root cause of the failure raised."""
        if self._comms is None:
            self._start()

        def counted_from_zero(comm):
            comm.reset_counters()
            return fn(comm)

        run = self._dispatch(counted_from_zero, lambda rank: self._comms[rank])
        return self._outcome(run, "a run")

    def close(self) -> None:
        """Close every rank's communicator and end the threads."""
        if self._comms is not None:
            self._take_down(self._comms)

    def _start(self) -> None:
        self._fabric = Fabric(self.world_size)
        self._inboxes = [queue.Queue() for _ in range(self.world_size)]
        self._done: queue.Queue = queue.Queue()
        self._busy: set[int] = set()
        self._threads = [threading.Thread(target=_serve, args=(r, self._inboxes[r], self._done), daemon=True,
                                          name=f"pooled-rank{r}") for r in range(self.world_size)]
        for t in self._threads:
            t.start()
        self.groups += 1

        def build(rank: int) -> Communicator:
            control = ThreadCommunicator(self._fabric, rank, self.timeout)
            comm = factory.build(self.p2p, control, timeout=self.timeout, network=None)
            if self.ranks_per_node is not None:
                comm.set_nodes(self.ranks_per_node)
            return comm

        run = self._dispatch(lambda comm: comm, build)
        self._comms = self._outcome(run, "connecting")

    def _dispatch(self, fn, start) -> RankRun:
        """fn on every rank's thread; returns once all are done, or timeout + 30 s after it began."""
        fabric = self._fabric
        run = RankRun(self.world_size, fn, start, keep=True,
                      on_error=lambda rank, e: fabric.abort(f"rank {rank} failed: {e}"))
        self._busy = set(range(self.world_size))
        for inbox in self._inboxes:
            inbox.put(run)
        deadline = time.monotonic() + self.timeout + 30
        while self._busy:
            try:
                self._busy.discard(self._done.get(timeout=max(deadline - time.monotonic(), 0)))
            except queue.Empty:
                break
        return run

    def _outcome(self, run: RankRun, what: str) -> list:
        try:
            return run.outcome(lambda stuck: f"pooled thread ranks {stuck} still in {what} "
                                             f"{self.timeout + 30:g} s after it began")
        except BaseException:
            # a failed rank closed its own communicator; the others' (built, or kept from earlier runs) close here
            self._take_down(self._comms or [c for c in run.results if isinstance(c, Communicator)])
            raise

    def _take_down(self, comms: list) -> None:
        """Close the communicators of the idle ranks and end their threads; a stuck rank is abandoned (a daemon
        thread, its fabric aborted so that it fails at its next receive)."""
        self._fabric.abort("the pool of thread ranks was taken down")
        for rank, comm in enumerate(comms):
            if rank not in self._busy and comm is not None:
                comm.close()
        for inbox in self._inboxes:
            inbox.put(None)
        for rank, t in enumerate(self._threads):
            if rank not in self._busy:
                t.join(self.timeout)
        self._comms = None


def _serve(rank: int, inbox: queue.Queue, done: queue.Queue) -> None:
    """A pooled rank's thread: each run put in its inbox, until None (its own group's queues: a rank abandoned
    stuck in a taken-down group never reports into the next group's)."""
    while (run := inbox.get()) is not None:
        run.rank(rank)
        done.put(rank)
