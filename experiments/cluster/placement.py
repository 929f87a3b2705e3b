"""Where a run's ranks go: k ranks per shaped node for kernel-emulated links, else anywhere (python emulation).

A kernel-emulated run (`link = { bandwidth = "1Gbit", emulation = "kernel" }`) needs a cluster made by
`syncbench cluster up`: with ranks_per_node = k (1 by default), ranks k*j .. k*j+k-1 (dedicated server ranks
included: they follow the workers, as on thread ranks and SimGrid) are placed on node n<j> (its custom
resource syncbench_n<j>), so every byte between two nodes, the backend's own collectives included, crosses two
tbf-shaped NICs, and every byte between two ranks of one node stays in its namespace (its own address routes
over the namespace's loopback). The nodes' links are read from their Ray labels and must be the links the run
asks for, and each node needs a Ray CPU per rank placed there (`cluster up --node-cpus k`); anything missing is
refused before a run starts. On such a cluster, python-emulated runs stay on the head node (loopback, not
shaped), so the kernel does not slow them a second time.
"""

from __future__ import annotations

import math
import os

from experiments.cluster import netns
from strategies.transport.link import Link, Network


def is_kernel(network: Network | None) -> bool:
    return network is not None and network.emulation == "kernel"


def connect_address(networks: list[Network | None], address: str | None) -> str | None:
    """The Ray address to use: `address`/RAY_ADDRESS, else, if any run is kernel-emulated, the cluster's.

    Refuses (ValueError), before any work, kernel emulation on a machine without root or namespaces, and
    kernel emulation without a cluster. Sets the cluster's token in this process's environment.
    """
    address = address or os.environ.get("RAY_ADDRESS") or None
    if not any(is_kernel(n) for n in networks):
        cluster = netns.find(address=address) if address else None
        if cluster is not None:
            use_token(cluster)
        return address
    problem = netns.support_problem()
    if problem:
        raise ValueError(f"link emulation 'kernel' shapes links between network namespaces, which this machine "
                         f"cannot make: {problem}. Use emulation = 'python' (the default) here")
    found, problems = netns.scan()  # a state file that cannot be verified is skipped here, and named if it matters
    cluster = (next((c for c in found if c.address == address), None) if address
               else found[0] if len(found) == 1 else None)
    if cluster is None:
        up = ", ".join(c.address for c in found) or "none"
        where = f"none of them is at {address}" if address else "pass --address to pick one" if "," in up else ""
        unreadable = f". Not read: {' | '.join(problems)}" if problems else ""
        raise ValueError(f"link emulation 'kernel' needs a cluster from `syncbench cluster up --nodes N --bandwidth "
                         f"BW` (clusters up: {up}{'; ' + where if where else ''}){unreadable}")
    use_token(cluster)
    return cluster.address


def use_token(cluster: netns.Cluster) -> None:
    """Put the cluster's token mode and token path in this process's environment, and make Ray re-read them
    (its config is read once, at import; Ray's own token setup refreshes it the same way)."""
    os.environ.update(cluster.env())
    from ray._raylet import AuthenticationTokenLoader, Config

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def shaped_nodes() -> dict[int, Link]:
    """Node index -> its shaped link, for every alive node of the connected Ray cluster that has one."""
    return {i: link for i, (link, _) in _shaped_nodes().items()}


def _shaped_nodes() -> dict[int, tuple[Link, float]]:
    """Node index -> (its shaped link, its Ray CPUs), for every alive node of the connected cluster that has one."""
    import ray

    nodes = {}
    for node in ray.nodes():
        labels = node.get("Labels") or {}
        name = labels.get(netns.NODE_LABEL, "")
        if node.get("Alive") and name.startswith("n") and name[1:].isdigit() and netns.BANDWIDTH_LABEL in labels:
            nodes[int(name[1:])] = (Link(float(labels[netns.BANDWIDTH_LABEL]),
                                         float(labels.get(netns.LATENCY_LABEL, 0)) / 1e9),
                                    float((node.get("Resources") or {}).get("CPU", 0)))
    return nodes


def nodes_needed(world_size: int, network: Network) -> int:
    """How many cluster nodes a kernel-emulated run of `world_size` ranks fills: ceil(world / ranks_per_node)."""
    return -(-world_size // network.ranks_per_node)


def node_ranks(world_size: int, network: Network, node: int) -> int:
    """How many of the run's ranks go on node n<node> (the last node may hold fewer)."""
    k = network.ranks_per_node
    return max(0, min(k, world_size - node * k))


def has_head_resource() -> bool:
    import ray

    return ray.cluster_resources().get("syncbench_head", 0) > 0


def check(world_size: int, network: Network | None) -> None:
    """Refuse (ValueError) a kernel-emulated run whose ranks the connected cluster cannot place as asked: too few
    shaped nodes, a node with fewer Ray CPUs than the ranks placed on it, or a node shaped to another link."""
    if not is_kernel(network):
        return
    k, count = network.ranks_per_node, nodes_needed(world_size, network)
    found = _shaped_nodes()
    nodes = {i: link for i, (link, _) in found.items()}
    per_node = f" in nodes of {k} ranks (ranks_per_node = {k})" if k > 1 else ""
    if len(nodes) < count or any(i not in nodes for i in range(count)):
        raise ValueError(f"link emulation 'kernel': {world_size} ranks{per_node} need shaped nodes n0..n{count - 1}, "
                         f"the cluster has {len(nodes)} ({', '.join(f'n{i}' for i in sorted(nodes)) or 'none'}): "
                         f"`syncbench cluster down` and `syncbench cluster up --nodes {count}"
                         f"{f' --node-cpus {k}' if k > 1 else ''} ...`")
    for node in range(count):
        need, cpus = node_ranks(world_size, network, node), found[node][1]
        if need > cpus + 1e-9:
            raise ValueError(f"link emulation 'kernel': {world_size} ranks{per_node} put {need} ranks on node n{node}, "
                             f"which has {cpus:g} Ray CPUs (one per rank is needed): `syncbench cluster down` and "
                             f"`syncbench cluster up --nodes {count} --node-cpus {k} ...`")
    for node in range(count):
        rank = node * k
        want, have = network.link(rank), nodes[node]
        if not (math.isclose(want.bandwidth, have.bandwidth, rel_tol=1e-6)
                and math.isclose(want.latency, have.latency, rel_tol=1e-6, abs_tol=1e-9)):
            last = rank + node_ranks(world_size, network, node) - 1
            whose = f"rank {rank}" if k == 1 else f"ranks {rank}..{last}"
            raise ValueError(f"link emulation 'kernel': {whose} asks for {netns.describe(want)} but node "
                             f"n{node} is shaped to {netns.describe(have)}: bring the cluster up with the sweep's "
                             f"links (--bandwidth, --latency, --node-bandwidth {node}=..., --node-latency {node}=...)")


class NodeLost(ValueError):
    """A run needs a node of the cluster that is gone (lost mid-sweep); names the node and how that is known."""


def lost_nodes(names: list[str]) -> dict[str, str]:
    """Of these nodes of the connected syncbench cluster ('n0', 'n1', ...), the ones that are gone, each with why:
    Ray no longer lists it alive, or (at once, before Ray's health checks notice) the kernel and the process
    table say its namespace or raylet is gone."""
    import ray

    alive = {(node.get("Labels") or {}).get(netns.NODE_LABEL) for node in ray.nodes() if node.get("Alive")}
    try:
        cluster = netns.find(address=ray.get_runtime_context().gcs_address)
    except Exception:  # noqa: BLE001 - not a cluster of `syncbench cluster up`: Ray's word alone
        cluster = None
    gone = {}
    for name in names:
        why = netns.node_gone(cluster, name) if cluster is not None else None
        if why is None and name not in alive:
            why = "Ray does not list it among the cluster's alive nodes"
        if why:
            gone[name] = why
    return gone


def bundles(world_size: int, network: Network | None) -> list[dict] | None:
    """Extra resources per rank's bundle: node n<rank // k> for kernel emulation (k = ranks_per_node), the head on
    a syncbench cluster, or None.

    A kernel-emulated run that needs a node lost since the sweep started is refused at once (NodeLost, naming
    the node) instead of waiting for a placement group that can never be placed.
    """
    if is_kernel(network):
        count = nodes_needed(world_size, network)
        gone = lost_nodes([f"n{node}" for node in range(count)])
        if gone:
            raise NodeLost(f"link emulation 'kernel': {world_size} ranks need nodes n0..n{count - 1}, and "
                           + "; ".join(f"node {name} is gone ({why})" for name, why in gone.items())
                           + ": run refused. `syncbench cluster status` shows the nodes; `syncbench cluster down` "
                             "and `up` bring them back")
        return [{f"syncbench_n{network.node_of(rank)}": 1} for rank in range(world_size)]
    if has_head_resource():
        return [{"syncbench_head": 1}] * world_size
    return None
