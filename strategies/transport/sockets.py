"""The socket transport: point to point over one stream socket per pair of ranks, driven by the calling thread.

Why not gloo's point to point: a gloo message goes from the caller to gloo's event-loop thread and back (two
thread wake-ups per message) after torch's dispatch; with 4 ranks on 2 cores that fixed cost, not the bytes,
set the time of a small allreduce (README, "Transport"). Here a small message is one `sendmsg` from the
sender's own thread and one `recv_into` by the receiver's; waiting is a `poll` on the sockets with work
pending, and every wait drives every pending transfer of the rank, so a ring's send to the right keeps moving
while the rank waits on its left.

Where the pairs run:
- Ranks in one network namespace of one machine (one Ray node) pair over Unix stream sockets, each rank's
  listening in a fresh 0700 directory (an abstract name is listed in /proc/net/unix for anyone to connect to;
  a file in a private directory admits this user only), removed once the ranks are paired. A payload above
  SINGLE_COPY_BYTES then moves as MPI's shared-memory transports move it (CMA):
  the sender sends a descriptor (its address), the receiver copies the bytes out of the sender's memory with
  one `process_vm_readv` and answers with an acknowledgement that completes the send. One copy instead of a
  socket's two (into the kernel, out of it), done by the receiver alone: on this 2-core machine that, not the
  wire, bounds a large allreduce. Whether a peer may read this process's memory (same user, ptrace allowed)
  is probed when connecting; a pair where it may not sends every payload through the socket.
- Ranks in different namespaces (the kernel-shaped cluster: one rank per namespace) or on different machines
  pair over TCP (TCP_NODELAY) on the address each rank's node is reached at, so every byte crosses the
  shaped link, and payloads always travel in the stream.
Addresses are swapped when the communicator is built, over a `control` communicator that also carries
`allgather_object` and the backend's own `native_allreduce` (gloo's TorchCommunicator between Ray actors, the
thread transport in tests); `close()` closes every socket.

Strangers. Anything may connect to a TCP listener, and any process of this user to a Unix one. Every accepted
connection must say, within its own short deadline (_HANDSHAKE_S), the group's random token and a rank this rank
still waits for; handshakes are read side by side, so a silent stranger delays no rank. A Unix connection from a
process that is not one of the group's is dropped at once (SO_PEERCRED). Strangers are dropped, counted
(`strangers`) and named in the error if a rank then fails to connect.

Every message starts with a 40-byte header (payload bytes, dtype code, kind, the sender's address for a
descriptor, the emulation stamp); messages on a pair arrive in the order they were sent and receives from a
peer match them in the order they were posted (as gloo and MPI match one tag). A message that arrives before
its receive is posted waits in the pair's arrived queue (a small payload as bytes, a descriptor as its
header). An in-stream send completes once its bytes are in the kernel; a descriptor send once the receiver
has copied it, as gloo's sends complete only against a posted receive: strategies written for gloo work
unchanged. A header that disagrees with the posted buffer is an error naming both sizes; the pair's stream
is then out of step, so the communicator refuses further traffic with that peer.
"""

from __future__ import annotations

import functools
import math
import os
import select
import socket
import struct
import time
import uuid
from collections import deque

import torch

from strategies.transport.communicator import DEFAULT_TIMEOUT_S, CommError, Communicator
from strategies.transport.link import Network
from strategies.transport.names import socket_mode
from strategies.transport.tcp.address import (
    _Address,
    _Handshakes,
    _namespace,
    _remove_unix_listener,
    _unix_listener,
)
from strategies.transport.tcp.cma import _can_read, _read_peer_memory
from strategies.transport.tcp.pair import (
    _ACK,
    _ACK_HEADER,
    _DATA,
    _DESCRIPTOR,
    _HEADER,
    _awaits,
    _byte_view,
    _Pair,
    _Recv,
    _Send,
)
from strategies.transport.wire import dtype_code, dtype_of, mismatch

# a Unix pair moves larger payloads by descriptor + process_vm_readv (measured: README, "Transport")
SINGLE_COPY_BYTES = 64 * 1024
# kernel socket buffers of a Unix pair (the default 208 KiB cost a wake-up per 208 KiB of a large payload)
_UNIX_SOCKET_BUFFER_BYTES = 1 << 20
_CONNECT_RETRY_S = 0.01
# how long an accepted connection has to say which rank it is; several run at once, so a silent one delays no rank
_HANDSHAKE_S = 5.0
_MAX_HANDSHAKES = 64  # in flight at once: past it the oldest is dropped, so a flood holds no more file descriptors
_BACKLOG_EXTRA = 64
_CLOSE_FLUSH_S = 2.0
MODES = ("auto", "unix", "tcp")


class SocketCommunicator(Communicator):
    """Point to point over a mesh of stream sockets; the control plane and native allreduce are `control`'s.

    `control`: a communicator of the same rank and world size (its own traffic is not counted here).
    `address`: the IP this rank's node is reached at (TCP pairs listen there; 127.0.0.1 on one machine).
    `mode`: "auto" (Unix + single copy within a namespace, else TCP), "unix" (Unix within a namespace, every
    payload in the stream) or "tcp" (every pair over TCP): the last two exist to test and measure each path.
    """

    def __init__(self, control: Communicator, timeout: float = DEFAULT_TIMEOUT_S, network: Network | None = None,
                 address: str = "127.0.0.1", mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        super().__init__(control.rank, control.world_size, timeout, network)
        self.control = control
        self.single_copy_bytes = SINGLE_COPY_BYTES  # larger payloads of a single-copy pair go by descriptor
        self._pairs: dict[int, _Pair] = {}
        self.strangers: list[str] = []  # connections to this rank's listeners that were not ranks: who, and why
        self._by_fd: dict[int, _Pair] = {}
        self._poll = select.poll()
        self._polled: dict[int, int] = {}
        try:
            self._connect(address, mode)
        except BaseException:
            self.close()
            raise
        kinds = sorted({("unix+single-copy" if p.single_copy else "unix") if p.sock.family == socket.AF_UNIX
                        else "tcp" for p in self._pairs.values()})
        self.transport = "sockets-" + ("/".join(kinds) if kinds else "none")

    def allgather_object(self, obj) -> list:
        return self.control.allgather_object(obj)

    def native_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        self.control.native_allreduce(tensor, op)

    # -- connecting: listen, swap addresses over the control group, connect down, accept up ------------

    def _connect(self, address: str, mode: str) -> None:
        where = _namespace()
        listeners, unix_path = [], None
        probe = torch.randint(0, 2**62, (1,), dtype=torch.int64)  # peers read it to learn if they may
        try:
            if mode != "tcp" and where[1] != -1:
                unix, unix_path = _unix_listener(self.world_size + _BACKLOG_EXTRA)
                listeners.append(unix)
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(tcp)
            tcp.bind((address, 0))
            tcp.listen(self.world_size + _BACKLOG_EXTRA)
            mine = _Address(where, unix_path, (address, tcp.getsockname()[1]), os.getpid(),
                            (probe.data_ptr(), int(probe)), uuid.uuid4().bytes)
            everyone: list[_Address] = self.allgather_object(mine)
            # every connection opens with rank 0's random token: anything else connecting is a stranger
            token = everyone[0].token
            deadline = time.monotonic() + self.timeout
            for peer in range(self.rank):  # connect to every lower rank, then accept every higher one
                other = everyone[peer]
                if unix_path is not None and other.unix is not None and other.where == where:
                    sock = self._dial(socket.AF_UNIX, other.unix, peer, deadline)
                else:
                    sock = self._dial(socket.AF_INET, other.tcp, peer, deadline)
                sock.sendall(token + struct.pack("<q", self.rank))
                self._add(peer, sock)
            hellos = _Handshakes(listeners, token, {a.pid for a in everyone}, min(_HANDSHAKE_S, self.timeout),
                                 _MAX_HANDSHAKES)
            try:
                self._accept_ranks(hellos, deadline)
            finally:
                hellos.close()
            # single copy: which Unix peers' memory this rank can read; a peer sends by descriptor only to those
            readable = [p for p, pair in self._pairs.items()
                        if mode == "auto" and pair.sock.family == socket.AF_UNIX and _can_read(everyone[p].pid,
                                                                                                *everyone[p].probe)]
            for p in readable:
                self._pairs[p].pid = everyone[p].pid
            can_read_me = self.allgather_object(readable)
            for p, pair in self._pairs.items():
                pair.single_copy = self.rank in can_read_me[p]
        finally:
            for listener in listeners:
                listener.close()
            if unix_path is not None:
                _remove_unix_listener(unix_path)
        del probe  # kept alive until every peer had its read

    def _dial(self, family: int, addr, peer: int, deadline: float) -> socket.socket:
        while True:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(max(deadline - time.monotonic(), 1e-3))
            try:
                sock.connect(addr)
                return sock
            except OSError as e:
                sock.close()
                if time.monotonic() >= deadline:
                    raise CommError(f"rank {self.rank}: could not connect to rank {peer} at {addr!r}: {e}") from e
                time.sleep(_CONNECT_RETRY_S)

    def _accept_ranks(self, hellos: _Handshakes, deadline: float) -> None:
        """Accept every higher rank; strangers are dropped as they show themselves (see _Handshakes)."""
        while len(self._pairs) < self.world_size - 1:
            if time.monotonic() >= deadline:
                missing = sorted(set(range(self.rank + 1, self.world_size)) - set(self._pairs))
                raise CommError(f"rank {self.rank}: ranks {missing} did not connect within {self.timeout:g} s"
                                f"{hellos.described()}")
            for peer, sock, who in hellos.poll(deadline):
                if self.rank < peer < self.world_size and peer not in self._pairs:
                    self._add(peer, sock)
                else:  # the group's token, but no rank this one still waits for: not trusted either
                    hellos.drop(sock, who, f"claims rank {peer}, not a rank still expected")
        self.strangers = list(hellos.strangers)

    def _add(self, peer: int, sock: socket.socket) -> None:
        if sock.family == socket.AF_INET:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        else:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _UNIX_SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _UNIX_SOCKET_BUFFER_BYTES)
        sock.setblocking(False)
        pair = _Pair(peer, sock)
        self._pairs[peer] = pair
        self._by_fd[pair.fd] = pair

    # -- the raw operations ----------------------------------------------------------------------------

    def _raw_isend(self, tensor, dst, stamp):
        pair = self._usable(dst)
        if tensor.is_cuda:
            tensor = tensor.cpu()
        first_byte, sender_done = stamp if stamp else (math.nan, math.nan)
        nbytes = tensor.numel() * tensor.element_size()
        code = dtype_code(tensor.dtype)
        if pair.single_copy and nbytes > self.single_copy_bytes:
            header = _HEADER.pack(nbytes, code, _DESCRIPTOR, tensor.data_ptr(), first_byte, sender_done)
            op = _Send(header, None, tensor, descriptor=True)
        else:
            op = _Send(_HEADER.pack(nbytes, code, _DATA, 0, first_byte, sender_done), _byte_view(tensor), tensor)
        pair.sends.append(op)
        self._push(pair)
        return functools.partial(self._wait, op)

    def _raw_irecv(self, tensor, src, stamped):
        pair = self._usable(src)
        target = None
        if tensor.is_cuda:  # received through a host buffer
            target, tensor = tensor, torch.empty(tensor.shape, dtype=tensor.dtype)
        op = _Recv(tensor, target)
        pair.recvs.append(op)
        self._match(pair)
        self._pull(pair)
        return functools.partial(self._wait, op)

    def _wait(self, op: _Send | _Recv, timeout: float):
        """A raw operation's wait: drive the rank's transfers until `op` is done; a receive returns its stamp."""
        self._drive(op, time.monotonic() + timeout)
        return getattr(op, "stamp", None)

    def _usable(self, peer: int) -> _Pair:
        pair = self._pairs.get(peer)
        if pair is None:
            raise CommError(f"rank {self.rank}: no connection to rank {peer} (the communicator is closed)")
        if pair.error:
            raise CommError(pair.error)
        return pair

    # -- writing -------------------------------------------------------------------------------------

    def _push(self, pair: _Pair) -> None:
        """Write what the kernel takes now, oldest send first."""
        while pair.sends:
            op = pair.sends[0]
            try:
                op.written += pair.sock.sendmsg(op.remaining())
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._fail(pair, f"sending to rank {pair.peer} failed: {e}")
            if op.written < op.total:
                return
            pair.sends.popleft()
            if op.descriptor:  # done when the peer has read it
                pair.unacked.append(op)
            else:
                op.done, op.keep = True, None

    # -- reading -------------------------------------------------------------------------------------

    def _pull(self, pair: _Pair) -> None:
        """Read what has arrived and act on every whole message, until the stream has nothing more to give."""
        while True:
            if pair.filling is not None:
                if not self._fill(pair):
                    return
                continue
            if self._parse(pair):
                continue
            if not (pair.recvs or pair.unacked) or not self._read(pair):
                return  # nothing awaited from this peer: leave the rest (or its end) in the kernel

    def _read(self, pair: _Pair) -> bool:
        """Read more of the stream into the pair's buffer; False if nothing came (or there is no room)."""
        if pair.lo == pair.hi:
            pair.lo = pair.hi = 0
        elif pair.hi == len(pair.rbuf):  # keep the unread tail, move it to the front
            if pair.lo == 0:
                return False  # a whole buffer of messages no receive is posted for: wait for one
            tail = pair.hi - pair.lo
            pair.rview[:tail] = pair.rview[pair.lo:pair.hi]
            pair.lo, pair.hi = 0, tail
        got = self._recv_into(pair, pair.rview[pair.hi:])
        pair.hi += got
        return got > 0

    def _recv_into(self, pair: _Pair, into: memoryview) -> int:
        """Bytes the kernel has for `into` now (0: none yet); the end of the stream or an error fails the pair."""
        try:
            got = pair.sock.recv_into(into)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            self._fail(pair, f"receiving from rank {pair.peer} failed: {e}")
        if got == 0:
            self._fail(pair, f"rank {pair.peer} closed the connection (its process exited or failed)")
        return got

    def _fill(self, pair: _Pair) -> bool:
        """Read a matched in-stream payload straight into its tensor; True once it is complete."""
        op = pair.filling
        op.got += self._recv_into(pair, op.payload[op.got:])
        if op.got < len(op.payload):
            return False
        pair.filling = None
        self._finish(op)
        return True

    def _parse(self, pair: _Pair) -> bool:
        """Act on the next whole message in the buffer; False if it needs more bytes (or a posted receive)."""
        avail = pair.hi - pair.lo
        if avail < _HEADER.size:
            return False
        header = _HEADER.unpack_from(pair.rbuf, pair.lo)
        nbytes, _, kind = header[:3]
        if kind == _ACK:
            pair.lo += _HEADER.size
            if not pair.unacked:
                self._fail(pair, f"rank {pair.peer} acknowledged a message this rank did not send")
            op = pair.unacked.popleft()
            op.done, op.keep = True, None
            return True
        if kind == _DESCRIPTOR:
            pair.lo += _HEADER.size
            pair.arrived.append((header, None))
            self._match(pair)
            return True
        if kind != _DATA:
            self._fail(pair, f"rank {pair.peer} sent a message of unknown kind {kind}")
        start = pair.lo + _HEADER.size
        if pair.recvs and not pair.arrived:  # its receive is posted: copy what is here, read the rest into place
            op = pair.recvs.popleft()
            self._check(pair, op, header)
            take = min(avail - _HEADER.size, nbytes)
            op.payload[:take] = pair.rview[start:start + take]
            op.got = take
            pair.lo = start + take
            if take == nbytes:
                self._finish(op)
            else:
                pair.filling = op
            return True
        if avail - _HEADER.size >= nbytes:  # no receive yet: keep the payload until one is posted
            pair.arrived.append((header, bytes(pair.rview[start:start + nbytes])))
            pair.lo = start + nbytes
            return True
        return False

    def _match(self, pair: _Pair) -> None:
        """Complete posted receives from messages that arrived before them, in order."""
        while pair.arrived and pair.recvs:
            header, data = pair.arrived.popleft()
            op = pair.recvs.popleft()
            self._check(pair, op, header)
            if data is not None:
                op.payload[:] = data
            else:  # a descriptor: copy out of the sender's memory, then tell it its buffer is free
                try:
                    _read_peer_memory(pair.pid, header[3], op.tensor.data_ptr(), header[0])
                except OSError as e:
                    self._fail(pair, f"reading rank {pair.peer}'s message from its memory failed: {e}")
                pair.sends.append(_Send(_ACK_HEADER, None, None))
                self._push(pair)
            self._finish(op)

    def _check(self, pair: _Pair, op: _Recv, header: tuple) -> None:
        nbytes, code, _, _, first_byte, sender_done = header
        why = mismatch(pair.peer, op.tensor, nbytes, dtype_of(code))
        if why:
            self._fail(pair, why)
        if header[2] == _DESCRIPTOR and not pair.pid:
            self._fail(pair, f"rank {pair.peer} sent a descriptor, but this rank cannot read its memory")
        op.stamp = None if math.isnan(first_byte) else (first_byte, sender_done)

    @staticmethod
    def _finish(op: _Recv) -> None:
        op.done = True
        if op.target is not None:
            op.target.copy_(op.tensor)
        op.tensor = op.target = op.payload = None

    def _fail(self, pair: _Pair, why: str):
        pair.error = f"rank {self.rank}: {why}; no more traffic with rank {pair.peer} on this communicator"
        raise CommError(pair.error)

    # -- waiting ---------------------------------------------------------------------------------------

    def _drive(self, op: _Send | _Recv, deadline: float) -> None:
        """Move every pending transfer of this rank until `op` is done; TimeoutError at the deadline."""
        while not op.done:
            want = {}
            for pair in self._pairs.values():
                if pair.error and (pair.sends or _awaits(pair)):
                    raise CommError(pair.error)
                if pair.sends:
                    self._push(pair)
                if _awaits(pair):
                    self._pull(pair)
                if op.done:
                    return
                # what is still pending after that progress decides what to wait for
                events = (select.POLLOUT if pair.sends else 0) | (select.POLLIN if _awaits(pair) else 0)
                if events:
                    want[pair.fd] = events
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no progress before the deadline")
            self._watch(want)
            for fd, event in self._poll.poll(min(left, 3600) * 1000):
                if event & (select.POLLERR | select.POLLHUP | select.POLLNVAL) and not event & select.POLLIN:
                    pair = self._by_fd[fd]
                    self._fail(pair, f"the connection to rank {pair.peer} broke (poll events {event:#x})")

    def _watch(self, want: dict[int, int]) -> None:
        """Register with poll() exactly the sockets (and events) with work pending."""
        for fd in [fd for fd in self._polled if fd not in want]:
            self._poll.unregister(fd)
            del self._polled[fd]
        for fd, events in want.items():
            if self._polled.get(fd) != events:
                self._poll.register(fd, events)
                self._polled[fd] = events

    def close(self) -> None:
        """Write what is still queued (an ack the kernel had no room for; bounded by _CLOSE_FLUSH_S), then close
        every socket: a peer waiting on this rank then fails at once on the closed stream."""
        deadline = time.monotonic() + min(self.timeout, _CLOSE_FLUSH_S)
        for pair in self._pairs.values():  # a descriptor not yet sent: its memory is not to be read any more
            pair.sends = deque(op for op in pair.sends if op.written or not op.descriptor)
        while any(p.sends and not p.error for p in self._pairs.values()) and time.monotonic() < deadline:
            want = {}
            for pair in self._pairs.values():
                if pair.sends and not pair.error:
                    try:
                        self._push(pair)
                    except CommError:
                        continue
                    if pair.sends:
                        want[pair.fd] = select.POLLOUT
            if want:
                self._watch(want)
                self._poll.poll(max(deadline - time.monotonic(), 0) * 1000)
        for pair in self._pairs.values():
            try:
                pair.sock.close()
            except OSError:
                pass
        self._pairs, self._by_fd, self._polled = {}, {}, {}
        self._poll = select.poll()
        self.control.close()


def build(name: str, control: Communicator, *, timeout: float, network: Network | None, address: str):
    """The factory's "sockets", "sockets-unix" and "sockets-tcp": a mesh of sockets, `control` its control plane."""
    return SocketCommunicator(control, timeout, network, address=address, mode=socket_mode(name))
