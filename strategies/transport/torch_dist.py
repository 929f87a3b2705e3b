"""The torch.distributed transport: gloo for host tensors, NCCL when every rank owns its own GPU.

Every message starts with a small float64 header (payload bytes, dtype, emulation stamp) that lets the
receiver refuse a payload of the wrong size or dtype: gloo itself silently truncates a shorter payload.
Over gloo, a payload of up to INLINE_BYTES travels in the same message as its header (one gloo message per
send: the fixed cost of a second one dominated small messages); a larger one follows the header as a
second message on the same pair, both posted at once. The receiver's first buffer always has room for a
header and an inline payload, so whatever the sender chose, the header arrives and is checked. NCCL needs
matching sizes on both sides: there, header and payload are always two messages. Over gloo, CUDA tensors
(ranks sharing one GPU) are staged through host memory. Two caveats of gloo on the wire, measured:
a send completes only once the peer has posted the matching receive (post irecv before waiting on a
send), and a longer payload than the receive buffer aborts the receiving process in gloo's own thread.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import pickle
import time

import torch
import torch.distributed as dist

from strategies.transport import factory
from strategies.transport.communicator import DEFAULT_TIMEOUT_S, CommError, Communicator
from strategies.transport.link import Network
from strategies.transport.ops import LOGICAL, check_op, finish_reduction
from strategies.transport.wire import check_received, dtype_code, dtype_of

_HEADER = 4  # float64: payload bytes, dtype code, first byte on the wire, sender done (NaN: no emulation)
_HEADER_BYTES = _HEADER * 8
# gloo: payloads up to this size ride in the header's message (measured: see README, small messages)
INLINE_BYTES = 64 * 1024
_POLL_S = 50e-6


def _wait_work(work, deadline: float, cuda: bool) -> None:
    """Wait for one torch.distributed request until a monotonic deadline; TimeoutError if it passes."""
    left = deadline - time.monotonic()
    if left <= 0 and not work.is_completed():
        raise TimeoutError("deadline passed before the operation completed")
    if not cuda:
        try:
            work.wait(timeout=dt.timedelta(seconds=max(left, 1e-3)))
        except RuntimeError as e:  # gloo says "Timed out waiting ..." or "Operation timed out!"
            if "timed out" in str(e).lower():
                raise TimeoutError(str(e)) from e
            raise
        return
    # NCCL: poll the CUDA event, so that a peer that never answers cannot block this thread
    while not work.is_completed():
        if time.monotonic() >= deadline:
            raise TimeoutError("NCCL operation did not complete")
        time.sleep(_POLL_S)
    work.wait()


def _wait_sent(works, keep, cuda: bool, timeout: float) -> None:
    """A posted header + payload send's wait; `keep` holds the tensors being sent until it returns."""
    deadline = time.monotonic() + timeout
    for work in works:
        _wait_work(work, deadline, cuda)


class _Posted:
    """A posted header (+ payload) receive; wait() checks the header against the buffer, returns the stamp.

    `payload_work` None: the payload comes inline, after the header in `header`'s buffer (uint8).
    """

    def __init__(self, rank, src, header, header_work, payload_work, tensor, cuda, target=None):
        self.rank, self.src = rank, src
        self.header, self.header_work, self.payload_work = header, header_work, payload_work
        self.tensor, self.cuda, self.target = tensor, cuda, target

    def wait(self, timeout: float):
        deadline = time.monotonic() + timeout
        _wait_work(self.header_work, deadline, self.cuda)
        header = self.header if self.header.dtype == torch.float64 else self.header[:_HEADER_BYTES].view(torch.float64)
        nbytes, code, first_byte, sender_done = header.tolist()
        want_bytes = self.tensor.numel() * self.tensor.element_size()
        check_received(self.rank, self.src, self.tensor, int(nbytes), dtype_of(int(code)))
        if self.payload_work is None:
            self.tensor.reshape(-1).view(torch.uint8).copy_(self.header[_HEADER_BYTES:_HEADER_BYTES + want_bytes])
        else:
            _wait_work(self.payload_work, deadline, self.cuda)
        if self.target is not None:  # a CUDA buffer received through a host staging buffer (gloo)
            self.target.copy_(self.tensor)
        return None if math.isnan(first_byte) else (first_byte, sender_done)


class TorchCommunicator(Communicator):
    """Point to point over an initialized torch.distributed process group (default: the world group).

    `control_group` carries allgather_object: pass a gloo group when `group` is NCCL (default: `group`).
    """

    def __init__(self, rank: int, world_size: int, timeout: float = DEFAULT_TIMEOUT_S,
                 network: Network | None = None, group=None, control_group=None):
        super().__init__(rank, world_size, timeout, network)
        if not dist.is_initialized():
            raise CommError(f"rank {rank}: torch.distributed is not initialized: call init_process_group "
                            f"(or use experiments.cluster.group.WorkerGroup) before TorchCommunicator")
        self.group = group
        self.backend = str(dist.get_backend(group))
        self.cuda = self.backend == "nccl"
        self.transport = f"torch-{self.backend}"
        self.control_group = control_group if control_group is not None else group
        if self.cuda and str(dist.get_backend(self.control_group)) != "gloo":
            raise CommError(f"rank {rank}: an NCCL communicator needs a gloo control_group for "
                            f"allgather_object, got backend {dist.get_backend(self.control_group)!r}")
        if dist.get_world_size(group) != world_size or dist.get_rank(group) != rank:
            raise CommError(f"rank {rank}: the process group has rank {dist.get_rank(group)} of "
                            f"{dist.get_world_size(group)}, expected rank {rank} of {world_size}")
        self._header_device = torch.device("cuda", torch.cuda.current_device()) if self.cuda else "cpu"
        self._inline_bytes = 0 if self.cuda else INLINE_BYTES

    def _check_device(self, tensor: torch.Tensor) -> None:
        if self.cuda and not tensor.is_cuda:
            raise CommError(f"rank {self.rank}: the nccl transport needs CUDA tensors, got one on "
                            f"{tensor.device}: move it to the rank's GPU first")

    def _raw_isend(self, tensor, dst, stamp):
        self._check_device(tensor)
        if tensor.is_cuda and not self.cuda:
            tensor = tensor.cpu()
        first_byte, sender_done = stamp if stamp else (math.nan, math.nan)
        nbytes = tensor.numel() * tensor.element_size()
        header = torch.tensor([nbytes, dtype_code(tensor.dtype), first_byte, sender_done], dtype=torch.float64,
                              device=self._header_device)
        peer = self._group_rank(dst)
        if nbytes <= self._inline_bytes:  # one message: header, then the payload's bytes
            message = torch.empty(_HEADER_BYTES + nbytes, dtype=torch.uint8)
            message[:_HEADER_BYTES].view(torch.float64).copy_(header)
            message[_HEADER_BYTES:].copy_(tensor.reshape(-1).view(torch.uint8))
            return functools.partial(_wait_sent, [dist.isend(message, peer, group=self.group)], message, self.cuda)
        works = [dist.isend(header, peer, group=self.group), dist.isend(tensor, peer, group=self.group)]
        return functools.partial(_wait_sent, works, (header, tensor), self.cuda)

    def _raw_irecv(self, tensor, src, stamped):
        self._check_device(tensor)
        target = tensor if tensor.is_cuda and not self.cuda else None
        if target is not None:
            tensor = torch.empty(tensor.shape, dtype=tensor.dtype)
        peer = self._group_rank(src)
        if self.cuda:  # NCCL: sizes must match, so always a header message and a payload message
            header = torch.empty(_HEADER, dtype=torch.float64, device=self._header_device)
            header_work = dist.irecv(header, peer, group=self.group)
            payload_work = dist.irecv(tensor, peer, group=self.group)
            return _Posted(self.rank, src, header, header_work, payload_work, tensor, True, target).wait
        # gloo: the first buffer holds a header and any inline payload, so an inline sender never overruns it
        # (a shorter message is fine; gloo aborts the process on a longer one)
        first = torch.empty(_HEADER_BYTES + self._inline_bytes, dtype=torch.uint8)
        header_work = dist.irecv(first, peer, group=self.group)
        nbytes = tensor.numel() * tensor.element_size()
        payload_work = None if nbytes <= self._inline_bytes else dist.irecv(tensor, peer, group=self.group)
        return _Posted(self.rank, src, first, header_work, payload_work, tensor, False, target).wait

    def _group_rank(self, rank: int) -> int:
        """isend/irecv take global ranks; translate when running on a subgroup."""
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    def native_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        """dist.all_reduce in place. gloo has no AVG: a mean is a SUM finished as the strategies finish it.
        Logical ops and bool tensors travel as 0/1 (or 0/255) uint8: land = MIN, lor = MAX, lxor = BXOR."""
        check_op(op, tensor.dtype)
        self._check_device(tensor)
        logical = op in LOGICAL or tensor.dtype == torch.bool
        reduce_op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
                     "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT, "land": dist.ReduceOp.MIN,
                     "lor": dist.ReduceOp.MAX, "lxor": dist.ReduceOp.BXOR, "band": dist.ReduceOp.BAND,
                     "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}[op]
        staged = tensor.cpu() if tensor.is_cuda and not self.cuda else tensor
        if logical:
            staged = (staged != 0).to(torch.uint8)
        work = dist.all_reduce(staged, reduce_op, group=self.group, async_op=True)
        self._control(lambda deadline: _wait_work(work, deadline, self.cuda), "all_reduce")
        finish_reduction(staged, op, self.world_size)
        if staged is not tensor:
            tensor.copy_(staged)

    def allgather_object(self, obj) -> list:
        """Every rank's picklable object in rank order, over the (gloo) control group, with the timeout."""
        data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)

        def exchange(deadline):
            size = torch.tensor([data.numel()], dtype=torch.int64)
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
            _wait_work(dist.all_gather(sizes, size, group=self.control_group, async_op=True), deadline, False)
            longest = max(int(s) for s in sizes)
            padded = torch.zeros(longest, dtype=torch.uint8)
            padded[:data.numel()] = data
            gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
            _wait_work(dist.all_gather(gathered, padded, group=self.control_group, async_op=True), deadline, False)
            return [pickle.loads(g[:int(s)].numpy().tobytes()) for g, s in zip(gathered, sizes)]

        return self._control(exchange, "allgather_object")

    def _control(self, fn, what: str):
        """Run a collective with this communicator's timeout; errors name this rank and the operation."""
        deadline = time.monotonic() + self.timeout
        return self._guard(lambda: fn(deadline), what, hint=f"a peer dead, stalled, or not calling {what}")


def build(name: str, control: Communicator, *, timeout: float, network: Network | None, address: str):
    """The factory's "gloo": point to point over the control plane's own process group (gloo, or NCCL where every
    rank owns its GPU), with `network` emulated."""
    factory.require(name, control, TorchCommunicator, "a torch.distributed communicator (TorchCommunicator)")
    return TorchCommunicator(control.rank, control.world_size, timeout, network, group=control.group,
                             control_group=control.control_group)
