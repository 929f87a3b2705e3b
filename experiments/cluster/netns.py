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
import errno
import ipaddress
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
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


# -- where state lives, and who may have written it -----------------------------------------------------

STATE_ENV = "SYNCBENCH_CLUSTER_DIR"
STATE_MAX_BYTES = 1 << 20  # a 200-node state file is about 60 kB
# Ray puts its Unix sockets at <node temp dir>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store, and the
# kernel allows 107 bytes: a node's temp dir may have at most 107 - 64 characters
RAY_SOCKET_SUFFIX = 64
TEMP_DIR_RE = re.compile(r"sbc-([a-z][a-z0-9]{0,5})-[a-z0-9_]{8}")  # what tempfile.mkdtemp(prefix="sbc-NAME-") makes


class StateError(ClusterError):
    """A state directory or file syncbench cannot trust or read; one line naming it and the command that recovers."""


def state_dir() -> Path:
    """Where state files and the clusters' temp dirs live: $SYNCBENCH_CLUSTER_DIR (or --state-dir), else
    /run/syncbench for root, $XDG_RUNTIME_DIR/syncbench or ~/.local/state/syncbench for other users.

    Never a shared default such as /tmp/syncbench-cluster: whoever creates that first owns root's cluster state.
    """
    override = os.environ.get(STATE_ENV)
    if override:
        return Path(os.path.abspath(override))
    if os.geteuid() == 0:
        return Path("/run/syncbench")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        return Path(runtime) / "syncbench"
    return Path.home() / ".local" / "state" / "syncbench"


@contextlib.contextmanager
def using_state_dir(path: str | None):
    """Within the block, state lives in `path` (--state-dir; None: unchanged). Set in the environment, so that
    the recovery commands printed and the processes started (ray, runs) use it too; restored afterwards."""
    if not path:
        yield
        return
    saved = os.environ.get(STATE_ENV)
    os.environ[STATE_ENV] = os.path.abspath(path)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(STATE_ENV, None)
        else:
            os.environ[STATE_ENV] = saved


def _cli(command: str) -> str:
    """`syncbench <command>` as a user must type it to reach this state directory."""
    override = os.environ.get(STATE_ENV)
    return f"{STATE_ENV}={override} syncbench {command}" if override else f"syncbench {command}"


def _owner_problem(st: os.stat_result, what: str) -> str | None:
    """Why a file or directory with this stat may have been written by someone other than this user, or None."""
    if st.st_uid != os.geteuid():
        return f"{what} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"{what} has mode {stat.S_IMODE(st.st_mode):04o}: other users can write to it"
    return None


def _ancestors_problem(path: Path) -> str | None:
    """Why a directory above `path` would let another user replace it (writable by them, not sticky), or None."""
    for parent in Path(os.path.realpath(path.parent)).resolve().joinpath("x").parents:
        st = os.lstat(parent)
        if st.st_uid not in (0, os.geteuid()):
            return f"the directory above it, {parent}, is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return f"the directory above it, {parent}, has mode {stat.S_IMODE(st.st_mode):04o} (writable by others)"
    return None


def _open_state_dir(create: bool) -> int | None:
    """A descriptor of the state directory, checked: a real directory of this user with mode 0700, below
    directories nobody else can rename it in. None when it does not exist (and `create` is false)."""
    path = state_dir()
    if create:
        missing = [p for p in [path, *path.parents] if not os.path.lexists(p)]
        for p in reversed(missing):
            try:
                os.mkdir(p, 0o700)
            except FileExistsError:
                pass  # made meanwhile: checked below like any other
            except OSError as e:
                raise StateError(f"cluster state directory {path}: cannot create {p} ({e.strerror}); choose "
                                 f"another with {STATE_ENV}=DIR or --state-dir DIR") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise StateError(f"cluster state directory {path}: cannot use it ({why}); remove it or choose another with "
                         f"{STATE_ENV}=DIR or --state-dir DIR") from None
    try:
        st = os.fstat(fd)
        problem = _owner_problem(st, "it")
        if problem is None and stat.S_IMODE(st.st_mode) & 0o077:
            problem = f"it has mode {stat.S_IMODE(st.st_mode):04o}, expected 0700"
        problem = problem or _ancestors_problem(path)
        if problem:
            raise StateError(f"cluster state directory {path}: {problem}, so its files cannot be trusted; "
                             f"syncbench uses only a directory of its own user with mode 0700: remove it "
                             f"(`rm -r {path}`) or choose another with {STATE_ENV}=DIR or --state-dir DIR")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _write_state(name: str, text: str, new: bool = False) -> None:
    """Write NAME.json in the checked state directory: a new file (O_EXCL|O_NOFOLLOW, a random name, so nothing
    planted there is followed or overwritten), then renamed over NAME.json atomically; `new`: linked to
    NAME.json only if no such file exists (two `up` of one name cannot both proceed)."""
    dir_fd = _open_state_dir(create=True)
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if new:
                os.link(tmp, f"{name}.json", src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            else:
                os.rename(tmp, f"{name}.json", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
    except FileExistsError:
        raise StateError(f"cluster state file {state_path(name)} appeared while this `up` ran (another `up` of "
                         f"{name!r}?): `{_cli(f'cluster status --name {name}')}` shows it") from None
    except OSError as e:
        raise StateError(f"cluster state file {state_path(name)}: cannot write it ({e.strerror}); free space there "
                         f"or choose another state directory with {STATE_ENV}=DIR or --state-dir DIR") from None
    finally:
        os.close(dir_fd)


def _read_state(dir_fd: int, filename: str) -> object:
    """The JSON in one state file, if this user wrote it: a regular file (not a link, FIFO or device) of this
    user, writable by nobody else, at most STATE_MAX_BYTES. Raises ValueError saying what is wrong."""
    try:
        fd = os.open(filename, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = "it is a symbolic link" if e.errno == errno.ELOOP else f"cannot open it ({e.strerror})"
        raise ValueError(why) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("it is not a regular file")
        problem = _owner_problem(st, "it")
        if problem:
            raise ValueError(problem)
        raw = f.read(STATE_MAX_BYTES + 1)
    if len(raw) > STATE_MAX_BYTES:
        raise ValueError(f"it is larger than {STATE_MAX_BYTES:,} bytes")
    try:
        return json.loads(raw.decode())
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    except RecursionError:
        raise ValueError("its JSON is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"it is not JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


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
    # node name -> [pid, start time (clock ticks after boot, /proc/PID/stat), command name] of its Ray processes
    ray_pids: dict[str, list[list]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{GCS_PORT}"

    def all_nodes(self) -> list[Node]:
        return [self.head, *self.nodes]

    def env(self) -> dict[str, str]:
        """What a Ray process (driver or node) needs in its environment to join this cluster."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    def save(self) -> None:
        _write_state(self.name, json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, name: str) -> Cluster | None:
        """The cluster NAME's state, verified (see verify()); None without a state file; StateError (one line
        naming the file and the command that recovers) for one that cannot be read or verified."""
        check_name(name)
        dir_fd = _open_state_dir(create=False)
        if dir_fd is None:
            return None
        try:
            return _load(dir_fd, f"{name}.json")
        finally:
            os.close(dir_fd)


def state_path(name: str) -> Path:
    return state_dir() / f"{name}.json"


def _load(dir_fd: int, filename: str) -> Cluster | None:
    name = filename[:-len(".json")]
    try:
        data = _read_state(dir_fd, filename)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise _bad_file(name, str(e)) from None
    try:
        return verify(name, data)
    except (ValueError, TypeError) as e:
        raise _bad_file(name, str(e)) from None


def _bad_file(name: str, problem: str) -> StateError:
    path = state_dir() / f"{name}.json"
    recover = (f"`rm {path}`, then `{_cli(f'cluster down --name {name}')}` removes what syncbench made under that "
               f"name (by its own name prefixes)") if NAME_RE.fullmatch(name) else f"`rm {path}`"
    return StateError(f"cluster state file {path}: {problem}; syncbench does not act on it. To recover: {recover}")


def _layout(name: str, subnet: ipaddress.IPv4Network, temp_dir: str, links: list[Link]) -> Cluster:
    """The names, addresses and paths syncbench gives cluster NAME: what plan() makes and verify() expects."""
    hosts = list(subnet.hosts())
    head = Node("head", f"sbc-{name}-head", str(hosts[1]), f"sb-{name}-h", f"sb-{name}-bh", None, 0.0,
                "syncbench_head", f"{temp_dir}/head")
    nodes = [Node(f"n{i}", f"sbc-{name}-n{i}", str(hosts[9 + i]), f"sb-{name}-n{i}", f"sb-{name}-b{i}",
                  link.bandwidth, link.latency, f"syncbench_n{i}", f"{temp_dir}/n{i}")
             for i, link in enumerate(links)]
    return Cluster(name=name, subnet=str(subnet), bridge=f"sb-{name}", bridge_ip=str(hosts[0]), head=head,
                   nodes=nodes, temp_dir=temp_dir, token_path=f"{temp_dir}/token", node_cpus=1, head_cpus=1)


def verify(name: str, data: object) -> Cluster:
    """A Cluster from a state file's JSON, if it is exactly what syncbench writes for cluster NAME: its own
    interface and namespace names, an address in 198.18.0.0/15, a temp dir it made in its state directory, Ray
    processes as [pid, start time, command]. Raises ValueError naming the first thing that is not."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, found a JSON {type(data).__name__}")
    names = {f.name for f in fields(Cluster)}
    required = {f.name for f in fields(Cluster) if f.default is MISSING and f.default_factory is MISSING}
    if required - data.keys():
        raise ValueError(f"missing {', '.join(sorted(required - data.keys()))}")
    if data.keys() - names:
        raise ValueError(f"unknown keys {', '.join(sorted(map(str, data.keys() - names)))}")
    if data["name"] != name:
        raise ValueError(f"name {data['name']!r} is not the file's name {name!r}")
    try:
        subnet = ipaddress.ip_network(data["subnet"])
    except (ValueError, TypeError):
        raise ValueError(f"subnet {data['subnet']!r} is not a network") from None
    if subnet.prefixlen != 24 or not subnet.subnet_of(RANGE):
        raise ValueError(f"subnet {data['subnet']!r}: syncbench uses /24 networks of {RANGE}")
    temp_dir = data["temp_dir"]
    if not (isinstance(temp_dir, str) and os.path.dirname(temp_dir) == str(state_dir())
            and (m := TEMP_DIR_RE.fullmatch(os.path.basename(temp_dir))) and m.group(1) == name):
        raise ValueError(f"temp_dir {temp_dir!r} is not a directory syncbench makes (sbc-{name}-XXXXXXXX in "
                         f"{state_dir()})")
    for key, kind in (("node_cpus", int), ("head_cpus", int), ("netem", bool), ("created_at", str),
                      ("ray_pids", dict), ("nodes", list), ("head", dict)):
        if key in data and (type(data[key]) is not kind):
            raise ValueError(f"{key} {data[key]!r}: expected a JSON {kind.__name__}")
    nodes = data["nodes"]
    if not 1 <= len(nodes) <= 200 or not all(isinstance(n, dict) for n in nodes):
        raise ValueError(f"nodes: expected 1 to 200 JSON objects, found {len(nodes)} entries")
    links = []
    for i, node in enumerate(nodes):
        bandwidth, latency = node.get("bandwidth"), node.get("latency", 0.0)
        if not (type(bandwidth) in (int, float) and type(latency) in (int, float)
                and 0 < bandwidth < math.inf and 0 <= latency < math.inf):
            raise ValueError(f"node n{i}: bandwidth {bandwidth!r} / latency {latency!r} are not a link")
        links.append(Link(float(bandwidth), float(latency)))
    expected = _layout(name, subnet, temp_dir, links)
    try:
        cluster = Cluster(**{**data, "head": Node(**data["head"]), "nodes": [Node(**n) for n in nodes]})
    except TypeError as e:
        raise ValueError(f"not the fields of a cluster: {e}") from None
    for have, want in zip([cluster.head, *cluster.nodes], expected.all_nodes()):
        if asdict(have) != asdict(want):
            bad = next(k for k, v in asdict(want).items() if asdict(have)[k] != v)
            raise ValueError(f"node {want.name}: {bad} {asdict(have)[bad]!r}, syncbench's is {asdict(want)[bad]!r}")
    for key in ("bridge", "bridge_ip", "token_path"):
        if getattr(cluster, key) != getattr(expected, key):
            raise ValueError(f"{key} {getattr(cluster, key)!r}, syncbench's is {getattr(expected, key)!r}")
    if not (1 <= cluster.node_cpus <= 4096 and 1 <= cluster.head_cpus <= 4096):
        raise ValueError(f"node_cpus {cluster.node_cpus} / head_cpus {cluster.head_cpus}: expected 1 to 4096")
    known = {n.name for n in cluster.all_nodes()}
    for node, entries in cluster.ray_pids.items():
        if node not in known or not isinstance(entries, list) or not all(
                isinstance(e, list) and len(e) == 3 and type(e[0]) is int and type(e[1]) is int
                and isinstance(e[2], str) and e[0] > 1 and e[1] >= 0 for e in entries):
            raise ValueError(f"ray_pids[{node!r}]: expected [pid, start time, command] of a node's processes")
    return cluster


def scan() -> tuple[list[Cluster], list[str]]:
    """Every cluster whose state file verifies, and one line for each file (or the directory) that does not:
    a bad file never hides the others."""
    try:
        dir_fd = _open_state_dir(create=False)
    except StateError as e:
        return [], [str(e)]
    if dir_fd is None:
        return [], []
    found, problems = [], []
    try:
        for filename in sorted(os.listdir(dir_fd)):
            if not filename.endswith(".json") or filename.startswith("."):
                continue
            try:
                cluster = _load(dir_fd, filename)
            except StateError as e:
                problems.append(str(e))
                continue
            if cluster is not None:
                found.append(cluster)
    finally:
        os.close(dir_fd)
    return found, problems


def clusters() -> list[Cluster]:
    """Every cluster with a state file that verifies (see scan() for the ones that do not)."""
    return scan()[0]


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


def _sh(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and out.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join((text or "").strip().splitlines()[-lines:])
