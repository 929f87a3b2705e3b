"""Connect to Ray, or start a quiet embedded one: the only place that decides where Ray runs."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import socket
import tempfile
import threading
import time

import ray

CONNECT_TIMEOUT_S = 30.0  # how long `--address` (or RAY_ADDRESS) may take to answer before we give up

_OWN_TEMP_DIRS: list[str] = []  # temp dirs of embedded sessions this process started: removed by stop_ray()


def ensure_ray(address: str | None = None, num_cpus: int | None = None, temp_dir: str | None = None,
               connect_timeout: float = CONNECT_TIMEOUT_S) -> bool:
    """Connect to `address` (or RAY_ADDRESS) if given, else start a local Ray; True if we started it.

    Only a Ray this call started should be shut down by the caller (stop_ray(), which also removes its
    temp dir; one left running is stopped and removed at exit); a cluster we only connected to, or a Ray
    already initialized in this process, is left alone. Connecting honours Ctrl-C and fails after
    `connect_timeout` seconds with the address in the error, instead of retrying for minutes.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _connect(address, connect_timeout)
        return False
    if temp_dir is None:
        temp_dir = tempfile.mkdtemp(prefix="syncbench-ray-")
        if not _OWN_TEMP_DIRS:
            atexit.register(stop_ray)  # registered after ray's own exit hook, so it runs first
        _OWN_TEMP_DIRS.append(temp_dir)
    ray.init(num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
             include_dashboard=False,
             _temp_dir=temp_dir,
             logging_level=logging.WARNING,
             configure_logging=True)
    return True


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None):
    """Ray for one command: connect to `address` or start an embedded Ray, and stop (and clean up) afterwards
    only a Ray this started. Yields True when it started one."""
    started = ensure_ray(address, num_cpus=num_cpus)
    try:
        yield started
    finally:
        if started:
            stop_ray()


def stop_ray() -> None:
    """ray.shutdown(), then remove the temp dirs of the embedded sessions this process started."""
    if ray.is_initialized():
        ray.shutdown()
    while _OWN_TEMP_DIRS:
        path = _OWN_TEMP_DIRS.pop()
        for _ in range(20):  # a Ray process that is still exiting may write one more log line
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                break
            time.sleep(0.1)


def _connect(address: str, timeout: float) -> None:
    """ray.init(address) with a deadline: first a plain TCP connect (a closed port fails at once), then
    ray.init in a thread, because it retries inside Ray's C++ client where Ctrl-C does not reach it."""
    host_port = re.fullmatch(r"(?:ray://)?\[?([^\[\]]+?)\]?:(\d+)", address.strip())
    if host_port:
        host, port = host_port.group(1), int(host_port.group(2))
        try:
            socket.create_connection((host, port), timeout=min(timeout, 10.0)).close()
        except OSError as e:
            raise ConnectionError(f"cannot reach a Ray cluster at --address {address!r}: {e.strerror or e} "
                                  f"(expected HOST:PORT of a running Ray head, e.g. 10.0.0.1:6379)") from None
    outcome: dict = {}

    def init() -> None:
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread below
            outcome["error"] = e

    thread = threading.Thread(target=init, name="ray-connect", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.2)  # short slices: Ctrl-C interrupts the wait
    if thread.is_alive():
        raise ConnectionError(f"no Ray cluster answered at --address {address!r} within {timeout:g} s "
                              f"(something listens there, but it is not a Ray head's GCS port)")
    if "error" in outcome:
        error = outcome["error"]
        raise ConnectionError(f"cannot connect to Ray at --address {address!r}: "
                              f"{str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__}")
