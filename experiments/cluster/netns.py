"""A real Ray cluster on one machine: one network namespace per node, a bridge, links shaped by the kernel.

    syncbench cluster up --nodes 4 --bandwidth 1Gbit     # namespaces, bridge, shaped veths, Ray head + 4 nodes
    syncbench cluster status
    syncbench cluster down                               # also after a crash: the state file says what exists

Cluster NAME on the subnet 198.18.K.0/24 (the benchmarking range, never one of the machine's own networks):
  root namespace    bridge sb-NAME, 198.18.K.1: the driver (`syncbench run`) reaches the head through it
  sbc-NAME-head     veth 198.18.K.2, not shaped: the Ray head; python-emulated runs are placed here (loopback)
  sbc-NAME-n<i>     veth 198.18.K.(10+i): a Ray worker node, `num_cpus` CPUs, the resource syncbench_n<i>
Each node's NIC is shaped both ways with tbf: on the node's end of its veth (egress = what the node transmits)
and on the bridge's end (egress = what the node receives), so n senders into one node queue at its port, as on
a switch. Per-message latency needs netem, which not every kernel has: it is used where it exists, and a
latency other than 0 is refused where it does not. Every Ray process runs inside a namespace this module
created, with its own temp dir and a token of its own; `down` kills exactly the processes in those namespaces.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from strategies.transport.link import Link

NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
RANGE = ipaddress.ip_network("198.18.0.0/15")
GCS_PORT = 6379
RAY_START_TIMEOUT_S = 180.0
START_BATCH = 2  # worker nodes started at once
START_ATTEMPTS = 3
BURST_S = 0.002  # tbf burst = 2 ms of the rate (about 256 KB at 1 Gbit/s; less under-delivers), at least 32 KB
QUEUE_S = 0.02  # tbf queue: 20 ms of the rate
NODE_LABEL = "syncbench-node"
BANDWIDTH_LABEL = "syncbench-bytes-per-s"
LATENCY_LABEL = "syncbench-latency-ns"


class ClusterError(RuntimeError):
    """The cluster cannot be created, reached or removed; says what failed and what to do."""


def state_dir() -> Path:
    """Where state files live: $SYNCBENCH_CLUSTER_DIR, else /tmp/syncbench-cluster."""
    return Path(os.environ.get("SYNCBENCH_CLUSTER_DIR") or Path(tempfile.gettempdir()) / "syncbench-cluster")


# -- what this machine can do --------------------------------------------------------------------------


def support_problem() -> str | None:
    """Why this machine cannot build a namespace cluster (not root, no `ip`/`tc`, no netns), or None."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return f"network namespaces and tc need root (this process runs as uid {os.geteuid()})"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    probe = f"sbprobe-{os.getpid()}"
    made = _sh(["ip", "netns", "add", probe], check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    try:
        shaped = _sh(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                      "1gbit", "burst", "256kb", "latency", "20ms"], check=False)
        if shaped.returncode != 0:
            return f"tc cannot add a tbf qdisc: {shaped.stderr.strip()}"
    finally:
        _sh(["ip", "netns", "del", probe], check=False)
    return None


def netem_available() -> bool:
    """Whether the kernel has the netem qdisc (per-packet delay), probed in a throwaway namespace."""
    probe = f"sbprobe-{os.getpid()}"
    if _sh(["ip", "netns", "add", probe], check=False).returncode != 0:
        return False
    try:
        return _sh(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay",
                    "1ms"], check=False).returncode == 0
    finally:
        _sh(["ip", "netns", "del", probe], check=False)


# -- the state file ------------------------------------------------------------------------------------


@dataclass
class Node:
    """One node: its namespace, its veth (node end inside, bridge end outside), address and link."""

    name: str  # "head", "n0", "n1", ...
    namespace: str
    ip: str
    veth_node: str
    veth_bridge: str
    bandwidth: float | None  # bytes/s each way; None: not shaped (the head)
    latency: float = 0.0
    resource: str = ""  # the custom Ray resource naming the node
    temp_dir: str = ""


@dataclass
class Cluster:
    """What `up` created (written before each piece is created, so `down` can remove it after a crash)."""

    name: str
    subnet: str
    bridge: str
    bridge_ip: str
    head: Node
    nodes: list[Node]
    temp_dir: str
    token_path: str
    node_cpus: int
    head_cpus: int
    netem: bool = False
    created_at: str = ""
    ray_pids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    def all_nodes(self) -> list[Node]:
        return [self.head, *self.nodes]

    def env(self) -> dict[str, str]:
        """What a Ray process (driver or node) needs in its environment to join this cluster."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    def save(self) -> None:
        path = state_path(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, name: str) -> Cluster | None:
        path = state_path(name)
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        data["head"] = Node(**data["head"])
        data["nodes"] = [Node(**n) for n in data["nodes"]]
        return cls(**data)


def state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def clusters() -> list[Cluster]:
    """Every cluster with a state file."""
    found = []
    for path in sorted(state_dir().glob("*.json")) if state_dir().is_dir() else []:
        cluster = Cluster.load(path.stem)
        if cluster is not None:
            found.append(cluster)
    return found


def find(address: str | None = None, name: str | None = None) -> Cluster | None:
    """The cluster with this head address or name; with neither, the only cluster up (None if zero or several)."""
    every = clusters()
    if name is not None:
        return next((c for c in every if c.name == name), None)
    if address is not None:
        return next((c for c in every if c.address == address), None)
    return every[0] if len(every) == 1 else None


# -- up ------------------------------------------------------------------------------------------------


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise ValueError(f"cluster name {name!r}: expected 1-6 lowercase letters or digits, starting with a letter "
                         f"(it becomes part of interface names, which the kernel limits to 15 characters)")
    return name


def plan(name: str, links: list[Link], node_cpus: int = 1, head_cpus: int = 8) -> Cluster:
    """Names, addresses and links of a cluster of len(links) worker nodes; creates nothing."""
    check_name(name)
    if not 1 <= len(links) <= 200:
        raise ValueError(f"--nodes {len(links)}: expected 1 to 200 nodes")
    if node_cpus < 1 or head_cpus < 1:
        raise ValueError(f"--node-cpus {node_cpus} / --head-cpus {head_cpus}: expected at least 1")
    subnet = _free_subnet()
    hosts = list(subnet.hosts())
    temp_dir = tempfile.mkdtemp(prefix=f"sbc-{name}-")
    head = Node("head", f"sbc-{name}-head", str(hosts[1]), f"sb-{name}-h", f"sb-{name}-bh", None, 0.0,
                "syncbench_head", f"{temp_dir}/head")
    nodes = [Node(f"n{i}", f"sbc-{name}-n{i}", str(hosts[9 + i]), f"sb-{name}-n{i}", f"sb-{name}-b{i}",
                  link.bandwidth, link.latency, f"syncbench_n{i}", f"{temp_dir}/n{i}")
             for i, link in enumerate(links)]
    return Cluster(name=name, subnet=str(subnet), bridge=f"sb-{name}", bridge_ip=str(hosts[0]), head=head,
                   nodes=nodes, temp_dir=temp_dir, token_path=f"{temp_dir}/token", node_cpus=node_cpus,
                   head_cpus=head_cpus, created_at=time.strftime("%Y-%m-%d %H:%M:%S %Z"))


def up(name: str, links: list[Link], node_cpus: int = 1, head_cpus: int = 8, log=print) -> Cluster:
    """Create the namespaces, the bridge and the shaped links, then start Ray in them; `down` on any failure."""
    problem = support_problem()
    if problem:
        raise ClusterError(f"cannot build a namespace cluster here: {problem}")
    if Cluster.load(check_name(name)) is not None:
        raise ClusterError(f"cluster {name!r} is already up (state file {state_path(name)}): "
                           f"`syncbench cluster down --name {name}` first")
    netem = netem_available()
    if not netem and any(link.latency > 0 for link in links):
        raise ClusterError(f"a latency of {max(link.latency for link in links) * 1e6:g} us needs the kernel's "
                           f"netem qdisc, which this kernel does not have (tc: 'Specified qdisc kind is unknown'): "
                           f"leave --latency out (0), or emulate latency in Python (emulation = 'python')")
    cluster = plan(name, links, node_cpus, head_cpus)
    cluster.netem = netem
    cluster.save()  # first: from here on `down` knows what to remove
    try:
        start = time.perf_counter()
        _make_network(cluster)
        log(f"network: bridge {cluster.bridge} {cluster.bridge_ip}, {len(cluster.nodes)} shaped nodes "
            f"({time.perf_counter() - start:.1f} s)")
        start = time.perf_counter()
        _start_ray(cluster)
        log(f"ray: head and {len(cluster.nodes)} nodes started ({time.perf_counter() - start:.1f} s)")
    except BaseException:
        down(name, log=lambda *_: None)
        raise
    return cluster


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


def _make_network(cluster: Cluster) -> None:
    prefix = ipaddress.ip_network(cluster.subnet).prefixlen
    _sh(["ip", "link", "add", cluster.bridge, "type", "bridge"])
    _sh(["ip", "addr", "add", f"{cluster.bridge_ip}/{prefix}", "dev", cluster.bridge])
    _sh(["ip", "link", "set", cluster.bridge, "up"])
    for node in cluster.all_nodes():
        ns = node.namespace
        _sh(["ip", "netns", "add", ns])
        _sh(["ip", "-n", ns, "link", "set", "lo", "up"])
        _sh(["ip", "link", "add", node.veth_bridge, "type", "veth", "peer", "name", node.veth_node, "netns", ns])
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


def _ray_cli() -> str:
    ray = Path(sys.executable).parent / "ray"
    return str(ray) if ray.exists() else "ray"


def _start_ray(cluster: Cluster) -> None:
    """The head first, then every worker node at once; each `ray start` inside its node's namespace."""
    Path(cluster.token_path).write_text(secrets.token_hex(32))
    os.chmod(cluster.token_path, 0o600)
    env = {**os.environ, **cluster.env(), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head = cluster.head
    _ray_start(cluster, head, ["--head", "--port", str(GCS_PORT), "--num-cpus", str(cluster.head_cpus),
                               "--resources", json.dumps({head.resource: cluster.head_cpus}),
                               "--include-dashboard", "false"], env)
    # a few nodes at a time, each retried: `ray start` gives a raylet 30 s to register, which a loaded machine
    # can miss when many start at once
    pending, failures = list(cluster.nodes), {}
    for _attempt in range(START_ATTEMPTS):
        failures = {}
        for first in range(0, len(pending), START_BATCH):
            procs = [(node, _ray_start(cluster, node, ["--address", cluster.address, "--num-cpus",
                                                       str(cluster.node_cpus), "--resources",
                                                       json.dumps({node.resource: cluster.node_cpus})],
                                       env, wait=False))
                     for node in pending[first:first + START_BATCH]]
            for node, proc in procs:
                problem = _finish_start(node, proc)
                if problem:
                    failures[node.name] = problem
                    _kill(_netns_pids(node.namespace))  # what the failed start left, before it is tried again
                    shutil.rmtree(node.temp_dir, ignore_errors=True)
        pending = [node for node in pending if node.name in failures]
        if not pending:
            break
    if failures:
        raise ClusterError(f"after {START_ATTEMPTS} attempts:\n" + "\n".join(failures.values()))
    cluster.ray_pids = {node.name: _netns_pids(node.namespace) for node in cluster.all_nodes()}
    cluster.save()
    wait_for_nodes(cluster, len(cluster.nodes) + 1)


def _ray_start(cluster: Cluster, node: Node, args: list[str], env: dict, wait: bool = True):
    labels = {NODE_LABEL: node.name}
    if node.bandwidth is not None:
        labels[BANDWIDTH_LABEL] = f"{node.bandwidth:.0f}"
        labels[LATENCY_LABEL] = f"{node.latency * 1e9:.0f}"
    cmd = ["ip", "netns", "exec", node.namespace, _ray_cli(), "start", *args, "--node-ip-address", node.ip,
           "--temp-dir", node.temp_dir, "--disable-usage-stats",
           "--labels", ",".join(f"{k}={v}" for k, v in labels.items())]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    if not wait:
        return proc
    problem = _finish_start(node, proc)
    if problem:
        raise ClusterError(problem)
    return proc


def _finish_start(node: Node, proc: subprocess.Popen) -> str:
    """Wait for one `ray start` (killed after RAY_START_TIMEOUT_S); '' when it worked, else what went wrong."""
    try:
        _, err = proc.communicate(timeout=RAY_START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return f"node {node.name}: ray start exited {proc.returncode}: {_tail(err)}" if proc.returncode != 0 else ""


def alive_nodes(cluster: Cluster) -> list[dict]:
    """The cluster's alive Ray nodes as {'ip', 'labels', 'resources'}, asked of its GCS."""
    code = ("import json, ray; from ray._raylet import GcsClient\n"
            f"infos = GcsClient(address={cluster.address!r}).get_all_node_info(timeout=10).values()\n"
            "print(json.dumps([{'ip': i.node_manager_address, 'labels': dict(i.labels),"
            " 'resources': dict(i.resources_total)} for i in infos if i.state == 0]))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **cluster.env()}, capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise ClusterError(f"cannot ask the head {cluster.address} for its nodes: {_tail(out.stderr)}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def wait_for_nodes(cluster: Cluster, count: int, timeout: float = 60.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = alive_nodes(cluster)
        if len(nodes) >= count or time.monotonic() > deadline:
            break
        time.sleep(1)
    if len(nodes) < count:
        raise ClusterError(f"only {len(nodes)} of {count} Ray nodes registered with the head within {timeout:g} s")
    return nodes


def describe(link: Link) -> str:
    """'1 Gbit/s, 0 us': a link as people write it."""
    return f"{link.bandwidth * 8 / 1e9:g} Gbit/s, {link.latency * 1e6:g} us"


# -- status --------------------------------------------------------------------------------------------


def status(cluster: Cluster) -> str:
    """A table of the cluster's nodes: namespace, address, link, Ray state, processes."""
    try:
        alive = {n["ip"] for n in alive_nodes(cluster)}
        reach = ""
    except (ClusterError, subprocess.TimeoutExpired) as e:
        alive, reach = set(), f" (head unreachable: {e})"
    lines = [f"cluster {cluster.name!r}: head {cluster.address}, subnet {cluster.subnet}, bridge {cluster.bridge}, "
             f"netem {'yes' if cluster.netem else 'no (no kernel latency)'}, created {cluster.created_at}{reach}",
             f"{'node':>5s} {'namespace':>18s} {'address':>15s} {'link':>22s} {'ray':>5s} {'processes':>9s}"]
    for node in cluster.all_nodes():
        link = "not shaped" if node.bandwidth is None else describe(Link(node.bandwidth, node.latency))
        exists = _namespace_exists(node.namespace)
        procs = len(_netns_pids(node.namespace)) if exists else 0
        ray_state = "up" if node.ip in alive else "down"
        lines.append(f"{node.name:>5s} {node.namespace if exists else '(missing)':>18s} {node.ip:>15s} {link:>22s} "
                     f"{ray_state:>5s} {procs:>9d}")
    return "\n".join(lines)


# -- link faults (tests, experiments) ------------------------------------------------------------------


def set_link(cluster: Cluster, node_name: str, up_: bool) -> None:
    """Take a node's NIC down (its bridge end: nothing in or out) or bring it back."""
    node = next((n for n in cluster.all_nodes() if n.name == node_name), None)
    if node is None:
        raise ValueError(f"node {node_name!r}: the cluster has {', '.join(n.name for n in cluster.all_nodes())}")
    _sh(["ip", "link", "set", node.veth_bridge, "up" if up_ else "down"])


# -- down ----------------------------------------------------------------------------------------------


def down(name: str, log=print) -> bool:
    """Stop every process in the cluster's namespaces, remove namespaces and bridge, temp dir and state file.

    Works from the state file, so also after a crash of `up` or of a run; False if there was nothing to remove.
    """
    cluster = Cluster.load(check_name(name))
    namespaces = _namespaces_of(name)
    if cluster is None and not namespaces:
        return False
    if cluster is not None:
        namespaces |= {n.namespace for n in cluster.all_nodes()}
    killed = _kill([pid for ns in namespaces for pid in _netns_pids(ns)]
                   + (_pids_using(cluster.temp_dir) if cluster else []))
    bridge = cluster.bridge if cluster else f"sb-{name}"
    # the bridge-side veth ends first: a namespace's deletion removes its peers only asynchronously
    for link in _links_named(bridge + "-"):
        _sh(["ip", "link", "del", link], check=False)
    for ns in sorted(namespaces):
        _sh(["ip", "netns", "del", ns], check=False)
    _sh(["ip", "link", "del", bridge], check=False)
    deadline = time.monotonic() + 10
    while _links_named(bridge) and time.monotonic() < deadline:  # wait for the kernel to finish removing them
        time.sleep(0.05)
    if cluster is not None:
        shutil.rmtree(cluster.temp_dir, ignore_errors=True)
        state_path(name).unlink(missing_ok=True)
    log(f"cluster {name!r} down: {killed} processes stopped, {len(namespaces)} namespaces and bridge {bridge} "
        f"removed")
    return True


def _links_named(prefix: str) -> list[str]:
    """Interfaces of the root namespace whose name starts with `prefix` (veth ends print as NAME@ifN)."""
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    names = [line.split(":", 2)[1].strip().split("@")[0] for line in out.splitlines() if line.count(":") >= 2]
    return [n for n in names if n.startswith(prefix)]


def _kill(pids: list[int], grace: float = 5.0) -> int:
    """SIGTERM, then SIGKILL what is left after `grace` seconds; the number of processes that existed."""
    pids = sorted(set(pids) - {os.getpid()})
    existed = [p for p in pids if _signal(p, signal.SIGTERM)]
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in existed) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in existed:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while any(_alive(p) for p in existed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(existed)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


def _netns_pids(namespace: str) -> list[int]:
    out = _sh(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in out.stdout.split()] if out.returncode == 0 else []


def _pids_using(path: str) -> list[int]:
    """Processes whose command line names `path` (this cluster's unique temp dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if path in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _namespaces_of(name: str) -> set[str]:
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(f"sbc-{name}-")}


def _namespace_exists(namespace: str) -> bool:
    return namespace in _sh(["ip", "netns", "list"], check=False).stdout.split()


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join((text or "").strip().splitlines()[-lines:])
