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
created, with its own temp dir and a token of its own.

State (NAME.json, and each cluster's temp dir sbc-NAME-XXXXXXXX) lives in a directory of this user with mode
0700, checked before every use (state_dir(): /run/syncbench for root). `down` acts only on what syncbench made,
checked against the kernel and the process table, and refuses a state file it cannot verify; a bad state file
is one line naming it and the command that recovers, and never hides the other clusters.
"""

from __future__ import annotations

import contextlib
import ipaddress  # noqa: F401 - callers read netns.ipaddress
import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from experiments.cluster.host import netem_available, support_problem
from experiments.cluster.network import _free_subnet, _make_network
from experiments.cluster.shell import ClusterError, _sh, _tail
from experiments.cluster.state import (  # noqa: F401 - the cluster's API, read as netns.<name> by its callers
    GCS_PORT,
    RANGE,
    RAY_SOCKET_SUFFIX,
    STATE_ENV,
    TEMP_DIR_RE,
    Cluster,
    Node,
    StateError,
    _cli,
    _layout,
    _open_state_dir,
    _write_state,
    check_name,
    clusters,
    find,
    scan,
    state_dir,
    state_path,
    using_state_dir,
    verify,
)
from strategies.transport.link import Link

RAY_START_TIMEOUT_S = 180.0
START_BATCH = 2  # worker nodes started at once
START_ATTEMPTS = 3
NODE_LABEL = "syncbench-node"
BANDWIDTH_LABEL = "syncbench-bytes-per-s"
LATENCY_LABEL = "syncbench-latency-ns"


# -- up ------------------------------------------------------------------------------------------------


def plan(name: str, links: list[Link], node_cpus: int = 1, head_cpus: int = 8) -> Cluster:
    """Names, addresses and links of a cluster of len(links) worker nodes; creates only its temp dir, in the
    checked state directory (where `down` will look for it)."""
    check_name(name)
    if not 1 <= len(links) <= 200:
        raise ValueError(f"--nodes {len(links)}: expected 1 to 200 nodes")
    if node_cpus < 1 or head_cpus < 1:
        raise ValueError(f"--node-cpus {node_cpus} / --head-cpus {head_cpus}: expected at least 1")
    subnet = _free_subnet()
    os.close(_open_state_dir(create=True))
    root = state_dir()
    longest = len(os.fsencode(f"{root}/sbc-{name}-12345678/n{len(links) - 1}"))
    if longest + RAY_SOCKET_SUFFIX > 107:
        raise ClusterError(f"cluster state directory {root}: its path is {longest + RAY_SOCKET_SUFFIX - 107} "
                           f"characters too long for the Unix sockets Ray makes in a node's temp dir there (at "
                           f"most 107 bytes); choose a shorter one with {STATE_ENV}=DIR or --state-dir DIR")
    temp_dir = tempfile.mkdtemp(prefix=f"sbc-{name}-", dir=root)
    cluster = _layout(name, subnet, temp_dir, links)
    cluster.node_cpus, cluster.head_cpus = node_cpus, head_cpus
    cluster.created_at = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return cluster


def up(name: str, links: list[Link], node_cpus: int = 1, head_cpus: int = 8, log=print) -> Cluster:
    """Create the namespaces, the bridge and the shaped links, then start Ray in them. On any failure, remove
    exactly what this call created (never something that existed before it)."""
    check_name(name)
    if Cluster.load(name) is not None:  # also refuses an untrusted state directory or a bad state file
        raise ClusterError(f"cluster {name!r} is already up (state file {state_path(name)}): "
                           f"`{_cli(f'cluster down --name {name}')}` first")
    problem = support_problem()
    if problem:
        raise ClusterError(f"cannot build a namespace cluster here: {problem}")
    leftovers = sorted(_namespaces_of(name)) + _links_of(name) + [str(p) for p in _temp_dirs_of(name)]
    if leftovers:
        raise ClusterError(f"cluster {name!r} has no state file, but {', '.join(leftovers[:4])}"
                           f"{f' and {len(leftovers) - 4} more' if len(leftovers) > 4 else ''} exist: "
                           f"`{_cli(f'cluster down --name {name}')}` removes what syncbench left under that name, "
                           f"or choose another --name")
    netem = netem_available()
    if not netem and any(link.latency > 0 for link in links):
        raise ClusterError(f"a latency of {max(link.latency for link in links) * 1e6:g} us needs the kernel's "
                           f"netem qdisc, which this kernel does not have (tc: 'Specified qdisc kind is unknown'): "
                           f"leave --latency out (0), or emulate latency in Python (emulation = 'python')")
    cluster = plan(name, links, node_cpus, head_cpus)
    cluster.netem = netem
    made: list[tuple[str, str]] = []  # ("netns" | "link", name) in the order this call created them
    try:
        _write_state(name, json.dumps(asdict(cluster), indent=1) + "\n", new=True)  # first: `down` knows
        made.append(("state", name))
        start = time.perf_counter()
        _make_network(cluster, made)
        log(f"network: bridge {cluster.bridge} {cluster.bridge_ip}, {len(cluster.nodes)} shaped nodes "
            f"({time.perf_counter() - start:.1f} s)")
        start = time.perf_counter()
        _start_ray(cluster)
        log(f"ray: head and {len(cluster.nodes)} nodes started ({time.perf_counter() - start:.1f} s)")
    except BaseException:
        _undo(cluster, made)
        raise
    return cluster


def _undo(cluster: Cluster, made: list[tuple[str, str]]) -> None:
    """Remove what a failed `up` created: the processes in its namespaces, its links, namespaces, temp dir and
    state file; nothing it found already there."""
    namespaces = [what for kind, what in made if kind == "netns"]
    _kill([pid for ns in namespaces for pid in _netns_pids(ns)] + _recorded_pids(cluster))
    for kind, what in reversed(made):
        if kind == "link":
            _sh(["ip", "link", "del", what], check=False)
    for ns in namespaces:
        _sh(["ip", "netns", "del", ns], check=False)
    _remove_temp_dir(Path(cluster.temp_dir))
    if ("state", cluster.name) in made:
        _remove_state_file(cluster.name)


def _ray_cli() -> str:
    ray = Path(sys.executable).parent / "ray"
    return str(ray) if ray.exists() else "ray"


def _start_ray(cluster: Cluster) -> None:
    """The head first, then every worker node at once; each `ray start` inside its node's namespace."""
    fd = os.open(cluster.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
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
    cluster.ray_pids = {node.name: [[pid, *ident] for pid in _netns_pids(node.namespace)
                                    if (ident := _identity(pid)) is not None] for node in cluster.all_nodes()}
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
    """Stop the cluster's processes, remove its namespaces, links, temp dir and state file; False if there was
    nothing to remove. Works after a crash of `up` or of a run, with or without a state file.

    Acts only on what syncbench made, checked against the kernel and the process table: namespaces, bridge and
    veths under its own name prefixes (sbc-NAME-*, sb-NAME, sb-NAME-*, of the right kind), temp dirs sbc-NAME-*
    it made in its own state directory, and the processes in those namespaces or recorded by `up` with their
    start times. A state file it cannot verify is refused (StateError) and nothing is touched.
    """
    check_name(name)
    cluster = Cluster.load(name)
    namespaces = _namespaces_of(name)
    links = _links_of(name)
    temp_dirs = _temp_dirs_of(name)
    if cluster is None and not (namespaces or links or temp_dirs):
        return False
    killed = _kill([pid for ns in namespaces for pid in _netns_pids(ns)]
                   + (_recorded_pids(cluster) if cluster else []))
    bridge = f"sb-{name}"
    # the bridge-side veth ends first: a namespace's deletion removes its peers only asynchronously
    for link in links:
        if link != bridge:
            _sh(["ip", "link", "del", link], check=False)
    for ns in sorted(namespaces):
        _sh(["ip", "netns", "del", ns], check=False)
    if bridge in links:
        _sh(["ip", "link", "del", bridge], check=False)
    deadline = time.monotonic() + 10
    while _links_of(name) and time.monotonic() < deadline:  # wait for the kernel to finish removing them
        time.sleep(0.05)
    for path in temp_dirs:
        _remove_temp_dir(path)
    if cluster is not None:
        _remove_state_file(name)
    log(f"cluster {name!r} down: {killed} processes stopped, {len(namespaces)} namespaces, {len(links)} "
        f"interfaces and {len(temp_dirs)} temp dirs removed")
    return True


def _links_of(name: str) -> list[str]:
    """Cluster NAME's interfaces in the root namespace: the bridge sb-NAME (a bridge) and the veths sb-NAME-*."""
    bridges = [n for n in _links_named(f"sb-{name}", kind="bridge") if n == f"sb-{name}"]
    return bridges + _links_named(f"sb-{name}-", kind="veth")


def _temp_dirs_of(name: str) -> list[Path]:
    """Temp dirs syncbench made for cluster NAME: sbc-NAME-XXXXXXXX in the state directory, real directories of
    this user (never a link, never anything outside it)."""
    try:
        dir_fd = _open_state_dir(create=False)
    except StateError:
        return []
    if dir_fd is None:
        return []
    try:
        entries = os.listdir(dir_fd)
    finally:
        os.close(dir_fd)
    found = []
    for entry in sorted(entries):
        m = TEMP_DIR_RE.fullmatch(entry)
        if m and m.group(1) == name:
            st = os.lstat(state_dir() / entry)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                found.append(state_dir() / entry)
    return found


def _remove_temp_dir(path: Path) -> None:
    """rmtree a temp dir of syncbench's (checked again: in the state directory, its pattern, a real directory)."""
    if path.parent != state_dir() or not TEMP_DIR_RE.fullmatch(path.name):
        raise ClusterError(f"refusing to remove {path}: not a temp dir syncbench makes in {state_dir()}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(path, ignore_errors=True)  # never follows a link inside (fd-based on Linux)


def _remove_state_file(name: str) -> None:
    dir_fd = _open_state_dir(create=False)
    if dir_fd is None:
        return
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{name}.json", dir_fd=dir_fd)
    finally:
        os.close(dir_fd)


def _identity(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks after boot, command name) of a running process, or None: with the pid, what
    tells a process `up` recorded from a later one that got the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    comm, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
    return (int(rest[19]), comm) if rest[0] not in "ZX" else None


def _recorded_pids(cluster: Cluster) -> list[int]:
    """The Ray processes `up` recorded that still run: same pid and start time, and still in one of the
    cluster's namespaces or naming its temp dir on their command line (else they are not the cluster's)."""
    inodes = set()
    for node in cluster.all_nodes():
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{node.namespace}").st_ino)
    pids = []
    for entries in cluster.ray_pids.values():
        for pid, start, comm in entries:
            if pid == os.getpid() or _identity(pid) != (start, comm):
                continue
            try:
                in_namespace = os.stat(f"/proc/{pid}/ns/net").st_ino in inodes
                names_temp_dir = f"{cluster.temp_dir}/".encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if in_namespace or names_temp_dir:
                pids.append(pid)
    return pids


def node_gone(cluster: Cluster, node_name: str) -> str | None:
    """Why node `node_name` of the cluster is gone (its namespace removed, its raylet exited), or None if it
    may be alive. Reads the kernel and the process table only: at once, where Ray notices after its health
    checks time out."""
    node = next((n for n in cluster.all_nodes() if n.name == node_name), None)
    if node is None:
        return f"the cluster has no node {node_name}"
    if not _namespace_exists(node.namespace):
        return f"its namespace {node.namespace} is gone"
    entries = cluster.ray_pids.get(node_name, [])
    raylets = [e for e in entries if e[2] == "raylet"] or entries
    if raylets and not any(_identity(pid) == (start, comm) for pid, start, comm in raylets):
        what = "raylet" if raylets is not entries else "Ray processes"
        return f"its {what} (pid {', '.join(str(e[0]) for e in raylets)}) exited"
    return None


def _links_named(prefix: str, kind: str | None = None) -> list[str]:
    """Interfaces (of this `kind`: bridge, veth) of the root namespace whose name starts with `prefix`."""
    out = subprocess.run(["ip", "-o", "link", "show", *(["type", kind] if kind else [])], capture_output=True,
                         text=True, timeout=60).stdout
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


def _namespaces_of(name: str) -> set[str]:
    out = _sh(["ip", "netns", "list"], check=False).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(f"sbc-{name}-")}


def _namespace_exists(namespace: str) -> bool:
    return namespace in _sh(["ip", "netns", "list"], check=False).stdout.split()
