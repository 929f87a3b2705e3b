"""The gloo transport between Ray actors: exact payloads and counters, no hang on a silent peer."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

pytestmark = pytest.mark.ray

SIZES = (0, 1, 1000, 2**20)
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16)


def payload(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Values that use every bit pattern class of the dtype: signs, large magnitudes, fractions."""
    g = torch.Generator().manual_seed(numel)
    if dtype.is_floating_point:
        return (torch.randn(numel, generator=g, dtype=torch.float64) * 1e3).to(dtype)
    return torch.randint(-(2**62), 2**62, (numel,), generator=g, dtype=dtype)


def _round_trip(ctx, dtype):
    """Rank 0 sends every size to rank 1, which sends it back; returns (exact?, counters) per rank."""
    comm = ctx.comm
    exact = True
    for numel in SIZES:
        sent = payload(numel, dtype)
        buf = torch.full((numel,), 7, dtype=dtype)
        if ctx.rank == 0:
            comm.send(sent, 1)
            comm.recv(buf, 1)
            exact &= torch.equal(buf, sent)
        else:
            comm.recv(buf, 0)
            exact &= torch.equal(buf, sent)
            comm.send(buf, 0)
    c = comm.counters()
    return exact, c.as_dict(), {peer: dataclasses.asdict(p) for peer, p in c.per_peer.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gloo_payload_round_trips_exactly_with_exact_counters(group2, dtype):
    results = group2.run(_round_trip, dtype)
    nbytes = sum(n * dtype.itemsize for n in SIZES)
    messages = sum(1 for n in SIZES if n)  # an empty tensor sends nothing
    for rank, (exact, totals, per_peer) in enumerate(results):
        assert exact, f"rank {rank}: payload of {dtype} changed on the wire"
        assert totals == {"bytes_sent": nbytes, "bytes_recv": nbytes, "msgs_sent": messages,
                          "msgs_recv": messages}
        assert per_peer == {1 - rank: {"bytes_sent": nbytes, "bytes_recv": nbytes, "msgs_sent": messages,
                                       "msgs_recv": messages}}


def _mismatched_sizes(ctx):
    """Rank 0 sends 10 floats, rank 1 expects 20 (gloo alone would silently fill half the buffer)."""
    if ctx.rank == 0:
        ctx.comm.send(torch.ones(10), 1)
    else:
        ctx.comm.recv(torch.zeros(20), 0)


def test_gloo_shorter_payload_than_buffer_is_an_error(group2):
    from experiments.cluster.group import GroupError

    with pytest.raises(GroupError) as err:  # breaks group2: the fixture starts a fresh one if needed
        group2.run(_mismatched_sizes)
    assert err.value.ranks == [1]
    assert "rank 1: rank 0 sent 40 bytes of float32, this rank expected 80 bytes of float32" in str(err.value)


def _recv_from_silent_peer(ctx):
    if ctx.rank == 0:
        ctx.comm.recv(torch.zeros(4), 1)  # rank 1 never sends


@pytest.mark.timing
def test_recv_from_silent_peer_fails_within_timeout_naming_the_peer(ray_session):
    from experiments.cluster.group import GroupError, WorkerGroup

    timeout = 3.0
    with WorkerGroup(2, timeout=timeout) as group:
        start = time.monotonic()
        with pytest.raises(GroupError) as err:
            group.run(_recv_from_silent_peer)
        elapsed = time.monotonic() - start
    assert elapsed < timeout + 5
    assert err.value.ranks == [0]
    assert "rank 0: recv from rank 1 timed out" in str(err.value)


def _gloo_messages_per_send(ctx, numels):
    """How many gloo messages rank 0's comm.send puts on the wire for each size (dist.isend calls, counted)."""
    import strategies.transport.torch_dist as td

    calls = []
    real = td.dist.isend
    td.dist.isend = lambda *a, **k: calls.append(1) or real(*a, **k)
    counts = []
    try:
        for numel in numels:
            before = len(calls)
            if ctx.rank == 0:
                ctx.comm.send(torch.arange(numel, dtype=torch.float32), 1)
            else:
                buf = torch.zeros(numel)
                ctx.comm.recv(buf, 0)
                assert torch.equal(buf, torch.arange(numel, dtype=torch.float32))
            counts.append(len(calls) - before)
    finally:
        td.dist.isend = real
    return counts


def test_a_small_payload_is_one_gloo_message_a_large_one_two(group2):
    from strategies.transport.torch_dist import INLINE_BYTES

    edge = INLINE_BYTES // 4  # float32 elements that exactly fill the inline room
    sent, received = group2.run(_gloo_messages_per_send, [1, edge, edge + 1, 1 << 20])
    assert sent == [1, 1, 2, 2]
    assert received == [0, 0, 0, 0]


def _mismatch(ctx, send_numel, recv_numel, send_dtype, recv_dtype):
    if ctx.rank == 0:
        ctx.comm.send(torch.ones(send_numel, dtype=send_dtype), 1)
    else:
        ctx.comm.recv(torch.zeros(recv_numel, dtype=recv_dtype), 0)


@pytest.mark.parametrize("send_numel, recv_numel, send_dtype, recv_dtype, message", [
    # inline sender, receiver expecting a payload too large to be inline
    (10, 20_000, torch.float32, torch.float32, "rank 0 sent 40 bytes of float32, this rank expected 80000 bytes"),
    # same byte count, another dtype: caught by the header of an inline message
    (16, 16, torch.float32, torch.int32, "rank 0 sent 64 bytes of float32, this rank expected 64 bytes of int32"),
    # a sender too large for inline into a receiver expecting an inline payload
    (20_000, 10, torch.float32, torch.float32, "rank 0 sent 80000 bytes of float32, this rank expected 40 bytes"),
], ids=["inline-to-large", "inline-dtype", "large-to-inline"])
def test_size_and_dtype_mismatches_across_the_inline_limit_are_errors(ray_session, send_numel, recv_numel,
                                                                      send_dtype, recv_dtype, message):
    from experiments.cluster.group import GroupError, WorkerGroup

    with WorkerGroup(2, timeout=5) as group, pytest.raises(GroupError) as err:
        group.run(_mismatch, send_numel, recv_numel, send_dtype, recv_dtype)
    assert f"rank 1: {message}" in str(err.value)


def _emulated_small_send(ctx):
    """Wall-clock moments (time.time(), the clock the emulation stamps with, shared by processes of one machine):
    the sender's start, the receiver's end."""
    if ctx.rank == 0:
        start = time.time()
        ctx.comm.send(torch.ones(250), 1)
        return start
    ctx.comm.recv(torch.zeros(250), 0)
    return time.time()


def test_an_inline_message_carries_the_emulation_stamp(group2):
    """1,000 bytes over 100 kB/s with 50 ms latency: received 60 ms after the send began, which only the stamp can
    tell the receiver. Measured from the sender's start: the receiver's own call may begin a few ms later."""
    from strategies.transport.link import Link, Network

    sent_at, received_at = group2.run(_emulated_small_send, network=Network(Link(1e5, 0.05)))
    assert received_at - sent_at >= 0.06 - 1e-3
