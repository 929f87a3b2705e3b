"""Connect to Ray, or start a quiet embedded one: the only place that decides where Ray runs."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray

CONNECT_TIMEOUT_S = 30.0  # how long `--address` (or RAY_ADDRESS) may take to answer before we give up
START_ATTEMPTS = 2  # an embedded Ray whose raylet does not register in time is started once more

_OWN_TEMP_DIRS: list[str] = []  # temp dirs of embedded sessions this process started: removed by stop_ray()


def ensure_ray(address: str | None = None, num_cpus: int | None = None, temp_dir: str | None = None,
               connect_timeout: float = CONNECT_TIMEOUT_S, log_path: str | os.PathLike | None = None) -> bool:
    """Connect to `address` (or RAY_ADDRESS) if given, else start a local Ray; True if we started it.

    Only a Ray this call started should be shut down by the caller (stop_ray(), which also removes its
    temp dir; one left running is stopped and removed at exit); a cluster we only connected to, or a Ray
    already initialized in this process, is left alone. Connecting honours Ctrl-C and fails after
    `connect_timeout` seconds with the address in the error, instead of retrying for minutes. With `log_path`,
    the messages Ray's driver logs while it starts and afterwards (its token-authentication notice among them) are
    appended to that file instead of landing in the middle of the progress lines.
    """
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _connect(address, connect_timeout)
        return False
    sigterm = signal.getsignal(signal.SIGTERM)
    for attempt in range(1, START_ATTEMPTS + 1):
        own_temp_dir = temp_dir is None
        session_dir = tempfile.mkdtemp(prefix="syncbench-ray-") if own_temp_dir else temp_dir
        if own_temp_dir:
            if not _OWN_TEMP_DIRS:
                atexit.register(stop_ray)  # registered after ray's own exit hook, so it runs first
            _OWN_TEMP_DIRS.append(session_dir)
        _start_reaper(session_dir, remove=own_temp_dir)  # before ray.init: it also ends what a failed start left
        try:
            with _ray_log(log_path):
                ray.init(num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
                         include_dashboard=False,
                         _temp_dir=session_dir,
                         logging_level=logging.WARNING,
                         configure_logging=True)
            break
        except Exception as e:  # noqa: BLE001 - only Ray's start timeout is retried, anything else re-raised
            if attempt == START_ATTEMPTS or "timed out during startup" not in str(e):
                stop_ray()
                raise
            # Ray gives its raylet a fixed 30 s to register: on a machine loaded far beyond its cores that can pass
            print(f"Ray did not start within its 30 s ({e}); load average {os.getloadavg()[0]:.0f} on "
                  f"{os.cpu_count()} cores: trying once more", file=sys.stderr, flush=True)
            stop_ray()  # the reaper ends what this attempt started and removes its temp dir
    if threading.current_thread() is threading.main_thread():
        # ray.init's SIGTERM handler drains the node for up to 30 s before exiting; SIGTERM raises KeyboardInterrupt
        # naming it instead (finished runs are saved, Ray is shut down on the way out), or keeps the caller's handler
        signal.signal(signal.SIGTERM, _raise_interrupt if sigterm in (signal.SIG_DFL, None) else sigterm)
    return True


@contextlib.contextmanager
def _ray_log(log_path):
    """Ray's driver logger (the "ray" logger, which ray.init logs through) writing to `log_path` (appended, never
    through a symlink) instead of stderr, from before ray.init until stop_ray(); nothing changes without a path."""
    if log_path is None:
        yield
        return
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644)
    except OSError as e:  # ELOOP: a symlink planted there; the results directory's own files are never links
        raise ValueError(f"cannot write Ray's log {str(log_path)!r}: {e.strerror} (a symlink there is refused: "
                         f"nothing is written outside the results directory)") from None
    handler = logging.StreamHandler(os.fdopen(fd, "a", buffering=1))
    logger = logging.getLogger("ray")
    if logger.handlers:
        handler.setFormatter(logger.handlers[0].formatter)
    _RAY_LOG_HANDLERS.append(logger.handlers[:])  # what stop_ray() puts back
    logger.handlers = [handler]
    try:
        yield
    except BaseException:
        _restore_ray_log()
        raise


_RAY_LOG_HANDLERS: list[list[logging.Handler]] = []


def _restore_ray_log() -> None:
    logger = logging.getLogger("ray")
    while _RAY_LOG_HANDLERS:
        for handler in logger.handlers:
            handler.close()
        logger.handlers = _RAY_LOG_HANDLERS.pop()


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
    """ray.shutdown(), then stop what is left of the embedded sessions this process started (their reapers end
    every Ray process the session started) and remove their temp dirs."""
    if ray.is_initialized():
        ray.shutdown()
    _restore_ray_log()
    _stop_reapers()
    while _OWN_TEMP_DIRS:
        path = _OWN_TEMP_DIRS.pop()
        for _ in range(20):  # a Ray process that is still exiting may write one more log line
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.exists(path):
                break
            time.sleep(0.1)


# -- an embedded Ray stops with its driver, however the driver ends --------------------------------------------

_REAPERS: list[subprocess.Popen] = []


def _start_reaper(temp_dir: str, remove: bool) -> None:
    """experiments/cluster/ray_reaper.py beside this embedded Ray: it outlives this process (its own session) and
    ends the session's Ray processes (and the temp dir, if `remove`: one ensure_ray made) when this process stops
    Ray, exits or is killed (SIGKILL too).

    Ray's own fate-sharing (PR_SET_PDEATHSIG on the processes ray.init starts) ends GCS and raylet with their
    driver, but not the raylet's children (agents, workers): after a SIGKILL two agents ran on as orphans."""
    reaper = subprocess.Popen([sys.executable, str(Path(__file__).with_name("ray_reaper.py")), str(os.getpid()),
                               temp_dir, "remove" if remove else "keep"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    _REAPERS.append(reaper)


def _stop_reapers(timeout: float = 10.0) -> None:
    """Close each reaper's pipe (it ends the session's remaining Ray processes, removes the temp dir), wait."""
    while _REAPERS:
        reaper = _REAPERS.pop()
        with contextlib.suppress(OSError):
            reaper.stdin.close()
        try:
            reaper.wait(timeout)
        except subprocess.TimeoutExpired:
            reaper.kill()
            reaper.wait()


def force_stop() -> None:
    """Without asking Ray: end every process of the embedded sessions this process started (their reapers) and
    remove their temp dirs. For a process about to exit that cannot wait for ray.shutdown() (a signal's deadline)."""
    _stop_reapers(timeout=3.0)
    for path in _OWN_TEMP_DIRS:
        shutil.rmtree(path, ignore_errors=True)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


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
