"""Link emulation: a NIC per rank with a bandwidth and a latency, parsed from human strings.

A message of m bytes occupies the sender's transmit side for latency + m / bandwidth and the receiver's
receive side for m / bandwidth, so n senders into one receiver take about n times as long (incast).
With ranks_per_node = k > 1, ranks k*j .. k*j+k-1 form node j: a message between two nodes books the sending
node's NIC (transmit) and the receiving node's NIC (receive), shared by the node's ranks; a message inside a
node books the two ranks' intra-node ports (the `intra` link: NVLink, PCIe). k = 1 is the per-rank NIC above.
Units: MB = 10^6 bytes, Gbit = 10^9 bits.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
import time
from dataclasses import dataclass, field

_BANDWIDTH_UNITS = {  # bytes per second for one unit
    "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
    "b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_SIZE_UNITS = {"": 1, "b": 1, "k": 1024, "kb": 1e3, "kib": 1024, "m": 1024**2, "mb": 1e6, "mib": 1024**2,
               "g": 1024**3, "gb": 1e9, "gib": 1024**3}

BANDWIDTH_HELP = "a number with a unit: '1Gbit', '25Gbit', '100Mbit', '125MB/s', '1.5GB/s'"
LATENCY_HELP = "a number with a unit: '50us', '0.2ms', '1ms', '0s'"
# who makes the link slow: the communicator's sleeps (any machine), or the kernel (`syncbench cluster up`: one rank
# per network namespace, tbf-shaped veths, so the backend's own collectives are shaped too)
EMULATIONS = ("python", "kernel")


def parse_bandwidth(text: str | float | int) -> float:
    """'1Gbit' -> 125e6 bytes/s. A bare number is taken as bytes per second."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Z/]+)\s*", str(text))
        unit = m.group(2).lower() if m else None
        if unit in ("gbps", "mbps", "kbps"):
            unit = unit[0] + "bit"
        if not m or unit not in _BANDWIDTH_UNITS:
            raise ValueError(f"bad bandwidth {text!r}: expected {BANDWIDTH_HELP}")
        value = float(m.group(1)) * _BANDWIDTH_UNITS[unit]
    if not math.isfinite(value):
        raise ValueError(f"bad bandwidth {text!r}: must be a finite number ({BANDWIDTH_HELP})")
    if not value > 0:
        raise ValueError(f"bad bandwidth {text!r}: must be greater than zero ({BANDWIDTH_HELP})")
    return value


def parse_latency(text: str | float | int) -> float:
    """'50us' -> 5e-5 seconds. A bare number is taken as seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zµ]+)\s*", str(text).lower())
        if not m or m.group(2) not in _TIME_UNITS:
            raise ValueError(f"bad latency {text!r}: expected {LATENCY_HELP}")
        value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
    if not math.isfinite(value):
        raise ValueError(f"bad latency {text!r}: must be a finite number ({LATENCY_HELP})")
    if value < 0:
        raise ValueError(f"bad latency {text!r}: must not be negative ({LATENCY_HELP})")
    return value


def parse_size(text: str | int) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '16MB' -> 16000000: message sizes for the command line."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(f"bad size {text!r}: expected bytes like '4K', '64K', '1M', '16M', '16MB', '1024'")
        value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
    if value < 0:
        raise ValueError(f"bad size {text!r}: must not be negative")
    return value


@dataclass(frozen=True)
class Link:
    """One rank's NIC: bandwidth in bytes/s (each direction) and latency in seconds per message."""

    bandwidth: float
    latency: float = 0.0

    @classmethod
    def parse(cls, bandwidth: str | float, latency: str | float = 0.0) -> Link:
        return cls(parse_bandwidth(bandwidth), parse_latency(latency))

UNLIMITED = Link(math.inf)  # the intra-node link when none is given: latency-free, no bandwidth limit


class Port:
    """One side pair of a NIC (transmit, receive): when each is next free. Locked: a node's ranks share it."""

    def __init__(self, link: Link, shared: bool = False):
        self.link = link
        self.tx_free = 0.0
        self.rx_free = 0.0
        self.lock = threading.Lock()
        # receives are booked when a thread waits for them, which need not be the order they arrive in: a node's
        # ranks wait in whatever order their threads get there, and one rank waiting on several peers (a parameter
        # server, all_to_all) waits in its own order while a later-waited message may be on the wire first. So the
        # receive side keeps its busy intervals and a message takes the first gap after its first byte (in-order
        # waits book exactly as a single "free at" time would); `rx_floor`: the end of intervals dropped as old
        self.shared = shared
        self.rx_busy: list[tuple[float, float]] = []
        self.rx_floor = 0.0

    def __getstate__(self):  # a Network travels to Ray actors by pickle: the lock does not
        return {"link": self.link, "tx_free": 0.0, "rx_free": 0.0, "shared": self.shared, "rx_busy": [],
                "rx_floor": 0.0}

    def book_receive(self, nbytes: int, first_byte: float, sender_done: float) -> float:
        """Book the receive side (caller holds the lock); returns when the message is fully received."""
        duration = nbytes / self.link.bandwidth
        start = max(first_byte, self.rx_floor)
        if start >= self.rx_free:  # after everything booked (waits in arrival order): no gap to look for
            done = max(sender_done, start + duration)
            self.rx_busy.append((start, done))
        else:
            for lo, hi in self.rx_busy:  # sorted by start: the first gap from first_byte that fits
                if start + duration <= lo:
                    break
                start = max(start, hi)
            done = max(sender_done, start + duration)
            bisect.insort(self.rx_busy, (start, done))
        self.rx_free = max(self.rx_free, done)
        horizon = time.time() - 1.0  # intervals long past cannot hold a gap any new message could use
        while self.rx_busy and self.rx_busy[0][1] < horizon:
            self.rx_floor = max(self.rx_floor, self.rx_busy.pop(0)[1])
        return done

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.lock = threading.Lock()


@dataclass(frozen=True)
class Network:
    """Every rank's link: one default plus per-rank overrides (a slow rank, a fat server NIC), and who emulates it.

    ranks_per_node = k groups ranks into nodes of k (the last one may be shorter); the default link is then each
    node's NIC, shared by its ranks, and `intra` the link between two ranks of one node. A node's NIC is shared
    only by ranks holding this same Network object (thread ranks; one process); with emulation = "kernel" it is
    the cluster's shaped veth of the node's namespace (no intra link: the namespace's loopback is not shaped).
    """

    default: Link
    overrides: tuple[tuple[int, Link], ...] = ()
    emulation: str = "python"  # one of EMULATIONS
    ranks_per_node: int = 1
    intra: Link = UNLIMITED
    _nics: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self):
        k = self.ranks_per_node
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"ranks_per_node = {k!r}: expected an integer >= 1")
        if k > 1 and self.overrides:
            raise ValueError(f"link ranks (per-rank links) with ranks_per_node = {k}: a node's ranks share one "
                             f"NIC; give per-rank links with ranks_per_node = 1 only")
        if self.emulation == "kernel" and self.intra != UNLIMITED:
            # the kernel cluster puts a node's ranks in one namespace: they talk over its loopback, not shaped
            raise ValueError(f"link intra_bandwidth / intra_latency ({self.intra.bandwidth * 8 / 1e9:g} Gbit/s, "
                             f"{self.intra.latency * 1e6:g} us) with link emulation 'kernel': the kernel-shaped "
                             f"cluster shapes each node's NIC only, a node's ranks talk over its unshaped loopback; "
                             f"leave them out there, or use emulation = \"python\"")

    def link(self, rank: int) -> Link:
        for r, link in self.overrides:
            if r == rank:
                return link
        return self.default

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def nic(self, node: int) -> Port:
        """Node `node`'s NIC, one object for every rank of the node that holds this Network."""
        with _NICS_LOCK:
            if node not in self._nics:
                self._nics[node] = Port(self.default, shared=True)
            return self._nics[node]

    @classmethod
    def from_spec(cls, spec: dict | None) -> Network | None:
        """{'bandwidth': '1Gbit', 'latency': '50us', 'ranks': {3: {'bandwidth': '100Mbit'}}} -> Network.

        'emulation': 'python' (default) or 'kernel' says who slows the link down.
        """
        if not spec:
            return None
        unknown = set(spec) - {"bandwidth", "latency", "ranks", "emulation", "intra_bandwidth", "intra_latency"}
        if unknown:
            raise ValueError(f"unknown link key(s) {sorted(unknown)}: accepted are bandwidth, latency, ranks, "
                             f"emulation, intra_bandwidth, intra_latency")
        emulation = spec.get("emulation", "python")
        if emulation not in EMULATIONS:
            raise ValueError(f"link emulation {emulation!r}: accepted are {', '.join(map(repr, EMULATIONS))}")
        if "bandwidth" not in spec:
            raise ValueError(f"link {spec!r} needs a bandwidth ({BANDWIDTH_HELP})")
        default = Link.parse(spec["bandwidth"], spec.get("latency", 0.0))
        ranks = spec.get("ranks") or {}
        example = "ranks = { 1 = { bandwidth = \"1Gbit\", latency = \"50us\" } }"
        if not isinstance(ranks, dict):
            raise ValueError(f"link ranks = {ranks!r}: expected a table of per-rank links, like {example}")
        overrides = []
        for rank, sub in ranks.items():
            if not re.fullmatch(r"\d+", str(rank)):
                raise ValueError(f"link ranks key {rank!r}: expected a rank number >= 0, like {example}")
            if not isinstance(sub, dict):
                raise ValueError(f"link ranks.{rank} = {sub!r}: expected a table, like {example}")
            unknown = set(sub) - {"bandwidth", "latency"}
            if unknown:  # a misspelt key would otherwise leave the rank at the default link, labelled otherwise
                raise ValueError(f"link ranks.{rank}: unknown key(s) {sorted(unknown)}: accepted are bandwidth, "
                                 f"latency")
            if not sub:
                raise ValueError(f"link ranks.{rank} is empty: give its bandwidth and/or latency, like {example}")
            overrides.append((int(rank), Link.parse(sub.get("bandwidth", default.bandwidth),
                                                    sub.get("latency", default.latency))))
        # the link between two ranks of one node (with ranks_per_node > 1): unlimited unless given
        intra = UNLIMITED
        if "intra_bandwidth" in spec or "intra_latency" in spec:
            intra = Link(parse_bandwidth(spec["intra_bandwidth"]) if "intra_bandwidth" in spec else math.inf,
                         parse_latency(spec.get("intra_latency", 0.0)))
        return cls(default, tuple(overrides), emulation, intra=intra)

    def with_nodes(self, ranks_per_node: int, intra: Link | None = None) -> Network:
        """This network with ranks grouped into nodes of `ranks_per_node` (intra: the intra-node link)."""
        return Network(self.default, self.overrides, self.emulation, ranks_per_node, intra or self.intra)


_NICS_LOCK = threading.Lock()


class LinkClock:
    """This rank's view of the network: when its NIC's (or its node's NIC's and its intra-node port's) transmit and
    receive sides are next free (wall-clock seconds).

    time.time() is used because sender and receiver stamps are compared: exact between processes of one
    machine, as good as the clock sync (NTP/PTP) between machines.
    """

    def __init__(self, network: Network, rank: int):
        self.network = network
        self.node = network.node_of(rank)
        # k = 1: the rank's own NIC (its override, if any); k > 1: the node's NIC, shared, and an intra-node port
        self.nic = Port(network.link(rank)) if network.ranks_per_node == 1 else network.nic(self.node)
        self.intra = Port(network.intra)

    @property
    def link(self) -> Link:
        return self.nic.link

    def _port(self, peer: int | None) -> Port:
        return self.intra if peer is not None and self.network.node_of(peer) == self.node and \
            self.network.ranks_per_node > 1 else self.nic

    def transmit(self, nbytes: int, peer: int | None = None) -> tuple[float, float]:
        """Book the transmit side for one message to `peer`; returns (first byte on the wire, last byte delivered)."""
        port = self._port(peer)
        with port.lock:
            start = max(time.time(), port.tx_free)
            end = start + port.link.latency + nbytes / port.link.bandwidth
            port.tx_free = end
        return start + port.link.latency, end

    def receive(self, nbytes: int, first_byte: float, sender_done: float, peer: int | None = None) -> float:
        """Book the receive side for a message `peer` stamped; returns when it is fully received."""
        port = self._port(peer)
        with port.lock:
            return port.book_receive(nbytes, first_byte, sender_done)


def sleep_until(deadline: float) -> None:
    """Sleep until a wall-clock deadline; the last 200 us spin, since sleep overshoots by ~60 us."""
    while True:
        left = deadline - time.time()
        if left <= 0:
            return
        if left > 2e-4:
            time.sleep(left - 1.5e-4)


class LinkDown:
    """A rank's NIC down for `seconds` from now: the communicator holds each of the rank's sends and receives that
    falls in the window until it ends (strategies/transport/communicator.py), so no message leaves or arrives
    meanwhile. `cancelled()`: the rank's group has given up on it (its run aborted), so the hold ends early."""

    def __init__(self, seconds: float, cancelled=None):
        if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"link down for {seconds!r} s: expected seconds > 0")
        self.start = time.monotonic()
        self.end = self.start + seconds
        self.cancelled = cancelled or (lambda: False)
        self.held_s = 0.0  # seconds the rank's messages were held, in all

    def hold(self) -> None:
        """Wait until the link is up again (now, if it is)."""
        began = time.monotonic()
        while (now := time.monotonic()) < self.end and not self.cancelled():
            time.sleep(min(0.01, self.end - now))
        self.held_s += time.monotonic() - began
