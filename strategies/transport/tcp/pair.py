"""One socket to one peer of the socket transport: the header every message starts with, the posted sends and
receives, the messages that arrived before their receive, and the buffer the stream is read through.
"""

from __future__ import annotations

import math
import socket
import struct
from collections import deque

import torch

# payload bytes, dtype code, kind, sender's address (a descriptor), first byte on the wire, sender done (NaN: none)
_HEADER = struct.Struct("<qiiQdd")
_DATA, _DESCRIPTOR, _ACK = 0, 1, 2
_ACK_HEADER = _HEADER.pack(0, 0, _ACK, 0, math.nan, math.nan)
# each pair's receive buffer: headers and in-stream payloads are read through it, many per recv call
_READ_BUFFER_BYTES = 1 << 20

def _byte_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous host tensor's storage (no copy)."""
    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy()).cast("B")


class _Send:
    """A posted send: its header and (in-stream) payload still to write; a descriptor waits for its ack."""

    __slots__ = ("data", "total", "written", "done", "keep", "descriptor")

    def __init__(self, header: bytes, payload: memoryview | None, keep, descriptor: bool = False):
        self.data = [memoryview(header)] + ([payload] if payload is not None else [])
        self.total = sum(len(d) for d in self.data)
        self.written = 0
        self.done = False
        self.keep = keep  # the tensor whose bytes are being sent or read by the peer
        self.descriptor = descriptor  # written, it is done only when the peer acknowledges its copy

    def remaining(self) -> list[memoryview]:
        off = self.written
        head = len(self.data[0])
        if off < head:
            return [self.data[0][off:]] + self.data[1:]
        return [self.data[1][off - head:]]


class _Recv:
    """A posted receive into a host tensor (a CUDA target gets the bytes after they arrive)."""

    __slots__ = ("tensor", "payload", "got", "done", "stamp", "target")

    def __init__(self, tensor: torch.Tensor, target: torch.Tensor | None):
        self.tensor, self.target = tensor, target
        self.payload = _byte_view(tensor)
        self.got = 0
        self.done = False
        self.stamp = None


class _Pair:
    """The socket to one peer: queues of sends to write, descriptors awaiting acks, posted receives, messages
    that arrived before their receive, and the buffer the stream is read through."""

    __slots__ = ("peer", "sock", "fd", "pid", "single_copy", "sends", "unacked", "recvs", "arrived", "filling",
                 "rbuf", "rview", "lo", "hi", "error")

    def __init__(self, peer: int, sock: socket.socket):
        self.peer, self.sock, self.fd = peer, sock, sock.fileno()
        self.pid = 0  # the peer's pid, when this rank may read its memory
        self.single_copy = False  # whether the peer may read this rank's memory (then large sends go by descriptor)
        self.sends: deque[_Send] = deque()
        self.unacked: deque[_Send] = deque()
        self.recvs: deque[_Recv] = deque()
        self.arrived: deque[tuple[tuple, bytes | None]] = deque()
        self.filling: _Recv | None = None  # matched, its in-stream payload read straight into its tensor
        self.rbuf = bytearray(_READ_BUFFER_BYTES)
        self.rview = memoryview(self.rbuf)
        self.lo = self.hi = 0
        self.error: str | None = None


def _awaits(pair: _Pair) -> bool:
    """Whether this rank expects bytes from the pair's peer: a posted receive, a payload being read, an ack."""
    return bool(pair.recvs or pair.unacked or pair.filling is not None)
