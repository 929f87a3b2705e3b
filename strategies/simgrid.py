"""The simulated transport: ranks are SimGrid actors, messages are SimGrid transfers of their real size.

The same strategy code that runs on threads and over gloo runs here unchanged; only time is simulated. Each
message is one host-to-host SimGrid transfer (`Comm.sendto_async`) of exactly `numel x element_size` bytes (the
size the base class counts) from the sender's host to the receiver's; SimGrid's flow-level network model
decides when it arrives.

Payloads. A rank's buffers are either real CPU tensors (the values move, so results can be checked against a
reference) or `meta` tensors: they have the real shape and dtype, hence the real byte size, but no storage,
so 1,024 ranks of a 100 MB model take no memory. Sizes are never scaled: the simulated size of a message is
the byte size of the tensor the strategy passed, and the receiver checks that the sender's element count and
dtype equal its buffer's (as the other transports do).

Matching. The payload travels beside its transfer, in a FIFO queue per (sender, receiver) pair, so messages
from one peer match receives in posting order (as gloo's do). A send starts moving when it is posted (eager,
as a TCP socket with room in its buffers, and as the link emulation books a send); the receive takes the
pair's next message and waits for its transfer to end. Python actors are OS threads that SimGrid runs one at
a time, so every call into SimGrid is a thread switch; a message costs one to start its transfer and one
blocking wait where simulated time must pass. A finished transfer is recognised by its finish time (free to
read), not by a call. A receiver whose queue is empty sleeps on its own semaphore until the sender posts.

No wall-clock timeout applies: a peer that never sends leaves the simulation with nothing to do, SimGrid
reports the deadlock and `run_simgrid` raises a CommError naming the ranks that never finished.
SimGrid's engine is one per process: `run_simgrid` may be called once per process (the simulate pipeline
runs each simulation in a fresh one).
"""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import sys
from collections import deque
from collections.abc import Callable
from pathlib import Path

import torch

from strategies.communicator import CommError, Communicator

# Debian's python3-simgrid installs the extension module here; the venv does not see dist-packages.
DEBIAN_MODULE_DIR = Path("/usr/lib/python3/dist-packages")
INSTALL_HINT = ("install SimGrid's Python bindings: as root on Debian/Ubuntu `apt-get install -y python3-simgrid` "
                "(SimGrid 3.32; `make install` and .ci/run do this when they can); PyPI's simgrid is a source "
                "package that needs a long C++ build")


NIC_MODES = ("shared", "fifo", "buffered")


class SimGridMissing(ImportError):
    """SimGrid's Python module is not installed where syncbench looks for it."""


def load_simgrid():
    """The `simgrid` module: from the current environment, else Debian's python3-simgrid for this Python."""
    if "simgrid" in sys.modules:
        return sys.modules["simgrid"]
    spec = importlib.util.find_spec("simgrid")
    if spec is None:
        suffix = importlib.machinery.EXTENSION_SUFFIXES[0]  # e.g. .cpython-311-x86_64-linux-gnu.so
        path = DEBIAN_MODULE_DIR / f"simgrid{suffix}"
        if not path.exists():
            raise SimGridMissing(f"SimGrid's Python module is not importable and {path} does not exist: "
                                 f"{INSTALL_HINT}")
        spec = importlib.util.spec_from_file_location("simgrid", path)
    try:
        with _quiet_stderr():  # the module announces "contexts/factory: thread" when it initializes
            module = importlib.util.module_from_spec(spec)
            sys.modules["simgrid"] = module
            spec.loader.exec_module(module)
    except ImportError as e:
        sys.modules.pop("simgrid", None)
        raise SimGridMissing(f"SimGrid's Python module did not load ({e}): {INSTALL_HINT}") from e
    return module


def simgrid_available() -> str:
    """'' when SimGrid can be used here, else why not (for pytest skip reasons and error messages)."""
    try:
        load_simgrid()
    except SimGridMissing as e:
        return str(e)
    return ""


class _quiet_stderr:
    """Silence file descriptor 2 (SimGrid's C++ logging writes there, below Python's sys.stderr)."""

    def __enter__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)


class _Message:
    """What a pair's queue carries: the sender's element count and dtype, the values (None for meta), and
    the SimGrid transfer that carries its bytes (None once the transfer is known to be over)."""

    __slots__ = ("numel", "dtype", "values", "comm")

    def __init__(self, tensor: torch.Tensor, comm=None):
        self.numel = tensor.numel()
        self.dtype = tensor.dtype
        self.values = None if tensor.is_meta else tensor.clone()
        self.comm = comm


class _Sent:
    """A send in flight (shared mode): its transfer's end is its completion."""

    __slots__ = ("comm",)

    def __init__(self, comm):
        self.comm = comm

    def wait(self, timeout):
        _finish(self.comm)


def _finish(comm) -> None:
    """Return once `comm` has ended. Its finish time is set when it ends and reading it is free; waiting is a
    switch to the engine and back, so it is paid only for a transfer still in flight."""
    if comm is not None and comm.finish_time < 0:
        comm.wait()


class _Receive:
    """A posted receive. Messages from one peer match receives in the order they were posted (as gloo's do):
    wait() takes the pair's next messages for every earlier receive from that peer still pending, then its own."""

    __slots__ = ("cluster", "rank", "src", "tensor", "posted", "done")

    def __init__(self, cluster, rank: int, src: int, tensor: torch.Tensor, posted):
        self.cluster, self.rank, self.src, self.tensor, self.posted = cluster, rank, src, tensor, posted
        self.done = False
        posted.append(self)

    def wait(self, timeout):
        while not self.done:
            self.posted.popleft()._take()
        return None

    def _take(self):
        message = self.cluster.take(self.src, self.rank)
        _finish(message.comm)  # the bytes arrive when the transfer ends
        self.done = True
        if message.numel != self.tensor.numel() or message.dtype != self.tensor.dtype:
            raise CommError(f"rank {self.rank}: recv from rank {self.src} expected {self.tensor.numel()} x "
                            f"{self.tensor.dtype}, got {message.numel} x {message.dtype}: ranks disagree on the "
                            f"tensor's size")
        if message.values is not None and not self.tensor.is_meta:
            self.tensor.copy_(message.values)


class _Queued:
    """A send waiting for this rank's NIC (fifo mode): wait() blocks until the NIC actor has delivered it."""

    __slots__ = ("nic", "dst", "message", "nbytes", "done", "port")

    def __init__(self, nic, dst: int, message, nbytes, port=None):
        self.nic, self.dst, self.message, self.nbytes, self.done = nic, dst, message, nbytes, False
        self.port = port  # buffered mode: the receiver's switch port (a _Port)

    def wait(self, timeout):
        while not self.done:  # each delivery releases once; a release meant for another send just loops
            self.nic.delivered.acquire()


class _Nic:
    """fifo mode: one actor per rank sends its messages one at a time, in the order they were posted."""

    def __init__(self, cluster, host, rank: int):
        sg = cluster.sg
        self.queue: deque[_Queued] = deque()
        self.posted = sg.Semaphore(0)
        self.delivered = sg.Semaphore(0)
        self.cluster, self.sg, self.host, self.rank = cluster, sg, host, rank
        sg.Actor.create(f"nic{rank}", host, self._run)

    def post(self, item: _Queued) -> None:
        self.queue.append(item)
        self.posted.release()

    def close(self) -> None:
        self.posted.release()

    def _run(self):
        try:
            while True:
                self.posted.acquire()
                if not self.queue:  # closed, nothing left to send
                    return
                item = self.queue.popleft()
                if item.port is None:
                    self.sg.Comm.sendto(self.host, self.cluster.hosts[item.dst], item.nbytes)
                    self.cluster.deliver(self.rank, item.dst, item.message)
                else:  # buffered: the port starts draining now (cut-through) while this NIC sends up to it
                    item.port.post((self.rank, item.dst, item.message, item.nbytes))
                    self.sg.Comm.sendto(self.host, item.port.host, item.nbytes)
                item.done = True
                self.delivered.release()
        except Exception as e:  # noqa: BLE001 - SimGrid ends a deadlocked simulation's actors this way
            if type(e).__name__ != "ActorKilled":
                raise


class _Port:
    """buffered mode: the switch port in front of a rank. A message starts down to the rank as soon as its
    sender starts sending it up (cut-through), one message at a time in the order they started: the downlink
    cannot finish before the uplink (same rate, later start), the sender is never slowed by a busy receiver
    (the switch buffers), as the link emulation books a receive (strategies/link.py, LinkClock.receive)."""

    def __init__(self, cluster, port_host, rank: int):
        sg = cluster.sg
        self.cluster, self.sg, self.host = cluster, sg, port_host
        self.queue: deque = deque()
        self.posted = sg.Semaphore(0)
        actor = sg.Actor.create(f"port{rank}", port_host, self._run)
        actor.daemonize()  # ends with the simulation's last rank

    def post(self, item) -> None:
        self.queue.append(item)
        self.posted.release()

    def _run(self):
        try:
            while True:
                self.posted.acquire()
                src, dst, message, nbytes = self.queue.popleft()
                self.sg.Comm.sendto(self.host, self.cluster.hosts[dst], nbytes)
                self.cluster.deliver(src, dst, message)
        except Exception as e:  # noqa: BLE001 - SimGrid ends the daemon this way
            if type(e).__name__ != "ActorKilled":
                raise


class Cluster:
    """The state the ranks of one simulation share: hosts, the pairs' message queues, the control-plane board.

    Messages. A send's bytes are one host-to-host SimGrid transfer (`Comm.sendto_async`) started when the send
    is posted (eager, as a TCP socket with room in its buffers, and as the link emulation books a send); its
    payload goes into the (sender, receiver) pair's FIFO queue at once, with the transfer, and the receive
    takes it from there and waits for that transfer's end. A message thus costs one call into SimGrid to
    start and one blocking wait where time must pass; no mailbox matching. A receiver that finds its pair's
    queue empty sleeps on its own semaphore until the sender posts.

    nic = "shared": a rank's concurrent sends share its NIC as TCP flows do (SimGrid's max-min sharing).
    nic = "fifo": they leave one at a time in posting order, each at the full rate; one more actor per rank
    and about twice the SimGrid calls per message.
    nic = "buffered": as fifo on the sender's uplink into a switch that buffers; each receiver's downlink
    takes one message at a time, in the order they started (see _Port): the link emulation's model
    (strategies/link.py books each NIC's transmit and receive sides separately). Star platforms only; two
    more actors per rank.
    """

    def __init__(self, sg, hosts: list, nic: str = "shared"):
        if nic not in NIC_MODES:
            raise ValueError(f"nic = {nic!r}: accepted are {', '.join(NIC_MODES)}")
        self.sg = sg
        self.hosts = hosts
        self.world_size = len(hosts)
        self.nic = nic
        self.nics: list[_Nic | None] = [None] * self.world_size
        self.ports: list[_Port] = []
        self.queues: dict[tuple[int, int], deque[_Message]] = {}
        self.waiting_for: list[int | None] = [None] * self.world_size  # the sender a blocked receiver waits on
        self.wakeups = [sg.Semaphore(0) for _ in range(self.world_size)]
        self.board: list = [None] * self.world_size
        self.barrier = sg.Barrier(self.world_size)

    def deliver(self, src: int, dst: int, message: _Message) -> None:
        """Put a message in the pair's queue (its transfer started, or over) and wake the receiver if it waits."""
        queue = self.queues.get((src, dst))
        if queue is None:
            queue = self.queues[(src, dst)] = deque()
        queue.append(message)
        if self.waiting_for[dst] == src:
            self.waiting_for[dst] = None
            self.wakeups[dst].release()

    def take(self, src: int, dst: int) -> _Message:
        """The pair's next message, sleeping until the sender has posted one."""
        while True:
            queue = self.queues.get((src, dst))
            if queue:
                return queue.popleft()
            self.waiting_for[dst] = src
            self.wakeups[dst].acquire()

    def exchange(self, rank: int, obj) -> list:
        """Every rank's object in rank order; takes no simulated time (two barriers: all posted, all read)."""
        self.board[rank] = obj
        self.barrier.wait()
        board = list(self.board)
        self.barrier.wait()
        return board


class SimGridCommunicator(Communicator):
    """A rank of a simulated cluster: send/recv are SimGrid mailbox transfers, counted by the base class."""

    transport = "simgrid"

    def __init__(self, cluster: Cluster, rank: int):
        super().__init__(rank, cluster.world_size)  # no link emulation: the simulated platform is the network
        self.cluster = cluster
        self.sg = cluster.sg
        self._posted: dict[int, deque[_Receive]] = {}  # per peer, receives posted and not yet matched

    def _raw_isend(self, tensor, dst, stamp):
        nbytes = tensor.numel() * tensor.element_size()
        cluster = self.cluster
        if cluster.nic == "shared":
            comm = self.sg.Comm.sendto_async(cluster.hosts[self.rank], cluster.hosts[dst], nbytes)
            cluster.deliver(self.rank, dst, _Message(tensor, comm))
            return _Sent(comm)
        nic = cluster.nics[self.rank]
        if nic is None:
            nic = cluster.nics[self.rank] = _Nic(cluster, cluster.hosts[self.rank], self.rank)
        port = cluster.ports[dst] if cluster.nic == "buffered" else None
        item = _Queued(nic, dst, _Message(tensor), nbytes, port)
        nic.post(item)
        return item

    def _raw_irecv(self, tensor, src, stamped):
        posted = self._posted.get(src)
        if posted is None:
            posted = self._posted[src] = deque()
        return _Receive(self.cluster, self.rank, src, tensor, posted)

    def allgather_object(self, obj) -> list:
        return self.cluster.exchange(self.rank, obj)

    def native_allreduce(self, tensor: torch.Tensor, op: str) -> None:
        raise CommError("the simulated transport has no backend allreduce: 'native' (and DDP) move their bytes "
                        "inside gloo/NCCL, where no simulator sees them; simulate a strategy written over "
                        "send/recv instead (ring is the algorithm gloo and NCCL use for large messages)")

    # -- simulated time -----------------------------------------------------------------------------

    def now(self) -> float:
        """Simulated seconds since the simulation started."""
        return self.sg.Engine.clock

    def compute(self, seconds: float) -> None:
        """Spend `seconds` of simulated compute time (the profile's forward, backward, optimizer)."""
        if seconds > 0:
            self.sg.this_actor.sleep_for(seconds)


def run_simgrid(world_size: int, fn: Callable[[SimGridCommunicator], object], build_platform,
                config: tuple[str, ...] = (), nic: str = "shared") -> list:
    """Simulate fn(comm) on world_size ranks; return each rank's result, or raise the first error.

    build_platform(sg) creates the platform (zones, hosts, links) in the fresh engine and returns the host of
    each rank in rank order. `config`: SimGrid settings, e.g. ("network/model:CM02",). `nic`: "shared",
    "fifo" or "buffered" (see Cluster). Once per process.
    """
    sg = load_simgrid()
    if getattr(sg, "_syncbench_engine_used", False):
        raise RuntimeError("run_simgrid: SimGrid's engine has already run in this process and cannot be created "
                           "twice; run each simulation in a fresh process (experiments.simulate does)")
    sg._syncbench_engine_used = True
    # SimGrid runs its actor threads one at a time: on one CPU each hand-over is a switch on that CPU, not a
    # wake-up sent to another (measured: a 256-rank ring simulates about 20% faster). The cyclic garbage
    # collector would walk every object the ranks allocate, again and again, while up to 1,024 actor threads
    # hand control around; the simulation's objects are freed by reference counting anyway. Both restored.
    cpus = os.sched_getaffinity(0)
    gc_was_enabled = gc.isenabled()
    os.sched_setaffinity(0, {_current_cpu(cpus)})
    gc.disable()
    try:
        return _simulate(sg, world_size, fn, build_platform, config, nic)
    finally:
        if gc_was_enabled:
            gc.enable()
        os.sched_setaffinity(0, cpus)


def _current_cpu(allowed: set[int]) -> int:
    """The CPU this thread runs on now (the scheduler's choice, so two simulations side by side usually get two
    CPUs), or the highest allowed one where /proc does not say."""
    try:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, counted after the command name
    except (OSError, ValueError, IndexError):
        return max(allowed)
    return cpu if cpu in allowed else max(allowed)


def _simulate(sg, world_size, fn, build_platform, config, nic) -> list:
    args = ["syncbench", "--log=root.thres:critical"] + [f"--cfg={c}" for c in config]
    with _quiet_stderr():
        engine = sg.Engine(args)
    hosts = build_platform(sg)
    if len(hosts) != world_size:
        raise ValueError(f"run_simgrid: the platform has {len(hosts)} hosts for {world_size} ranks")
    cluster = Cluster(sg, hosts, nic)
    results: list = [None] * world_size
    errors: list = [None] * world_size
    finished = [False] * world_size

    def body(rank):
        comm = SimGridCommunicator(cluster, rank)
        try:
            results[rank] = fn(comm)
            finished[rank] = True
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            if isinstance(e, sg.ActorKilled) or isinstance(e.__cause__, sg.ActorKilled):
                return  # SimGrid ends the actors of a deadlocked simulation this way: reported below
            errors[rank] = e
            finished[rank] = True
        finally:
            if cluster.nics[rank] is not None:
                cluster.nics[rank].close()

    for rank in range(world_size):
        sg.Actor.create(f"rank{rank}", hosts[rank], body, rank)
    if nic == "buffered":
        ports = [sg.Host.by_name(f"port{rank}") for rank in range(world_size)]
        if any(p is None for p in ports):
            raise ValueError("nic = 'buffered' needs a platform with a switch port host 'port<rank>' per rank "
                             "(the star platform builds them)")
        cluster.ports = [_Port(cluster, ports[rank], rank) for rank in range(world_size)]
    with _quiet_stderr():  # a deadlock report goes to stderr; it is raised below as a CommError instead
        engine.run()
    first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    stuck = [r for r in range(world_size) if not finished[r]]
    if stuck:
        shown = ", ".join(map(str, stuck[:10])) + (" ..." if len(stuck) > 10 else "")
        raise CommError(f"simulation deadlocked at {engine.clock:.6f} simulated s: {len(stuck)} of {world_size} "
                        f"ranks never finished (ranks {shown}): a receive without a matching send, or ranks "
                        f"disagreeing on sizes")
    return results
