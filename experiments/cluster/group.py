"""A group of Ray worker actors joined by torch.distributed: start, run a function on every rank, tear down.

    with WorkerGroup(4) as group:
        results = group.run(fn, arg)   # fn(ctx, arg) on every rank at once, results in rank order

The actors live in one placement group (PACK). Rank 0's actor opens the rendezvous store on a free port of
its node; gloo binds to `lo` when every actor is on one node (this machine's hostname may resolve to
127.0.0.1), else to the interface that holds each actor's node IP. Two actors of one node (k ranks per namespace
of the kernel-shaped cluster) then reach each other at that node IP, which the kernel routes over the
namespace's loopback: their bytes never cross the node's shaped veth.

After a failure, `reform(members)` joins some of the actors into a new process group in their own processes (their
state kept), and `replace(i)` starts a fresh actor in a dead one's bundle (experiments/pipeline/ray_faults.py).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
import time
from dataclasses import dataclass, field

import ray
import torch
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from strategies.transport.communicator import DEFAULT_TIMEOUT_S
from strategies.transport.link import Network
from strategies.transport.names import P2P
from workloads.profile import cpu_model

STARTUP_TIMEOUT_S = 120.0
# every wait on Ray returns at least this often, so that Ctrl-C (and SIGTERM) interrupt it promptly
WAIT_SLICE_S = 0.5
# after the first rank fails, how long the others get to report their own errors before run() raises
GRACE_S = 2.0


# glibc otherwise unmaps every large tensor freed in a step (activations, fresh gradients) and faults the
# pages in again the next step: measured 34 ms of a 190 ms resnet18 step on 1 thread, 8 ms with these.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296",
              "MALLOC_TOP_PAD_": "268435456"}


class GroupError(RuntimeError):
    """One or more ranks failed (raised, or their actor died); names the ranks and the cause."""

    def __init__(self, message: str, ranks: list[int]):
        super().__init__(message)
        self.ranks = ranks


@dataclass
class RankContext:
    """What a function run on the group sees on its rank."""

    rank: int
    world_size: int
    comm: object  # the Communicator of run()'s p2p (strategies.transport.factory), fresh for each run() call
    device: str  # "cpu" or "cuda"
    state: dict = field(default_factory=dict)  # persists on the actor across run() calls


def _interface_of(ip: str) -> str | None:
    """The network interface that holds `ip` (gloo binds on it), or None."""
    import psutil  # vendored by Ray

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return None


@ray.remote
class GroupWorker:
    """One rank: a torch.distributed member that runs functions sent to it."""

    def __init__(self, rank: int, world_size: int, sys_path: list[str]):
        for path in reversed(sys_path):  # so functions pickled by reference (tests, scripts) import here
            if path not in sys.path and os.path.isdir(path):
                sys.path.insert(0, path)
        torch.set_num_threads(1)
        self.rank, self.world_size = rank, world_size
        self.state: dict = {}
        self.store = None
        self.control_group = None
        self.backend = "gloo"
        self.ip = "127.0.0.1"  # where this rank's socket transport listens for TCP pairs

    def address(self) -> tuple[str, str]:
        """This actor's node IP and the interface that holds it."""
        ip = ray.util.get_node_ip_address()
        return ip, _interface_of(ip)

    def open_store(self, host: str, timeout: float) -> int:
        """Rank 0: start the rendezvous store on a free port of `host` (the OS picks it, no race); return it.

        The store listens on `host` only (127.0.0.1 when every rank is on this machine), not on every
        interface as TCPStore does when it opens the socket itself.
        """
        self._listener = socket.create_server((host, 0), backlog=max(self.world_size, 128))
        self.store = torch.distributed.TCPStore(host, self._listener.getsockname()[1], self.world_size,
                                                is_master=True, timeout=dt.timedelta(seconds=timeout),
                                                wait_for_workers=False, master_listen_fd=self._listener.fileno())
        return self.store.port

    def join(self, host: str, port: int, ifname: str, backend: str, timeout: float) -> dict:
        """Join the process group (and, for NCCL, a gloo control group); return facts about this rank."""
        os.environ["GLOO_SOCKET_IFNAME"] = ifname
        self.ip = "127.0.0.1" if ifname == "lo" else ray.util.get_node_ip_address()
        store = self.store or torch.distributed.TCPStore(host, port, self.world_size, is_master=False,
                                                         timeout=dt.timedelta(seconds=timeout))
        if backend == "nccl":
            torch.cuda.set_device(0)  # Ray made this actor's own GPU the only visible one
        torch.distributed.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size,
                                             timeout=dt.timedelta(seconds=timeout))
        if backend == "nccl":
            self.control_group = torch.distributed.new_group(backend="gloo")
        self.backend = backend
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() and ray.get_gpu_ids() else None
        return {"host": socket.gethostname(), "cores": os.cpu_count(), "cpu": cpu_model(), "gpu": gpu,
                "pid": os.getpid()}

    def run(self, fn, args: tuple, network: Network | None, timeout: float, p2p: str = "gloo"):
        from strategies.transport import factory
        from strategies.transport.torch_dist import TorchCommunicator

        # the process group is the control plane (and the native allreduce); p2p names what carries the messages
        control = TorchCommunicator(self.rank, self.world_size, timeout, control_group=self.control_group)
        comm = factory.build(p2p, control, timeout=timeout, network=network, address=self.ip)
        device = "cuda" if ray.get_gpu_ids() else "cpu"
        ctx = RankContext(self.rank, self.world_size, comm, device, self.state)
        try:
            return fn(ctx, *args)
        finally:
            comm.close()

    def leave(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    def reform(self, rank: int, world_size: int) -> None:
        """Leave the process group (one a failure broke, or of another size) to join a new one as `rank` of
        `world_size`: elastic recovery re-forms the survivors in their processes, their state kept."""
        self.leave()
        if getattr(self, "_listener", None) is not None:  # this rank hosted the old group's store
            self._listener.close()
            self._listener = None
        self.store, self.control_group = None, None
        self.rank, self.world_size = rank, world_size


class WorkerGroup:
    """n worker actors in a placement group, joined by torch.distributed; see the module docstring."""

    def __init__(self, world_size: int, num_cpus: float = 1, num_gpus: float = 0,
                 timeout: float = DEFAULT_TIMEOUT_S, startup_timeout: float = STARTUP_TIMEOUT_S,
                 node_resources: list[dict] | None = None):
        if world_size < 1:
            raise ValueError(f"world_size {world_size!r} must be at least 1")
        if num_cpus < 0 or num_gpus < 0 or (num_gpus > 1 and num_gpus != int(num_gpus)):
            raise ValueError(f"num_cpus {num_cpus!r} / num_gpus {num_gpus!r}: expected num_cpus >= 0 and "
                             f"num_gpus 0, a fraction of one GPU, or a whole number of GPUs")
        if not ray.is_initialized():
            raise RuntimeError("Ray is not initialized: call experiments.cluster.ray_runtime.ensure_ray() first")
        self.world_size = world_size
        self.timeout = float(timeout)
        self.uses_gpu = num_gpus > 0
        # NCCL needs a whole GPU per rank; ranks sharing a GPU talk gloo through host memory
        self.backend = "nccl" if num_gpus >= 1 else "gloo"
        self.broken = False
        # per rank, custom resources that pin it to a node (experiments.cluster.placement); None: anywhere
        self.node_resources = node_resources
        if node_resources is not None and len(node_resources) != world_size:
            raise ValueError(f"node_resources has {len(node_resources)} entries: expected one per rank ({world_size})")
        self.actors: list = []
        self.pg = None
        self.info: list[dict] = []
        bundle = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        try:
            self._start(bundle, startup_timeout)
        except BaseException:
            self.shutdown()
            raise

    def _start(self, bundle: dict, startup_timeout: float) -> None:
        _check_fits(self.world_size, bundle)
        self.pg = placement_group([{**bundle, **(self.node_resources[rank] if self.node_resources else {})}
                                   for rank in range(self.world_size)], strategy="PACK")
        if not _wait_any([self.pg.ready()], startup_timeout):
            raise RuntimeError(f"placement group of {self.world_size} x {bundle} not placed within "
                               f"{startup_timeout:g} s; the cluster has {ray.available_resources()} available")
        self._bundle = bundle
        self.actors = [self._spawn(rank, rank, self.world_size) for rank in range(self.world_size)]
        self.info = self._rendezvous(self.actors, startup_timeout)

    def _spawn(self, index: int, rank: int, world_size: int):
        """A fresh actor in bundle `index` of the placement group, to be `rank` of `world_size`."""
        env = {"env_vars": {"TORCH_CPP_LOG_LEVEL": "ERROR", "OMP_NUM_THREADS": "1", **MALLOC_ENV}}
        return GroupWorker.options(
            num_cpus=self._bundle["CPU"], num_gpus=self._bundle.get("GPU", 0), runtime_env=env,
            scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=index),
        ).remote(rank, world_size, list(sys.path))

    def replace(self, index: int, startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        """A fresh actor in place of actor `index` (dead: its bundle is free again), started and waited for."""
        self.actors[index] = actor = self._spawn(index, index, self.world_size)
        self._get([actor.address.remote()], startup_timeout, "start")

    def reform(self, members: list[int], startup_timeout: float = STARTUP_TIMEOUT_S) -> None:
        """A new process group of the actors `members` (indices into `actors`), ranks in that order; the others
        are left out of it. Each member leaves the group it was in (a failure broke it) and keeps its state."""
        actors = [self.actors[i] for i in members]
        self._get([a.reform.remote(rank, len(actors)) for rank, a in enumerate(actors)], startup_timeout, "reform")
        self.info = self._rendezvous(actors, startup_timeout)

    def _rendezvous(self, actors: list, startup_timeout: float) -> list[dict]:
        """Join `actors` into one process group, ranks in list order (rank 0 hosts the store); their facts."""
        addresses = self._get([a.address.remote() for a in actors], startup_timeout, "start")
        one_node = len({ip for ip, _ in addresses}) == 1
        host = "127.0.0.1" if one_node else addresses[0][0]
        ifnames = ["lo" if one_node else ifname for _, ifname in addresses]
        if None in ifnames:
            rank = ifnames.index(None)
            raise RuntimeError(f"rank {rank}: no network interface holds its node IP {addresses[rank][0]}, "
                               f"so gloo cannot tell where to bind")
        port = self._get([actors[0].open_store.remote(host, self.timeout)], startup_timeout, "start")[0]
        self.port = port
        return self._get([a.join.remote(host, port, ifname, self.backend, self.timeout)
                          for a, ifname in zip(actors, ifnames)], startup_timeout, "rendezvous")

    @property
    def host(self) -> str:
        return self.info[0]["host"] if self.info else ""

    @property
    def cores(self) -> int:
        return self.info[0]["cores"] if self.info else 0

    @property
    def cpu(self) -> str:
        return self.info[0]["cpu"] if self.info else ""

    @property
    def gpu_name(self) -> str | None:
        return self.info[0]["gpu"] if self.info else None

    def run(self, fn, *args, network: Network | None = None, timeout: float | None = None,
            p2p: str = "gloo") -> list:
        """fn(ctx, *args) on every rank at once; results in rank order. `timeout`: overall deadline (s).

        `p2p`: what carries the strategies' point to point: "gloo" (torch.distributed) or "sockets"
        (strategies.transport.sockets: Unix + single copy within a namespace, else TCP; "sockets-unix" without the
        single copy, "sockets-tcp" TCP for every pair); the backend's own allreduce is gloo's (or NCCL's) either way.
        """
        if p2p not in P2P:
            raise ValueError(f"p2p {p2p!r}: expected one of {', '.join(P2P)}")
        if self.broken:
            raise GroupError("the worker group is broken by an earlier failure: shut it down and start a new one",
                             [])
        refs = [a.run.remote(fn, args, network, self.timeout, p2p) for a in self.actors]
        try:
            return self._get(refs, timeout, f"run({getattr(fn, '__name__', fn)})")
        except KeyboardInterrupt:  # Ctrl-C/SIGTERM: the ranks are still busy with fn, so shutdown() kills them
            self.broken = True
            raise

    def _get(self, refs: list, timeout: float | None, what: str) -> list:
        """Results of one call per rank, in rank order; GroupError naming the first failed rank(s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        pending = dict(zip(refs, range(len(refs))))
        while pending:
            left = None if deadline is None else max(deadline - time.monotonic(), 0)
            if errors:  # a rank failed: the others get a short grace to report, not their full timeout
                left = GRACE_S if left is None else min(left, GRACE_S)
            done = _wait_any(list(pending), left)
            if not done:
                break
            for ref in done:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as e:
                    errors[rank] = f"its actor died: {_first_line(e)}"
                except RayTaskError as e:
                    cause = e.cause if e.cause is not None else e
                    errors[rank] = f"{type(cause).__name__}: {cause}"
                except RayError as e:  # Ray killed the task (OutOfMemoryError: its memory monitor): the run fails,
                    errors[rank] = f"its actor died ({type(e).__name__}): {_first_line(e)}"  # the sweep goes on
        if errors or pending:
            self.broken = True
            # the cause: a rank whose actor died (its peers then fail on a broken connection, often first),
            # else the earliest failure
            died = [r for r, msg in errors.items() if msg.startswith("its actor died")]
            first = died[0] if died else next(iter(errors), None)
            lines = [f"rank {r} failed: {msg}" for r, msg in sorted(errors.items(), key=lambda e: e[0] != first)]
            if pending:
                lines.append(f"rank(s) {sorted(pending.values())} still running "
                             + (f"{GRACE_S:g} s after rank {first} failed" if errors
                                else f"after the {timeout:g} s deadline"))
            head = f"{what} failed on rank {first}" if errors else f"{what} timed out"
            raise GroupError(head + ":\n  " + "\n  ".join(lines), sorted(errors) or sorted(pending.values()))
        return [results[r] for r in range(len(refs))]

    def shutdown(self) -> None:
        """Leave the process groups, kill the actors, remove the placement group; safe to call twice."""
        if self.actors and not self.broken:
            try:
                ray.get([a.leave.remote() for a in self.actors], timeout=10)
            except Exception:  # noqa: BLE001 - the actors are killed below either way
                pass
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
        self.broken = True

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _wait_any(refs: list, timeout: float | None) -> list:
    """ray.wait for one of `refs` (None: no deadline), in WAIT_SLICE_S slices so Ctrl-C gets through."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAIT_SLICE_S if end is None else min(WAIT_SLICE_S, max(end - time.monotonic(), 0.0))
        done, _ = ray.wait(refs, num_returns=1, timeout=left)
        if done or (end is not None and time.monotonic() >= end):
            return done


def _check_fits(world_size: int, bundle: dict) -> None:
    """Refuse at once a placement group the whole cluster could never hold (it would wait forever)."""
    total = ray.cluster_resources()
    for resource in ("CPU", "GPU"):
        need = world_size * bundle.get(resource, 0)
        if need > total.get(resource, 0) + 1e-9:
            raise RuntimeError(f"{world_size} ranks x {bundle.get(resource, 0):g} {resource} need {need:g} "
                               f"{resource}s: the Ray cluster has {total.get(resource, 0):g} in all")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
