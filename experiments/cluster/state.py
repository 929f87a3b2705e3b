"""A namespace cluster's state: the 0700 directory it lives in (and who may have written it), the state file
NAME.json (Cluster, Node), verified before any use, and the scan that lists every cluster of this user.
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
import stat
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from experiments.cluster.shell import ClusterError
from strategies.transport.link import Link

NAME_RE = re.compile(r"[a-z][a-z0-9]{0,5}")
RANGE = ipaddress.ip_network("198.18.0.0/15")
GCS_PORT = 6379


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


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name or ""):
        raise ValueError(f"cluster name {name!r}: expected 1-6 lowercase letters or digits, starting with a letter "
                         f"(it becomes part of interface names, which the kernel limits to 15 characters)")
    return name
