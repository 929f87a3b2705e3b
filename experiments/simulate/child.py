"""The process a simulation runs in: forked (SimGrid's engine runs once per process), killed with its parent, its
peak resident memory watched from the parent; what it gives back (ChildRun).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


def run_in_child(call: Callable[[], object]) -> tuple[object, str, float]:
    """call() in a forked process (SimGrid's engine runs once per process): (result, error, wall seconds)."""
    done = run_child(call)
    return done.result, done.error, done.wall_s


def run_in_child_timed(call: Callable[[], object]) -> tuple[object, str, float, float]:
    """As run_in_child, with the CPU seconds of the process (on a loaded machine nearer what a quiet one's wall
    time would be than the wall)."""
    done = run_child(call)
    return done.result, done.error, done.wall_s, done.cpu_s


@dataclass(frozen=True)
class ChildRun:
    """What a forked simulation gave back: its result or error, wall and CPU seconds, and its peak resident
    memory (the kernel's high-water mark, read while it ran: known even when the kernel killed it)."""

    result: object
    error: str
    wall_s: float
    cpu_s: float
    peak_bytes: int


# Held while a process forks a simulation, and by threads of the same process while they import, price or print
# (experiments/validate.py's --jobs): a fork copies only the forking thread, so a lock another thread held at that
# moment (the import lock, an output buffer's) stays held forever in the child, which then hangs at 0% CPU.
FORK_LOCK = threading.RLock()


def run_child(call: Callable[[], object]) -> ChildRun:
    """call() in a forked process, its peak memory watched from here.

    Fork, not spawn: milliseconds instead of seconds of imports, and `call` may be a closure. This process
    must not have run SimGrid's engine itself (it never does: every simulation goes through here).
    """
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    parent_pid = os.getpid()

    def main():
        _die_with_parent(parent_pid)
        try:
            start, cpu = time.perf_counter(), time.process_time()
            result = call()
            child.send(("ok", result, time.perf_counter() - start, time.process_time() - cpu))
        except BaseException as e:  # noqa: BLE001 - sent to the parent, which reports it
            child.send(("error", f"{type(e).__name__}: {e}", 0.0, 0.0))
        finally:
            child.close()

    proc = ctx.Process(target=main, daemon=True)
    with FORK_LOCK:
        proc.start()
    child.close()
    peak = 0
    try:
        while not parent.poll(0.5):  # the high-water mark is gone with the process: read it while it lives
            peak = max(peak, _peak_resident(proc.pid))
            if not proc.is_alive():
                break
        peak = max(peak, _peak_resident(proc.pid))
        status, payload, wall, cpu = parent.recv()
    except EOFError:
        proc.join()
        died = f"the simulation process died (exit code {proc.exitcode})"
        if peak:
            died += f" at {peak / 2**20:,.0f} MiB resident"
            if proc.exitcode == -signal.SIGKILL:
                died += " (killed: the kernel's out-of-memory killer, most likely; see --max-memory)"
        status, payload, wall, cpu = "error", died, 0.0, 0.0
    except BaseException:  # Ctrl-C, a test's timeout: the simulation must not outlive its reason to run
        proc.kill()
        raise
    finally:
        proc.join()
        parent.close()
    if status == "ok":
        return ChildRun(payload, "", wall, cpu, peak)
    return ChildRun(None, payload, wall, cpu, peak)


def _peak_resident(pid: int) -> int:
    """A live process's peak resident memory in bytes (VmHWM; 0 where /proc does not say)."""
    from experiments.simulate.memory import proc_bytes

    return proc_bytes(f"/proc/{pid}/status", "VmHWM") or 0


def _die_with_parent(parent_pid: int) -> None:
    """Linux: have the kernel kill this (forked) process when its parent dies, even by SIGKILL, so that a killed
    `syncbench simulate` or test run leaves no simulation running. Elsewhere a no-op. (The kernel watches the
    thread that forked: run_in_child is called from the main thread.) A parent that died before the request
    was made is caught by the check after it."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:
        os._exit(1)
