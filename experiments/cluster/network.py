"""A namespace cluster's network: a free /24, the bridge, one namespace per node and its veth, shaped with tbf
(under netem's delay where the kernel has it) on both ends, so that an incast queues at the node's port.
"""

from __future__ import annotations

import ipaddress
import re

from experiments.cluster.shell import ClusterError, _sh
from experiments.cluster.state import RANGE, Cluster, clusters

BURST_S = 0.002  # tbf burst = 2 ms of the rate (about 256 KB at 1 Gbit/s; less under-delivers), at least 32 KB
QUEUE_S = 0.02  # tbf queue: 20 ms of the rate


def _free_subnet() -> ipaddress.IPv4Network:
    """The first /24 of 198.18.0.0/15 that no interface of this machine (or a cluster state file) uses."""
    used = set()
    out = _sh(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    for m in re.finditer(r"inet (\d+\.\d+\.\d+\.\d+)/(\d+)", out):
        used.add(ipaddress.ip_interface(f"{m.group(1)}/{m.group(2)}").network)
    used |= {ipaddress.ip_network(c.subnet) for c in clusters()}
    for subnet in RANGE.subnets(new_prefix=24):
        if not any(subnet.overlaps(u) for u in used):
            return subnet
    raise ClusterError("every /24 of 198.18.0.0/15 is in use on this machine")


def _make_network(cluster: Cluster, made: list[tuple[str, str]] | None = None) -> None:
    """The bridge, one namespace per node and its shaped veth; each recorded in `made` once it exists."""
    made = [] if made is None else made
    prefix = ipaddress.ip_network(cluster.subnet).prefixlen
    _sh(["ip", "link", "add", cluster.bridge, "type", "bridge"])
    made.append(("link", cluster.bridge))
    _sh(["ip", "addr", "add", f"{cluster.bridge_ip}/{prefix}", "dev", cluster.bridge])
    _sh(["ip", "link", "set", cluster.bridge, "up"])
    for node in cluster.all_nodes():
        ns = node.namespace
        _sh(["ip", "netns", "add", ns])
        made.append(("netns", ns))
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        _sh(["ip", "link", "add", node.veth_bridge, "type", "veth", "peer", "name", node.veth_node, "netns", ns])
        made.append(("link", node.veth_bridge))
        _sh(["ip", "link", "set", node.veth_bridge, "master", cluster.bridge])
        _sh(["ip", "-n", ns, "addr", "add", f"{node.ip}/{prefix}", "dev", node.veth_node])
        _sh(["ip", "-n", ns, "link", "set", node.veth_node, "up"])
        _sh(["ip", "link", "set", node.veth_bridge, "up"])
        if node.bandwidth is not None:
            # transmit: the node's own end; receive: the bridge's end (where an incast queues)
            _shape(["ip", "netns", "exec", ns], node.veth_node, node.bandwidth, node.latency if cluster.netem else 0)
            _shape([], node.veth_bridge, node.bandwidth, 0.0)


def _shape(prefix: list[str], dev: str, bandwidth: float, latency: float) -> None:
    """tbf at `bandwidth` bytes/s on dev's egress, under netem's delay when latency > 0."""
    rate = f"{bandwidth * 8:.0f}bit"
    burst = max(int(bandwidth * BURST_S), 32 * 1024)
    limit = burst + int(bandwidth * QUEUE_S)
    tbf = ["tbf", "rate", rate, "burst", str(burst), "limit", str(limit)]
    if latency > 0:
        _sh([*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay",
             f"{latency * 1e6:.0f}us"])
        _sh([*prefix, "tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *tbf])
    else:
        _sh([*prefix, "tc", "qdisc", "add", "dev", dev, "root", *tbf])
