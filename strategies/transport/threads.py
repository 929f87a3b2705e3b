"""The in-process transport: one thread per rank, one queue per (src, dst) pair.

Fast, deterministic and Ray-free: the strategy tests and the plug-in harness run on it. A shared Fabric
holds the queues; when one rank fails the fabric is aborted so its peers fail at once instead of waiting
out their timeout.
"""

from __future__ import annotations

import queue
import threading
import time

import torch

from strategies.ops import finish_reduction, reduce_into
from strategies.transport.communicator import DEFAULT_TIMEOUT_S, CommError, Communicator
from strategies.transport.link import Network

_POLL_S = 0.05


class Fabric:
    """The shared wiring of one group of thread ranks."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.queues = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size) if s != d}
        self.aborted: str | None = None
        self._board: list = [None] * world_size
        self._barrier = threading.Barrier(world_size)

    def abort(self, why: str) -> None:
        self.aborted = self.aborted or why
        self._barrier.abort()

    def exchange(self, rank: int, obj, timeout: float) -> list:
        """Every rank's object, in rank order (two barriers: all posted, all read)."""
        self._board[rank] = obj
        try:
            self._barrier.wait(timeout)
            board = list(self._board)
            self._barrier.wait(timeout)
        except threading.BrokenBarrierError as e:
            raise CommError(f"rank {rank}: control-plane exchange broken: "
                            f"{self.aborted or 'a peer did not arrive within the timeout'}") from e
        return board


class _Sent:
    def wait(self, timeout):
        return None


class _Pending:
    """A receive: wait() takes the next message from src off the queue and copies it in."""

    def __init__(self, fabric: Fabric, rank: int, src: int, tensor: torch.Tensor):
        self.fabric, self.rank, self.src, self.tensor = fabric, rank, src, tensor

    def wait(self, timeout):
        q = self.fabric.queues[(self.src, self.rank)]
        deadline = time.monotonic() + timeout
        while True:
            if self.fabric.aborted:
                raise CommError(f"aborted: {self.fabric.aborted}")
            try:
                payload, stamp = q.get(timeout=min(_POLL_S, max(deadline - time.monotonic(), 0)))
                break
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"no message from rank {self.src}") from None
        if payload.shape != self.tensor.shape or payload.dtype != self.tensor.dtype:
            raise CommError(f"rank {self.rank}: recv from rank {self.src} expected {self.tensor.numel()} "
                            f"x {self.tensor.dtype}, got {payload.numel()} x {payload.dtype}: "
                            f"ranks disagree on the tensor's size")
        self.tensor.copy_(payload)
        return stamp


class ThreadCommunicator(Communicator):
    transport = "threads"

    def __init__(self, fabric: Fabric, rank: int, timeout: float = DEFAULT_TIMEOUT_S,
                 network: Network | None = None):
        super().__init__(rank, fabric.world_size, timeout, network)
        self.fabric = fabric

    def _raw_isend(self, tensor, dst, stamp):
        self.fabric.queues[(self.rank, dst)].put((tensor.clone(), stamp))
        return _Sent()

    def _raw_irecv(self, tensor, src, stamped):
        return _Pending(self.fabric, self.rank, src, tensor)

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


THREAD_P2P = ("threads", "sockets", "sockets-unix", "sockets-tcp")


def run_threads(world_size: int, fn, timeout: float = DEFAULT_TIMEOUT_S, network: Network | None = None,
                p2p: str = "threads"):
    """Run fn(comm) on world_size thread ranks; return each rank's result, or raise the first error.

    `p2p`: "threads" (queues) or "sockets[-unix|-tcp]": strategies.transport.sockets between the threads (on loopback),
    with the queues as its control plane.
    """
    if p2p not in THREAD_P2P:
        raise ValueError(f"p2p {p2p!r}: expected one of {', '.join(THREAD_P2P)}")
    fabric = Fabric(world_size)
    results: list = [None] * world_size
    errors: list = [None] * world_size

    def body(rank):
        comm = None
        try:
            comm = ThreadCommunicator(fabric, rank, timeout, None if p2p != "threads" else network)
            if p2p != "threads":
                from strategies.transport.sockets import SocketCommunicator, mode_of

                comm = SocketCommunicator(comm, timeout, network, mode=mode_of(p2p))
            results[rank] = fn(comm)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors[rank] = e
            fabric.abort(f"rank {rank} failed: {e}")
        finally:
            if comm is not None:
                comm.close()

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    if any(t.is_alive() for t in threads):
        raise CommError(f"thread ranks still running {timeout + 30:g} s after their timeout")
    # Report the root cause: the first rank that failed on its own, not one aborted because of it.
    first = [e for e in errors if e is not None and "aborted:" not in str(e)] or [e for e in errors if e]
    if first:
        raise first[0]
    return results
