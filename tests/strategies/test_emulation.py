"""Link emulation over the thread transport: bandwidth, incast and per-message latency cost what they say.

Emulation only ever sleeps, so a result below the tolerance is a real failure; one above it may be a loaded
machine, so each measurement gets one retry.
"""

from __future__ import annotations

import time

import pytest
import torch

from strategies.transport.link import Link, Network
from strategies.transport.threads import run_threads

MB = 10**6


def within(measure, expected: float, tolerance: float) -> float:
    """Run `measure` (seconds) up to twice; return the first result within expected +- tolerance."""
    result = measure()
    if abs(result - expected) > tolerance * expected:
        result = measure()
    return result


def incast_time(senders: int, nbytes: int, network: Network, p2p: str = "threads") -> float:
    """Ranks 1..senders each send nbytes to rank 0 at once; seconds from the start until rank 0 has all."""

    def body(comm):
        comm.barrier()
        start = time.time()
        if comm.rank == 0:
            for h in [comm.irecv(torch.empty(nbytes, dtype=torch.uint8), src) for src in range(1, senders + 1)]:
                h.wait()
            return time.time() - start
        comm.send(torch.empty(nbytes, dtype=torch.uint8), 0)

    return run_threads(senders + 1, body, timeout=30, network=network, p2p=p2p)[0]


@pytest.mark.timing
@pytest.mark.parametrize("p2p", ["threads", "sockets"])
def test_8MB_at_100MBps_takes_80ms(p2p):
    """Over the socket transport too: the emulation stamp travels in its header (descriptor or in-stream)."""
    network = Network(Link.parse("100MB/s"))
    elapsed = within(lambda: incast_time(1, 8 * MB, network, p2p), 0.080, 0.15)
    assert 0.080 * 0.85 <= elapsed <= 0.080 * 1.15


@pytest.mark.timing
@pytest.mark.parametrize("p2p", ["threads", "sockets"])
def test_three_senders_into_one_receiver_take_three_times_one_sender(p2p):
    network = Network(Link.parse("100MB/s"))

    def ratio():
        return incast_time(3, 4 * MB, network, p2p) / incast_time(1, 4 * MB, network, p2p)

    assert 3 * 0.8 <= within(ratio, 3.0, 0.2) <= 3 * 1.2


@pytest.mark.timing
def test_latency_adds_per_message():
    latency = 0.005
    network = Network(Link(bandwidth=1e12, latency=latency))  # bandwidth so high only latency counts

    def messages_time(count: int) -> float:
        def body(comm):
            comm.barrier()
            start = time.time()
            if comm.rank == 0:
                for h in [comm.isend(torch.zeros(1), 1) for _ in range(count)]:
                    h.wait()
            else:
                for _ in range(count):
                    comm.recv(torch.zeros(1), 0)
                return time.time() - start

        return run_threads(2, body, timeout=30, network=network)[1]

    assert latency * 0.9 <= within(lambda: messages_time(1), latency, 0.5) <= latency * 1.5
    assert 10 * latency * 0.9 <= within(lambda: messages_time(10), 10 * latency, 0.2) <= 10 * latency * 1.2
