"""Per-rank links in the emulation: a rank whose NIC is slower makes exactly its own transfers slower, as the
model says (a message takes latency + bytes / the slower of the sender's and receiver's bandwidth), over the
thread and socket transports; and a ring allreduce with one slow rank costs what its critical path says.

Emulation only ever sleeps, so a time below the model's is a real failure (asserted always); one far above it
may be a loaded machine (marked `timing`).
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from strategies.testing import run_collective
from strategies.transport.link import Link, Network
from strategies.transport.threads import run_threads

MB = 10**6
FAST, SLOW = 1000 * MB, 20 * MB  # bytes/s: the default NIC, and rank 1's
NETWORK = Network.from_spec({"bandwidth": "1000MB/s", "ranks": {1: {"bandwidth": "20MB/s", "latency": "2ms"}}})


def test_a_rank_override_is_that_ranks_link_only():
    assert NETWORK.link(1) == Link(SLOW, 0.002)
    assert NETWORK.link(0) == NETWORK.link(2) == Link(FAST, 0.0)


def _transfer_times(p2p: str, nbytes: int) -> dict[tuple[int, int], float]:
    """Seconds for rank src to send nbytes to rank dst, one pair at a time: (0, 2) fast-fast, (0, 1) into the
    slow rank, (1, 2) out of it."""

    def body(comm):
        times = {}
        for src, dst in ((0, 2), (0, 1), (1, 2)):
            comm.barrier()
            start = time.time()
            if comm.rank == src:
                comm.send(torch.zeros(nbytes, dtype=torch.uint8), dst)
            elif comm.rank == dst:
                comm.recv(torch.zeros(nbytes, dtype=torch.uint8), src)
            comm.barrier()
            times[src, dst] = time.time() - start
        return times

    return run_threads(3, body, timeout=30, network=NETWORK, p2p=p2p)[0]


@pytest.mark.timing
@pytest.mark.parametrize("p2p", ["threads", "sockets"])
def test_transfers_into_and_out_of_the_slow_rank_take_its_time(p2p):
    """2 MB: into or out of rank 1 takes at least 2 ms + 2 MB / 20 MB/s = 102 ms; between fast ranks 2 ms."""
    nbytes = 2 * MB
    times = _transfer_times(p2p, nbytes)
    slow = nbytes / SLOW
    assert times[0, 1] >= 0.95 * slow, times  # the receiver's NIC limits it
    assert times[1, 2] >= 0.95 * (0.002 + slow), times  # the sender's NIC and latency
    assert times[0, 2] < 0.5 * slow, times  # nobody slow involved: a fraction of the slow transfer


@pytest.mark.slow  # an upper bound on wall time: out of make test-fast (at load 6 it took 0.23 s for 0.2 s)
@pytest.mark.timing
def test_the_slow_transfers_take_no_more_than_the_model_says():
    nbytes = 2 * MB
    times = _transfer_times("threads", nbytes)
    assert times[0, 1] <= 1.5 * nbytes / SLOW + 0.05, times
    assert times[1, 2] <= 1.5 * (0.002 + nbytes / SLOW) + 0.05, times


def test_a_ring_with_one_slow_rank_is_paced_by_it():
    """Ring allreduce of 4 MB on 4 ranks: each of the 6 rounds passes a 1 MB chunk through rank 1's NIC (in and
    out), so the collective takes at least 6 x 1 MB / 20 MB/s = 0.3 s; on uniform fast links, 6 ms."""
    numel = MB  # float32: 4 MB
    inputs = [np.full(numel, r + 1, dtype=np.float32) for r in range(4)]
    start = time.time()
    outputs, _ = run_collective("ring", inputs, op="sum", timeout=30, network=NETWORK)
    elapsed = time.time() - start
    assert all((out == 10).all() for out in outputs)
    assert elapsed >= 0.95 * 6 * (numel * 4 / 4) / SLOW, elapsed
