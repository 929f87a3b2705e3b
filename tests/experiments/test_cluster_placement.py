"""Kernel-emulated links without a cluster: refused before any work; names, addresses and links of a plan.

These run on any machine (no root, no namespaces): they check decisions, not the kernel.
"""

from __future__ import annotations

import ipaddress

import pytest

from experiments.cli.main import main
from experiments.cluster import netns, placement
from experiments.config.sweep import parse
from strategies.transport.link import Link, Network
from strategies.transport.threads import run_threads


def test_kernel_emulation_without_namespace_support_is_refused_naming_the_reason(monkeypatch):
    monkeypatch.setattr(netns, "support_problem", lambda: "network namespaces and tc need root (uid 1000)")
    kernel = Network(Link(125e6), emulation="kernel")
    with pytest.raises(ValueError, match=r"kernel.*need root \(uid 1000\).*emulation = 'python'"):
        placement.connect_address([kernel, None], None)
    placement.connect_address([None, Network(Link(125e6))], None)  # python emulation needs nothing


def test_kernel_emulation_without_a_cluster_says_how_to_make_one(monkeypatch, tmp_path):
    monkeypatch.setattr(netns, "support_problem", lambda: None)
    monkeypatch.setenv("SYNCBENCH_CLUSTER_DIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ValueError, match=r"syncbench cluster up --nodes N.*clusters up: none"):
        placement.connect_address([Network(Link(125e6), emulation="kernel")], None)


def test_a_sweep_refuses_kernel_links_before_ray_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(netns, "support_problem", lambda: "the `tc` command (iproute2) is not installed")
    sweep = tmp_path / "k.toml"
    sweep.write_text('[defaults]\nworkload = "tiny"\nsteps = 2\nwarmup_steps = 1\nworkers = 2\n'
                     'link = { bandwidth = "1Gbit", emulation = "kernel" }\n')
    assert main(["run", str(sweep), "--out", str(tmp_path / "out"), "--no-report"]) == 2
    assert "`tc` command (iproute2) is not installed" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()


def test_emulation_is_part_of_the_link_label_and_python_is_the_default():
    def spec(link):
        return parse({"defaults": {"workload": "tiny", "link": link}}).runs[0]

    kernel = spec({"bandwidth": "1Gbit", "emulation": "kernel"})
    python = spec({"bandwidth": "1Gbit", "emulation": "python"})
    assert kernel.link_label == "1Gbit kernel" and kernel.network().emulation == "kernel"
    assert python.link_label == "1Gbit" and python.run_id == spec({"bandwidth": "1Gbit"}).run_id
    with pytest.raises(ValueError, match=r"emulation 'ebpf': accepted are 'python', 'kernel'"):
        Network.from_spec({"bandwidth": "1Gbit", "emulation": "ebpf"})


def test_the_communicator_does_not_sleep_for_a_kernel_shaped_network():
    """A 1 MB message on a 1 Mbit/s link would take 8 s if the communicator emulated it."""
    import time

    import torch

    slow = Network(Link(125e3), emulation="kernel")

    def exchange(comm):
        x = torch.ones(250_000)
        if comm.rank == 0:
            comm.send(x, 1)
        else:
            comm.recv(x, 0)
        return comm.counters().bytes_sent + comm.counters().bytes_recv

    start = time.perf_counter()
    assert run_threads(2, exchange, network=slow) == [1_000_000, 1_000_000]
    assert time.perf_counter() - start < 2


def test_a_plan_names_interfaces_within_the_kernel_limit_and_addresses_in_the_benchmarking_range():
    cluster = netns.plan("abcdef", [Link(125e6)] * 12 + [Link(12.5e6, 0.001)])
    try:
        names = [n for node in cluster.all_nodes() for n in (node.veth_node, node.veth_bridge)] + [cluster.bridge]
        assert max(len(n) for n in names) <= 15 and len(set(names)) == len(names)
        ips = [ipaddress.ip_address(node.ip) for node in cluster.all_nodes()]
        assert all(ip in netns.RANGE for ip in ips) and len(set(ips)) == len(ips)
        assert cluster.nodes[12].bandwidth == 12.5e6 and cluster.nodes[12].latency == 0.001
        assert cluster.head.bandwidth is None  # the head's link is not shaped
    finally:
        import shutil

        shutil.rmtree(cluster.temp_dir)
    with pytest.raises(ValueError, match=r"cluster name 'Big-1': expected 1-6 lowercase"):
        netns.check_name("Big-1")


def test_cluster_up_parses_per_node_overrides(monkeypatch, capsys):
    seen = {}

    def up(name, links, **kw):
        seen["links"] = links
        raise netns.ClusterError("stopped by the test before any namespace is made")

    monkeypatch.setattr(netns, "up", up)
    assert main(["cluster", "up", "--nodes", "3", "--bandwidth", "1Gbit", "--node-bandwidth", "2=100Mbit",
                 "--node-latency", "0=1ms"]) == 2
    assert seen["links"] == [Link(125e6, 0.001), Link(125e6), Link(12.5e6)]
    assert main(["cluster", "up", "--nodes", "3", "--bandwidth", "1Gbit", "--node-bandwidth", "3=1Gbit"]) == 2
    assert "--node-bandwidth '3=1Gbit': expected I=VALUE with a node index I in 0..2" in capsys.readouterr().err
