"""The reaper of an embedded Ray: a small process that outlives its driver and stops what the driver's Ray started.

`ray_runtime.ensure_ray()` starts it beside an embedded Ray, in a session of its own (a signal to the driver's
process group does not reach it), with a pipe from the driver on its stdin. Twice a second it notes the Ray
processes of the session: the driver's children whose command line names the session's temp dir (GCS, raylet,
monitors, dashboard) and all their descendants (workers, agents), each by pid and start time. When the pipe
closes (the driver stopped Ray, exited, or was killed with SIGKILL), every noted process still running with the
same start time is sent SIGTERM, then SIGKILL a second later, and the temp dir is removed (`remove`: a temp dir
ensure_ray made; one its caller chose is kept). Only processes it saw descend from its driver are touched (a pid
reused by another process has another start time).

    python ray_reaper.py DRIVER_PID TEMP_DIR remove|keep
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 1.0  # between SIGTERM and SIGKILL


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[1]), int(fields[19])  # ppid is field 4, starttime field 22 (after "pid (comm)")
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _processes() -> dict[int, tuple[int, int]]:
    """Every live process: pid -> (parent pid, start time)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None:
            table[int(name)] = stat
    return table


def ray_processes(driver: int, temp_dir: str, table: dict[int, tuple[int, int]]) -> dict[int, int]:
    """The session's Ray processes: pid -> start time (roots: the driver's children naming temp_dir)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    roots = [pid for pid in children.get(driver, []) if pid != os.getpid() and temp_dir in _cmdline(pid)]
    found, stack = {}, list(roots)
    while stack:
        pid = stack.pop()
        if pid not in found and pid in table:
            found[pid] = table[pid][1]
            stack.extend(children.get(pid, []))
    return found


def reap(noted: dict[int, int]) -> list[int]:
    """SIGTERM, then SIGKILL, every noted process still running with its noted start time (and its descendants
    started since); the pids signalled."""
    table = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    targets, stack = {}, [pid for pid, start in noted.items() if table.get(pid, (0, None))[1] == start]
    while stack:  # processes started after the last look, below one we know
        pid = stack.pop()
        if pid not in targets and pid in table and pid != os.getpid():
            targets[pid] = table[pid][1]
            stack.extend(children.get(pid, []))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid, start in targets.items() if (_stat(pid) or (0, None))[1] == start]
        for pid in alive:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and alive:
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline and any((_stat(p) or (0, None))[1] == targets[p] for p in alive):
                time.sleep(0.05)
    return sorted(targets)


def main(driver: int, temp_dir: str, remove: bool) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # stopped by its pipe only
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    noted: dict[int, int] = {}
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready and not os.read(sys.stdin.fileno(), 64):
            break  # EOF: the driver closed the pipe or is gone
        if _stat(driver) is None:
            break
        noted.update(ray_processes(driver, temp_dir, _processes()))
    reap(noted)
    for _ in range(20 if remove else 0):  # a process that was exiting may write one more log line
        shutil.rmtree(temp_dir, ignore_errors=True)
        if not os.path.exists(temp_dir):
            break
        time.sleep(0.1)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3] == "remove")
