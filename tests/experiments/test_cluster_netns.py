"""The namespace cluster (`syncbench cluster up/down`): real TCP between Ray nodes over kernel-shaped links.

One 3-node cluster of 2 CPUs per node serves the whole module (a Ray node costs seconds to start; 2 CPUs: room
for 2 ranks per namespace); the fixture always takes it down, and the last test checks that `down` leaves
nothing behind. Skipped, with the reason, where this machine cannot make network namespaces (not root, no
iproute2).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

import strategies
from experiments.cluster import netns
from experiments.results.dataset import read_runs

REPO = Path(__file__).resolve().parents[2]
NODES = 3
NODE_CPUS = 2
BANDWIDTH = "1Gbit"
PROBLEM = netns.support_problem()

pytestmark = [pytest.mark.ray, pytest.mark.netns,
              pytest.mark.skipif(PROBLEM is not None, reason=f"no namespace cluster here: {PROBLEM}")]


def _syncbench(*args: str, timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cluster():
    """A 3-node cluster at 1 Gbit/s, 2 CPUs per node, under a name and state directory of this test session's own.

    Beside it in the state directory lies a corrupt state file: it must not stop `up`, the runs or `down`.
    """
    saved = os.environ.get(netns.STATE_ENV)
    root = tempfile.mkdtemp(prefix="sb", dir="/tmp")  # short: Ray's socket paths in it must fit in 107 bytes
    os.environ[netns.STATE_ENV] = root
    (Path(root) / "junk.json").write_text('{"name": "junk", "head" {')
    name = f"t{os.getpid() % 100000}"
    try:
        up = _syncbench("cluster", "up", "--nodes", str(NODES), "--node-cpus", str(NODE_CPUS), "--bandwidth",
                        BANDWIDTH, "--name", name)
        assert up.returncode == 0, up.stderr[-3000:]
        yield netns.Cluster.load(name), up.stdout
    finally:
        netns.down(name, log=lambda *_: None)  # idempotent: the last test has normally done it already
        shutil.rmtree(root, ignore_errors=True)
        if saved is None:
            os.environ.pop(netns.STATE_ENV, None)
        else:
            os.environ[netns.STATE_ENV] = saved


def test_up_starts_a_shaped_ray_node_per_namespace(cluster):
    c, stdout = cluster
    assert f"address: {c.address}" in stdout
    nodes = netns.alive_nodes(c)
    by_name = {n["labels"][netns.NODE_LABEL]: n for n in nodes}
    assert sorted(by_name) == ["head"] + [f"n{i}" for i in range(NODES)]
    for i in range(NODES):
        node = by_name[f"n{i}"]
        assert node["resources"][f"syncbench_n{i}"] == NODE_CPUS and node["resources"]["CPU"] == NODE_CPUS
        assert float(node["labels"][netns.BANDWIDTH_LABEL]) == 125e6
        assert netns.ipaddress.ip_address(node["ip"]) in netns.RANGE
        for dev, prefix in ((c.nodes[i].veth_bridge, []), (c.nodes[i].veth_node, ["ip", "netns", "exec",
                                                                                    c.nodes[i].namespace])):
            qdisc = subprocess.run([*prefix, "tc", "qdisc", "show", "dev", dev], capture_output=True, text=True)
            assert "tbf" in qdisc.stdout and "rate 1Gbit" in qdisc.stdout, qdisc.stdout
    status = netns.status(c)  # what `syncbench cluster status` prints (in-process: a CLI start costs seconds)
    assert status.count(" up ") == NODES + 1 and "(missing)" not in status, status


TCP_PROBE = """
import socket, sys, time
mode, host, nbytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "recv":
    server = socket.create_server((host, 5201))
    print("listening", flush=True)
    conn, _ = server.accept()
    buf, got, first = bytearray(1 << 20), 0, None
    while (n := conn.recv_into(buf)):
        first = first or time.perf_counter()
        got += n
    print(got, time.perf_counter() - first, flush=True)
else:
    conn, chunk = socket.create_connection((host, 5201)), b"x" * (1 << 20)
    for _ in range(nbytes >> 20):
        conn.sendall(chunk)
    conn.close()
"""


def _transfer(sender, receiver, nbytes: int) -> tuple[float, float]:
    """One TCP transfer between two nodes: (payload bytes/s, bytes/s the receiver's port carried)."""
    wire_before = _tc_bytes(receiver.veth_bridge)  # the receiver's port: frames as the link carries them
    recv = subprocess.Popen(["ip", "netns", "exec", receiver.namespace, sys.executable, "-c", TCP_PROBE, "recv",
                             receiver.ip, str(nbytes)], stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "listening"
        subprocess.run(["ip", "netns", "exec", sender.namespace, sys.executable, "-c", TCP_PROBE, "send",
                        receiver.ip, str(nbytes)], check=True, timeout=60)
        got, seconds = recv.stdout.readline().split()
    finally:
        recv.kill()
        recv.wait()
    assert int(got) == nbytes
    return nbytes / float(seconds), (_tc_bytes(receiver.veth_bridge) - wire_before) / float(seconds)


def test_shaped_bandwidth_between_two_nodes_is_the_configured_one(cluster):
    c, _ = cluster
    # 160 MiB: 1.3 s at 1 Gbit/s, so tbf's 2 ms burst is noise. The link's capacity is the best of up to three
    # transfers: a receiver starved of CPU by other jobs on this machine can only make one slower, never faster
    best_goodput = best_wire = 0.0
    for _ in range(3):
        goodput, wire = _transfer(c.nodes[0], c.nodes[1], 160 << 20)
        best_goodput, best_wire = max(best_goodput, goodput), max(best_wire, wire)
        if abs(best_wire - 125e6) / 125e6 <= 0.05:
            break
    assert abs(best_wire - 125e6) / 125e6 <= 0.10, f"the link carried {best_wire / 1e6:.1f} MB/s, configured 125"
    # Ethernet + IP + TCP headers are 66 of every 1514 bytes on the wire: 119.5 MB/s of payload at most
    ceiling = 125e6 * 1448 / 1514
    assert ceiling * 0.85 <= best_goodput <= ceiling * 1.02, f"TCP payload {best_goodput / 1e6:.1f} MB/s"


SWEEP = """
name = "kernel-tiny"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
steps = 3
warmup_steps = 1
workers = 2
timeout = 60
link = {{ bandwidth = "{bandwidth}", emulation = "kernel" }}
[grid]
strategy = {strategies}
[strategy_params.parameter_server]
servers = 1
"""


def _tc_bytes(dev: str) -> int:
    out = subprocess.run(["tc", "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
    return int(re.search(r"Sent (\d+) bytes", out).group(1))


def test_tiny_sweep_of_every_strategy_runs_across_the_shaped_nodes(cluster, tmp_path):
    c, _ = cluster
    names = [n for n in strategies.names() if strategies.make(n).world_size(2) <= NODES]
    assert "native" in names and "parameter_server" in names
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(SWEEP.format(bandwidth=BANDWIDTH, strategies="[" + ", ".join(f'"{n}"' for n in names) + "]"))
    before = [_tc_bytes(node.veth_bridge) for node in c.nodes]
    done = _syncbench("run", str(sweep), "--out", str(tmp_path / "out"), "--no-report", "--address", c.address)
    assert done.returncode == 0, done.stderr[-4000:]
    runs = read_runs(tmp_path / "out")
    assert sorted(runs["strategy"]) == sorted(names)
    assert (runs["status"] == "ok").all(), runs[["strategy", "error"]].to_string()
    assert set(runs["link"]) == {f"{BANDWIDTH} kernel"}
    counted = runs[runs["analytic_bytes_sent_per_worker"].notna()]
    assert (counted["bytes_sent_per_worker"] == counted["analytic_bytes_sent_per_worker"]).all()
    # every rank was on its own node: the bytes went through the shaped ports (the receive side of n0 and n1)
    received = [_tc_bytes(node.veth_bridge) - b for node, b in zip(c.nodes, before)]
    assert min(received[:2]) > counted["bytes_recv_per_worker"].sum(), received


NODE_SYNCS = r"""
import json, sys, time
from pathlib import Path

import ray
import torch

from experiments.bench.collectives import _config
from experiments.cluster import placement
from experiments.cluster.group import WorkerGroup
from experiments.cluster.ray_runtime import ray_session
from strategies.transport.link import Network

address, bandwidth, numel, ports = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
network = Network.from_spec({"bandwidth": bandwidth, "emulation": "kernel"}).with_nodes(2)


def port_bytes():  # per node: (bytes it transmitted, bytes it received), at the bridge end of its veth
    stat = lambda dev, what: int(Path(f"/sys/class/net/{dev}/statistics/{what}_bytes").read_text())
    return [(stat(dev, "rx"), stat(dev, "tx")) for dev in ports]


def sync_once(ctx, name):
    x = torch.full((numel,), float(ctx.rank + 1))
    strategy = _config(name, 2).bind(ctx.comm, ctx.world_size)
    ctx.comm.barrier()
    start = time.perf_counter()
    strategy.sync(x, "sum")
    seconds = time.perf_counter() - start
    peers = ctx.comm.counters().per_peer
    return {"ip": ray.util.get_node_ip_address(), "nodes": [ctx.comm.node_of(r) for r in range(ctx.world_size)],
            "seconds": seconds,
            "exact": bool((x == ctx.world_size * (ctx.world_size + 1) / 2).all()),
            "sent": {p: c.bytes_sent for p, c in peers.items()}, "recv": {p: c.bytes_recv for p, c in peers.items()}}


address = placement.connect_address([network], address)
out = []
with ray_session(address):
    placement.check(4, network)
    with WorkerGroup(4, node_resources=placement.bundles(4, network)) as group:
        for p2p in ("gloo", "sockets"):
            for name in ("ring", "hierarchical"):
                before = port_bytes()
                ranks = group.run(sync_once, name, network=network, p2p=p2p, timeout=120)
                after = port_bytes()
                out.append({"p2p": p2p, "strategy": name, "ranks": ranks,
                            "ports": [[a - b for a, b in zip(x, y)] for x, y in zip(after, before)]})
print(json.dumps(out))
"""
NODE_NUMEL = 1 << 20  # 4 MiB of float32: the ring's node NIC carries 6.3 MB each way, 50 ms at 1 Gbit/s
# what a port carries beyond the payload: TCP/IP and Ethernet headers, at most 66 bytes per 1448-byte segment
# (4.6%; fewer with GSO, which counts a 64 KB segment once), the ACKs of the other direction (one 66-byte ACK per
# two segments: 2.3%), and per call the Ray task and its reply, gloo's or the sockets' message headers
HEADERS = 1.10
FIXED_BYTES = 256 * 1024


def test_two_ranks_per_namespace_only_inter_node_bytes_cross_the_shaped_ports(cluster):
    """Issue 26: 2 nodes x 2 ranks (ranks_per_node = 2: ranks 0, 1 in n0's namespace, 2, 3 in n1's), one worker
    group, the flat ring and hierarchical over gloo and over the sockets. What each node's shaped port carried (its
    veth's counters, both ways) equals the analytic inter-node bytes of the node's ranks (strategies.cost
    .node_levels) within the headers; the ring's intra-node hops (as many bytes again) never reach the port. Between
    nodes the sockets pair over TCP (never a Unix socket or a single copy that would bypass the links), and no sync
    is faster than the shaped NICs allow."""
    from experiments.bench.collectives import _config
    from strategies.cost import node_cost, node_levels

    c, _ = cluster
    nodes = c.nodes[:2]
    done = subprocess.run([sys.executable, "-c", NODE_SYNCS, c.address, BANDWIDTH, str(NODE_NUMEL),
                           ",".join(n.veth_bridge for n in nodes)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert [(r["p2p"], r["strategy"]) for r in results] == [(p, s) for p in ("gloo", "sockets")
                                                             for s in ("ring", "hierarchical")]
    for r in results:
        what = f"{r['strategy']} over {r['p2p']}"
        ranks = r["ranks"]
        assert [rank["ip"] for rank in ranks] == [nodes[0].ip] * 2 + [nodes[1].ip] * 2, what
        assert all(rank["nodes"] == [0, 0, 1, 1] and rank["exact"] for rank in ranks), what
        levels = node_levels(_config(r["strategy"], 2), 4, NODE_NUMEL, 4, 2)
        floor = node_cost(_config(r["strategy"], 2), 4, NODE_NUMEL, 2, 125e6, math.inf).time_s
        assert max(rank["seconds"] for rank in ranks) >= 0.9 * floor, (what, ranks, floor)
        for node, (sent, received) in enumerate(r["ports"]):
            mine = range(2 * node, 2 * node + 2)
            nic = [levels["nic"][i] for i in mine]
            intra = sum(levels["intra"][i].bytes_sent for i in mine)
            want_sent, want_recv = sum(t.bytes_sent for t in nic), sum(t.bytes_recv for t in nic)
            # the ranks' own counters, split by node, are those bytes too
            assert sum(b for i in mine for p, b in ranks[i]["sent"].items() if int(p) // 2 != node) == want_sent
            assert sum(b for i in mine for p, b in ranks[i]["recv"].items() if int(p) // 2 != node) == want_recv
            for level, counted, want in (("sent", sent, want_sent), ("received", received, want_recv)):
                assert want <= counted <= want * HEADERS + FIXED_BYTES, (
                    f"{what}: node n{node}'s port {level} {counted:,} bytes, its ranks' inter-node payload is "
                    f"{want:,} (intra-node: {intra:,}, which must not cross)")


FAULT_SWEEP = """
name = "kernel-fault"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
warmup_steps = 1
workers = 3
timeout = {timeout}
strategy = "ring"
link = {{ bandwidth = "{bandwidth}", emulation = "kernel" }}
[grid]
p2p = ["sockets", "gloo"]
steps = [100000, 3]   # each long run loses a link; the short one after it must start and succeed
"""
FAULT_TIMEOUT_S = 6
IN_LOOP_BYTES = 500_000  # received by the victim node: ~4 steps of tiny's 88 kB gradients (ring, 3 ranks)


def _wait_in_loop(victim, proc, printed, deadline: float) -> None:
    """Until the run in flight is in its step loop: the victim node's port has received IN_LOOP_BYTES more."""
    baseline = _tc_bytes(victim.veth_bridge)
    while _tc_bytes(victim.veth_bridge) - baseline < IN_LOOP_BYTES:
        assert proc.poll() is None and time.monotonic() < deadline, printed()
        time.sleep(0.05)


def test_a_node_link_going_down_fails_the_run_naming_the_rank_and_the_sweep_goes_on(cluster, tmp_path):
    """Over the sockets and over gloo (one sweep, one process): a long run loses node n1's link mid-loop and fails
    within its timeout naming rank 1; the short run after it starts and succeeds."""
    c, _ = cluster
    sweep = tmp_path / "fault.toml"
    sweep.write_text(FAULT_SWEEP.format(timeout=FAULT_TIMEOUT_S, bandwidth=BANDWIDTH))
    victim = c.nodes[1]
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "run", str(sweep), "--out", str(tmp_path / "out"),
                             "--no-report", "--address", c.address], cwd=REPO, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()

    def printed() -> str:
        return "".join(lines)[-3000:]

    def count(text: str) -> int:
        return sum(text in line for line in list(lines))

    failed_after = {}
    try:
        for i, p2p in enumerate(("sockets", "gloo")):  # runs 1 and 3 of 4 are the long ones
            deadline = time.monotonic() + 150
            while count("[run ") < 2 * i + 1:
                assert proc.poll() is None and time.monotonic() < deadline, printed()
                time.sleep(0.05)
            _wait_in_loop(victim, proc, printed, deadline)
            netns.set_link(c, victim.name, up_=False)
            down_at = time.monotonic()
            while count("FAILED") < i + 1:
                assert time.monotonic() - down_at < FAULT_TIMEOUT_S + 30, printed()
                time.sleep(0.05)
            failed_after[p2p] = time.monotonic() - down_at
            netns.set_link(c, victim.name, up_=True)  # before Ray's health check gives the node up
        assert proc.wait(timeout=150) == 1, printed()  # the sweep ends by itself; exit 1: it recorded failed runs
    finally:
        netns.set_link(c, victim.name, up_=True)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    reader.join(5)
    runs = read_runs(tmp_path / "out").set_index(["transport", "steps"])  # ring: the p2p carried its bytes
    for p2p, took in failed_after.items():
        long, short = runs.loc[(p2p, 100000)], runs.loc[(p2p, 3)]
        assert long["status"] == "failed" and "timed out" in long["error"] and "rank 1" in long["error"], \
            (p2p, long["error"])
        assert took < FAULT_TIMEOUT_S + 15, f"{p2p}: the run failed {took:.1f} s after the link went down"
        assert short["status"] == "ok", (p2p, short["error"])
    assert sorted(failed_after) == ["gloo", "sockets"]


LOST_SWEEP = """
name = "kernel-lost"
[defaults]
workload = "tiny"
image_size = 16
batch_size = 8
warmup_steps = 1
workers = 3
timeout = 30
strategy = "ring"
[grid]
link = [{{ bandwidth = "{bandwidth}", emulation = "kernel" }}, "none"]
steps = [100, 3]   # kernel: the long run loses node n2 a few steps in, the short one needs it; "none": on the head
"""


def test_a_node_killed_mid_sweep_refuses_the_runs_needing_it_at_once_and_the_sweep_goes_on(cluster, tmp_path):
    """Issue 27: node n2's Ray processes are killed while a run uses it. That run fails; the next run that
    needs n2 is refused at once naming it (not after a 120 s placement wait); runs on the head still run."""
    c, _ = cluster
    sweep = tmp_path / "lost.toml"
    sweep.write_text(LOST_SWEEP.format(bandwidth=BANDWIDTH))
    victim = c.nodes[2]
    proc = subprocess.Popen([sys.executable, "-m", "experiments", "run", str(sweep), "--out", str(tmp_path / "out"),
                             "--no-report", "--address", c.address], cwd=REPO, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []  # (when it was printed, line)
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr),
                              daemon=True)
    reader.start()

    def printed() -> str:
        return "".join(line for _, line in lines)[-3000:]

    try:
        _wait_in_loop(victim, proc, printed, time.monotonic() + 150)  # the long run is in its step loop
        netns._kill(netns._netns_pids(victim.namespace), grace=0)  # the node dies: raylet, workers, all
        assert proc.wait(timeout=240) == 1, printed()  # ends by itself; exit 1: it recorded failed runs
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    reader.join(5)
    # the short kernel run: from its "[run k/n]" line to its "-> FAILED" line
    start = next(i for i, (_, line) in enumerate(lines)
                 if re.search(rf"link={BANDWIDTH} kernel\b.* steps=3\b", line))
    refused_after = lines[start + 1][0] - lines[start][0]
    assert "FAILED" in lines[start + 1][1] and "node n2" in lines[start + 1][1], printed()
    assert refused_after < 10, f"the run needing the lost node was refused after {refused_after:.1f} s"
    runs = read_runs(tmp_path / "out")
    kernel = runs[runs["link"] == f"{BANDWIDTH} kernel"].sort_values("steps", ascending=False)
    long, short = kernel.iloc[0], kernel.iloc[1]
    assert long["status"] == "failed", long
    assert short["status"] == "failed" and "node n2 is gone" in short["error"], short["error"]
    head = runs[runs["link"] != f"{BANDWIDTH} kernel"]
    assert len(head) == 2 and (head["status"] == "ok").all(), head[["steps", "error"]].to_string()


def test_down_leaves_no_namespace_bridge_process_or_port(cluster):
    c, _ = cluster
    pids = [pid for ns in (n.namespace for n in c.all_nodes()) for pid in netns._netns_pids(ns)]
    assert pids
    done = _syncbench("cluster", "down", "--name", c.name)
    assert done.returncode == 0, done.stderr
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"sbc-{c.name}-" not in namespaces
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f"sb-{c.name}" not in links
    assert not [pid for pid in pids if netns._alive(pid)]
    assert not netns._recorded_pids(c)
    assert netns.scan()[1] and "junk.json" in netns.scan()[1][0]  # the bad file beside it: named, left alone
    listening = subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout
    subnet = netns.ipaddress.ip_network(c.subnet)
    assert not [line for line in listening.splitlines()
                if any(netns.ipaddress.ip_address(ip) in subnet for ip in re.findall(r"(\d+\.\d+\.\d+\.\d+):", line))]
    assert not Path(c.temp_dir).exists() and netns.Cluster.load(c.name) is None
    assert netns.down(c.name, log=lambda *_: None) is False  # nothing left to remove



def test_down_after_up_crashed_halfway_removes_what_exists(monkeypatch):
    """`up` writes its state file before it creates anything: a crash after the network (before Ray) is undone."""
    root = tempfile.mkdtemp(prefix="sb", dir="/tmp")
    monkeypatch.setenv(netns.STATE_ENV, root)
    crashed = netns.plan(f"c{os.getpid() % 100000}", [netns.Link(125e6)] * 2)
    try:
        crashed.save()
        netns._make_network(crashed)  # and here `up` dies: no Ray, no processes
        assert all(netns._namespace_exists(n.namespace) for n in crashed.all_nodes())
        assert netns.down(crashed.name, log=lambda *_: None)
        assert not any(netns._namespace_exists(n.namespace) for n in crashed.all_nodes())
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        assert crashed.bridge not in links and not Path(crashed.temp_dir).exists()
        assert netns.Cluster.load(crashed.name) is None
    finally:
        netns.down(crashed.name, log=lambda *_: None)  # idempotent: what a failed assertion above left
        shutil.rmtree(root, ignore_errors=True)
