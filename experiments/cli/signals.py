"""Signals while a command runs: SIGTERM and SIGINT end it like Ctrl-C, and within a deadline whatever its way out
waits on (the command line's main() wraps every command in `bounded_by_signals`)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import threading
import time

INTERRUPT_DEADLINE_S = 5.0  # after SIGTERM or SIGINT, how long the orderly way out may take (timeout, systemd and
# Slurm send SIGKILL ~10 s after SIGTERM); then the Ray processes this command started are ended and it exits


@contextlib.contextmanager
def bounded_by_signals(command: str, deadline: bool = True):
    """SIGTERM and SIGINT end the command like Ctrl-C (KeyboardInterrupt naming the signal: finished runs saved, Ray
    shut down on the way out), and within INTERRUPT_DEADLINE_S whatever the way out waits on: a watcher sees the
    signal through signal.set_wakeup_fd (whichever Python handler is installed: the runner has its own), and at
    the deadline ends this command's embedded Ray (its reapers), removes its temp dir and exits with 128 + the
    signal. Only while the command runs: main() called in-process (tests) leaves nothing armed. Without
    `deadline`, only the first part: SIGTERM raises KeyboardInterrupt naming it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    if not deadline:
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    old_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    watcher = threading.Thread(target=_deadline_after_signal, args=(reader, command), daemon=True,
                               name="syncbench-signal-deadline")
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, previous)
        with contextlib.suppress(OSError):
            reader.shutdown(socket.SHUT_RDWR)  # the watcher sees the end and returns
        watcher.join(1.0)
        reader.close()
        writer.close()


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _deadline_after_signal(reader, command: str) -> None:
    while True:
        try:
            data = reader.recv(64)
        except OSError:
            return
        if not data:
            return  # the command ended: disarmed
        stops = [n for n in data if n in (signal.SIGTERM, signal.SIGINT)]
        if stops:
            break
    end = time.monotonic() + INTERRUPT_DEADLINE_S
    while time.monotonic() < end:  # returns early if the command ends first
        ready, _, _ = select.select([reader], [], [], max(0.0, end - time.monotonic()))
        if ready:
            try:
                if not reader.recv(64):
                    return
            except OSError:
                return
    name = signal.Signals(stops[0]).name
    print(f"syncbench {command}: {name}: not stopped within {INTERRUPT_DEADLINE_S:g} s: ending the Ray processes "
          f"it started and exiting; finished runs are saved", file=sys.stderr, flush=True)
    runtime = sys.modules.get("experiments.cluster.ray_runtime")
    if runtime is not None:
        runtime.force_stop()
    os._exit(128 + stops[0])

