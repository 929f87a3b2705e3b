"""The measured substrate: every rank a Ray actor, joined by torch.distributed (gloo/NCCL), messages over gloo or
syncbench's sockets, links emulated in Python or shaped by the kernel (experiments/cluster/).

Runs that share a world size reuse one worker group (an actor holding torch costs seconds to start), so runs
execute grouped by world size, in file order within a group. Before any actor starts, the runs are checked
against the machine or cluster (experiments/cluster/limits.py, placement.py) and against what this substrate
can apply (experiments/pipeline/substrate.py). Nodes of several ranks (ranks_per_node = k > 1) need kernel-shaped
links: k actors per namespace of the cluster share its shaped veth (experiments/cluster/placement.py); a
python-emulated NIC cannot be shared by separate processes, so such runs are refused.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import threading
import time

from experiments.cluster import placement
from experiments.cluster.group import GroupError, WorkerGroup
from experiments.cluster.limits import check_capacity, cluster_capacity, local_capacity
from experiments.cluster.ray_runtime import ensure_ray, stop_ray
from experiments.pipeline.profiles import install_profile
from experiments.pipeline.store import RAY_LOG
from experiments.pipeline.substrate import Run, Substrate, now_utc
from experiments.pipeline.summary import summarize
from experiments.pipeline.trace import run_events
from experiments.pipeline.train import train


class RaySubstrate(Substrate):
    name = "ray"
    failures = True  # the failing rank's actor dies, the survivors recover (experiments/pipeline/ray_sweep_faults.py)
    model_wrappers = True  # ranks are torch.distributed members: DDP runs
    nodes = True  # on the kernel-shaped cluster only: k ranks per namespace share its shaped NIC (problems())

    def __init__(self, address: str | None = None, train_fn=train, oversubscribe: bool = False):
        """`train_fn(ctx, spec[, progress])` is what every rank executes (tests substitute their own; `progress`
        is passed only when the log is a terminal); `oversubscribe` lifts the ranks-per-core limit."""
        self.address, self.train_fn, self.oversubscribe = address, train_fn, oversubscribe

    def problems(self, run: Run) -> list[str]:
        from experiments.pipeline.ray_sweep_faults import problems as ray_fault_problems
        from experiments.pipeline.sweep_faults import problems as fault_problems

        spec = run.spec
        found = super().problems(run) + fault_problems(spec) + ray_fault_problems(spec)
        config = spec.strategy_config()
        network = spec.network()
        if spec.ranks_per_node > 1 and not placement.is_kernel(network):
            # python emulation shares a node's NIC between ranks holding one Network object (threads of one
            # process); Ray actors are processes: only the kernel's shaped port can be shared by them
            links = f"link emulation {network.emulation!r}" if network else "no link"
            found.append(f"run {spec.strategy} x {spec.workers} workers: ranks_per_node = {spec.ranks_per_node} cannot "
                         f"be applied on the ray substrate with {links}: its ranks are separate processes, which "
                         f"cannot share a python-emulated NIC; accepted there: ranks_per_node = 1, or link = {{ "
                         f"bandwidth = ..., emulation = \"kernel\" }} on a cluster of `syncbench cluster up "
                         f"--node-cpus {spec.ranks_per_node}` ({spec.ranks_per_node} ranks per namespace), or "
                         f"--substrate threads")
        if config.asynchronous and spec.p2p == "sockets":
            # its server receives from every worker at once, from a thread per worker; the sockets transport
            # drives all of a rank's transfers from one thread at a time (measured: "concurrent poll() invocation")
            found.append(f"run {spec.strategy} x {spec.workers} workers: staleness={config.staleness!r}, backups="
                         f"{config.backups} serves each worker from a thread of its own, and p2p = 'sockets' moves "
                         f"a rank's messages from one thread at a time; accepted: p2p = \"gloo\" for these runs")
        return found

    def order(self, runs: list[Run]) -> list[Run]:
        return sorted(runs, key=lambda run: run.world_size())

    @contextlib.contextmanager
    def session(self, runs: list[Run], store, log):
        specs = [run.spec for run in runs]
        # kernel-emulated links need the namespace cluster: refused here, before any work, when there is none
        address = placement.connect_address([s.network() for s in specs], self.address)
        import ray

        embedded = not ray.is_initialized() and not (address or os.environ.get("RAY_ADDRESS"))
        if embedded:  # this machine's limits, before Ray starts
            check_capacity(specs, local_capacity(), self.oversubscribe)
        # an embedded Ray gets a logical CPU per rank: oversubscribing the cores is allowed, and reported
        started_ray = ensure_ray(address, num_cpus=max(os.cpu_count() or 1, max(s.world_size() for s in specs)),
                                 log_path=store.dir / RAY_LOG)
        groups = _Groups(self.train_fn, store, log)
        try:
            if not embedded:  # the cluster's limits, before any actor starts
                check_capacity(specs, cluster_capacity(), self.oversubscribe)
            for spec in specs:  # every kernel-emulated run placeable on the cluster's shaped nodes, or no run starts
                placement.check(spec.world_size(), spec.network())
            yield groups.execute
        finally:
            groups.shutdown()
            if started_ray:
                stop_ray()


class _Groups:
    """The worker group of the runs in flight: kept while runs share its shape, replaced when they do not."""

    def __init__(self, train_fn, store, log):
        self.train_fn, self.store, self.log = train_fn, store, log
        self.group: WorkerGroup | None = None
        self.measured_profiles: dict = {}  # compute = "profile" without a file: measured once per sweep

    def execute(self, run: Run) -> tuple[dict, list[dict]]:
        spec = run.spec
        world, cuda = spec.world_size(), spec.device == "cuda"
        try:
            nodes = placement.bundles(world, spec.network())
        except placement.NodeLost as e:  # a node lost mid-sweep: this run refused at once, the sweep goes on
            return summarize(spec, None, str(e), _no_group_meta())
        group = self.group
        if (group is None or group.broken or group.world_size != world or group.uses_gpu != cuda
                or group.node_resources != nodes):
            self.shutdown()
            try:
                self.group = group = WorkerGroup(world, num_gpus=_gpus_per_actor(world) if cuda else 0,
                                                 timeout=spec.timeout, node_resources=nodes)
            except (RuntimeError, ValueError) as e:
                return summarize(spec, None, f"worker group did not start: {e}", _no_group_meta())
        try:
            install_profile(group, spec, self.measured_profiles, self.store)
        except GroupError as e:  # the run measures it itself, and fails saying why if it cannot
            print(f"           -> profile measurement failed: {str(e)[:300]}", file=self.log, flush=True)
        if spec.failures:  # the run loses actors and recovers: segments of the training (ray_sweep_faults.py)
            from experiments.pipeline.ray_sweep_faults import execute

            meta = {"started_at": now_utc(), "transport": spec.p2p, "gpu": group.gpu_name or "",
                    "cores": group.cores, "host": group.host or platform.node()}
            return execute(spec, meta, group)
        return _run_one(group, spec, self.train_fn, self.log)

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.shutdown()
            self.group = None


def _run_one(group: WorkerGroup, spec, train_fn, log=None) -> tuple[dict, list[dict]]:
    started_at = now_utc()
    start = time.perf_counter()
    try:
        if log is not None and log.isatty():  # a live step counter for a person watching a terminal
            results = _with_step_progress(group, spec, train_fn, log)
        else:  # the communicator timeout bounds every wait, the run's deadline the whole run (compute included)
            results = group.run(train_fn, spec, network=spec.network(), p2p=spec.p2p, timeout=run_deadline(spec))
        error = ""
    except GroupError as e:
        results, error = None, str(e)
        if "deadline" in error:
            error += (f" (a run's deadline is its timeout x (steps + 2) = {spec.timeout:g} s x {spec.steps + 2}: "
                      f"raise timeout for longer steps)")
    # what carried the strategy's bytes: the sweep's p2p, except for a backend's own allreduce (native, ddp)
    transport = spec.p2p if spec.p2p != "gloo" and spec.strategy_config().counted else group.backend
    meta = {"started_at": started_at, "duration_s": time.perf_counter() - start, "transport": transport,
            "gpu": group.gpu_name or "", "cores": group.cores, "host": group.host or platform.node()}
    row, steps = summarize(spec, results, error, meta)
    return row, steps, run_events(row["run_id"], results)


def run_deadline(spec) -> float:
    """How long a whole run may take on its ranks: every step (warm-up included) within the communicator's timeout,
    plus two for building the model and evaluating it. Real-mode compute has no other bound: a 1-worker run never
    waits on a peer."""
    return spec.timeout * (spec.steps + 2)


def _with_step_progress(group: WorkerGroup, spec, train_fn, log) -> list:
    """group.run in a thread while rank 0 reports finished steps through a Ray queue; redraw one line."""
    from ray.util.queue import Queue

    queue = Queue(actor_options={"num_cpus": 0})
    outcome: dict = {}

    def call():
        try:
            outcome["result"] = group.run(train_fn, spec, StepProgress(queue), network=spec.network(), p2p=spec.p2p,
                                          timeout=run_deadline(spec))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread below
            outcome["error"] = e

    thread = threading.Thread(target=call, daemon=True)
    start = time.perf_counter()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(0.5)
            step = None
            while not queue.empty():
                step = queue.get_nowait()
            if step:
                elapsed = time.perf_counter() - start
                eta = elapsed / step * (spec.steps - step)
                print(f"\r           step {step}/{spec.steps}, {elapsed:.0f} s, ETA run {eta:.0f} s   ",
                      end="", file=log, flush=True)
    except BaseException:
        group.broken = True  # interrupted: shutdown kills the busy ranks instead of waiting for them
        raise
    finally:
        print("\r" + " " * 60 + "\r", end="", file=log, flush=True)
        queue.shutdown()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class StepProgress:
    """Rank 0's finished steps into the progress queue without waiting for the queue to take them. Ray's
    Queue.put_nowait waits for its actor's reply: a round trip (a second for the first, on a loaded machine) that
    rank 0 would spend between two steps, outside every timed interval, and that every other rank would then wait
    out inside its next step's communication time."""

    def __init__(self, queue):
        self._actor = queue.actor

    def put_nowait(self, step: int) -> None:
        self._actor.put_nowait.remote(step)  # not waited for: a lost progress line never matters


def _no_group_meta() -> dict:
    return {"started_at": now_utc(), "duration_s": 0.0, "transport": "", "gpu": "", "cores": os.cpu_count() or 1,
            "host": platform.node()}


def _gpus_per_actor(world: int) -> float:
    """One GPU each when there are enough, else an equal share of the GPUs there are."""
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if gpus < 1:
        raise RuntimeError("device = 'cuda' but the Ray cluster has no GPU: use device = 'cpu'")
    return 1.0 if gpus >= world else math.floor(gpus / world * 100) / 100
