"""Kernel-emulated links without a cluster: refused before any work; names, addresses and links of a plan.

These run on any machine (no root, no namespaces): they check decisions, not the kernel.
"""

from __future__ import annotations

import ipaddress
import os
import subprocess
import types

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
    """Refused before Ray is asked for, whether or not an earlier test left a Ray session up (was order-dependent:
    it failed whenever a Ray test ran before it)."""
    import ray

    from experiments.cluster import ray_runtime
    from experiments.pipeline import ray_substrate

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was asked for before the sweep was refused")

    was_up = ray.is_initialized()
    monkeypatch.setattr(ray_runtime, "ensure_ray", no_ray)
    monkeypatch.setattr(ray_substrate, "ensure_ray", no_ray)
    monkeypatch.setattr(netns, "support_problem", lambda: "the `tc` command (iproute2) is not installed")
    sweep = tmp_path / "k.toml"
    sweep.write_text('[defaults]\nworkload = "tiny"\nsteps = 2\nwarmup_steps = 1\nworkers = 2\n'
                     'link = { bandwidth = "1Gbit", emulation = "kernel" }\n')
    assert main(["run", str(sweep), "--out", str(tmp_path / "out"), "--no-report"]) == 2
    assert "`tc` command (iproute2) is not installed" in capsys.readouterr().err
    assert ray.is_initialized() == was_up


def test_emulation_is_part_of_the_link_label_and_python_is_the_default():
    def spec(link):
        return parse({"defaults": {"workload": "tiny", "link": link}}).runs[0]

    kernel = spec({"bandwidth": "1Gbit", "emulation": "kernel"})
    python = spec({"bandwidth": "1Gbit", "emulation": "python"})
    assert kernel.link_label == "1Gbit kernel" and kernel.network().emulation == "kernel"
    assert python.link_label == "1Gbit" and python.run_id == spec({"bandwidth": "1Gbit"}).run_id
    with pytest.raises(ValueError, match=r"emulation 'ebpf': accepted are 'python', 'kernel'"):
        Network.from_spec({"bandwidth": "1Gbit", "emulation": "ebpf"})


@pytest.mark.timing
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


def test_a_plan_names_interfaces_within_the_kernel_limit_and_addresses_in_the_benchmarking_range(monkeypatch):
    import tempfile

    monkeypatch.setenv(netns.STATE_ENV, tempfile.mkdtemp(prefix="sb", dir="/tmp"))  # short: Ray's socket paths
    cluster = netns.plan("abcdef", [Link(125e6)] * 12 + [Link(12.5e6, 0.001)])
    try:
        names = [n for node in cluster.all_nodes() for n in (node.veth_node, node.veth_bridge)] + [cluster.bridge]
        assert max(len(n) for n in names) <= 15 and len(set(names)) == len(names)
        ips = [ipaddress.ip_address(node.ip) for node in cluster.all_nodes()]
        assert all(ip in netns.RANGE for ip in ips) and len(set(ips)) == len(ips)
        assert cluster.nodes[12].bandwidth == 12.5e6 and cluster.nodes[12].latency == 0.001
        assert cluster.head.bandwidth is None  # the head's link is not shaped
        assert os.path.dirname(cluster.temp_dir) == str(netns.state_dir())  # where `down` looks for it
    finally:
        import shutil

        shutil.rmtree(netns.state_dir())
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


def _ray_sees(monkeypatch, alive: dict[str, bool], gcs_address: str | None = None) -> None:
    """Make placement's view of the connected Ray cluster these syncbench nodes (name -> alive)."""
    import ray

    monkeypatch.setattr(ray, "nodes", lambda: [{"Alive": up, "Labels": {netns.NODE_LABEL: name}}
                                               for name, up in alive.items()])

    def context():
        if gcs_address is None:
            raise RuntimeError("not a syncbench cluster in this test")
        return types.SimpleNamespace(gcs_address=gcs_address)

    monkeypatch.setattr(ray, "get_runtime_context", context)


def test_a_run_needing_a_node_lost_mid_sweep_is_refused_at_once_naming_the_node(monkeypatch):
    """Issue 27: after a node is lost, a run that needs it is refused naming it (placement.bundles, before any
    placement group waits for a node that will not come back); runs that do not need it are placed."""
    kernel = Network(Link(125e6), emulation="kernel")
    _ray_sees(monkeypatch, {"head": True, "n0": True, "n1": True, "n2": False})
    assert placement.bundles(2, kernel) == [{"syncbench_n0": 1}, {"syncbench_n1": 1}]
    with pytest.raises(placement.NodeLost, match=r"node n2 is gone \(Ray does not list it.*run refused"):
        placement.bundles(3, kernel)
    _ray_sees(monkeypatch, {"head": True, "n0": True})  # a node Ray forgot altogether
    with pytest.raises(placement.NodeLost, match=r"ranks need nodes n0..n1, and node n1 is gone"):
        placement.bundles(2, kernel)


def test_a_killed_node_is_known_lost_from_the_process_table_before_ray_notices(monkeypatch, tmp_path):
    """Ray marks a node dead only after its health checks time out; the kernel and the process table know at
    once: the raylet `up` recorded (pid and start time) has exited, or the node's namespace is gone."""
    import shutil

    cluster = netns._layout("lost", ipaddress.ip_network("198.18.7.0/24"), "/nonexistent/sbc-lost-12345678",
                            [Link(125e6)] * 3)
    raylet = tmp_path / "raylet"  # a process whose command name is "raylet", as Ray's is
    shutil.copy(shutil.which("sleep"), raylet)
    alive, dead = subprocess.Popen([raylet, "60"]), subprocess.Popen([raylet, "0"])
    try:
        dead.wait()
        while netns._identity(alive.pid) is None or netns._identity(alive.pid)[1] != "raylet":
            pass  # between fork and exec
        start, comm = netns._identity(alive.pid)
        me = netns._identity(os.getpid())
        cluster.ray_pids = {"n0": [[alive.pid, start, comm]],
                            "n1": [[dead.pid, start, "raylet"], [os.getpid(), *me]],  # raylet gone, others not
                            "n2": [[alive.pid, start + 1, comm]]}  # same pid, another start: not that raylet
        monkeypatch.setattr(netns, "_namespace_exists", lambda ns: ns != cluster.nodes[2].namespace)
        assert netns.node_gone(cluster, "n0") is None
        assert netns.node_gone(cluster, "n1") == f"its raylet (pid {dead.pid}) exited"
        assert netns.node_gone(cluster, "n2") == f"its namespace {cluster.nodes[2].namespace} is gone"
        monkeypatch.setattr(netns, "_namespace_exists", lambda ns: True)
        assert netns.node_gone(cluster, "n2") == f"its raylet (pid {alive.pid}) exited"
    finally:
        alive.kill()
        alive.wait()


    # what the runner asks before each run: with every node alive in Ray's eyes, the process table decides
    cluster.ray_pids["n0"] = [[os.getpid(), *me]]
    monkeypatch.setattr(netns, "find", lambda address=None, name=None: cluster if address == cluster.address else None)
    _ray_sees(monkeypatch, {"head": True, "n0": True, "n1": True, "n2": True}, gcs_address=cluster.address)
    kernel = Network(Link(125e6), emulation="kernel")
    assert placement.bundles(1, kernel) == [{"syncbench_n0": 1}]
    with pytest.raises(placement.NodeLost, match=rf"node n1 is gone \(its raylet \(pid {dead.pid}\) exited\); "
                                                 rf"node n2 is gone"):
        placement.bundles(3, kernel)


def test_nodes_of_k_ranks_go_k_per_namespace_and_a_cluster_too_small_is_refused_naming_the_counts(monkeypatch):
    """Issue 26: ranks_per_node = k on the kernel-shaped cluster: ranks k*j .. k*j+k-1 (servers after the workers)
    on node n<j>; too few nodes, too few Ray CPUs on a node, or another link is refused before any actor starts."""
    import ray

    def cluster(cpus: list[float], bandwidth: float = 125e6):
        monkeypatch.setattr(ray, "nodes", lambda: [
            {"Alive": True, "Labels": {netns.NODE_LABEL: f"n{i}", netns.BANDWIDTH_LABEL: f"{bandwidth:.0f}"},
             "Resources": {"CPU": n, f"syncbench_n{i}": n}} for i, n in enumerate(cpus)])
        monkeypatch.setattr(ray, "get_runtime_context", lambda: (_ for _ in ()).throw(RuntimeError("no cluster")))

    nodes_of_2 = Network(Link(125e6), emulation="kernel").with_nodes(2)
    cluster([2, 2, 2])
    placement.check(5, nodes_of_2)  # the last node holds one rank
    assert placement.bundles(5, nodes_of_2) == [{"syncbench_n0": 1}] * 2 + [{"syncbench_n1": 1}] * 2 + [
        {"syncbench_n2": 1}]
    with pytest.raises(ValueError, match=r"7 ranks in nodes of 2 ranks \(ranks_per_node = 2\) need shaped nodes "
                                         r"n0..n3, the cluster has 3 \(n0, n1, n2\).*--nodes 4 --node-cpus 2"):
        placement.check(7, nodes_of_2)
    cluster([2, 1])
    with pytest.raises(ValueError, match=r"put 2 ranks on node n1, which has 1 Ray CPUs.*--node-cpus 2"):
        placement.check(4, nodes_of_2)
    cluster([2, 2], bandwidth=12.5e6)
    with pytest.raises(ValueError, match=r"ranks 0..1 asks for 1 Gbit/s, 0 us but node n0 is shaped to 0.1 Gbit/s"):
        placement.check(4, nodes_of_2)
    with pytest.raises(ValueError, match=r"intra_bandwidth.*emulation 'kernel'.*loopback"):
        Network.from_spec({"bandwidth": "1Gbit", "emulation": "kernel", "intra_latency": "2us"})
