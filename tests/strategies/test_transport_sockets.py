"""The socket transport (strategies.transport.sockets) on thread ranks: every strategy against the reference on
awkward world sizes and sizes, exact payloads of every dtype on each path (Unix + single copy, Unix in-stream,
TCP), messages that arrive before their receive, size disagreements and dead or silent peers. Between Ray
actors: verify."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import strategies
from strategies.testing import check_strategy, run_collective
from strategies.transport.communicator import CommError, CommTimeout
from strategies.transport.sockets import _HANDSHAKE_S, SINGLE_COPY_BYTES, SocketCommunicator, _Address, _can_read
from strategies.transport.threads import run_threads

MODES = ("sockets", "sockets-unix", "sockets-tcp")
_PROBE = torch.tensor([0x5EED], dtype=torch.int64)
# whether this machine lets a process read a peer's memory (process_vm_readv; a container may forbid it)
CMA = _can_read(os.getpid(), _PROBE.data_ptr(), 0x5EED)
WORLD_SIZES = (1, 2, 3, 5, 7, 8)
# shorter than the world, not divisible by it, and 50021 floats: chunks above SINGLE_COPY_BYTES at n <= 3
NUMELS = (1, 3, 4099, 50021)
assert 50021 * 4 // 3 > SINGLE_COPY_BYTES > 4099 * 4
# each path (in-stream over Unix, over TCP) on the strategies whose message patterns differ most
PATH_SETTINGS = [("ring", {}), ("halving_doubling", {}), ("parameter_server", {"servers": 2}), ("all_to_all", {}),
                 ("reduce_broadcast", {"tree": True}), ("decentralized", {"topology": "exponential",
                                                                           "weights": "uniform"})]


def label(name, params):
    return name + "".join(f"[{k}={v}]" for k, v in params.items())


def _ops(name):
    return ["sum", "max"] if strategies.get(name).exact else None


def _numels(params):
    """NUMELS; for a parameter server cut into partitions smaller than SINGLE_COPY_BYTES (100 bytes: thousands of
    in-stream messages per worker at 4099 or 50021 floats), 1031 floats instead of both: 40 partitions of 25 or 26
    (they do not divide it evenly); no message of theirs takes the single copy at any size. The same for a pipeline
    of pieces under 1 KiB (hierarchical's 0.0001 MiB: 24 s of the suite at 50021 floats)."""
    partition = params.get("partition_mb")
    if partition is not None and partition * 2**20 < SINGLE_COPY_BYTES:
        return (*NUMELS[:2], 1031)
    pipeline = params.get("pipeline_mb")  # hierarchical's pieces of ~100 bytes: 1031 floats are ~40 of them
    if pipeline is not None and 0 < pipeline * 2**20 < 1024:
        return (*NUMELS[:2], 1031)
    return NUMELS


@pytest.mark.parametrize("name,params", strategies.registry.settings(),
                         ids=[label(*s) for s in strategies.registry.settings()])
def test_every_strategy_matches_the_reference_over_sockets(name, params):
    """Results, bitwise agreement and every rank's analytic bytes, as on the thread transport (one group of
    socket-connected ranks per world size, every case on it)."""
    assert check_strategy(name, WORLD_SIZES, _numels(params), _ops(name), p2p="sockets", **params) > 0


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


@pytest.mark.timing
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
    with pytest.raises(ValueError, match="p2p 'shm': expected one of threads, gloo, sockets, sockets-unix, "
                                         "sockets-tcp, simgrid"):
        run_threads(2, lambda comm: None, p2p="shm")


def test_a_transport_refuses_a_control_plane_it_cannot_work_over():
    with pytest.raises(TypeError, match="p2p 'gloo' needs a torch.distributed communicator .TorchCommunicator. as "
                                        "its control plane, got a ThreadCommunicator"):
        run_threads(2, lambda comm: None, p2p="gloo")


def test_the_command_line_offers_the_groups_p2p_choices():
    from experiments.cli.main import P2P_CHOICES
    from strategies.transport.names import P2P

    assert P2P_CHOICES == P2P


@pytest.mark.ray
def test_every_strategy_is_correct_over_sockets_between_ray_actors(ray_session):
    """Between processes: the single copy reads another process's memory (process_vm_readv)."""
    from experiments.bench.collectives import verify

    lines = []
    # 50021 floats (NUMELS): 3 workers' chunks just above SINGLE_COPY_BYTES, so the single copy carries them
    assert verify(workers=3, numel=50021, p2p="sockets", out=lines.append), "\n".join(lines)
    assert "Unix + single copy" in lines[0]
    assert len(lines) == 2 + len(strategies.registry.settings())


# -- strangers: anything else that connects to a rank's listeners while the ranks pair up ---------------------

def _listeners(address, p2p):
    """A rank's listeners as (family, address): its Unix one (unless sockets-tcp) and its TCP one."""
    found = [(socket.AF_INET, address.tcp)]
    if address.unix is not None and p2p != "sockets-tcp":
        found.append((socket.AF_UNIX, address.unix))
    return found


def _with_strangers(monkeypatch, p2p, knock):
    """Before any rank dials, every rank calls knock(rank, its own listeners), then the ranks wait for each other:
    whatever knock connects is in the listeners' queues ahead of every rank's connection."""
    exchange = SocketCommunicator.allgather_object

    def allgather_then_knock(self, obj):
        everyone = exchange(self, obj)
        if isinstance(obj, _Address):
            knock(self.rank, _listeners(everyone[self.rank], p2p))
            exchange(self, None)  # every rank's strangers are queued before anyone dials
        return everyone

    monkeypatch.setattr(SocketCommunicator, "allgather_object", allgather_then_knock)


class _Strangers:
    """Connections a test opens and closes: silent ones, a wrong token claiming rank 1, half a hello, and (on a
    Unix listener) a silent one from another process."""

    def __init__(self):
        self.socks, self.procs, self.lock = [], [], threading.Lock()

    def knock(self, rank, listeners):
        for family, addr in listeners:
            for hello in (b"", b"\x00" * 16 + (1).to_bytes(8, "little"), b"\x00" * 5):
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.connect(addr)
                sock.sendall(hello)
                with self.lock:
                    self.socks.append(sock)
            if family == socket.AF_UNIX:  # another process of this user: refused by its credentials at once
                proc = subprocess.Popen([sys.executable, "-c", _SILENT_PROCESS, addr], stdout=subprocess.PIPE)
                with self.lock:
                    self.procs.append(proc)
                assert proc.stdout.readline() == b"connected\n"

    def close(self):
        for sock in self.socks:
            sock.close()
        for proc in self.procs:
            proc.kill()
            proc.wait()
            proc.stdout.close()


_SILENT_PROCESS = ("import socket, sys, time\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
                   "print('connected', flush=True)\ntime.sleep(60)\n")


@pytest.fixture
def strangers():
    made = _Strangers()
    yield made
    made.close()


@pytest.mark.timing
@pytest.mark.parametrize("p2p", MODES)
def test_silent_strangers_on_every_listener_do_not_stall_the_group(p2p, monkeypatch, strangers):
    """Silent connections, half a hello and a wrong token on every rank's listeners, queued ahead of the ranks:
    the group still forms at once (handshakes run side by side), not after a stranger's deadline or the timeout."""
    _with_strangers(monkeypatch, p2p, strangers.knock)
    inputs = [torch.arange(1000, dtype=torch.float32).numpy() * (r + 1) for r in range(4)]
    start = time.monotonic()
    outputs, _ = run_collective("ring", inputs, op="sum", timeout=20, p2p=p2p)
    elapsed = time.monotonic() - start
    assert all((out == inputs[0] * 10).all() for out in outputs)
    assert strangers.socks and (p2p == "sockets-tcp" or strangers.procs)
    assert elapsed < _HANDSHAKE_S, f"the group took {elapsed:.1f} s to form"


def test_a_flood_of_silent_strangers_holds_a_bounded_number_of_handshakes_and_the_group_still_forms(monkeypatch):
    """More silent connections than handshakes may be in flight (4 here, 64 by default): the oldest make room, so
    the ranks' own connections, queued behind all of them, still get in at once."""
    from strategies.transport import sockets as sockets_module

    monkeypatch.setattr(sockets_module, "_MAX_HANDSHAKES", 4)
    silent = []

    def knock(rank, listeners):
        for family, addr in listeners:
            for _ in range(20):
                silent.append(socket.socket(family, socket.SOCK_STREAM))
                silent[-1].connect(addr)

    _with_strangers(monkeypatch, "sockets-tcp", knock)
    start = time.monotonic()
    try:
        strangers = run_threads(3, lambda comm: comm.strangers, timeout=20, p2p="sockets-tcp")
    finally:
        for sock in silent:
            sock.close()
    assert time.monotonic() - start < _HANDSHAKE_S
    # ranks 0 and 1 accept (2 ranks and 1): at least the 20 - 4 oldest strangers made room, at most one more per rank
    assert 16 <= len(strangers[0]) <= 18 and 16 <= len(strangers[1]) <= 17, strangers
    assert all("silent while 4 more handshakes waited" in line for s in strangers for line in s)


@pytest.mark.parametrize("p2p", ["sockets-unix", "sockets-tcp"])
def test_a_rank_that_never_connects_is_named_and_so_are_the_strangers(p2p, monkeypatch, strangers):
    """The error names the rank that is missing and every stranger that connected instead (not innocent ranks)."""
    def stay_away(self, family, addr, peer, deadline):  # rank 1 dials nobody until rank 0 has failed
        fabric = self.control.fabric
        while not fabric.aborted and time.monotonic() < deadline + 30:
            time.sleep(0.01)
        raise RuntimeError("rank 1 stays away (test)")

    monkeypatch.setattr(SocketCommunicator, "_dial", stay_away)
    _with_strangers(monkeypatch, p2p, lambda rank, listeners: rank == 0 and strangers.knock(rank, listeners))
    with pytest.raises(CommError) as err:
        run_threads(2, lambda comm: None, timeout=1.5, p2p=p2p)
    text = str(err.value)
    assert text.startswith("rank 0: ranks [1] did not connect within 1.5 s; "), text
    named = 7 if p2p == "sockets-unix" else 3  # 3 on each listener (Unix, TCP), and the process on the Unix one
    assert f"{named} stranger(s) connected meanwhile and were dropped" in text, text
    assert "wrong token" in text and "still silent" in text, text
    if p2p == "sockets-tcp":
        assert "127.0.0.1:" in text, text
    else:
        assert f"unix peer pid {strangers.procs[0].pid} uid {os.getuid()}: not a process of this group" in text, text


def test_unix_listeners_are_files_only_their_user_can_reach(monkeypatch):
    """Not an abstract name (listed in /proc/net/unix for anyone): a socket file in a 0700 directory, removed once
    the ranks are paired."""
    seen = []
    exchange = SocketCommunicator.allgather_object

    def allgather_and_look(self, obj):
        if isinstance(obj, _Address) and obj.unix is not None:
            mode = os.stat(os.path.dirname(obj.unix)).st_mode
            seen.append((obj.unix, stat.S_IMODE(mode), stat.S_ISSOCK(os.stat(obj.unix).st_mode)))
        return exchange(self, obj)

    monkeypatch.setattr(SocketCommunicator, "allgather_object", allgather_and_look)
    run_threads(3, lambda comm: None, timeout=10, p2p="sockets-unix")
    assert len(seen) == 3
    for path, mode, is_socket in seen:
        assert not path.startswith("\0") and mode == 0o700 and is_socket, (path, oct(mode))
        assert not os.path.exists(os.path.dirname(path)), f"{path} left behind"
