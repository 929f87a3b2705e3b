"""Faults on the socket transport's streams (strategies.transport.sockets) on thread ranks: a truncated frame, a
garbage header, a reset in the middle of a payload, a slow reader and a slow writer. Each fault ends in a CommError
on the receiving rank that names the peer, within a bound far below a hang; slow but live peers still deliver
every byte.

The faults are injected below the transport, on the stream itself: after the group is built, a rank's socket to
its peer is wrapped (`_wrap_stream`, the one place that reaches inside the communicator) by a socket that writes
only part of what the transport hands it, writes garbage, resets, or reads a few bytes at a time. The transport's
own code builds every frame; what is asserted is what its public send/recv do about it.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
import torch

from strategies.transport.communicator import CommError, CommTimeout
from strategies.transport.threads import run_threads

P2P = ("sockets", "sockets-tcp")
# 4,000 float32 = 16 KB: below the single-copy limit, so the payload travels in the stream on every path
NUMEL = 4000
HEADER_BYTES = 40  # the documented frame header: payload bytes, dtype code, kind, address, two stamps


def _wrap_stream(comm, peer: int, make):
    """Replace this rank's socket to `peer` by make(real_socket); returns the wrapper."""
    pair = comm._pairs[peer]  # the transport's per-peer state: the only internal these tests touch
    pair.sock = make(pair.sock)
    return pair.sock


class _Stream:
    """A socket that passes everything to the real one; subclasses change what sendmsg/recv_into do."""

    def __init__(self, real: socket.socket):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)


class _Truncating(_Stream):
    """Writes the first `keep` bytes the transport sends, then `then`: "close" (the process is gone), "reset"
    (TCP RST: SO_LINGER 0; a Unix stream just closes) or "silent" (stays connected, writes nothing more)."""

    def __init__(self, real, keep: int, then: str):
        super().__init__(real)
        self.keep, self.then, self.written, self.cut = keep, then, 0, threading.Event()

    def sendmsg(self, buffers, *args):
        data = b"".join(bytes(b) for b in buffers)[:self.keep - self.written]
        if data:
            self.written += self.real.sendmsg([data])
        if self.written < self.keep:
            return self.written
        if not self.cut.is_set():
            self.cut.set()
            if self.then == "reset" and self.real.family == socket.AF_INET:
                self.real.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if self.then in ("close", "reset"):
                self.real.close()
        raise BlockingIOError  # the rest never goes: the kernel "has no room"


class _Garbling(_Stream):
    """Sends `header` instead of the transport's first frame header, then the frame's payload as it was."""

    def __init__(self, real, header: bytes):
        super().__init__(real)
        self.header, self.sent = header, 0

    def sendmsg(self, buffers, *args):
        data = b"".join(bytes(b) for b in buffers)
        if self.sent < HEADER_BYTES:
            take = HEADER_BYTES - self.sent
            data = self.header[self.sent:HEADER_BYTES] + data[take:]
        n = self.real.sendmsg([data])
        self.sent += n
        return n


class _Dribbling(_Stream):
    """A slow peer: reads or writes at most `most` bytes per call (headers split anywhere), sleeping a little."""

    def __init__(self, real, most: int):
        super().__init__(real)
        self.most = most

    def recv_into(self, buffer, *args):
        time.sleep(0.0005)
        return self.real.recv_into(memoryview(buffer)[:self.most])

    def sendmsg(self, buffers, *args):
        time.sleep(0.0005)
        return self.real.sendmsg([b"".join(bytes(b) for b in buffers)[:self.most]])


def _receiver_error(p2p: str, make_stream, timeout: float = 10.0, numel: int = NUMEL, keep_alive: bool = False):
    """Rank 1 sends `numel` floats to rank 0 through the faulty stream make_stream(real); returns (rank 0's error
    text, its type, seconds rank 0 waited). `keep_alive`: rank 1 stays connected until rank 0 has failed."""
    failed = threading.Event()

    def body(comm):
        if comm.rank == 1:
            _wrap_stream(comm, 0, make_stream)
            try:
                comm.send(torch.arange(numel, dtype=torch.float32), 0)
            except CommError:
                pass  # the sender may notice its own broken stream: rank 0's error is the one under test
            if keep_alive:
                failed.wait(timeout + 10)
            return None
        start = time.monotonic()
        try:
            comm.recv(torch.zeros(numel), 1)
        except CommError as e:
            return str(e), type(e), time.monotonic() - start
        finally:
            failed.set()
        return None, None, time.monotonic() - start

    return run_threads(2, body, timeout=timeout, p2p=p2p)[0]


@pytest.mark.timing
@pytest.mark.parametrize("p2p", P2P)
@pytest.mark.parametrize("cut", [HEADER_BYTES // 2, HEADER_BYTES + 4 * NUMEL // 2], ids=["in-header", "in-payload"])
def test_a_frame_cut_short_by_a_peer_that_dies_fails_at_once_naming_the_peer(p2p, cut):
    text, kind, waited = _receiver_error(p2p, lambda real: _Truncating(real, cut, "close"))
    assert kind is not None and issubclass(kind, CommError), "a truncated frame was received as a whole message"
    assert text.startswith("rank 0: "), text
    assert "rank 1 closed the connection" in text, text
    assert waited < 5, f"rank 0 waited {waited:.1f} s for a peer already gone (timeout 10 s)"


@pytest.mark.parametrize("p2p", P2P)
def test_a_frame_cut_short_by_a_live_silent_peer_times_out_naming_the_peer(p2p):
    cut = HEADER_BYTES + 100
    text, kind, waited = _receiver_error(p2p, lambda real: _Truncating(real, cut, "silent"), timeout=1.5,
                                         keep_alive=True)
    assert kind is CommTimeout, (kind, text)
    assert text.startswith("rank 0: recv from rank 1 timed out after 1.5 s"), text
    assert 1.4 < waited < 5, f"rank 0 waited {waited:.1f} s with a 1.5 s timeout"


@pytest.mark.parametrize("p2p", P2P)
def test_a_reset_in_the_middle_of_a_payload_fails_at_once_naming_the_peer(p2p):
    cut = HEADER_BYTES + 4 * NUMEL // 3
    text, kind, waited = _receiver_error(p2p, lambda real: _Truncating(real, cut, "reset"))
    assert kind is not None and issubclass(kind, CommError), "a reset stream delivered a whole message"
    assert text.startswith("rank 0: "), text
    # TCP: the reset itself (ECONNRESET) or, if the kernel delivered the end first, the closed stream
    assert ("rank 1 closed the connection" in text or "receiving from rank 1 failed" in text), text
    assert waited < 5, f"rank 0 waited {waited:.1f} s for a reset peer (timeout 10 s)"


GARBAGE = {
    # every field -1: a negative size, no dtype, a kind that does not exist
    "all-ones": b"\xff" * HEADER_BYTES,
    # seeded noise
    "noise": bytes(torch.randint(0, 256, (HEADER_BYTES,), generator=torch.Generator().manual_seed(7),
                                 dtype=torch.uint8).tolist()),
}


@pytest.mark.parametrize("p2p", P2P)
@pytest.mark.parametrize("garbage", list(GARBAGE), ids=list(GARBAGE))
def test_a_garbage_header_fails_at_once_naming_the_peer(p2p, garbage):
    text, kind, waited = _receiver_error(p2p, lambda real: _Garbling(real, GARBAGE[garbage]))
    assert kind is not None and issubclass(kind, CommError), "a garbage header was accepted as a message"
    assert text.startswith("rank 0: rank 1 "), text
    assert "no more traffic with rank 1" in text, text
    assert waited < 5, f"rank 0 waited {waited:.1f} s on a garbage header (timeout 10 s)"


# the documented header's fields (struct "<qiiQdd"): offset and format
FIELDS = {"size": (0, "<q"), "dtype": (8, "<i"), "kind": (12, "<i"), "address": (16, "<Q")}


class _Rewriting(_Stream):
    """Sends the transport's first frame with one header field rewritten (the rest of the stream as it was)."""

    def __init__(self, real, field: str, value: int):
        super().__init__(real)
        self.offset, self.fmt = FIELDS[field]
        self.value, self.sent = value, 0

    def sendmsg(self, buffers, *args):
        data = b"".join(bytes(b) for b in buffers)
        if self.sent == 0 and len(data) >= HEADER_BYTES:
            data = bytearray(data)
            struct.pack_into(self.fmt, data, self.offset, self.value)
        n = self.real.sendmsg([bytes(data)])
        self.sent += n
        return n


@pytest.mark.parametrize("p2p", P2P)
@pytest.mark.parametrize("claimed", [-4, 2**62], ids=["negative-size", "huge-size"])
def test_a_header_claiming_an_impossible_size_is_refused_naming_both_sizes(p2p, claimed):
    """Rank 0 names what was claimed and what it expected; it never allocates or waits for 2^62 bytes."""
    text, kind, waited = _receiver_error(p2p, lambda real: _Rewriting(real, "size", claimed))
    assert kind is not None and issubclass(kind, CommError), "an impossible size was accepted"
    assert text.startswith(f"rank 0: rank 1 sent {claimed} bytes of float32, this rank expected {4 * NUMEL} bytes"), \
        text
    assert waited < 5


@pytest.mark.parametrize("p2p", P2P)
def test_a_header_with_an_unknown_dtype_is_refused_naming_it(p2p):
    text, kind, _ = _receiver_error(p2p, lambda real: _Rewriting(real, "dtype", 99))
    assert kind is not None and issubclass(kind, CommError), "a payload of an unknown dtype was accepted"
    assert text.startswith(f"rank 0: rank 1 sent {4 * NUMEL} bytes of unlisted dtype, this rank expected"), text


@pytest.mark.parametrize("p2p", P2P)
def test_a_forged_descriptor_is_refused_naming_the_peer(p2p):
    """A data frame relabelled as a descriptor (address 0): a TCP pair cannot read peer memory at all, a
    single-copy pair fails reading address 0; neither copies anything in nor waits."""
    text, kind, waited = _receiver_error(p2p, lambda real: _Rewriting(real, "kind", 1))
    assert kind is not None and issubclass(kind, CommError), "a forged descriptor was accepted"
    assert text.startswith("rank 0: "), text
    assert ("rank 1 sent a descriptor, but this rank cannot read its memory" in text
            or "reading rank 1's message from its memory failed" in text), text
    assert waited < 5


@pytest.mark.parametrize("p2p", P2P)
def test_a_stray_acknowledgement_is_refused_naming_the_peer(p2p):
    text, kind, _ = _receiver_error(p2p, lambda real: _Rewriting(real, "kind", 2))
    assert kind is not None and issubclass(kind, CommError), "an acknowledgement of nothing was accepted"
    assert text.startswith("rank 0: rank 1 acknowledged a message this rank did not send"), text


@pytest.mark.parametrize("p2p", P2P)
def test_a_reader_that_comes_late_still_gets_every_byte(p2p):
    """8 MB (more than the kernel buffers) sent to a rank that posts its receive 1 s later: the send waits, it
    does not fail, and the bytes arrive exactly."""
    numel = 2_000_000

    def body(comm):
        if comm.rank == 1:
            comm.send(torch.arange(numel, dtype=torch.float32), 0)
            return None
        time.sleep(1.0)
        got = torch.zeros(numel)
        comm.recv(got, 1)
        return bool(torch.equal(got, torch.arange(numel, dtype=torch.float32)))

    assert run_threads(2, body, timeout=20, p2p=p2p)[0] is True


@pytest.mark.parametrize("p2p", P2P)
def test_a_reader_that_never_comes_times_the_sender_out_naming_it(p2p):
    """A sender to a live rank that does not receive within the timeout fails naming that rank, never hangs."""
    numel = 2_000_000
    done = threading.Event()

    def body(comm):
        if comm.rank == 0:
            done.wait(15)  # connected, alive, never receiving
            return None
        start = time.monotonic()
        try:
            comm.send(torch.arange(numel, dtype=torch.float32), 0)
        except CommError as e:
            return type(e), str(e), time.monotonic() - start
        finally:
            done.set()
        return None, None, time.monotonic() - start

    kind, text, waited = run_threads(2, body, timeout=1.5, p2p=p2p)[1]
    assert kind is CommTimeout, (kind, text)
    assert text.startswith("rank 1: send to rank 0 timed out after 1.5 s"), text
    assert waited < 5


@pytest.mark.parametrize("p2p", P2P)
@pytest.mark.parametrize("side", ["reader", "writer"])
def test_a_peer_moving_seven_bytes_at_a_time_delivers_every_message_in_order(p2p, side):
    """Headers and payloads split at every offset, several messages of different sizes and dtypes queued at once:
    each arrives whole, in order, bit for bit."""
    messages = [torch.arange(n, dtype=dtype) * 3 for n, dtype in
                ((1, torch.float32), (37, torch.float64), (1000, torch.int32), (5, torch.uint8), (2500, torch.float32))]

    def body(comm):
        if comm.rank == 1:
            if side == "writer":
                _wrap_stream(comm, 0, lambda real: _Dribbling(real, 7))
            handles = [comm.isend(m, 0) for m in messages]
            for h in handles:
                h.wait()
            return None
        if side == "reader":
            _wrap_stream(comm, 1, lambda real: _Dribbling(real, 7))
        got = [torch.zeros_like(m) for m in messages]
        handles = [comm.irecv(g, 1) for g in got]
        for h in handles:
            h.wait()
        return [bool(torch.equal(g, m)) for g, m in zip(got, messages)]

    assert run_threads(2, body, timeout=30, p2p=p2p)[0] == [True] * len(messages)
