"""Where a rank of the socket transport listens and how its peers' connections are told from strangers': the
namespace a rank runs in (Unix pairs only inside one), the address it announces, its private Unix listener, and
the handshakes read side by side while ranks pair up.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import tempfile
import time
from dataclasses import dataclass

_STRANGERS_NAMED = 8  # in an error message, the rest counted
_UNIX_PATH_MAX = 100  # bytes of a Unix socket's path (the kernel's sun_path holds 108 with its NUL)


def _namespace() -> tuple[str, int, int, int]:
    """(boot id, network, mount and pid namespace inodes): ranks with equal ones share a kernel, can reach each
    other's Unix socket files, and see each other's pids (SO_PEERCRED, process_vm_readv)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return (boot, *(os.stat(f"/proc/self/ns/{ns}").st_ino for ns in ("net", "mnt", "pid")))
    except OSError:  # not Linux: every pair takes TCP
        return socket.gethostname(), -1, -1, -1


@dataclass(frozen=True)
class _Address:
    """What a rank tells its peers over the control plane before they connect."""

    where: tuple  # _namespace(): Unix pairs only between ranks where it is equal
    unix: str | None  # the path of its Unix listener (in a 0700 directory), None: TCP only
    tcp: tuple[str, int]
    pid: int
    probe: tuple[int, int]  # the address and value of an int64 a peer reads to learn if it may read this process
    token: bytes  # rank 0's opens every connection of the group


class _Handshakes:
    """Connections accepted while ranks pair up, each with its own short deadline for its hello (token + rank),
    all read side by side: a silent stranger delays no rank. Strangers (not a process of this group, a wrong
    token, silent, closed) are dropped, counted and named for any error."""

    def __init__(self, listeners: list[socket.socket], token: bytes, pids: set[int], handshake_s: float,
                 most: int):
        self.token, self.pids, self.handshake_s = token, pids, handshake_s
        self.most = most  # handshakes in flight at once: past it the oldest is dropped
        self.size = len(token) + 8
        self.pending: dict[socket.socket, list] = {}  # socket -> [hello bytes so far, its deadline, who]
        self.strangers: list[str] = []
        self.selector = selectors.DefaultSelector()
        for listener in listeners:
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, None)

    def poll(self, until: float) -> list[tuple[int, socket.socket, str]]:
        """Accept and read until `until` or the next handshake deadline; (rank, socket, who) of each whole hello
        with the group's token (the caller checks the rank)."""
        now = time.monotonic()
        for sock, (got, deadline, who) in list(self.pending.items()):
            if now >= deadline:
                self.drop(sock, who, f"silent ({len(got)} of {self.size} hello bytes within {self.handshake_s:g} s)")
        wake = min([until] + [entry[1] for entry in self.pending.values()])
        hellos = []
        for key, _ in self.selector.select(max(wake - now, 0)):
            if key.data is None:
                self._accept(key.fileobj, now)
            elif (hello := self._read(key.fileobj)) is not None:
                hellos.append(hello)
        return hellos

    def _accept(self, listener: socket.socket, now: float) -> None:
        try:
            sock, addr = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        who = _who(sock, addr)
        if sock.family == socket.AF_UNIX and _peer_credentials(sock)[0] not in self.pids:
            self.drop(sock, who, "not a process of this group")
            return
        if len(self.pending) >= self.most:  # a flood: the oldest silent one makes room (ranks say hello at once)
            oldest = min(self.pending, key=lambda s: self.pending[s][1])
            self.drop(oldest, self.pending[oldest][2], f"silent while {self.most} more handshakes waited")
        sock.setblocking(False)
        self.pending[sock] = [b"", now + self.handshake_s, who]
        self.selector.register(sock, selectors.EVENT_READ, who)

    def _read(self, sock: socket.socket) -> tuple[int, socket.socket, str] | None:
        got, _, who = entry = self.pending[sock]
        try:
            chunk = sock.recv(self.size - len(got))
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as e:
            self.drop(sock, who, f"failed during its hello: {e}")
            return None
        if not chunk:
            self.drop(sock, who, f"closed after {len(got)} of {self.size} hello bytes")
            return None
        entry[0] = got = got + chunk
        if len(got) < self.size:
            return None
        if got[:len(self.token)] != self.token:
            self.drop(sock, who, "wrong token")
            return None
        self._forget(sock)
        return struct.unpack("<q", got[len(self.token):])[0], sock, who

    def _forget(self, sock: socket.socket) -> None:
        if self.pending.pop(sock, None) is not None:
            self.selector.unregister(sock)

    def drop(self, sock: socket.socket, who: str, why: str) -> None:
        self._forget(sock)
        sock.close()
        self.strangers.append(f"{who}: {why}")

    def close(self) -> None:
        for sock in list(self.pending):
            self._forget(sock)
            sock.close()
        self.selector.close()

    def described(self) -> str:
        """'' or '; N stranger(s) connected meanwhile (who: why; ...)', for an error message: those dropped and
        those still silent."""
        named = self.strangers + [f"{who}: still silent" for _, _, who in self.pending.values()]
        if not named:
            return ""
        more = len(named) - _STRANGERS_NAMED
        shown = "; ".join(named[:_STRANGERS_NAMED]) + (f"; ... and {more} more" if more > 0 else "")
        return f"; {len(named)} stranger(s) connected meanwhile and were dropped ({shown})"


def _who(sock: socket.socket, addr) -> str:
    """A connection's origin for an error: ip:port over TCP, the process (pid, uid) over Unix."""
    if sock.family != socket.AF_UNIX:
        return f"{addr[0]}:{addr[1]}"
    pid, uid = _peer_credentials(sock)
    return f"unix peer pid {pid} uid {uid}" if pid else "unix peer (credentials unknown)"


def _peer_credentials(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a Unix socket (SO_PEERCRED; (0, -1) where unknown)."""
    try:
        pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid, uid
    except (OSError, AttributeError):
        return 0, -1


def _unix_listener(backlog: int) -> tuple[socket.socket, str]:
    """A Unix listener in a fresh 0700 directory (only this user can connect to it); returns it and its path."""
    base = None
    if len(os.path.join(tempfile.gettempdir(), "syncbench-xxxxxxxx", "s")) > _UNIX_PATH_MAX:
        base = "/tmp"  # sun_path holds 108 bytes: a long TMPDIR would not fit
    directory = tempfile.mkdtemp(prefix="syncbench-", dir=base)
    path = os.path.join(directory, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        _remove_unix_listener(path)
        raise
    return sock, path


def _remove_unix_listener(path: str) -> None:
    for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        try:
            remove(target)
        except OSError:
            pass
