"""The socket transport (strategies.transport.sockets) on thread ranks: every strategy against the reference on
awkward world sizes and sizes, exact payloads of every dtype on each path (Unix + single copy, Unix in-stream,
TCP), messages that arrive before their receive, size disagreements and dead or silent peers. Between Ray
actors: verify."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

import strategies
from strategies.testing import check_strategy
from strategies.transport.communicator import CommError, CommTimeout
from strategies.transport.sockets import SINGLE_COPY_BYTES, _can_read
from strategies.transport.threads import run_threads

MODES = ("sockets", "sockets-unix", "sockets-tcp")
_PROBE = torch.tensor([0x5EED], dtype=torch.int64)
# whether this machine lets a process read a peer's memory (process_vm_readv; a container may forbid it)
CMA = _can_read(os.getpid(), _PROBE.data_ptr(), 0x5EED)
WORLD_SIZES = (1, 2, 3, 5, 7, 8)
# shorter than the world, not divisible by it, and 50021 floats: chunks above SINGLE_COPY_BYTES at n <= 3
NUMELS = (1, 3, 4099, 50021)
# each path (in-stream over Unix, over TCP) on the strategies whose message patterns differ most
PATH_SETTINGS = [("ring", {}), ("halving_doubling", {}), ("parameter_server", {"servers": 2}), ("all_to_all", {}),
                 ("reduce_broadcast", {"tree": True}), ("decentralized", {"topology": "exponential",
                                                                           "weights": "uniform"})]


def label(name, params):
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


def _ops(name):
    return ["sum", "max"] if strategies.get(name).exact else None


@pytest.mark.parametrize("name,params", strategies.registry.settings(),
                         ids=[label(*s) for s in strategies.registry.settings()])
def test_every_strategy_matches_the_reference_over_sockets(name, params):
    """Results, bitwise agreement and every rank's analytic bytes, as on the thread transport."""
    assert check_strategy(name, WORLD_SIZES, NUMELS, _ops(name), p2p="sockets", **params) > 0


@pytest.mark.parametrize("p2p", ["sockets-unix", "sockets-tcp"])
@pytest.mark.parametrize("name,params", PATH_SETTINGS, ids=[label(*s) for s in PATH_SETTINGS])
def test_each_socket_path_matches_the_reference(name, params, p2p):
    assert check_strategy(name, WORLD_SIZES, NUMELS, _ops(name), p2p=p2p, **params) > 0


DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.bool,
          torch.complex64)
# around the single-copy limit, and one large payload
SIZES_BYTES = (1, SINGLE_COPY_BYTES, SINGLE_COPY_BYTES + 16, 3 << 20)


def payload(nbytes: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random bits of `dtype` (every pattern, NaN payloads included), nbytes rounded to whole elements."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (max(nbytes // itemsize, 1) * itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype) if dtype != torch.bool else raw % 2 == 1


@pytest.mark.parametrize("p2p", MODES)
def test_payloads_of_every_dtype_round_trip_bit_exactly_with_exact_counters(p2p):
    def body(comm):
        other, sent_bytes, same = 1 - comm.rank, 0, True
        for dtype in DTYPES:
            for nbytes in SIZES_BYTES:
                mine, theirs = payload(nbytes, dtype, comm.rank), payload(nbytes, dtype, other)
                buf = torch.empty_like(theirs)
                handles = [comm.irecv(buf, other), comm.isend(mine, other)]
                for h in handles:
                    h.wait()
                same &= bool(torch.equal(buf.view(torch.uint8), theirs.view(torch.uint8)))
                sent_bytes += mine.numel() * mine.element_size()
        return same, sent_bytes, comm.counters().as_dict(), comm.transport

    results = run_threads(2, body, timeout=20, p2p=p2p)
    messages = len(DTYPES) * len(SIZES_BYTES)
    for rank, (same, sent_bytes, counters, transport) in enumerate(results):
        assert same, f"rank {rank}: a payload changed on the way ({p2p})"
        assert counters == {"bytes_sent": sent_bytes, "bytes_recv": sent_bytes, "msgs_sent": messages,
                            "msgs_recv": messages}
        assert transport == {"sockets": "sockets-unix+single-copy" if CMA else "sockets-unix",
                             "sockets-unix": "sockets-unix", "sockets-tcp": "sockets-tcp"}[p2p]


@pytest.mark.parametrize("p2p", MODES)
def test_messages_that_arrive_before_their_receive_are_kept_in_order(p2p):
    """Rank 0 posts small and large sends at once; rank 1 posts its receives only later, one at a time."""
    sizes = [3, 100_000, 5, 200_000, 1]  # floats: in-stream, descriptor (single copy), in-stream, ...

    def body(comm):
        if comm.rank == 0:
            handles = [comm.isend(torch.arange(n, dtype=torch.float32) + i, 1) for i, n in enumerate(sizes)]
            for h in handles:
                h.wait()
            return None
        time.sleep(0.2)
        got = []
        for n in sizes:
            buf = torch.empty(n, dtype=torch.float32)
            comm.recv(buf, 0)
            got.append(buf)
        return got

    got = run_threads(2, body, timeout=20, p2p=p2p)[1]
    for i, (n, buf) in enumerate(zip(sizes, got)):
        assert torch.equal(buf, torch.arange(n, dtype=torch.float32) + i), f"message {i} of {n} floats"


@pytest.mark.parametrize("p2p", MODES)
@pytest.mark.parametrize("send_numel,recv_numel", [(10, 20), (100_000, 50_000)])
def test_a_size_disagreement_is_an_error_naming_both_sizes(p2p, send_numel, recv_numel):
    """The receiver names both sizes (a descriptor's sender then fails too: its receiver closed)."""

    def body(comm):
        try:
            if comm.rank == 0:
                comm.send(torch.ones(send_numel), 1)
            else:
                comm.recv(torch.zeros(recv_numel), 0)
        except CommError as e:
            return str(e)
        return None

    receiver_error = run_threads(2, body, timeout=10, p2p=p2p)[1]
    assert receiver_error.startswith(f"rank 1: rank 0 sent {4 * send_numel} bytes of float32, this rank expected "
                                     f"{4 * recv_numel} bytes of float32 ({recv_numel} elements): ranks disagree")


def test_after_a_disagreement_the_pair_refuses_further_traffic():
    def body(comm):
        if comm.rank == 0:
            comm.send(torch.ones(10), 1)
            return None
        try:
            comm.recv(torch.zeros(20), 0)
        except CommError:
            pass
        with pytest.raises(CommError, match="no more traffic with rank 0"):
            comm.recv(torch.zeros(10), 0)
        return "refused"

    assert run_threads(2, body, timeout=10, p2p="sockets")[1] == "refused"


@pytest.mark.parametrize("p2p", MODES)
def test_a_peer_that_exits_fails_the_receive_at_once_naming_it(p2p):
    def body(comm):
        if comm.rank == 1:
            return None  # returns at once: run_threads closes its sockets
        start = time.monotonic()
        with pytest.raises(CommError, match="rank 0: rank 1 closed the connection .its process exited or failed."):
            comm.recv(torch.zeros(100_000), 1)
        return time.monotonic() - start

    assert run_threads(2, body, timeout=20, p2p=p2p)[0] < 5  # not the 20 s timeout


def test_a_silent_peer_times_out_naming_it():
    timed_out = threading.Event()

    def body(comm):
        if comm.rank == 0:
            with pytest.raises(CommTimeout, match="rank 0: recv from rank 1 timed out after 1 s"):
                comm.recv(torch.zeros(4), 1)
            timed_out.set()
        else:
            timed_out.wait(10)  # stays connected, and silent, until rank 0 has timed out

    run_threads(2, body, timeout=1, p2p="sockets")
    assert timed_out.is_set()


def test_an_unknown_p2p_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="p2p 'shm': expected one of threads, sockets, sockets-unix, sockets-tcp"):
        run_threads(2, lambda comm: None, p2p="shm")


def test_the_command_line_offers_the_groups_p2p_choices():
    from experiments.cli.main import P2P_CHOICES
    from strategies.transport.sockets import P2P

    assert P2P_CHOICES == P2P


@pytest.mark.ray
def test_every_strategy_is_correct_over_sockets_between_ray_actors(ray_session):
    """Between processes: the single copy reads another process's memory (process_vm_readv)."""
    from experiments.bench.collectives import verify

    lines = []
    assert verify(workers=3, numel=100_003, p2p="sockets", out=lines.append), "\n".join(lines)
    assert "Unix + single copy" in lines[0]
    assert len(lines) == 2 + len(strategies.registry.settings())


@pytest.mark.parametrize("p2p", ["sockets", "sockets-tcp"])
def test_a_stray_connection_to_a_ranks_listener_is_dropped(p2p, monkeypatch):
    """Anything that connects while ranks pair up (without the group's token) is closed, not taken for a rank."""
    import socket

    from strategies.testing import run_collective
    from strategies.transport.sockets import SocketCommunicator

    strays, lock = [], threading.Lock()
    exchange = SocketCommunicator.allgather_object

    def allgather_with_strays(self, obj):
        everyone = exchange(self, obj)
        if self.rank == 0 and isinstance(obj, tuple) and len(obj) == 7:  # the addresses: knock on every door first
            for _, unix_name, tcp_addr, *_ in everyone:
                for family, addr in ((socket.AF_INET, tcp_addr), (socket.AF_UNIX, unix_name)):
                    if addr is not None:
                        stray = socket.socket(family, socket.SOCK_STREAM)
                        stray.connect(addr)
                        stray.sendall(b"\x00" * 16 + (1).to_bytes(8, "little"))  # a wrong token claiming rank 1
                        with lock:
                            strays.append(stray)
        return everyone

    monkeypatch.setattr(SocketCommunicator, "allgather_object", allgather_with_strays)
    inputs = [torch.arange(1000, dtype=torch.float32).numpy() * (r + 1) for r in range(3)]
    outputs, _ = run_collective("ring", inputs, op="sum", timeout=10, p2p=p2p)
    for stray in strays:
        stray.close()
    assert strays and all((out == inputs[0] * 6).all() for out in outputs)
