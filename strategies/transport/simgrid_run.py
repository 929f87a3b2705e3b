"""run_simgrid: fn(comm) on simulated ranks in this process's one SimGrid engine (the process set up for many actor
threads: pinned to one CPU, the cyclic collector off, the futex table sized)."""

from __future__ import annotations

import ctypes
import gc
import os
import sys
from collections.abc import Callable
from contextlib import contextmanager

from strategies.transport import factory
from strategies.transport.ranks import RankRun
from strategies.transport.simgrid import Cluster, SimGridCommunicator, _Port
from strategies.transport.simgrid_loader import _quiet_stderr, load_simgrid


def run_simgrid(world_size: int, fn: Callable[[SimGridCommunicator], object], build_platform,
                config: tuple[str, ...] = (), nic: str = "shared") -> list:
    """Simulate fn(comm) on world_size ranks; return each rank's result, or raise the first error.

    build_platform(sg) creates the platform (zones, hosts, links) in the fresh engine and returns the host of
    each rank in rank order. `config`: SimGrid settings, e.g. ("network/model:CM02",). `nic`: "shared",
    "fifo" or "buffered" (see Cluster). Once per process.
    """
    with simgrid_process(2 * world_size + 1, config) as (sg, engine):  # a NIC actor per rank in fifo/buffered
        return _simulate(sg, engine, world_size, fn, build_platform, nic)


@contextmanager
def simgrid_process(threads: int, config: tuple[str, ...] = ()):
    """This process's one SimGrid engine, the process set up for `threads` actor threads at once; yields (sg,
    engine) and restores the process after. Once per process (SimGrid's engine cannot be created twice)."""
    sg = load_simgrid()
    if getattr(sg, "_syncbench_engine_used", False):
        raise RuntimeError("run_simgrid: SimGrid's engine has already run in this process and cannot be created "
                           "twice; run each simulation in a fresh process (experiments.simulate does)")
    sg._syncbench_engine_used = True
    # SimGrid runs its actor threads one at a time: on one CPU each hand-over is a switch on that CPU, not a
    # wake-up sent to another (measured: a 256-rank ring simulates about 20% faster). The cyclic garbage
    # collector would walk every object the ranks allocate, again and again, while up to 1,024 actor threads
    # hand control around; the simulation's objects are freed by reference counting anyway. Both restored.
    pin = hasattr(os, "sched_setaffinity")  # Linux
    cpus = os.sched_getaffinity(0) if pin else set()
    gc_was_enabled = gc.isenabled()
    if pin:
        os.sched_setaffinity(0, {_current_cpu(cpus)})
    gc.disable()
    policy = _batch_scheduling()
    _size_futex_hash(threads)
    try:
        args = ["syncbench", "--log=root.thres:critical"] + [f"--cfg={c}" for c in config]
        with _quiet_stderr():
            engine = sg.Engine(args)
        yield sg, engine
    finally:
        if policy is not None:
            os.sched_setscheduler(0, *policy)
        if gc_was_enabled:
            gc.enable()
        if pin:
            os.sched_setaffinity(0, cpus)


def _batch_scheduling() -> tuple | None:
    """Run this thread, and the actor threads SimGrid starts from it (they inherit it), under SCHED_BATCH; return
    the policy to restore (None where the platform has none, or the change is refused).

    Every hand-over between SimGrid's threads (maestro to an actor and back) is a semaphore release (a mutex, a
    condition variable's signal, the mutex's unlock) followed by a wait. Under the default policy the woken thread
    preempts the waker on the one CPU at the signal, finds the mutex still held, and sleeps on it again: about four
    switches a hand-over where one does. A batch thread never preempts on wake-up: the waker finishes its release
    and sleeps, then the woken one runs. Measured on a ring step: 7 switches a message instead of 15 at 128 ranks,
    15-20% less CPU at 64-128 ranks, 6-15% at 256 (docs/simulation.md). Simulated time does not depend on it
    (SimGrid's threads run one at a time, in its order).
    Changing between SCHED_OTHER and SCHED_BATCH at the same nice value needs no privilege."""
    if not hasattr(os, "SCHED_BATCH"):
        return None
    try:
        saved = (os.sched_getscheduler(0), os.sched_getparam(0))
        if saved[0] == os.SCHED_BATCH:
            return None
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        return None
    return saved


def _size_futex_hash(threads: int) -> None:
    """Give this process a futex hash table of about 4 buckets per thread (Linux 6.16+; elsewhere a no-op).

    Every hand-over between SimGrid's actor threads is a futex wake, and the kernel finds the sleeping thread by
    walking a hash bucket's list. Linux 6.16 gives each process a private table sized by the online CPUs, not the
    threads: 16 buckets on this 2-CPU machine, so with thousands of parked actor threads every wake walked
    hundreds of entries (perf: futex_wake 14% of a 2,048-rank halving-doubling, 41% at 4,096: the simulation's
    time grew as ranks squared). PR_FUTEX_HASH / PR_FUTEX_HASH_SET_SLOTS sets the table's size."""
    if not sys.platform.startswith("linux") or threads < 64:
        return
    slots = 1 << min(22, max(4, (4 * threads - 1).bit_length()))
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(78, 1, slots, 0, 0)  # PR_FUTEX_HASH, PR_FUTEX_HASH_SET_SLOTS: fails harmlessly on older kernels
    except (OSError, AttributeError):
        return


def _current_cpu(allowed: set[int]) -> int:
    """The CPU this thread runs on now (the scheduler's choice, so two simulations side by side usually get two
    CPUs), or the highest allowed one where /proc does not say."""
    try:
        with open("/proc/thread-self/stat") as f:
            cpu = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, counted after the command name
    except (OSError, ValueError, IndexError):
        return max(allowed)
    return cpu if cpu in allowed else max(allowed)


def _simulate(sg, engine, world_size, fn, build_platform, nic) -> list:
    hosts = build_platform(sg)
    if len(hosts) != world_size:
        raise ValueError(f"run_simgrid: the platform has {len(hosts)} hosts for {world_size} ranks")
    cluster = Cluster(sg, world_size, nic)
    # SimGrid ends the actors of a deadlocked simulation with ActorKilled: they stay unfinished, named below
    run = RankRun(world_size, fn, lambda rank: factory.build("simgrid", SimGridCommunicator(cluster, rank)),
                  ignore=(sg.ActorKilled,))
    for rank in range(world_size):
        cluster.actors[rank] = sg.Actor.create(f"rank{rank}", hosts[rank], run.rank, rank)
    if nic == "buffered":
        ports = [sg.Host.by_name(f"port{rank}") for rank in range(world_size)]
        if any(p is None for p in ports):
            raise ValueError("nic = 'buffered' needs a platform with a switch port host 'port<rank>' per rank "
                             "(the star platform builds them)")
        cluster.ports = [_Port(sg, ports[rank], rank) for rank in range(world_size)]
    with _quiet_stderr():  # a deadlock report goes to stderr; it is raised below as a CommError instead
        engine.run()

    def deadlocked(stuck: list[int]) -> str:
        shown = ", ".join(map(str, stuck[:10])) + (" ..." if len(stuck) > 10 else "")
        return (f"simulation deadlocked at {engine.clock:.6f} simulated s: {len(stuck)} of {world_size} ranks never "
                f"finished (ranks {shown}): a receive without a matching send, or ranks disagreeing on sizes")

    return run.outcome(deadlocked)
