"""The `syncbench cluster` command: a Ray cluster on this machine, nodes in network namespaces (root only)."""

from __future__ import annotations

import argparse


def add_arguments(p) -> None:
    action = p.add_subparsers(dest="action", required=True)
    q = action.add_parser("up", help="create the namespaces, bridge and shaped links; start Ray in them")
    q.add_argument("--nodes", type=int, required=True, help="Ray worker nodes, one rank each")
    q.add_argument("--bandwidth", required=True, help="every node's NIC, each way, e.g. 1Gbit")
    q.add_argument("--latency", default="0s", help="one-way delay per packet (needs the kernel's netem), e.g. 50us")
    q.add_argument("--node-bandwidth", action="append", default=[], metavar="I=BW",
                   help="node I's own bandwidth, e.g. 2=100Mbit (repeatable)")
    q.add_argument("--node-latency", action="append", default=[], metavar="I=LAT",
                   help="node I's own latency, e.g. 2=1ms (repeatable)")
    q.add_argument("--node-cpus", type=int, default=1, help="Ray CPUs per worker node (default 1: one rank each)")
    q.add_argument("--head-cpus", type=int, default=8, help="Ray CPUs of the head, where python-emulated runs go")
    action.add_parser("status", help="the cluster's nodes, links, Ray nodes and processes")
    action.add_parser("down", help="stop what `up` started and remove the namespaces (also after a crash)")
    for q in action.choices.values():
        q.add_argument("--name", default="sb", help="cluster name, 1-6 lowercase letters/digits (default sb)")
        q.add_argument("--state-dir", help="where cluster state lives, a directory of this user with mode 0700 "
                                           "(default: $SYNCBENCH_CLUSTER_DIR, else /run/syncbench for root)")


def run(args) -> int:
    from experiments.cluster import netns

    if args.state_dir:  # for this command only (main() may run in-process, as in tests)
        with netns.using_state_dir(args.state_dir):
            return run(argparse.Namespace(**{**vars(args), "state_dir": None}))
    if args.action == "up":
        cluster = netns.up(args.name, _node_links(args), node_cpus=args.node_cpus, head_cpus=args.head_cpus)
        print(netns.status(cluster))
        print(f"address: {cluster.address}  (`syncbench run` and `syncbench bench --emulation kernel` find it "
              f"by itself; other Ray clients: export RAY_ADDRESS={cluster.address} "
              + " ".join(f"{k}={v}" for k, v in cluster.env().items()) + ")")
        return 0
    cluster = netns.Cluster.load(netns.check_name(args.name))
    if args.action == "status":
        if cluster is None:
            print(f"no cluster {args.name!r} (no state file {netns.state_path(args.name)})")
            return 1
        print(netns.status(cluster))
        return 0
    if not netns.down(args.name):
        print(f"cluster {args.name!r}: nothing to remove")
    return 0


def _node_links(args) -> list:
    """Every node's Link: --bandwidth/--latency, overridden per node by --node-bandwidth/--node-latency I=VALUE."""
    from strategies.transport.link import Link, parse_bandwidth, parse_latency

    if args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: expected at least 1")
    bandwidth = [parse_bandwidth(args.bandwidth)] * args.nodes
    latency = [parse_latency(args.latency)] * args.nodes
    for option, values, parse in (("--node-bandwidth", bandwidth, parse_bandwidth),
                                  ("--node-latency", latency, parse_latency)):
        for item in getattr(args, option[2:].replace("-", "_")):
            index, _, value = item.partition("=")
            if not index.strip().isdigit() or not 0 <= int(index) < args.nodes or not value:
                raise ValueError(f"{option} {item!r}: expected I=VALUE with a node index I in 0..{args.nodes - 1}")
            values[int(index)] = parse(value)
    return [Link(b, lat) for b, lat in zip(bandwidth, latency)]
