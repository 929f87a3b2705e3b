"""Simulated platforms: a star, a two-level fat tree, and nodes of k GPUs, built as SimGrid zones.

Every rank is a host with its own NIC: a split-duplex link (send and receive each at the full bandwidth).
- star: every NIC goes straight into one non-blocking switch, which is what the link emulation models.
- fat_tree: ranks hang off leaf switches, `hosts_per_leaf` each; each leaf reaches a non-blocking spine
  through uplinks of hosts_per_leaf x bandwidth / oversubscription in all (1 = full bisection, 4 = 4:1). The
  leaf's uplinks are one aggregated link: the fluid view of ECMP spreading flows evenly over the spines.
- nodes: ranks are GPUs, `gpus_per_node` to a node, joined inside the node by a fast link (`intra_bandwidth`,
  `intra_latency`, NVLink-like) and reaching other nodes through the node's NIC (`bandwidth`, `latency`),
  all nodes on one non-blocking switch.
One message pays its route's latency once: a route's links split the configured `latency` between them.
A rank's concurrent sends share its NIC as TCP flows do (nic = "shared", SimGrid's max-min sharing), or leave
one at a time in posting order (nic = "fifo"), or, on the star, one at a time into a switch that buffers them
and drains each receiver's port one message at a time (nic = "buffered": the link emulation's model).

Network models (SimGrid's, stated on every result row):
- "tcp" (SimGrid's default LV08): max-min sharing with TCP corrections: 97% goodput (bandwidth-factor 0.97),
  latency x 13.01 (latency-factor, slow start), the reverse ACK flow on each link (crosstraffic), the window
  limit TCP-gamma = 4 MiB per round trip.
- "alpha_beta" (corrections off: CM02, bandwidth and latency factors 1, no crosstraffic, no window limit):
  a message of m bytes alone on a route takes exactly latency + m / bandwidth, as the alpha-beta model says.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.transport.link import BANDWIDTH_HELP, LATENCY_HELP, parse_bandwidth, parse_latency
from strategies.transport.names import NIC_MODES

TOPOLOGIES = ("star", "fat_tree", "nodes")
# network/optim:Full: SimGrid 3.32's default lazy update re-solves the sharing only where it thinks something changed
# and can leave a link over its capacity: a node's ring of 4 ranks started, then its 4 messages to the next node, at
# 100 Gbit/s everywhere, got 6.25 GB/s each through the 12.5 GB/s NIC (hierarchical on 2 nodes of 4: 7% fast; 4 ranks
# in nodes of 2 at 10 Gbit/s, pipelined: 40% fast, under the NIC's bound). Full re-solves every flow at every event
# (max-min exactly; simulations take about 1.2-1.5x the CPU). sharing = "lazy" keeps SimGrid's lazy update: only on
# the alpha-beta star with shared split-duplex NICs, and only for a strategy no link of which carries two flows at
# once (the ring: FaultSim refuses the rest), where there is nothing to share and the lazy update cannot err.
_EXACT_SHARING = ("network/optim:Full",)
NETWORK_MODELS = {
    "tcp": ("network/model:LV08",),
    "alpha_beta": ("network/model:CM02", "network/crosstraffic:0", "network/TCP-gamma:0",
                   "network/latency-factor:1", "network/bandwidth-factor:1"),
}
SHARING = ("full", "lazy")
LAZY_PLATFORM = ("star", "alpha_beta", "shared")  # (topology, network_model, nic) where sharing = "lazy" is accepted
NETWORK_MODEL_HELP = ("'tcp' (SimGrid's default LV08: 97% goodput, latency x 13.01, crosstraffic, TCP-gamma 4 MiB) "
                      "or 'alpha_beta' (CM02, corrections off: latency + bytes / bandwidth exactly)")
_HOST_SPEED = 1e9  # flop/s; nothing computes in flops (compute is simulated sleep), but hosts need a speed


@dataclass(frozen=True)
class Platform:
    """A simulated cluster's shape and links; bandwidths in bytes/s, latencies in seconds."""

    topology: str = "star"
    bandwidth: float = 125e6
    latency: float = 50e-6
    network_model: str = "tcp"
    nic: str = "shared"
    hosts_per_leaf: int = 16
    oversubscription: float = 1.0
    gpus_per_node: int = 8
    intra_bandwidth: float = 150e9
    intra_latency: float = 2e-6
    sharing: str = "full"

    def __post_init__(self):
        problems = []
        if self.topology not in TOPOLOGIES:
            problems.append(f"topology = {self.topology!r}: accepted are {', '.join(TOPOLOGIES)}")
        if self.network_model not in NETWORK_MODELS:
            problems.append(f"network_model = {self.network_model!r}: accepted are {NETWORK_MODEL_HELP}")
        if self.nic not in NIC_MODES:
            problems.append(f"nic = {self.nic!r}: accepted are 'shared' (a rank's concurrent sends share its NIC, as "
                            f"TCP flows do), 'fifo' (they leave one at a time) or 'buffered' (one at a time into a "
                            f"buffering switch, drained one at a time per receiver: the link emulation's model)")
        if self.nic == "buffered" and self.topology != "star":
            problems.append(f"nic = 'buffered' is modelled on the star only, not on topology = {self.topology!r}")
        if self.sharing not in SHARING:
            problems.append(f"sharing = {self.sharing!r}: accepted are 'full' (SimGrid re-solves every flow's share at "
                            f"every event) or 'lazy' (its lazy update, on {'/'.join(LAZY_PLATFORM)} only)")
        elif self.sharing == "lazy" and (self.topology, self.network_model, self.nic) != LAZY_PLATFORM:
            problems.append(f"sharing = 'lazy' on {self.topology}, {self.network_model}, nic {self.nic}: accepted on "
                            f"the star, alpha_beta, nic shared only (split-duplex NICs, no TCP corrections), where a "
                            f"ring's links never carry two flows")
        for key in ("hosts_per_leaf", "gpus_per_node"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append(f"{key} = {value!r}: accepted is an integer >= 1")
        if not (isinstance(self.oversubscription, (int, float)) and self.oversubscription >= 1):
            problems.append(f"oversubscription = {self.oversubscription!r}: accepted is a number >= 1 "
                            f"(1 = full bisection bandwidth, 4 = 4:1)")
        for key in ("bandwidth", "intra_bandwidth"):
            if not getattr(self, key) > 0:
                problems.append(f"{key} = {getattr(self, key)!r}: must be > 0 ({BANDWIDTH_HELP})")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def parse(cls, spec: dict) -> Platform:
        """{'topology': 'fat_tree', 'bandwidth': '1Gbit', 'latency': '50us', 'oversubscription': 4, ...}."""
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(spec) - known
        if unknown:
            raise ValueError(f"unknown platform key(s) {sorted(unknown)}: accepted are {', '.join(sorted(known))}")
        values = dict(spec)
        for key in ("bandwidth", "intra_bandwidth"):
            if key in values:
                values[key] = parse_bandwidth(values[key])
        for key in ("latency", "intra_latency"):
            if key in values:
                try:
                    values[key] = parse_latency(values[key])
                except ValueError as e:
                    raise ValueError(f"{key}: {e} ({LATENCY_HELP})") from None
        return cls(**values)

    @property
    def config(self) -> tuple[str, ...]:
        """SimGrid settings of the network model and its sharing."""
        return NETWORK_MODELS[self.network_model] + (_EXACT_SHARING if self.sharing == "full" else ())

    def label(self) -> str:
        link = f"{self.bandwidth * 8 / 1e9:g}Gbit {self.latency * 1e6:g}us"
        if self.topology == "fat_tree":
            return f"fat_tree {self.hosts_per_leaf}/leaf {self.oversubscription:g}:1, {link}"
        if self.topology == "nodes":
            return (f"nodes of {self.gpus_per_node} ({self.intra_bandwidth * 8 / 1e9:g}Gbit "
                    f"{self.intra_latency * 1e6:g}us inside), NIC {link}")
        return f"star, {link}"

    def groups(self, ranks: int) -> list[list[int]]:
        """Ranks by leaf switch (fat_tree) or node (nodes); one group per rank on the star."""
        size = {"star": 1, "fat_tree": self.hosts_per_leaf, "nodes": self.gpus_per_node}[self.topology]
        return [list(range(start, min(start + size, ranks))) for start in range(0, ranks, size)]

    def build(self, sg, ranks: int) -> list:
        """Create this platform in SimGrid's (fresh) engine; return the host of each rank, in rank order."""
        root = sg.NetZone.create_star_zone("switch")
        up = sg.LinkInRoute.Direction.UP
        hosts = []
        if self.topology == "star":
            for rank in range(ranks):
                host = root.create_host(f"rank{rank}", _HOST_SPEED).seal()
                nic = root.create_split_duplex_link(f"nic{rank}", self.bandwidth).set_latency(self.latency / 2).seal()
                root.add_route(host.netpoint, None, None, None, [sg.LinkInRoute(nic, up)], True)
                hosts.append(host)
            if self.nic == "buffered":  # the switch's port in front of each rank: a host with no link of its own
                for rank in range(ranks):
                    port = root.create_host(f"port{rank}", _HOST_SPEED).seal()
                    root.add_route(port.netpoint, None, None, None, [], True)
            root.seal()
            return hosts
        if self.topology == "fat_tree":  # host NIC to leaf, then the leaf's aggregated uplink to the spine
            host_bw, host_lat, group_lat = self.bandwidth, self.latency / 4, self.latency / 4
        else:  # nodes: GPU to node over the fast link, then the node's NIC to the switch
            host_bw, host_lat, group_lat = self.intra_bandwidth, self.intra_latency / 2, self.latency / 2
        for g, members in enumerate(self.groups(ranks)):
            zone = sg.NetZone.create_star_zone(f"group{g}")
            zone.set_parent(root)
            gateway = zone.create_router(f"group{g}-gw")
            for rank in members:
                host = zone.create_host(f"rank{rank}", _HOST_SPEED).seal()
                link = zone.create_split_duplex_link(f"port{rank}", host_bw).set_latency(host_lat).seal()
                zone.add_route(host.netpoint, None, None, None, [sg.LinkInRoute(link, up)], True)
                hosts.append(host)
            if self.topology == "fat_tree":
                uplink_bw = len(members) * self.bandwidth / self.oversubscription
            else:
                uplink_bw = self.bandwidth
            uplink = root.create_split_duplex_link(f"uplink{g}", uplink_bw).set_latency(group_lat).seal()
            zone.seal()
            root.add_route(zone.netpoint, None, gateway, None, [sg.LinkInRoute(uplink, up)], True)
        root.seal()
        return hosts
