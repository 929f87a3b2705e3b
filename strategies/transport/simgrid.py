"""The simulated transport: ranks are SimGrid actors, messages are SimGrid mailbox transfers of their real size.

The same strategy code that runs on threads and over gloo runs here unchanged; only time is simulated. Each
message is one `Mailbox.put_async` of exactly `numel x element_size` bytes (the size the base class counts)
from the sender's host to the receiver's; SimGrid's flow-level network model decides when it arrives.

Payloads. A rank's buffers are either real CPU tensors (the values move, so results can be checked against a
reference) or `meta` tensors: they have the real shape and dtype, hence the real byte size, but no storage,
so 1,024 ranks of a 100 MB model take no memory. Sizes are never scaled: the simulated size of a message is
the byte size of the tensor the strategy passed, and the receiver checks that the sender's element count and
dtype equal its buffer's (as the other transports do).

Mailboxes. One per (sender, receiver) pair, created on first use, with the receiver as its permanent
receiver: a send starts moving when it is posted (eager, as a TCP socket with room in its buffers, and as the
link emulation books a send), and the receive takes it when it arrives. A receive therefore costs one
blocking `get` when it is waited for; a send one `put_async`, and a wait only if it is still in flight.
Python actors are OS threads that SimGrid runs one at a time, so every call into SimGrid is a thread switch:
these are the fewest calls a message can cost (see experiments/simulate/bench.py for what that buys). A
finished send is recognised by its finish time (free to read), not by a wait.

Host-to-host transfers (`Comm.sendto_async`) with the payload in a Python queue per pair were tried instead of
mailboxes: 15% faster on a ring, but 14x slower on all_to_all at 256 ranks (SimGrid 3.32 spends the time
walking a list inside the engine once hundreds of them are in flight), so mailboxes stay.

No wall-clock timeout applies: a peer that never sends leaves the simulation with nothing to do, SimGrid reports
the deadlock and `run_simgrid` raises a CommError naming the ranks that never finished. SimGrid's engine is one per
process: `run_simgrid` may be called once per process (the simulate pipeline runs each simulation in a fresh one).
"""

from __future__ import annotations

import functools
from collections import deque

import torch

from strategies.transport import factory
from strategies.transport.communicator import CommError, Communicator
from strategies.transport.link import Network
from strategies.transport.names import NIC_MODES
from strategies.transport.ranks import Board
from strategies.transport.recorder import Direction
from strategies.transport.simgrid_loader import (  # noqa: F401 - the loader's names, read from here too
    INSTALL_HINT,
    SimGridMissing,
    load_simgrid,
    simgrid_available,
)
from strategies.transport.wire import check_received


class _Message:
    """What travels through a mailbox: the sender's byte count and dtype, and the values (None for meta)."""

    __slots__ = ("nbytes", "dtype", "values")

    def __init__(self, tensor: torch.Tensor):
        self.nbytes = tensor.numel() * tensor.element_size()
        self.dtype = tensor.dtype
        self.values = None if tensor.is_meta else tensor.clone()


def _wait_sent(comm, timeout) -> None:
    """A mailbox send's wait: free if it has finished (its finish time is set), else one switch."""
    if comm.finish_time < 0:
        comm.wait()


class _Receive:
    """A posted receive. Messages from one peer match receives in the order they were posted (as gloo's do):
    wait() takes the pair's next messages for every earlier receive from that peer still pending, then its own.
    Slotted: a ring keeps a phase's n - 1 of them per rank pending at once."""

    __slots__ = ("box", "rank", "src", "tensor", "posted", "done")

    def __init__(self, box, rank: int, src: int, tensor: torch.Tensor, posted):
        self.box, self.rank, self.src, self.tensor, self.posted = box, rank, src, tensor, posted
        self.done = False
        posted.append(self)

    def wait(self, timeout):
        while not self.done:
            self.posted.popleft()._take()
        return None

    def _take(self):
        message = self.box.get()
        self.done = True
        check_received(self.rank, self.src, self.tensor, message.nbytes, message.dtype)
        if message.values is not None and not self.tensor.is_meta:
            self.tensor.copy_(message.values)


class _AnyReceive:
    """A receive SimGridCommunicator.wait_any can wait for: posted at once (`get_async`), taken by wait_any.
    `message`: the payload once it is in hand (a message that had arrived before the receive was posted);
    `record`: the message recorder's done() (strategies/transport/recorder.py), None when nothing records."""

    __slots__ = ("activity", "data", "tensor", "src", "nbytes", "message", "record")

    def __init__(self, activity, data, tensor: torch.Tensor, src: int, nbytes: int, message=None, record=None):
        self.activity, self.data, self.tensor, self.src, self.nbytes = activity, data, tensor, src, nbytes
        self.message, self.record = message, record


class _Queued:
    """A send waiting for this rank's NIC (fifo mode): wait() blocks until the NIC actor has delivered it."""

    __slots__ = ("nic", "box", "message", "nbytes", "done", "via", "sent", "comm")

    def __init__(self, nic, box, message, nbytes, via=None):
        self.nic, self.box, self.message, self.nbytes, self.done = nic, box, message, nbytes, False
        self.via = via  # buffered mode: `box` is the receiver's switch port (a _Port), `via` the pair's mailbox
        self.sent = None  # shared mode: a waiter's semaphore, made only when someone waits while it is queued
        self.comm = None  # shared mode: its transfer, once the pair's actor has put it on the wire

    def wait_sent(self, timeout):
        """shared mode (a _Connection's queue): wait until the pair's actor has put it on the wire, then until it
        has arrived. Actors run one at a time, so nothing happens between the check and the semaphore's making."""
        if self.comm is None:
            self.sent = self.nic.sg.Semaphore(0)
            self.sent.acquire()
        _wait_sent(self.comm, timeout)

    def wait(self, timeout):
        while not self.done:  # each delivery releases once; a release meant for another send just loops
            self.nic.delivered.acquire()


class _Connection:
    """shared mode: the connection from one rank to one peer. Its messages leave in the order they were posted, each
    when the one before it has arrived, as on a TCP socket or a gloo pair (one stream per pair of ranks); different
    peers' connections share the rank's NIC (SimGrid's max-min sharing). Without it every message was a flow of its
    own: a parameter-server worker's 4 MiB partitions to one server shared its NIC and all arrived together at the
    end, so no server could answer a partition before the last push (twice traffic()'s time), and a ring's next
    chunk slowed the one its neighbour was waiting for. A message posted while the pair is idle is put at once by
    the posting actor (no extra switch); one posted behind another waits in `queue` for an actor of the pair's own,
    started on the first backlog and ended when the backlog drains (SimGrid actors are OS threads). That actor costs
    each queued message two calls into SimGrid (wait for the one before, put): its sender gets a semaphore only if it
    waits for the message while it is still queued (a ring waits for its sends at the end, when they have arrived).
    (A semaphore per message, released after a wait for its arrival, was 4 calls: ring at 256 ranks, where two thirds
    of the messages queue, took about 5% more CPU on a quiet machine; docs/simulation.md.)"""

    __slots__ = ("sg", "host", "name", "head", "queue", "running")

    def __init__(self, sg, host, name: str):
        self.sg, self.host, self.name = sg, host, name
        self.head = None  # the pair's last message put on the wire (a Comm)
        self.queue: deque[_Queued] = deque()
        self.running = False

    def idle(self) -> bool:
        return not self.queue and (self.head is None or self.head.finish_time >= 0)

    def put(self, box, message, nbytes: int):
        """The pair is idle: put now; the handle's wait()."""
        self.head = box.put_async(message, nbytes)
        return functools.partial(_wait_sent, self.head)

    def post(self, box, message, nbytes: int):
        """The pair is busy: queue behind it; the handle's wait()."""
        item = _Queued(self, box, message, nbytes)
        self.queue.append(item)
        if not self.running:
            self.running = True
            self.sg.Actor.create(self.name, self.host, self._run)
        return item.wait_sent

    def _run(self):
        try:
            while True:  # each message put when the one before it has arrived; ends when the last one has
                if self.head is not None and self.head.finish_time < 0:
                    self.head.wait()
                if not self.queue:
                    break
                # off the queue once it is the head (put_async lets others run: a sender would put beside it)
                item = self.queue[0]
                item.comm = self.head = item.box.put_async(item.message, item.nbytes)
                self.queue.popleft()
                if item.sent is not None:  # its sender waits for it: it waits for the transfer itself now
                    item.sent.release()
            self.running = False
        except Exception as e:  # noqa: BLE001 - SimGrid ends a deadlocked simulation's actors this way
            if type(e).__name__ != "ActorKilled":
                raise


class _Nic:
    """fifo mode: one actor per rank sends its messages one at a time, in the order they were posted."""

    def __init__(self, sg, host, rank: int):
        self.queue: deque[_Queued] = deque()
        self.posted = sg.Semaphore(0)
        self.delivered = sg.Semaphore(0)
        self.closed = False
        self.sg, self.host = sg, host
        sg.Actor.create(f"nic{rank}", host, self._run)

    def post(self, item: _Queued) -> None:
        self.queue.append(item)
        self.posted.release()

    def close(self) -> None:
        self.closed = True
        self.posted.release()

    def _run(self):
        try:
            while True:
                self.posted.acquire()
                if not self.queue:  # closed, nothing left to send
                    return
                item = self.queue.popleft()
                if item.via is None:
                    item.box.put(item.message, item.nbytes)
                else:  # buffered: the port starts draining now (cut-through) while this NIC sends up to it
                    item.box.post((item.via, item.message, item.nbytes))
                    self.sg.Comm.sendto(self.host, item.box.host, item.nbytes)
                item.done = True
                self.delivered.release()
        except Exception as e:  # noqa: BLE001 - SimGrid ends a deadlocked simulation's actors this way
            if type(e).__name__ != "ActorKilled":
                raise


class _Port:
    """buffered mode: the switch port in front of a rank. A message starts down to the rank as soon as its
    sender starts sending it up (cut-through), one message at a time in the order they started: the downlink
    cannot finish before the uplink (same rate, later start), the sender is never slowed by a busy receiver
    (the switch buffers), as the link emulation books a receive (strategies/transport/link.py, LinkClock.receive)."""

    def __init__(self, sg, port_host, rank: int):
        self.host = port_host
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
                pair_box, message, nbytes = self.queue.popleft()
                pair_box.put(message, nbytes)
        except Exception as e:  # noqa: BLE001 - SimGrid ends the daemon this way
            if type(e).__name__ != "ActorKilled":
                raise


class _Condition:
    """threading.Condition for SimGrid actors: the lock a SimGrid mutex, each waiter parked on a semaphore of its
    own (a release before its acquire is kept, so no wake-up is lost). No timeout: simulated time may legitimately
    run long (a straggler), and a wait nothing will ever end is a deadlock SimGrid detects and run_simgrid names."""

    def __init__(self, sg):
        self.sg, self.mutex, self.waiting = sg, sg.Mutex(), []

    def __enter__(self):
        self.mutex.lock()
        return self

    def __exit__(self, *exc):
        self.mutex.unlock()

    def notify_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for parked in waiting:
            parked.release()

    def wait_for(self, predicate, timeout=None) -> bool:
        while not predicate():
            parked = self.sg.Semaphore(0)
            self.waiting.append(parked)
            self.mutex.unlock()
            parked.acquire()
            self.mutex.lock()
        return True


class ActorConcurrency:
    """A simulated rank's loops side by side (strategies/transport/concurrency.py): SimGrid actors on the rank's
    host, the simulated clock. Each actor is an OS thread: run_simgrid's callers bound how many there are."""

    def __init__(self, sg):
        self.sg = sg

    def clock(self) -> float:
        return self.sg.Engine.clock

    def condition(self) -> _Condition:
        return _Condition(self.sg)

    def start(self, fn, name: str):
        return self.sg.Actor.create(name, self.sg.this_actor.get_host(), fn)


class _SharedBoard(Board):
    """The control plane's board for actors that run one at a time (SimGrid's): the first rank through the
    barrier takes one copy of what every rank posted and all share it. A copy each (Board's) is world_size^2
    references held at once between the two waits: 2 GiB at 16,384 ranks for one size check."""

    def __init__(self, world_size: int, barrier):
        super().__init__(world_size, barrier)
        self._shared: tuple = ()
        self._readers = 0

    def exchange(self, rank: int, obj, *wait_args) -> tuple:
        self._posted[rank] = obj
        self.barrier.wait(*wait_args)
        # between the two waits every rank runs this part without a switch: no other rank interleaves
        if self._readers == 0:
            self._shared = tuple(self._posted)
        board = self._shared
        self._readers = (self._readers + 1) % len(self._posted)
        self.barrier.wait(*wait_args)
        return board


class Cluster:
    """The state the ranks of one simulation share: actors, mailboxes, the control-plane board.

    nic = "shared": a rank's messages to one peer leave in order on that pair's connection, and its connections to
    different peers share its NIC as TCP flows do (SimGrid's max-min sharing): see _Connection.
    nic = "fifo": they leave one at a time in posting order, each at the full rate; one more actor per rank
    and about twice the SimGrid calls per message.
    nic = "buffered": as fifo on the sender's uplink into a switch that buffers; each receiver's downlink
    takes one message at a time, in the order they started (see _Port): the link emulation's model
    (strategies/transport/link.py books each NIC's transmit and receive sides separately). Star platforms only; two
    more actors per rank.
    """

    def __init__(self, sg, world_size: int, nic: str = "shared"):
        if nic not in NIC_MODES:
            raise ValueError(f"nic = {nic!r}: accepted are {', '.join(NIC_MODES)}")
        self.sg = sg
        self.world_size = world_size
        self.nic = nic
        self.nics: list[_Nic | None] = [None] * world_size
        self.ports: list[_Port] = []
        self.actors: list = [None] * world_size
        self.boxes: dict[tuple[int, int], object] = {}
        self.connections: dict[tuple[int, int], _Connection] = {}
        self.board = _SharedBoard(world_size, sg.Barrier(world_size))  # takes no simulated time

    def connection(self, src: int, dst: int) -> _Connection:
        """shared mode: the pair's connection (its messages in order), made on first use by a sending actor of src."""
        key = (src, dst)
        found = self.connections.get(key)
        if found is None:
            found = self.connections[key] = _Connection(self.sg, self.sg.this_actor.get_host(), f"conn{src}>{dst}")
        return found

    def box(self, src: int, dst: int):
        key = (src, dst)
        box = self.boxes.get(key)
        if box is None:
            box = self.boxes[key] = self.sg.Mailbox.by_name(f"{src}>{dst}")
            box.set_receiver(self.actors[dst])  # eager: sends start when posted (see the module docstring)
        return box


class SimGridCommunicator(Communicator):
    """A rank of a simulated cluster: send/recv are SimGrid mailbox transfers, counted by the base class."""

    transport = "simgrid"

    def __init__(self, cluster: Cluster, rank: int):
        super().__init__(rank, cluster.world_size)  # no link emulation: the simulated platform is the network
        self.cluster = cluster
        self.sg = cluster.sg
        self.concurrency = ActorConcurrency(cluster.sg)  # a server's per-worker loops: actors, simulated clock
        self._posted: dict[int, deque[_Receive]] = {}  # per peer, receives posted and not yet matched

    def _raw_isend(self, tensor, dst, stamp):
        nbytes = tensor.numel() * tensor.element_size()
        box = self.cluster.box(self.rank, dst)
        if self.cluster.nic in ("fifo", "buffered"):
            nic = self.cluster.nics[self.rank]
            if nic is None:
                nic = self.cluster.nics[self.rank] = _Nic(self.sg, self.sg.this_actor.get_host(), self.rank)
            if self.cluster.nic == "buffered":
                item = _Queued(nic, self.cluster.ports[dst], _Message(tensor), nbytes, via=box)
            else:
                item = _Queued(nic, box, _Message(tensor), nbytes)
            nic.post(item)
            return item.wait
        connection = self.cluster.connection(self.rank, dst)
        if connection.idle():
            return connection.put(box, _Message(tensor), nbytes)
        return connection.post(box, _Message(tensor), nbytes)

    def _raw_irecv(self, tensor, src, stamped):
        posted = self._posted.get(src)
        if posted is None:
            posted = self._posted[src] = deque()
        return _Receive(self.cluster.box(src, self.rank), self.rank, src, tensor, posted).wait

    # -- one actor waiting for whichever of several peers sends first ---------------------------------------
    # (a barrier-free parameter server serves all its workers from one actor this way: every actor is an OS
    # thread, and one per worker would be 132k threads at 1,024 workers x 128 servers; parameter_server_async.py)

    receives_any = True

    def irecv_any(self, tensor: torch.Tensor, src: int) -> _AnyReceive:
        """Post a receive from `src` now, for wait_any. Messages from `src` must not also be awaited by irecv
        meanwhile (the pair's messages match receives in posting order: one kind at a time)."""
        self._check_peer(src, "recv from")
        if self._posted.get(src):
            raise CommError(f"rank {self.rank}: irecv_any from rank {src} while an irecv from it is pending: "
                            f"accepted is one kind of receive per peer at a time")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:  # the sender sends nothing (both sides know the size): done when posted
            return _AnyReceive(None, None, tensor, src, 0)
        # recorded as irecv records: posted now, finished when wait_any takes it
        record = (self.recorder.start(self.rank, src, Direction.RECV, nbytes, self.concurrency.clock)
                  if self.recorder is not None else None)
        activity, data = self.cluster.box(src, self.rank).get_async()
        if activity.finish_time >= 0:
            # The send had arrived before this receive was posted: the mailbox's permanent receiver (eager
            # sends) kept it finished, and get_async matched it. SimGrid 3.32 copies such a payload into `data`
            # only when the receive is waited for (or tested): until then data.get() raises pybind11's
            # "TypeError: Unable to convert function return value ... (self: simgrid.PyGetAsync) -> object".
            # One wait (no simulated time: it has finished) takes it now. A message still on the wire when its
            # receive is posted is copied when it ends, and wait_any takes it without a wait.
            activity.wait()
            return _AnyReceive(activity, data, tensor, src, nbytes, data.get(), record)
        return _AnyReceive(activity, data, tensor, src, nbytes, record=record)

    def wait_any(self, receives: list[_AnyReceive]) -> list[int]:
        """Wait until one of the posted receives has its message; take every one that has it by now (checked,
        copied, counted as irecv counts) and return their indices in `receives`, in the order they arrived
        (finish time, then index). One `Comm.wait_any` (its cost grows with the receives) is shared by all the
        messages that arrived together: the others are found by their finish time (free to read). None is waited
        for once finished (one that had arrived before it was posted was waited for by irecv_any, see there):
        SimGrid copied its payload when it ended, and a wait would be one more switch and, in
        SimGrid 3.32, a walk of this actor's list of activities (a std::list, removed from on each wait: at 1,024
        pending receives a server's waits were 12% of a 1,024 x 128 simulation's CPU time, perf). An activity
        never waited for stays in that list until the actor ends, as a send found finished does."""
        found = [i for i, r in enumerate(receives) if r.activity is None]  # empty: done when posted
        if not found:
            found = [i for i, r in enumerate(receives) if r.activity.finish_time >= 0]
        if not found:
            first = self.sg.Comm.wait_any([r.activity for r in receives])
            found = [i for i, r in enumerate(receives) if i == first or r.activity.finish_time >= 0]
        found.sort(key=lambda i: (receives[i].activity.finish_time if receives[i].activity is not None else -1.0, i))
        for i in found:
            taken = receives[i]
            if taken.activity is None:
                continue
            # in hand since it was posted, or finished since: SimGrid copied the payload out when the transfer ended
            message = taken.message if taken.message is not None else taken.data.get()
            taken.message = None  # the payload is taken once (data.get() hands over its one reference)
            check_received(self.rank, taken.src, taken.tensor, message.nbytes, message.dtype)
            if message.values is not None and not taken.tensor.is_meta:
                taken.tensor.copy_(message.values)
            peer = self._peer(taken.src)
            peer.bytes_recv += taken.nbytes
            peer.msgs_recv += 1
            if taken.record is not None:
                taken.record()
        return found

    def allgather_object(self, obj) -> list:
        return self.cluster.board.exchange(self.rank, obj)

    def close(self) -> None:
        """Stop this rank's NIC actor (fifo and buffered modes), so that the simulation can end."""
        nic = self.cluster.nics[self.rank]
        if nic is not None:
            nic.close()

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


def build(name: str, control: Communicator, *, timeout: float, network: Network | None, address: str):
    """The factory's "simgrid": the simulated rank carries its own point to point (mailbox transfers); the
    simulated platform is its network, so a python-emulated `network` is refused."""
    factory.require(name, control, SimGridCommunicator, "a simulated rank (run_simgrid)")
    if network is not None:
        raise ValueError("p2p 'simgrid' takes no link emulation: the simulated platform is the network (give its "
                         "bandwidth and latency to the platform)")
    return control
