"""The simulated transport's per-pair connection (nic = "shared"): a pair's messages leave one after another, each
when the one before it has arrived, put by an actor of the pair's own; a send waited for while it is still queued
returns when it has arrived. Forked, as every simulation."""

from __future__ import annotations

import pytest
import torch

from experiments.simulate.platform import Platform
from experiments.simulate.substrate import run_in_child
from strategies.transport.simgrid import simgrid_available
from strategies.transport.simgrid_run import run_simgrid

pytestmark = pytest.mark.skipif(bool(simgrid_available()), reason=simgrid_available() or "SimGrid is installed")

BANDWIDTH, LATENCY, NUMEL = 125e6, 50e-6, 250_000  # 1 Gbit/s, 50 us; 1 MB messages
ONE = LATENCY + NUMEL * 4 / BANDWIDTH  # one message alone on the route (alpha_beta: exact)


def _run(fn, world: int = 2) -> list:
    platform = Platform.parse({"bandwidth": "1Gbit", "latency": "50us", "network_model": "alpha_beta"})
    result, error, _ = run_in_child(lambda: run_simgrid(world, fn, lambda sg: platform.build(sg, world),
                                                        platform.config))
    if error:
        raise RuntimeError(error)
    return result


def test_queued_sends_leave_one_after_another_and_a_wait_on_a_queued_one_returns_when_it_arrived():
    def fn(comm):
        if comm.rank == 0:
            handles = [comm.isend(torch.full((NUMEL,), float(i)), 1) for i in range(3)]  # 2 and 3 queue
            handles[2].wait()  # still queued behind two: returns when it has arrived
            third = comm.now()
            handles[0].wait()
            handles[1].wait()  # arrived long ago: no wait
            return third, comm.now()
        got = []
        for _ in range(3):
            buf = torch.empty(NUMEL)
            comm.recv(buf, 0)
            got.append((buf[0].item(), buf[-1].item(), comm.now()))
        return got

    (third, end), got = _run(fn)
    assert third == pytest.approx(3 * ONE, rel=1e-6) and end == pytest.approx(third)
    assert [(first, last) for first, last, _ in got] == [(0.0, 0.0), (1.0, 1.0), (2.0, 2.0)]
    assert [t for _, _, t in got] == pytest.approx([ONE, 2 * ONE, 3 * ONE], rel=1e-6)


def test_queued_sends_waited_for_last_first_arrive_in_order():
    def fn(comm):
        if comm.rank == 0:
            handles = [comm.isend(torch.full((NUMEL,), float(i)), 1) for i in range(4)]
            for handle in reversed(handles):
                handle.wait()
            return comm.now()
        bufs = [torch.empty(NUMEL) for _ in range(4)]
        handles = [comm.irecv(buf, 0) for buf in bufs]
        for handle in reversed(handles):  # matched in posting order whichever is waited for first
            handle.wait()
        return [buf[0].item() for buf in bufs], comm.now()

    sent, (values, end) = _run(fn)
    assert values == [0.0, 1.0, 2.0, 3.0]
    assert end == pytest.approx(4 * ONE, rel=1e-6) and sent == pytest.approx(end)
